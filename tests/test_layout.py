"""The code's layout, as docs/files.md describes it: no import cycle, nothing imports the CLI,
imports run down the layers (inside pipelines/ too), shared pieces never import a stage, small modules,
and dvc.yaml's code deps as `make deps` writes them from the imports (a change to any module a stage
imports must re-run the stage, and nothing else does)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from pipelines.execution import stage_deps
from pipelines.execution.stage_deps import PACKAGES, import_graph, imported, module_files
from tests.project_files import project_files

REPO = Path(__file__).resolve().parents[1]
STAGES = list(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])
MAX_LINES = 400
FLOW_MAX_LINES = 250
SUBPACKAGES = ("common", "problems", "models", "training", "evaluation")  # components/ by concern


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


MODULES = module_files(REPO)
GRAPH = import_graph(MODULES)


def closure(module: str) -> set[str]:
    return stage_deps.closure(GRAPH, module)


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


def test_no_module_imports_itself_through_a_cycle():
    assert find_cycle(GRAPH) is None


def test_nothing_imports_the_cli():
    assert [m for m, deps in GRAPH.items() if "pipelines.cli" in deps] == []


def test_components_never_import_pipelines():
    assert [m for m, deps in GRAPH.items()
            if m.startswith("components") and any(d.startswith("pipelines") for d in deps)] == []


def test_shared_pieces_never_import_a_stage():
    stages = {f"components.{s}" for s in STAGES}
    shared = [m for m in GRAPH if m.startswith("components.") and m not in stages]
    offenders = {m: sorted(GRAPH[m] & stages) for m in shared if GRAPH[m] & stages}
    assert offenders == {}


# The layers, bottom up: a module imports only from its own layer or the ones below it.
LAYERS = (
    ("components.common",),
    ("components.problems", "components.models"),
    ("components.training", "components.evaluation"),
    tuple(f"components.{s}" for s in STAGES),
    ("pipelines", "pipelines.handoff"),  # the hand-off types, at the bottom of pipelines/
    ("pipelines.params",),
    ("pipelines.execution",),
    ("pipelines.registry", "pipelines.evaluation"),
    ("pipelines.flow",),
    ("pipelines.cli",),
    ("benchmarks",),
)


def layer(module: str) -> int:
    """The layer of a module: the longest prefix of LAYERS it falls under (`components` itself: 0)."""
    best = (-1, 0)
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best[0]:
                best = (len(prefix), rank)
    return best[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if layer(d) > layer(m))


def test_the_layer_check_catches_an_upward_import():
    assert layer("components.common.params") == 0 and layer("components.problems.bands") == 1
    assert layer("components.grpo") == 3 and layer("pipelines.handoff") == 4 and layer("pipelines.flow.run") == 8
    assert layer("pipelines.registry.register") == layer("pipelines.evaluation.grading") == 7
    assert layer("pipelines.cli") == 9 and layer("benchmarks.grpo_gain") == 10
    assert upward_imports({"components.common.params_rules": {"components.problems.bands"}}) == [
        "components.common.params_rules -> components.problems.bands"]
    assert upward_imports({"components.problems.bands": {"components.common.errors"}}) == []
    assert upward_imports({"pipelines.execution.x": {"pipelines.flow.y", "pipelines.handoff"}}) == [
        "pipelines.execution.x -> pipelines.flow.y"]
    assert upward_imports({"pipelines.registry.x": {"pipelines.evaluation.y", "pipelines.execution.z"}}) == []


def test_imports_run_down_the_layers():
    """common < problems, models < training, evaluation < the six stages < pipelines < benchmarks; inside
    pipelines/: handoff < params < execution < registry, evaluation < flow < cli."""
    known = set(MODULES) | {f"benchmarks.{q.stem}" for q in (REPO / "benchmarks").glob("*.py")}
    bench = {f"benchmarks.{p.stem}": imported(p, known) for p in (REPO / "benchmarks").glob("*.py")}
    assert upward_imports({**GRAPH, **bench}) == []
    assert [m for m, deps in GRAPH.items() if any(d.startswith("benchmarks") for d in deps)] == []


def test_every_stage_has_a_module_named_after_it_and_its_params_section():
    from components.common.params import SECTIONS

    for stage in STAGES:
        assert (REPO / "components" / f"{stage}.py").is_file(), stage
        assert stage in SECTIONS, stage
        cmd = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]["cmd"]
        assert cmd == f"python -m components.{stage}"


def test_components_lists_the_stages_and_folders_by_concern():
    """`ls components/` reads as the pipeline: the six stage modules and the helpers' folders."""
    top = sorted(p.name for p in (REPO / "components").iterdir() if p.name != "__pycache__")
    assert top == sorted(["__init__.py", *(f"{s}.py" for s in STAGES), *SUBPACKAGES])


