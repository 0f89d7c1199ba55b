"""Every third-party module that components/ and pipelines/ import is declared in pyproject.toml
(a dependency, or an extra for a module only an extra's code path imports), so that a package
arriving today through Prefect, MLflow, DVC or transformers is not lost when they drop it."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("components", "pipelines")
# Modules imported only where their extra is installed: module -> extra.
EXTRA_ONLY = {"vllm": "vllm"}


def third_party_imports(files: list[Path]) -> dict[str, set[str]]:
    """Top-level third-party module -> the files importing it (module level or inside functions)."""
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in PACKAGES:
                    found.setdefault(top, set()).add(
                        str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name)
    return found


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: list[str]) -> set[str]:
    return {normalize(re.match(r"[A-Za-z0-9_.\-]+", r).group(0)) for r in requirements}


def undeclared(imports: dict[str, set[str]], declared: set[str], extras: dict[str, set[str]]) -> list[str]:
    """One line per imported module whose distribution is not declared."""
    dists = packages_distributions()
    problems = []
    for module, files in sorted(imports.items()):
        if module in EXTRA_ONLY:
            if normalize(EXTRA_ONLY[module]) not in extras.get(EXTRA_ONLY[module], set()):
                problems.append(f"{module}: not in the [{EXTRA_ONLY[module]}] extra")
            continue
        names = {normalize(d) for d in dists.get(module, [module])}
        if not names & declared:
            problems.append(f"{module} (distribution {' or '.join(sorted(names))}) "
                            f"imported by {', '.join(sorted(files))}")
    return problems


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_every_imported_third_party_module_is_declared():
    meta = project()
    files = [p for d in PACKAGES for p in (REPO / d).rglob("*.py")]
    extras = {k: requirement_names(v) for k, v in meta["optional-dependencies"].items()}
    problems = undeclared(third_party_imports(files), requirement_names(meta["dependencies"]), extras)
    assert not problems, "imported but not declared in pyproject.toml dependencies:\n" + "\n".join(problems)


def test_the_check_names_an_undeclared_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nimport yaml\nfrom tqdm.auto import tqdm\n\ndef f():\n    import pandas\n")
    imports = third_party_imports([module])
    assert set(imports) == {"yaml", "tqdm", "pandas"}
    problems = undeclared(imports, requirement_names(["pyyaml>=6", "tqdm>=4"]), {})
    assert problems == ["pandas (distribution pandas) imported by m.py"]
