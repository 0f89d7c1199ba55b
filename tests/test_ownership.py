"""Nothing deletes or overwrites a folder grpoflow did not make: `grpoflow stage --workdir` removes only
the working copy it made, `grpoflow export` replaces only a folder holding its own earlier export."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipelines.registry.export import EXPORT_MARKER


def grpoflow(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=os.environ, timeout=300)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("error: ")]


def test_stage_refuses_a_workdir_holding_the_users_files_and_leaves_them(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("data: {}\n")
    workdir = tmp_path / "mine"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("the user's")
    proc = grpoflow(tmp_path, "stage", "data", "--commit", "HEAD", "--params-file", str(params), "--remote",
                    str(tmp_path / "remote"), "--parent-run-id", "x", "--workdir", str(workdir))
    assert proc.returncode == 2
    assert error_lines(proc) == [f"error: {workdir} is not empty; give a new folder"]
    assert (workdir / "notes.txt").read_text() == "the user's"


def test_a_stage_workdir_goes_only_when_the_stage_made_it(tmp_path):
    """The working copy goes in a folder made inside --workdir and only that goes afterwards (then
    --workdir too, when it was made here and nothing else is in it); a file the user puts in --workdir
    while the stage runs stays, in a folder they gave or one made here; a file as --workdir is refused."""
    from components.common.errors import GrpoflowError
    from pipelines.execution.gitrepo import own_workdir

    for given in (tmp_path / "given", tmp_path / "made-here"):
        if given.name == "given":
            given.mkdir()
        with own_workdir(given, "s-", keep=False) as work:
            (work / "sub").mkdir(parents=True)
            (work / "sub" / "f").write_text("x")
            (given / "notes.txt").write_text("the user's, written while the stage runs")
        assert [p.name for p in given.iterdir()] == ["notes.txt"], given
        assert (given / "notes.txt").read_text() == "the user's, written while the stage runs"

    made = tmp_path / "new" / "copy"
    with own_workdir(made, "s-", keep=False) as work:
        assert work == made / "s" and made.is_dir()
        assert work.is_dir() and not any(work.iterdir())  # made here, exclusively, for git clone to fill
        (work / "cloned.txt").write_text("x")
    assert not made.exists() and (tmp_path / "new").is_dir()

    with own_workdir(None, "s-", keep=False) as work:
        temporary = work
        assert not work.exists()  # git clone makes it
        work.mkdir()
    assert not temporary.exists()

    with own_workdir(made, "s-", keep=True) as work:
        assert work.is_dir()
        (work / "kept.txt").write_text("x")
    assert (made / "s" / "kept.txt").is_file()

    (tmp_path / "a-file").write_text("the user's")
    for path in (tmp_path / "a-file", made):
        try:
            with own_workdir(path, "s-", keep=False):
                raise AssertionError("entered")
        except GrpoflowError as exc:
            assert str(path) in str(exc)
    assert (tmp_path / "a-file").read_text() == "the user's" and (made / "s" / "kept.txt").is_file()


def test_export_replaces_its_own_export_and_refuses_another_models_folder(tmp_path):
    """Another model's folder with the very file names an export writes is left as it was (exit 2, one
    line); an earlier export (its marker) is replaced."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (model / name).write_text(f"ours: {name}")
    other = tmp_path / "other"
    other.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (other / name).write_text(f"another model's {name}")

    proc = grpoflow(tmp_path, "export", str(model), str(other))
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1 and str(other) in lines[0] and EXPORT_MARKER in lines[0], proc.stderr
    assert sorted(p.name for p in other.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (other / "config.json").read_text() == "another model's config.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "other"]  # no temporary folder left

    out = tmp_path / "export"
    for _ in range(2):  # a new folder, then the export it holds
        proc = grpoflow(tmp_path, "export", str(model), str(out))
        assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted([EXPORT_MARKER, "config.json", "model.safetensors",
                                                            "tokenizer.json"])


def test_make_clean_removes_only_a_venv_make_created(tmp_path):
    import shutil

    from tests.project_repo import REPO

    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("the user's own venv")
    proc = subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert ".venv left in place: make did not create it" in proc.stdout
    assert (tmp_path / ".venv" / "bin" / "python").is_file()
    (tmp_path / ".venv" / ".grpoflow-made").touch()  # what the venv target writes when it creates .venv
    assert subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, timeout=60).returncode == 0
    assert not (tmp_path / ".venv").exists()


def test_the_make_clean_test_leaves_the_venv_of_an_outer_make_alone(tmp_path):
    """`make test VENV=DIR` passes VENV=DIR down through MAKEFLAGS; the make clean test above ran in it
    and removed DIR, a venv make had made (found when `make test VENV=...` lost its venv mid-run)."""
    import sys

    from tests.project_repo import REPO

    outer = tmp_path / "outer-venv"
    outer.mkdir()
    (outer / ".grpoflow-made").touch()
    (tmp_path / "Makefile").write_text(
        f"run:\n\t{sys.executable} -m pytest -q -p no:cacheprovider -n 0 "
        f"{REPO}/tests/test_ownership.py::test_make_clean_removes_only_a_venv_make_created\n")
    proc = subprocess.run(["make", "run", f"VENV={outer}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert (outer / ".grpoflow-made").is_file(), "the outer make's VENV was removed"


def test_benchmarks_keep_no_folder_holding_files_they_did_not_make(tmp_path):
    from tests.project_repo import REPO

    (tmp_path / "params.yaml").write_text("the user's params")
    for script in ("grpo_gain.py", "grpo_step.py"):
        proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--keep", str(tmp_path)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and f"--keep {tmp_path} is not empty" in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
    assert (tmp_path / "params.yaml").read_text() == "the user's params"
