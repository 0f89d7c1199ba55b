"""The code's layout, as docs/files.md describes it: no import cycle, nothing imports the CLI,
shared pieces never import a stage, small modules, dvc.yaml deps equal to the project modules a
stage imports (a change to any of them must re-run the stage, and nothing else does), and the
table of which stages a change to a module re-runs (RERUNS)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("components", "pipelines")
STAGES = list(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])
MAX_LINES = 400
FLOW_MAX_LINES = 250
SUBPACKAGES = ("common", "problems", "models", "training", "evaluation")  # components/ by concern


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


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


def test_no_module_imports_itself_through_a_cycle():
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


# The layers, bottom up: a module imports only from its own layer or the ones below it.
LAYERS = (
    ("components.common",),
    ("components.problems", "components.models"),
    ("components.training", "components.evaluation"),
    tuple(f"components.{s}" for s in STAGES),
    ("pipelines",),
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
    assert layer("components.grpo") == 3 and layer("pipelines.flow.run") == 4
    assert upward_imports({"components.common.params_rules": {"components.problems.bands"}}) == [
        "components.common.params_rules -> components.problems.bands"]
    assert upward_imports({"components.problems.bands": {"components.common.errors"}}) == []


def test_imports_run_down_the_layers():
    """common < problems, models < training, evaluation < the six stages < pipelines < benchmarks."""
    bench = {f"benchmarks.{p.stem}": imports(p, set(MODULES) | {f"benchmarks.{q.stem}" for q in (REPO / "benchmarks").glob("*.py")})
             for p in (REPO / "benchmarks").glob("*.py")}
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
    deps = {d for e in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].values() for d in e["deps"]
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


# The one deliberate exception (dvc.yaml's header says why): the selection stage samples with the
# evaluation engine, which stays evaluate's dep alone.
NOT_DEPS = {"selection": {"components/evaluation/generation.py", "components/evaluation/vllm_backend.py",
                          "components/evaluation/vllm_worker.py", "components/models/batching.py"}}


@pytest.mark.parametrize("stage", STAGES)
def test_dvc_deps_list_every_module_the_stage_imports(stage):
    entry = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]
    deps = {d for d in entry["deps"] if isinstance(d, str)}
    needed = {
        str(MODULES[m].relative_to(REPO)) for m in closure(f"components.{stage}") if not is_package(m)
    } - NOT_DEPS.get(stage, set())
    assert NOT_DEPS.get(stage, set()) <= {str(MODULES[m].relative_to(REPO)) for m in closure(f"components.{stage}")}
    assert sorted(needed - deps) == []
    declared_code = {d for d in deps if d.endswith(".py")}
    assert sorted(declared_code - needed) == []  # no stale entries either


# Which stages a change to a module re-runs (DVC marks a stage changed when one of its deps does);
# a change that alters a stage's outputs re-runs the stages after it in turn, through their inputs.
RERUNS = {
    # shared by every stage (a change here re-runs the whole pipeline)
    "components/common/entry.py": {"data", "model", "sft", "selection", "grpo", "evaluate"},
    "components/common/errors.py": {"data", "model", "sft", "selection", "grpo", "evaluate"},
    "components/common/files.py": {"data", "model", "sft", "selection", "grpo", "evaluate"},
    "components/common/params.py": {"data", "model", "sft", "selection", "grpo", "evaluate"},
    "components/common/params_load.py": {"data", "model", "sft", "selection", "grpo", "evaluate"},
    "components/common/params_rules.py": {"data", "model", "sft", "selection", "grpo", "evaluate"},
    "components/common/path_safety.py": {"data", "model", "sft", "selection", "grpo", "evaluate"},
    "components/common/tracking.py": {"data", "model", "sft", "selection", "grpo", "evaluate"},
    "components/problems/answers.py": {"data", "model", "sft", "selection", "grpo", "evaluate"},
    "components/problems/bands.py": {"data", "grpo", "evaluate"},
    "components/problems/arithmetic.py": {"evaluate"},
    "components/problems/gsm8k.py": {"data", "model", "sft", "selection", "grpo", "evaluate"},
    "components/problems/sources.py": {"data", "model", "sft", "selection", "grpo", "evaluate"},
    # model folders: every stage that reads or writes one
    "components/models/modelio.py": {"model", "sft", "selection", "grpo", "evaluate"},
    "components/models/adapters.py": {"sft", "selection", "grpo", "evaluate"},  # LoRA runs write and read adapters
    "components/models/resolve.py": {"selection", "evaluate"},  # the readers' model specs
    "components/models/batching.py": {"sft", "grpo", "evaluate"},  # generate on a model in memory
    # one concern, one or two stages
    "components/training/finetune.py": {"sft", "grpo"},
    "components/training/precision.py": {"sft", "grpo"},
    "components/training/job.py": {"sft", "grpo"},
    "components/training/train_samples.py": {"sft", "grpo"},
    "components/training/dev_accuracy.py": {"sft", "grpo"},
    "components/evaluation/metrics.py": {"evaluate"},
    "components/data.py": {"data"},
    "components/evaluate.py": {"evaluate"},
    "components/evaluation/endpoint.py": {"evaluate"},
    "components/evaluation/generation.py": {"evaluate"},
    "components/evaluation/lm_eval_gsm8k.py": {"evaluate"},
    "components/evaluation/reports.py": {"evaluate"},
    "components/evaluation/scoring.py": {"evaluate"},
    "components/evaluation/stats.py": {"evaluate"},
    "components/evaluation/vllm_backend.py": {"evaluate"},
    "components/evaluation/vllm_worker.py": {"evaluate"},
    "components/grpo.py": {"grpo"},
    "components/model.py": {"model"},
    "components/models/gguf_import.py": {"model"},
    "components/problems/synthetic.py": {"data"},
    "components/selection.py": {"selection"},
    "components/sft.py": {"sft"},
    "components/training/rewards.py": {"grpo"},
    "components/training/signal_monitor.py": {"grpo"},
    "components/training/rollouts.py": {"grpo"},
    "components/training/informative.py": {"grpo"},
    "components/training/grpo_trainer.py": {"grpo"},
    "components/training/logps.py": {"grpo"},
    "components/training/lean_passes.py": {"grpo", "sft"},
}


def test_the_rerun_table_covers_every_module_a_stage_imports():
    imported = {str(MODULES[m].relative_to(REPO)) for s in STAGES for m in closure(f"components.{s}") if not is_package(m)}
    assert sorted(imported ^ set(RERUNS)) == []


@pytest.mark.parametrize("module", sorted(RERUNS))
def test_a_module_change_reruns_only_the_stages_it_can_affect(module):
    """A comment added to `module` makes `dvc status` list exactly these stages (a reward tweak does
    not re-run data, model or SFT; evaluation code does not re-run training)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    listed = {name for name, entry in stages.items() if module in entry["deps"]}
    assert listed == RERUNS[module]


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


def test_file_list_follows_the_tree():
    """docs/files.md (linked from the README) names every tracked file once (and nothing that is gone)."""
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
    known = set(MODULES) | {f"benchmarks.{p.stem}" for p in (REPO / "benchmarks").glob("*.py")} | {"components.noop", "components.NAME"}  # the guides' placeholders
    found = {m for f in files if f.is_file() for m in MODULE_STRING.findall(f.read_text(errors="replace"))}
    assert len(found) > 10
    assert sorted(found - known) == []
