"""A throw-away checkout of this project with small settings, for end-to-end tests of real stages.

`make_project_repo(path, overrides)` copies the code (components/, dvc.yaml, params.yaml, the plot
templates in .dvc/plots/) into a fresh git + DVC repository with a local DVC remote, applies SMALL
(settings that train and evaluate in about a minute on a CPU) and `overrides` to its params.yaml,
and commits. The pipeline then runs
there with `python -m pipelines.cli run` (cwd = the copy), exactly as a user's checkout would.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SMALL = [
    "data.synthetic_train_size=200",
    "data.synthetic_test_size=40",
    "model.tiny_hidden_size=64",
    "model.tiny_intermediate_size=128",
    "model.tiny_num_heads=2",
    "model.tiny_num_layers=1",
    "sft.trainer.max_steps=30",
    "sft.trainer.per_device_train_batch_size=8",
    "sft.trainer.save_steps=10",
    "sft.trainer.logging_steps=5",
    "sft.sample_size=2",
    "selection.max_candidates=40",
    "selection.num_samples=2",
    "selection.keep_unsolved=true",  # a 30-step SFT model solves (almost) nothing
    "selection.min_prompts=4",
    "selection.max_new_tokens=24",
    "selection.backend=transformers",
    "grpo.trainer.max_steps=2",
    "grpo.trainer.per_device_train_batch_size=8",
    "grpo.trainer.max_completion_length=24",
    "grpo.trainer.logging_steps=1",
    "grpo.sample_size=2",
    "evaluate.backend=transformers",
    "evaluate.max_new_tokens=24",
]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def make_project_repo(path: Path, overrides: list[str] = (), with_flows: bool = False) -> Path:
    """The checkout; `with_flows` adds pipelines/ and infra/prefect.yaml (to deploy from it)."""
    from components.config import write_overrides

    path.mkdir(parents=True)
    for package in ("components", "pipelines") if with_flows else ("components",):
        shutil.copytree(REPO / package, path / package, ignore=shutil.ignore_patterns("__pycache__"))
    if with_flows:
        (path / "infra").mkdir()
        shutil.copy(REPO / "infra" / "prefect.yaml", path / "infra" / "prefect.yaml")
    for name in ("dvc.yaml", "params.yaml", ".gitignore", ".dvcignore"):
        shutil.copy(REPO / name, path / name)
    write_overrides(path / "params.yaml", [*SMALL, *overrides])
    git(path, "init", "-q")
    git(path, "config", "user.email", "test@example.com")
    git(path, "config", "user.name", "test")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=path, check=True)
    shutil.copytree(REPO / ".dvc" / "plots", path / ".dvc" / "plots")  # dvc.yaml's plot templates
    subprocess.run([sys.executable, "-m", "dvc", "remote", "add", "-d", "store", str(path.parent / "dvc-remote")],
                   cwd=path, check=True, capture_output=True)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "test checkout")
    return path


def grpoflow(repo: Path, *args: str, log: Path | None = None, **kw) -> subprocess.Popen:
    """`grpoflow ARGS` in the checkout, output to `log` (default: a pipe)."""
    out = open(log, "w") if log else subprocess.PIPE  # noqa: SIM115 (the caller's process owns it)
    return subprocess.Popen([sys.executable, "-m", "pipelines.cli", *args], cwd=repo, stdout=out,
                            stderr=subprocess.STDOUT, text=True, **kw)
