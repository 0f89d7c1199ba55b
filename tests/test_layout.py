"""The code's layout, as DESIGN.md and docs/files.md describe it: no import cycle, nothing imports the CLI,
shared pieces never import a stage, small modules, and dvc.yaml deps that list every project
module a stage runs (a change to any of them must re-run the stage)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("components", "pipelines")
STAGES = list(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])
MAX_LINES = 400
FLOW_MAX_LINES = 250
FIELD_TABLES = {"components/config.py"}  # typed params: one dataclass field per key


def modules() -> dict[str, Path]:
    files = [p for d in PACKAGES for p in (REPO / d).rglob("*.py")]
    return {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p for p in files}


def imports(path: Path, known: set[str]) -> set[str]:
    """Project modules `path` imports anywhere (module level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        out |= {n for n in names if n in known}
    return out


MODULES = modules()
GRAPH = {m: imports(p, set(MODULES)) - {m} for m, p in MODULES.items()}


def closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += GRAPH[m]
    return seen


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(u: str, path: list[str]) -> list[str] | None:
        state[u] = 1
        path.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return path[path.index(v):] + [v]
            if not state.get(v) and (found := visit(v, path)):
                return found
        path.pop()
        state[u] = 2
        return None

    for m in sorted(graph):
        if not state.get(m) and (found := visit(m, [])):
            return found
    return None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    assert find_cycle(GRAPH) is None


def test_nothing_imports_the_cli():
    assert [m for m, deps in GRAPH.items() if "pipelines.cli" in deps] == []


def test_components_never_import_pipelines():
    assert [m for m, deps in GRAPH.items() if m.startswith("components") and any(d.startswith("pipelines") for d in deps)] == []


def test_shared_pieces_never_import_a_stage():
    stages = {f"components.{s}" for s in STAGES}
    shared = [m for m in GRAPH if m.startswith("components.") and m not in stages]
    offenders = {m: sorted(GRAPH[m] & stages) for m in shared if GRAPH[m] & stages}
    assert offenders == {}


def test_every_stage_has_a_module_named_after_it_and_its_params_section():
    from components.config import SECTIONS

    for stage in STAGES:
        assert (REPO / "components" / f"{stage}.py").is_file(), stage
        assert stage in SECTIONS, stage
        cmd = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]["cmd"]
        assert cmd == f"python -m components.{stage}"


def test_modules_are_small():
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in MODULES.values()}
    big = {f: n for f, n in sizes.items() if n > MAX_LINES and f not in FIELD_TABLES}
    assert big == {}
    assert sizes["pipelines/training.py"] < FLOW_MAX_LINES


@pytest.mark.parametrize("stage", STAGES)
def test_dvc_deps_list_every_module_the_stage_imports(stage):
    entry = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]
    deps = {d for d in entry["deps"] if isinstance(d, str)}
    needed = {
        str(MODULES[m].relative_to(REPO)) for m in closure(f"components.{stage}") if m not in PACKAGES
    }
    assert sorted(needed - deps) == []
    declared_code = {d for d in deps if d.endswith(".py")}
    assert sorted(declared_code - needed) == []  # no stale entries either


@pytest.mark.parametrize("stage", STAGES)
def test_run_cache_is_on_for_every_stage(stage):
    """DVC skips its run cache for a stage with a `cache: false` output that is not a metric or a
    plot (dvc/stage run: no_cache_outs), so a clone could not restore it (regression: the sft,
    grpo and evaluate stages ran again in a second clone)."""
    entry = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]
    for out in entry.get("outs", []):
        options = next(iter(out.values())) if isinstance(out, dict) else {}
        assert options.get("cache", True), f"{stage}: {out} is uncached: declare it under metrics or plots"
        assert not options.get("persist"), f"{stage}: {out} is persist (DVC's run cache ignores the stage)"


def test_file_list_follows_the_tree():
    """docs/files.md (linked from the README) names every tracked file once (and nothing that is gone)."""
    import re
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    section = (REPO / "docs" / "files.md").read_text()
    assert "docs/files.md" in (REPO / "README.md").read_text()
    listed = []
    for line in section.splitlines():
        if line.startswith("- "):
            head = line.split(" — ", 1)[0]
            listed += re.findall(r"`([^`]+)`", head)
    files = set(tracked.stdout.split())
    assert len(listed) == len(set(listed))
    assert sorted(files - set(listed)) == []
    assert sorted(set(listed) - files) == []


def test_no_module_shadows_the_standard_library():
    """components/vllm_worker.py runs as a script, so components/ is first on its sys.path: a module
    there named like a standard-library one (a stage called `select`) replaced it for every import in
    that process (subprocess imports `select`), and vLLM generation fell back to transformers."""
    import sys

    for folder in ("components", "pipelines", "benchmarks"):
        clash = sorted(p.stem for p in (REPO / folder).glob("*.py") if p.stem in sys.stdlib_module_names)
        assert clash == [], f"{folder}/: {clash} shadow standard-library modules"
