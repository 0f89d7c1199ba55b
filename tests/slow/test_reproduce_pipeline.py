"""Determinism and `grpoflow reproduce` on the real pipeline: a copy of this project with small
settings (tests/project_repo.py, a fresh git + DVC repo) runs `grpoflow run` (every stage, then
registration of grpoflow-policy v1), then `grpoflow reproduce grpoflow-policy 1` re-runs every
stage from scratch in a clean working copy: every recorded metric comes out identical, and so does
every stage output but the metrics files, which hold timings (dvc.lock md5s: data, tokenizer,
model weights, per-item results). The evaluate stage runs on vLLM
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

from tests.project_repo import git, make_project_repo

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# On top of tests/project_repo.py's small settings: the default engine (vLLM when .venv-vllm is
# there, linked into the copy as in a checkout) and a few seeded samples per problem.
OVERRIDES = ["evaluate.backend=auto", "evaluate.num_samples=2", "evaluate.max_new_tokens=48"]


def test_a_small_run_reproduces_exactly(tmp_path):
    repo = make_project_repo(tmp_path / "repo", OVERRIDES)
    if (REPO / ".venv-vllm").exists():
        (repo / ".venv-vllm").symlink_to((REPO / ".venv-vllm").resolve(), target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PYTHONPATH")}

    run = subprocess.run([sys.executable, "-m", "pipelines.cli", "run"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "grpoflow-policy v1 registered" in run.stdout
    backend = json.loads((repo / "reports/eval/grpo.json").read_text())["backend"]
    assert f"evaluation backend: {backend}" in run.stdout
    assert backend == ("vllm" if (REPO / ".venv-vllm").exists() else "transformers")

    work = tmp_path / "reproduced"
    rep = subprocess.run([sys.executable, "-m", "pipelines.cli", "reproduce", "grpoflow-policy", "1",
                          "--workdir", str(work)], cwd=repo, env=env, capture_output=True, text=True, timeout=3600)
    assert rep.returncode == 0, rep.stdout[-4000:] + rep.stderr[-3000:]
    assert "nothing known that would keep it from reproducing exactly" in rep.stdout
    report = json.loads((work / "reproduce.json").read_text())
    compared = [r for r in report["metrics"] if r["status"] != "timing"]
    assert [r for r in compared if r["status"] != "same"] == []
    assert {"grpo", "sft"} == {r["model"] for r in compared} and len(compared) >= 30  # sampled metrics too
    assert {"maj_at_k_strict", "pass_at_k_flexible", "sampled_accuracy_strict"} <= {r["key"] for r in compared}
    # Every output but the metrics files (which hold timings) is byte-identical: data, model weights, items.
    differ = {p: s for p, s in report["outputs"].items() if s != "identical"}
    assert differ and all(s == "differs (a metrics file: timings)" for s in differ.values()), differ
    assert {"models/sft", "models/grpo", "reports/eval/grpo.items.jsonl"} <= set(report["outputs"]) - set(differ)
    assert git(repo, "status", "--porcelain", "--untracked-files=no").strip() in ("", "A  dvc.lock")
