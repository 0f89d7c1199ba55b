"""Each stage's code deps in dvc.yaml, derived from its imports: `make deps` writes them.

    make deps                                          # = python -m pipelines.execution.stage_deps
    python -m pipelines.execution.stage_deps --check   # exit 1, naming the stages, where dvc.yaml differs

A stage's code deps are the module its command runs (`cmd: python -m components.<stage>`) and every
project module that module imports, directly or not, at module level or inside a function; package
`__init__.py` files aside (they hold a docstring only: tests/test_layout.py checks) and LEFT_OUT aside.
The command rewrites only the `- components/...py` lines of each stage's `deps:`, the stage's module
first and the others sorted, where the first of them stood; comments, data deps, params and every
other line of dvc.yaml stay byte for byte. A development tool, run by no stage and no flow:
tests/test_layout.py fails when dvc.yaml differs from what it writes, and reruns() answers the tests
that ask which stages a module change re-runs (DVC re-runs a stage when one of its deps changed).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import yaml

PACKAGES = ("components", "pipelines")
# The one deliberate exception (dvc.yaml's header says why): `selection` samples with the evaluation
# engine, the measuring instrument, which stays evaluate's dep alone; a change to it is re-measured by
# `evaluate`, and `dvc repro --force selection` re-samples.
LEFT_OUT = {"selection": {"components/evaluation/generation.py", "components/evaluation/vllm_backend.py",
                          "components/evaluation/vllm_worker.py", "components/models/batching.py"}}
CODE_DEP = re.compile(r"^( *)- ((?:components|pipelines)/[\w/]+\.py)( +#.*)?$")
STAGE_KEY = re.compile(r"^( +)([\w.-]+):")


def module_files(root: Path) -> dict[str, Path]:
    """{dotted module name: its file} of every module in the project's packages."""
    files = [p for d in PACKAGES for p in sorted((root / d).rglob("*.py"))]
    return {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p for p in files}