def test_package_inits_hold_a_docstring_only():
    """A package's __init__.py is imported with each of its modules but is no stage's dep, so it
    holds no code."""
    for module, path in MODULES.items():
        if is_package(module):
            body = ast.parse(path.read_text()).body
            assert len(body) == 1 and isinstance(body[0], ast.Expr), path


def test_every_component_module_is_some_stage_dep():
    """What runs in no stage belongs in pipelines/ (the flow, the CLI)."""
    deps = {d for e in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].values() for d in e.get("deps", [])
            if isinstance(d, str)}
    component_files = {str(p.relative_to(REPO)) for m, p in MODULES.items() if m.startswith("components.")
                       and not is_package(m)}
    assert sorted(component_files - deps) == []


def test_modules_are_small():
    """No module in components/, pipelines/ or benchmarks/ is over MAX_LINES lines."""
    files = [*MODULES.values(), *(REPO / "benchmarks").rglob("*.py")]
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in files}
    big = {f: n for f, n in sizes.items() if n > MAX_LINES}
    assert big == {}
    assert sizes["pipelines/flow/pipeline.py"] < FLOW_MAX_LINES


def test_dvc_deps_list_every_module_the_stage_imports():
    """Each stage's code deps in dvc.yaml are what `make deps` writes: the project modules the stage
    imports, directly or not (pipelines/execution/stage_deps.py), so a change to any of them re-runs it."""
    differences = stage_deps.differences(REPO)
    assert not differences, "dvc.yaml differs from its imports (run `make deps`): " + "; ".join(differences)


def test_a_change_reruns_only_the_stages_its_concern_serves():
    """Derived from the imports as DVC sees them through dvc.yaml: a reward edit re-runs grpo alone,
    evaluation code evaluate alone, training code the training stages only; the stages' shared entry point
    every stage."""
    reruns = stage_deps.reruns(REPO)
    assert reruns["components/training/rewards.py"] == {"grpo"}
    assert reruns["components/common/entry.py"] == set(STAGES)
    for module, stages in reruns.items():
        if module.startswith("components/evaluation/"):
            assert stages == {"evaluate"}, module
        if module.startswith("components/training/"):
            assert stages <= {"sft", "grpo"}, module


# The params code by concern: the schema (field declarations), value and cross-field rules, loading,
# path safety, the stage entry point, the flow-only `-S` writer and remote allow-list, the CLI.
PARAMS_SCHEMA = "components.common.params"
PARAMS_MODULES = ("components.common.params_rules", "components.common.params_load", "components.common.path_safety",
                  "components.common.entry", "pipelines.params.overrides", "pipelines.params.config")
FLOW_ONLY = ("pipelines.params.overrides", "pipelines.params.config")


def test_params_schema_holds_field_declarations_and_section_rules_only():
    """Classes with fields and their rules across keys (`check`; Params.to_dict aside); module-level
    functions are the private field helpers (`_f`, `_lora`, ...) that return a field."""
    tree = ast.parse(MODULES[PARAMS_SCHEMA].read_text())
    methods = [
        f"{c.name}.{f.name}" for c in tree.body if isinstance(c, ast.ClassDef)
        for f in c.body if isinstance(f, ast.FunctionDef)
    ]
    assert [m for m in methods if not m.endswith(".check")] == ["Params.to_dict"]
    helpers = [f for f in tree.body if isinstance(f, ast.FunctionDef)]
    assert all(f.name.startswith("_") for f in helpers), [f.name for f in helpers]
    for f in helpers:  # each returns a field: `return field(...)` or `return _f(...)`
        returns = [n for n in ast.walk(f) if isinstance(n, ast.Return)]
        assert returns and all(isinstance(r.value, ast.Call) and getattr(r.value.func, "id", "") in ("field", "_f")
                               for r in returns), f.name


def test_params_modules_are_under_250_lines():
    sizes = {m: len(MODULES[m].read_text().splitlines()) for m in PARAMS_MODULES}
    assert {m: n for m, n in sizes.items() if n >= 250} == {}


