"""docs/development.md's guides are followed once: "Adding a stage" adds a throwaway stage `noop` to a
copy of the repository (module, params section, params.yaml with its help, dvc.yaml's stage with the code
deps `make deps` writes, its device class in infra/prefect.yaml, docs/files.md) and touches those files
only, "Adding a param" adds a key in its two places and nothing else,
the layout, params and placement tests pass on the copy and the stage runs there; leaving out one step
makes the test the guide names for it fail. Every file and test the guides name exists. `make test-slow` hands
its longest scenario out first.

    pytest -q tests/test_development.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.project_files import project_files

REPO = Path(__file__).resolve().parents[1]
GUIDE = (REPO / "docs" / "development.md").read_text()

NOOP_MODULE = '''"""Stage `noop`: a throwaway stage (tests/test_development.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from components.common.entry import stage_main
from components.common.files import write_json
from components.common.params import Params

STAGE = "noop"


def run(params: Params) -> Path:
    from components.common.tracking import stage_run

    with stage_run(STAGE, params):
        return write_json(params.noop.output_file, {"ok": True})


def main(argv: list[str] | None = None) -> int:
    return stage_main(STAGE, __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
'''


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: {old!r}"
    path.write_text(text.replace(old, new))


def sh(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, **kw)


def add_noop_stage(root: Path, leave_out: str = "") -> None:
    """The guide's steps for a stage `noop`, but for the stage table of docs/pipeline.md (no test reads it)."""
    (root / "components" / "noop.py").write_text(NOOP_MODULE)
    params = root / "components" / "common" / "params.py"
    edit(params, "\n\nSECTIONS: dict[str, type] = {", '''

@dataclass
class NoopParams:
    output_file: str = _f("reports/noop.json", path="output_file")


SECTIONS: dict[str, type] = {''')
    edit(params, '    "placement": PlacementParams,\n}',
         '    "placement": PlacementParams,\n    "noop": NoopParams,\n}')
    edit(params, "    placement: PlacementParams\n", "    placement: PlacementParams\n    noop: NoopParams\n")
    edit(params, '    evaluate: str = _placement()\n',
         '    evaluate: str = _placement()\n    noop: str = _placement()\n')
    p = root / "params.yaml"
    edit(p, "  # Where the evaluate stage runs.\n  evaluate: local\n",
         "  # Where the evaluate stage runs.\n  evaluate: local\n  # Where the noop stage runs.\n  noop: local\n")
    help_line = "" if leave_out == "help" else "  # The noop stage's output.\n"
    p.write_text(p.read_text() + f"\nnoop:\n{help_line}  output_file: reports/noop.json\n")
    edit(root / "dvc.yaml", "\n# `dvc plots show`", "  noop:\n    cmd: python -m components.noop\n"
         "    params:\n      - noop\n    outs:\n      - reports/noop.json\n\n# `dvc plots show`")
    if leave_out != "deps":  # `make deps` writes its code deps (`-o venv`: this interpreter's, not a new .venv)
        sh(["make", "--no-print-directory", "-o", "venv", "deps", f"PY={sys.executable}"], root, check=True)
    if leave_out != "resources":
        edit(root / "infra" / "prefect.yaml", "    evaluate: gpu\n", "    evaluate: gpu\n    noop: cpu\n")
    if leave_out != "files":
        edit(root / "docs" / "files.md", "- `components/evaluate.py` —",
             "- `components/noop.py` — stage `noop`: a throwaway stage\n- `components/evaluate.py` —")


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The project's files (tests/project_files.py: not what a run of this checkout wrote), as a fresh clone;
    stage_copy gives it a git index (test_file_list_follows_the_tree reads `git ls-files`)."""
    src = tmp_path_factory.mktemp("clone")
    files = project_files(REPO)
    if files is None:
        pytest.skip("not a git checkout")
    for name in sorted(files):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    return src


def stage_copy(clone: Path, dest: Path, leave_out: str = "", add_stage: bool = True) -> Path:
    shutil.copytree(clone, dest)
    if add_stage:
        add_noop_stage(dest, leave_out)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    return dest


CHECKS = ["tests/test_layout.py",
          "tests/test_config.py::test_every_params_key_has_its_help_in_the_comment_block_above_it",
          "tests/test_config.py::test_config_command_explains_every_key_as_yaml",
          "tests/test_config.py::test_repo_params_load_and_match_dataclass_defaults",
          "tests/test_infra.py::test_prefect_yaml_pools_images_and_gpu_requests_agree",
          "tests/test_infra.py::test_stage_placement_dvc_stages_and_stage_deployments_agree"]
# The files the walk-through touches; every other file is derived from them or left as it was.
STAGE_FILES = ["components/common/params.py", "components/noop.py", "docs/files.md", "dvc.yaml", "infra/prefect.yaml",
               "params.yaml"]


def pytest_in(root: Path, *args: str) -> subprocess.CompletedProcess:
    return sh([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *args], root)


def changed(root: Path) -> list[str]:
    """The files that differ from git's index, new ones included."""
    edited = sh(["git", "diff", "--name-only"], root, check=True).stdout.split()
    return sorted(edited + sh(["git", "ls-files", "--others", "--exclude-standard"], root, check=True).stdout.split())


def test_adding_a_stage_as_the_guide_says(clone, tmp_path):
    root = stage_copy(clone, tmp_path / "repo", add_stage=False)
    add_noop_stage(root)
    assert changed(root) == STAGE_FILES
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    res = pytest_in(root, *CHECKS)
    assert res.returncode == 0, res.stdout[-3000:]
    ran = sh([sys.executable, "-m", "components.noop"], root)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (root / "reports" / "noop.json").is_file()
    described = sh([sys.executable, "-m", "pipelines.params.config"], root, check=True).stdout
    assert "noop:\n  # The noop stage's output.\n  output_file: reports/noop.json" in described


PARAM_CHECKS = ["tests/test_config.py::test_repo_params_load_and_match_dataclass_defaults",
                "tests/test_config.py::test_every_params_key_has_its_help_in_the_comment_block_above_it",
                "tests/test_config.py::test_config_command_explains_every_key_as_yaml", "tests/test_layout.py"]


def add_param(root: Path, leave_out: str = "") -> list[str]:
    """The guide's two steps for a key `grpo.noop_knob`: the field, and params.yaml's key with its help.
    Returns the files that changed (git's view)."""
    if leave_out != "field":
        edit(root / "components" / "common" / "params.py", "@dataclass\nclass GRPOParams:\n",
             "@dataclass\nclass GRPOParams:\n    noop_knob: int = _f(3, ge=0)\n")
    help_line = "" if leave_out == "help" else "  # How many noops per step (a throwaway key).\n"
    value = "4" if leave_out == "default" else "3"
    edit(root / "params.yaml", "\ngrpo:\n", f"\ngrpo:\n{help_line}  noop_knob: {value}\n")
    return sorted(sh(["git", "diff", "--name-only"], root, check=True).stdout.split())  # against the index


def test_adding_a_param_takes_the_two_steps_the_guide_names(clone, tmp_path):
    assert "## Adding a param" in GUIDE
    root = stage_copy(clone, tmp_path / "repo", add_stage=False)
    assert add_param(root) == ["components/common/params.py", "params.yaml"]
    res = pytest_in(root, *PARAM_CHECKS)
    assert res.returncode == 0, res.stdout[-3000:]
    described = sh([sys.executable, "-m", "pipelines.params.config"], root, check=True).stdout
    assert "  # How many noops per step (a throwaway key).\n  noop_knob: 3\n" in described


@pytest.mark.parametrize("guide, step, test", [
    ("stage", "deps", "tests/test_layout.py::test_dvc_deps_list_every_module_the_stage_imports"),
    ("stage", "help", "tests/test_config.py::test_every_params_key_has_its_help_in_the_comment_block_above_it"),
    ("stage", "resources", "tests/test_infra.py::test_prefect_yaml_pools_images_and_gpu_requests_agree"),
    ("stage", "files", "tests/test_layout.py::test_file_list_follows_the_tree"),
    ("param", "help", "tests/test_config.py::test_every_params_key_has_its_help_in_the_comment_block_above_it"),
    ("param", "default", "tests/test_config.py::test_repo_params_load_and_match_dataclass_defaults"),
    ("param", "field", "tests/test_config.py::test_every_params_key_has_its_help_in_the_comment_block_above_it"),
])
def test_a_step_left_out_fails_the_test_the_guide_names(clone, tmp_path, guide, step, test):
    assert test.split("::")[1] in GUIDE
    root = stage_copy(clone, tmp_path / "repo", leave_out=step, add_stage=guide == "stage")
    if guide == "param":
        add_param(root, leave_out=step)
    res = pytest_in(root, test)
    assert res.returncode == 1 and "failed" in res.stdout, res.stdout[-3000:]


def test_the_guides_name_files_and_tests_that_exist():
    start = GUIDE.index("## Adding a stage")
    text = GUIDE[start:]
    for path in set(re.findall(r"`((?:components|pipelines|tests|presets|benchmarks|infra|docs)/[\w./]+)`", text)):
        if "NAME" not in path:
            assert (REPO / path).exists(), path
    names = set(re.findall(r"`(test_\w+)`", text))
    defined = {m for f in (REPO / "tests").rglob("test_*.py")
               for m in re.findall(r"^def (test_\w+)", f.read_text(), re.M)}
    assert names and names <= defined, sorted(names - defined)
    for section in ("## Adding a stage", "## Adding a param", "## Adding a reward", "## Adding a preset"):
        assert section in GUIDE


def test_the_slow_tier_shares_its_scenarios_out_longest_first():
    """`make test-slow` runs on pytest-xdist workers and hands the SmolLM2 scenario, its longest, out first:
    left to its place in the alphabet it started last and ran alone while the other worker idled."""
    make = (REPO / "Makefile").read_text()
    recipe = make[make.index("\ntest-slow:"):].split("\n\n")[0]
    assert "-n $(TEST_WORKERS)" in recipe, recipe
    res = pytest_in(REPO, "--collect-only", "-m", "slow", "tests/slow")  # prints the node ids in run order
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    items = [line for line in res.stdout.splitlines() if "::" in line]
    assert len(items) > 20 and items[0].startswith("tests/slow/test_real_model.py::"), items[:3]
    rest = [node.split("::")[0] for node in items[1:]]
    assert rest == sorted(rest), "the other scenarios keep their collection order"
