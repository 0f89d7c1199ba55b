"""Every command the docs show is checked: README.md and docs/*.md, their fenced shell blocks and their
inline `-S` overrides. A `grpoflow` line parses with the real CLI parser (and its subcommand answers
--help), a `make` target and its variables exist in the Makefile, `-S` overrides load as params, a
`dvc` line parses with DVC's own parser, `python -m` modules and scripts exist, and repository paths a
command names are tracked. Links between the pages resolve, and the README stays one screen long.
(Commands that need services run for real elsewhere: tests/test_infra.py, tests/slow/.)

    pytest -q tests/test_docs.py
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.project_files import project_files

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250
SHELLS = ("bash", "sh", "shell", "console")
SEPARATORS = {"&&", "||", ";", "|", "&"}
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
REPO_PATH = re.compile(r"^(benchmarks|components|infra|pipelines|requirements|tests)/[\w./-]+$")
CREATED_BY_THE_COMMAND = {"infra/.env"}  # `cp infra/.env.example infra/.env`


def shell_lines(text: str) -> list[str]:
    """The command lines of the fenced shell blocks: continuations joined, comments kept for shlex.

    >>> shell_lines("x\\n```bash\\na \\\\\\n  b   # c\\n\\nd\\n```\\n```python\\ne\\n```")
    ['a b   # c', 'd']
    """
    lines, inside, pending = [], False, ""
    for line in text.splitlines():
        fence = line.strip().startswith("```")
        if fence:
            inside = not inside and line.strip()[3:].strip() in SHELLS
            continue
        if not inside:
            continue
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        if line:
            lines.append(line)
    return lines


def commands(line: str) -> list[list[str]]:
    """argv of each command on a line (split at && ; | &), leading VAR=value assignments dropped.

    >>> commands("A=1 make demo TORCH_SPEC=x && dvc push   # note")
    [['make', 'demo', 'TORCH_SPEC=x'], ['dvc', 'push']]
    """
    out, argv = [], []
    for token in [*shlex.split(line, comments=True), ";"]:
        if token in SEPARATORS:
            while argv and ENV_ASSIGNMENT.match(argv[0]):
                argv.pop(0)
            if argv:
                out.append(argv)
            argv = []
        else:
            argv.append(token)
    return out


def overrides(argv: list[str]) -> list[str]:
    """The values of every `-S` in argv.

    >>> overrides(["grpoflow", "run", "-S", "grpo.trainer.beta=0.0", "-S", "data.seed=7"])
    ['grpo.trainer.beta=0.0', 'data.seed=7']
    """
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-S"]


def shown() -> list[tuple[str, list[str]]]:
    return [(p.name, argv) for p in PAGES for line in shell_lines(p.read_text()) for argv in commands(line)]


COMMANDS = shown()


def ids(rows) -> list[str]:
    return [f"{page}: {' '.join(argv)[:70]}" for page, argv in rows]


def program(argv: list[str]) -> str:
    return Path(argv[0]).name


def test_the_docs_show_commands():
    assert len(COMMANDS) > 50
    assert {"grpoflow", "make", "dvc", "python"} <= {program(a) for _, a in COMMANDS}


GRPOFLOW = [(page, argv) for page, argv in COMMANDS if program(argv) == "grpoflow"]


@pytest.mark.parametrize("page, argv", GRPOFLOW, ids=ids(GRPOFLOW))
def test_grpoflow_lines_parse(page, argv):
    from pipelines.cli import build_parser

    try:
        args = build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"{page}: `{' '.join(argv)}` does not parse (exit {exc.code})")
    assert args.command == argv[1]


def test_every_subcommand_is_shown_and_answers_help():
    from pipelines.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    used = {argv[1] for _, argv in GRPOFLOW}
    assert sorted(set(sub.choices) - used) == []  # every subcommand has an example in the docs
    for command in sorted(used):
        out = subprocess.run(
            [sys.executable, "-m", "pipelines.cli", command, "--help"], cwd=REPO, capture_output=True, text=True
        )
        assert out.returncode == 0 and f"grpoflow {command}" in out.stdout, (command, out.stderr)


def makefile() -> tuple[set[str], set[str]]:
    text = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+)\s*:(?!=)", text, re.M))
    variables = set(re.findall(r"^([A-Z_]+)\s*[?:]?=", text, re.M))
    return targets, variables


MAKE = [(page, argv) for page, argv in COMMANDS if program(argv) == "make"]


@pytest.mark.parametrize("page, argv", MAKE, ids=ids(MAKE))
def test_make_targets_exist(page, argv):
    targets, variables = makefile()
    names = [a for a in argv[1:] if "=" not in a]
    assigned = [a.split("=", 1)[0] for a in argv[1:] if "=" in a]
    assert names and sorted(set(names) - targets) == [], page
    assert sorted(set(assigned) - variables) == [], page


def test_the_readme_test_command_is_ci_s():
    """The README's test command is the one .ci/run runs first, then the slow tier; the Makefile's recipes
    run the two tiers of the suite, split on the `slow` marker, printing the slowest tests."""
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith("make ")]
    readme = [argv for line in shell_lines(README.read_text()) for argv in commands(line) if argv[0] == "make"]
    assert ci[:2] == ["make test", "make test-slow"] and ["make", "test"] in readme and ["make", "demo"] in readme
    makefile_text = (REPO / "Makefile").read_text()
    for target, marker in (("test", '-m "not slow"'), ("test-slow", "-m slow")):
        recipe = re.search(rf"^{target}:.*\n\t(.+)$", makefile_text, re.M).group(1)
        assert "pytest" in recipe and marker in recipe and "--durations" in recipe and recipe.endswith(" tests")


OVERRIDDEN = [(page, argv) for page, argv in COMMANDS if overrides(argv)]


@pytest.mark.parametrize("page, argv", OVERRIDDEN, ids=ids(OVERRIDDEN))
def test_overrides_in_commands_load(page, argv):
    from pipelines.params.config import load_params

    if argv[1:2] == ["sweep"]:  # `-S key=a,b,c` is a grid there: read as `grpoflow sweep` reads it
        from pipelines.params.sweep_spec import read_spec

        read_spec(None, overrides(argv), REPO / "params.yaml")
        return
    load_params(None, overrides(argv))  # raises ConfigError naming the key


INLINE_OVERRIDE = re.compile(r'`[^`\n]*?-S "?([a-z_]+\.[\w.]+=[^`"\s]*)"?[^`\n]*`')


def test_inline_overrides_load():
    """`-S key=value` in the prose (inline code) names a real params key with a valid value."""
    from components.common.errors import ConfigError
    from pipelines.params.config import load_params

    found = [(p.name, m) for p in PAGES for m in INLINE_OVERRIDE.findall(p.read_text())]
    assert len(found) >= 8
    for page, text in found:
        try:
            load_params(None, [text])
        except ConfigError as exc:
            pytest.fail(f"{page}: -S {text}: {exc}")


DVC = [(page, argv) for page, argv in COMMANDS if program(argv) == "dvc"]


@pytest.mark.parametrize("page, argv", DVC, ids=ids(DVC))
def test_dvc_lines_parse(page, argv):
    from dvc.cli.parser import get_main_parser

    try:
        get_main_parser().parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"{page}: `{' '.join(argv)}` does not parse (exit {exc.code})")


def modules_and_scripts(argv: list[str]) -> tuple[list[str], list[str]]:
    runs_python = program(argv).startswith("python") or argv[:2] == ["accelerate", "launch"]
    modules = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m" and runs_python][:1]  # later -m: the module's
    scripts = [argv[1]] if program(argv).startswith("python") and len(argv) > 1 and argv[1].endswith(".py") else []
    return modules, scripts


def test_modules_scripts_and_paths_exist():
    tracked = project_files(REPO) or set()  # not a run's outputs, committed or not
    missing = []
    for page, argv in COMMANDS:
        modules, scripts = modules_and_scripts(argv)
        missing += [(page, m) for m in modules if importlib.util.find_spec(m) is None]
        paths = scripts + [a for a in argv if REPO_PATH.match(a)]
        missing += [(page, p) for p in paths if p not in CREATED_BY_THE_COMMAND and not (REPO / p).exists()]
        if tracked:
            missing += [(page, p) for p in paths if (REPO / p).is_file() and p not in tracked]
    assert missing == []


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_links_resolve_and_every_page_is_linked_from_the_readme():
    broken = [
        (p.name, target) for p in PAGES for target in LINK.findall(p.read_text())
        if "://" not in target and not (p.parent / target).exists()
    ]
    assert broken == []
    linked = {(REPO / t).resolve() for t in LINK.findall(README.read_text()) if "://" not in t}
    assert sorted(p.name for p in PAGES[1:] if p.resolve() not in linked) == []


def test_readme_fits_one_screen():
    assert len(README.read_text().splitlines()) < README_MAX_LINES


def test_the_rerun_claim_of_grpo_keys_follows_dvc_yaml():
    """docs/pipeline.md names the grpo keys that also re-run selection and evaluate (it once said a
    grpo change re-ran grpo and evaluate only)."""
    import yaml

    text = " ".join((REPO / "docs" / "pipeline.md").read_text().split())
    claim = text[text.index("Changing a `grpo.*` param"):]
    claim = claim[:claim.index("A run with nothing changed")]
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    grpo_keys = {s: {p for p in e.get("params", []) if isinstance(p, str) and p.startswith("grpo.")}
                 for s, e in stages.items()}
    assert set(re.findall(r"`(grpo\.[\w.]+)`", claim)) == grpo_keys["selection"] | grpo_keys["evaluate"]
    assert grpo_keys["evaluate"] == {"grpo.trainer.temperature"}
    assert "`evaluate` also reads `grpo.trainer.temperature`" in claim
    assert [s for s, e in stages.items() if "grpo" in e.get("params", [])] == ["grpo"]


DEFAULT_IN_PROSE = re.compile(r"`([a-z_]+\.[a-z_][a-z_.]*)`\s*\((-?[\d.]+(?:e-?\d+)?)\)")


def test_defaults_named_in_the_prose_are_the_defaults():
    """"`section.key` (N)" in the prose states that key's default: it follows the code when a default
    changes (docs/training.md once said 1200 candidates and 100 prompts against 800 and 50)."""
    from pipelines.params.config import load_params

    params = load_params(None, [])

    def default(key: str):
        value = params
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
        return value

    found = [(p.name, key, text) for p in PAGES for key, text in DEFAULT_IN_PROSE.findall(p.read_text())
             if default(key) is not None]
    assert len(found) >= 4
    wrong = [f"{page}: `{key}` ({text}), default {default(key)}" for page, key, text in found
             if float(text) != float(default(key))]
    assert not wrong, wrong