@pytest.mark.parametrize("stage", STAGES)
def test_flow_only_params_code_is_no_stage_dep(stage):
    """Neither the `-S` writer nor the remote allow-list, the help text or the params facade re-runs a
    stage (a help sentence edited leaves `dvc status` clean)."""
    assert sorted(closure(f"components.{stage}") & set(FLOW_ONLY)) == []


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


def check_file_list(root: Path) -> None:
    """docs/files.md (linked from the README) names every project file of the checkout at `root` once, and
    nothing that is gone; what a pipeline run wrote there, committed or not, is no project file
    (tests/project_files.py)."""
    files = project_files(root)
    if files is None:
        pytest.skip("not a git checkout")
    assert "docs/files.md" in (root / "README.md").read_text()
    listed = []
    for line in (root / "docs" / "files.md").read_text().splitlines():
        if line.startswith("- "):
            head = line.split(" — ", 1)[0]
            listed += re.findall(r"`([^`]+)`", head)
    assert len(listed) == len(set(listed))
    assert sorted(files - set(listed)) == []
    assert sorted(set(listed) - files) == []


def test_file_list_follows_the_tree():
    check_file_list(REPO)


def test_no_module_shadows_the_standard_library():
    """components/evaluation/vllm_worker.py runs as a script, so its folder is first on its sys.path: a module
    there named like a standard-library one (a stage called `select`) replaced it for every import in
    that process (subprocess imports `select`), and vLLM generation fell back to transformers."""
    import sys

    for folder in ("components", "pipelines", "benchmarks"):
        clash = sorted(p.stem for p in (REPO / folder).rglob("*.py") if p.stem in sys.stdlib_module_names)
        assert clash == [], f"{folder}/: {clash} shadow standard-library modules"


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_enters_the_same_way(stage):
    """One stage contract: `run(params)` (the whole stage, in its MLflow run) and
    `main = stage_main(STAGE, __doc__, run, argv)`; no second entry such as `run_tracked`."""
    tree = ast.parse(MODULES[f"components.{stage}"].read_text())
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    assert "run_tracked" not in functions
    run = functions["run"]
    assert [a.arg for a in run.args.args] == ["params"] and ast.unparse(run.args.args[0].annotation) == "Params"
    main = ast.unparse(functions["main"])
    assert "return stage_main(STAGE, __doc__, run, argv)" in main


# The per-stage contract: every stage module (and every command module's main) repeats these names
# for one job each.
SHARED_NAMES = {"run", "main", "trainer_settings", "fingerprint_settings"}


def test_no_two_public_functions_or_classes_share_a_name():
    """No two public functions or classes in components/ and pipelines/ share a name (it once had
    three `generate`, three `server_command` and two `build_prompts`, each a different job)."""
    seen: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                seen.setdefault(node.name, []).append(module)
    assert {n: ms for n, ms in seen.items() if len(ms) > 1 and n not in SHARED_NAMES} == {}


MODULE_STRING = re.compile(r"""(?:-m\s+|"-m",\s*")((?:components|pipelines|benchmarks)(?:\.\w+)+)""")


def test_every_entrypoint_and_module_string_resolves():
    """infra/prefect.yaml's `path.py:function` entrypoints name a file that defines the function, and every
    `-m package.module` written in the code, the docs, dvc.yaml, the Makefile and infra/ names a module
    that exists (a moved module leaves none behind: the reorganisation of pipelines/ by concern)."""
    deployments = yaml.safe_load((REPO / "infra" / "prefect.yaml").read_text())["deployments"]
    for d in deployments:
        path, func = d["entrypoint"].split(":")
        tree = ast.parse((REPO / path).read_text())
        assert func in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, d["entrypoint"]
    files = [*REPO.glob("*.md"), *REPO.glob("docs/*.md"), REPO / "dvc.yaml", REPO / "Makefile", *REPO.glob("infra/*"),
             *(p for d in (*PACKAGES, "benchmarks", "tests") for p in (REPO / d).rglob("*.py"))]
    known = (set(MODULES) | {f"benchmarks.{p.stem}" for p in (REPO / "benchmarks").glob("*.py")}
             | {"components.noop", "components.NAME"})  # the guides' placeholders
    found = {m for f in files if f.is_file() for m in MODULE_STRING.findall(f.read_text(errors="replace"))}
    assert len(found) > 10
    assert sorted(found - known) == []