def imported(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports anywhere (module level or inside functions)."""
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


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the project modules it imports itself}."""
    return {m: imported(p, set(modules)) - {m} for m, p in modules.items()}


def closure(graph: dict[str, set[str]], module: str) -> set[str]:
    """`module` and every module it imports, directly or not."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph[m]
    return seen


def stage_modules(root: Path) -> dict[str, str]:
    """{stage: the project module its `cmd` runs with `python -m`} (stages whose cmd runs none are left out)."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    out = {}
    for stage, entry in stages.items():
        cmd = entry.get("cmd", "")
        found = re.search(r"-m\s+((?:components|pipelines)(?:\.\w+)+)", " ".join(cmd) if isinstance(cmd, list) else cmd)
        if found:
            out[stage] = found.group(1)
    return out


def code_deps(root: Path) -> dict[str, list[str]]:
    """{stage: its code deps}: its module's file, then those of the modules it imports, by path."""
    modules = module_files(root)
    graph = import_graph(modules)
    out = {}
    for stage, module in stage_modules(root).items():
        if module not in modules:
            raise ValueError(f"dvc.yaml: stage {stage} runs {module}, which is no module of {', '.join(PACKAGES)}/")
        files = {modules[m].relative_to(root).as_posix() for m in closure(graph, module)
                 if modules[m].name != "__init__.py"}
        stale = LEFT_OUT.get(stage, set()) - files
        if stale:
            raise ValueError(f"pipelines/execution/stage_deps.py: LEFT_OUT names modules stage {stage} no "
                             f"longer imports: {', '.join(sorted(stale))}; remove them there")
        own = modules[module].relative_to(root).as_posix()
        out[stage] = [own, *sorted(files - LEFT_OUT.get(stage, set()) - {own})]
    return out


def reruns(root: Path) -> dict[str, set[str]]:
    """{module file: the stages a change to it re-runs}, for every module some stage imports."""
    out: dict[str, set[str]] = {}
    for stage, files in code_deps(root).items():
        for f in files:
            out.setdefault(f, set()).add(stage)
    return out


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _stage_blocks(lines: list[str]) -> dict[str, tuple[int, int]]:
    """{stage: (its first line, the line after its last)} of the stages under the top-level `stages:`."""
    start = next(i for i, line in enumerate(lines) if line.rstrip() == "stages:") + 1
    end = next((i for i in range(start, len(lines)) if lines[i][:1] not in ("", " ", "\n", "#")), len(lines))
    keys = [(i, m) for i in range(start, end) if (m := STAGE_KEY.match(lines[i]))]
    starts = [(i, m.group(2)) for i, m in keys if len(m.group(1)) == len(keys[0][1].group(1))]
    return {name: (i, next_i) for (i, name), (next_i, _) in zip(starts, [*starts[1:], (end, "")], strict=True)}


def _with_deps(block: list[str], deps: list[str]) -> list[str]:
    """A stage's lines with its code dep lines replaced by `deps`, where the first of them stood (or first
    under `deps:`; a stage without `deps:` gets one after its `cmd:`)."""
    keys = [(i, m) for i, line in enumerate(block[1:], 1) if (m := STAGE_KEY.match(line))]
    indent = len(keys[0][1].group(1)) if keys else 4

    def key_end(at: int, comments_end: bool) -> int:  # the line after the key at `at` and what it holds
        for i in range(at + 1, len(block)):
            text = block[i].strip()
            if text and _indent(block[i]) <= indent and (comments_end or not text.startswith("#")):
                return i
        return len(block)

    at = next((i for i, m in keys if m.group(2) == "deps" and len(m.group(1)) == indent), None)
    if at is None:
        after = key_end(next((i for i, m in keys if m.group(2) == "cmd"), 0), comments_end=True)
        while after > 1 and not block[after - 1].strip():
            after -= 1
        return [*block[:after], f"{' ' * indent}deps:\n", *(f"{' ' * (indent + 2)}- {d}\n" for d in deps),
                *block[after:]]
    end = key_end(at, comments_end=False)
    body = block[at + 1:end]
    found = {i: m for i, line in enumerate(body) if (m := CODE_DEP.match(line.rstrip("\n")))}
    comments = {m.group(2): m.group(3) or "" for m in found.values()}  # a note on a dep line stays with it
    first = min(found, default=0)
    pad = found[first].group(1) if found else " " * (indent + 2)
    rest = [line for i, line in enumerate(body) if i not in found]
    new = [f"{pad}- {d}{comments.get(d, '')}\n" for d in deps]
    return [*block[:at + 1], *rest[:first], *new, *rest[first:], *block[end:]]


def render(text: str, deps: dict[str, list[str]]) -> str:
    """dvc.yaml's `text` with each stage of `deps` listing those code deps; every other line as it was."""
    lines = text.splitlines(keepends=True)
    blocks = _stage_blocks(lines)
    for stage in sorted(deps, key=lambda s: blocks[s][0], reverse=True):  # from the end: indices stay valid
        first, end = blocks[stage]
        lines[first:end] = _with_deps(lines[first:end], deps[stage])
    new = "".join(lines)
    _check_only_code_deps_changed(text, new, deps)
    return new


def _code(deps: list | None) -> list[str]:
    """The code deps among a stage's parsed `deps`."""
    return [d for d in deps or [] if isinstance(d, str) and CODE_DEP.match(f"- {d}")]


def _without_code_deps(dvc: dict) -> dict:
    for entry in dvc["stages"].values():
        entry["deps"] = [d for d in entry.get("deps") or [] if d not in _code([d])]
    return dvc


def _check_only_code_deps_changed(old: str, new: str, deps: dict[str, list[str]]) -> None:
    """The rewrite, parsed: the stages of `deps` list exactly those code deps, and nothing else changed."""
    try:
        after = yaml.safe_load(new)
        listed = {s: _code(after["stages"][s].get("deps")) for s in deps}
    except (yaml.YAMLError, AttributeError, KeyError, TypeError):
        after, listed = None, None
    if listed != deps or _without_code_deps(yaml.safe_load(old)) != _without_code_deps(after):
        raise ValueError("pipelines/execution/stage_deps.py would change more of dvc.yaml than its code deps "
                         "(a layout it does not know); nothing was written")


def differences(root: Path) -> list[str]:
    """What `make deps` would change in dvc.yaml, one line a stage ([] when nothing)."""
    text = (root / "dvc.yaml").read_text()
    want = code_deps(root)
    stages = yaml.safe_load(text)["stages"]
    out = []
    for stage, deps in want.items():
        have = _code(stages[stage].get("deps"))
        missing, extra = sorted(set(deps) - set(have)), sorted(set(have) - set(deps))
        words = [f"missing {', '.join(missing)}"] * bool(missing) + [f"not imported {', '.join(extra)}"] * bool(extra)
        if words:
            out.append(f"stage {stage}: {'; '.join(words)}")
    if not out and render(text, want) != text:
        out.append("the code deps are in another order or place than `make deps` writes them")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.execution.stage_deps",
                                     description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when dvc.yaml differs")
    args = parser.parse_args(argv)
    from components.common.files import repo_root, write_text

    root = repo_root()
    try:
        changes = differences(root)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not changes:
        print("dvc.yaml: every stage's code deps are its imports")
        return 0
    if args.check:
        print("\n".join(f"dvc.yaml: {line}" for line in changes) + "\nrun `make deps` to write them", file=sys.stderr)
        return 1
    path = root / "dvc.yaml"
    write_text(path, render(path.read_text(), code_deps(root)))
    print("\n".join(f"dvc.yaml: {line}" for line in changes) + "\ndvc.yaml: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
