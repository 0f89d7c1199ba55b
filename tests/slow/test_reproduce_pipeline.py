"""Determinism and `grpoflow reproduce` on the real pipeline: a copy of this checkout (its tracked
files, committed in a fresh git repo) with small settings runs `grpoflow run` (every stage, then
registration of grpoflow-policy v1), then `grpoflow reproduce grpoflow-policy 1` re-runs every
stage from scratch in a clean working copy: every recorded metric comes out identical, and so does
every stage output (dvc.lock md5s: data, model weights, reports). The evaluate stage runs on vLLM
when `.venv-vllm` exists (linked into the copy, as in a checkout), else on transformers.

About 10-15 minutes on two busy cores.

    pytest -q tests/slow/test_reproduce_pipeline.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.config import write_overrides

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "data.synthetic_train_size=200",
    "data.synthetic_test_size=20",
    "sft.sample_size=2",
    "sft.trainer.max_steps=20",
    "sft.trainer.logging_steps=10",
    "grpo.sample_size=2",
    "grpo.trainer.max_steps=2",
    "grpo.trainer.per_device_train_batch_size=8",
    "grpo.trainer.max_completion_length=32",
    "grpo.trainer.logging_steps=1",
    "evaluate.max_new_tokens=48",
    "evaluate.num_samples=2",
]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *args],
        cwd=cwd, check=True, capture_output=True, text=True,
    ).stdout


def test_a_small_run_reproduces_exactly(tmp_path):
    repo = tmp_path / "repo"
    for rel in git(REPO, "ls-files").split():
        src, dst = REPO / rel, repo / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(src.read_bytes())
        dst.chmod(src.stat().st_mode)
    write_overrides(repo / "params.yaml", SMALL)
    if (REPO / ".venv-vllm").exists():
        (repo / ".venv-vllm").symlink_to((REPO / ".venv-vllm").resolve(), target_is_directory=True)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "small settings")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PYTHONPATH")}
    env["PYTHONPATH"] = str(repo)

    run = subprocess.run([sys.executable, "-m", "pipelines.cli", "run"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "grpoflow-policy v1 registered" in run.stdout
    assert git(repo, "status", "--porcelain", "--untracked-files=no").strip() in ("", "A  dvc.lock")
    backend = json.loads((repo / "reports/eval/grpo.json").read_text())["backend"]
    assert f"evaluation backend: {backend}" in run.stdout

    work = tmp_path / "reproduced"
    rep = subprocess.run([sys.executable, "-m", "pipelines.cli", "reproduce", "grpoflow-policy", "1",
                          "--workdir", str(work)], cwd=repo, env=env, capture_output=True, text=True, timeout=3600)
    assert rep.returncode == 0, rep.stdout[-4000:] + rep.stderr[-3000:]
    assert "nothing known that would keep it from reproducing exactly" in rep.stdout
    report = json.loads((work / "reproduce.json").read_text())
    compared = [r for r in report["metrics"] if r["status"] != "timing"]
    assert len(compared) > 40 and all(r["status"] == "same" for r in compared)
    assert {"grpo", "sft"} <= {r["model"] for r in compared}
    assert report["outputs"] and set(report["outputs"].values()) == {"identical"}, report["outputs"]
