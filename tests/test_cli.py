"""The `grpoflow` CLI: fast start-up (no heavy imports for --help) and every subcommand's help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "mlflow", "prefect", "trl", "datasets", "dvc")


def test_help_imports_no_heavy_module():
    code = (
        "import sys\n"
        "from pipelines import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    "command", ["run", "evaluate", "grade", "promote", "rollback", "deploy", "schedule", "serve", "reproduce", "ui"]
)
def test_each_subcommand_answers_help_under_its_own_name(command):
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", command, "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert f"grpoflow {command}" in out.stdout


def test_every_handler_resolves():
    import importlib

    from pipelines.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        module, func = p.get_default("handler").split(":")
        assert callable(getattr(importlib.import_module(module), func)), name


def test_schedule_help_says_what_it_does_and_what_stops_it():
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "schedule", "--help"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    text = " ".join(out.split())
    assert "cron schedule" in text and "PREFECT_API_URL" in text and "temporary server" in text
    assert "Ctrl-C or SIGTERM stops it" in text


def test_params_options_match_the_stages():
    """`grpoflow`'s --params/-S options repeat components.common.entry.add_params_args (so that
    --help stays light): the same flags, destinations, defaults and actions."""
    import argparse

    from components.common.entry import add_params_args
    from pipelines import cli

    def options(add):
        parser = argparse.ArgumentParser()
        add(parser)
        return sorted((tuple(a.option_strings), a.dest, repr(a.default), type(a).__name__, a.metavar)
                      for a in parser._actions if a.option_strings and a.dest != "help")

    assert options(cli._add_params) == options(add_params_args)
