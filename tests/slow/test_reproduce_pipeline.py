"""Determinism and `grpoflow reproduce` on the real pipeline: the session's baseline run (a small copy
of this project, tests/project_repo.py, that ran every stage and registered grpoflow-policy v1) is
reproduced by `grpoflow reproduce grpoflow-policy 1`, which re-runs every stage from scratch in a
clean working copy: every recorded metric comes out identical, and so does every stage output but
the stages' summaries, which hold timings (dvc.lock md5s: data, tokenizer, model weights, per-item
results). The baseline evaluated on vLLM when `.venv-vllm` exists, else on transformers.

    pytest -q tests/slow/test_reproduce_pipeline.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.project_repo import git, run_ok

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_the_baseline_run_reproduces_exactly(baseline, tmp_path):
    repo = baseline.repo
    assert "grpoflow-policy v1 registered" in baseline.output
    backend = json.loads((repo / "reports/eval/grpo.json").read_text())["backend"]
    assert f"evaluation backend: {backend}" in baseline.output
    assert backend == ("vllm" if (REPO / ".venv-vllm").exists() else "transformers")
    status_before = git(repo, "status", "--porcelain")
    # The run leaves the code and params as committed (it stages the new dvc.lock, nothing else).
    assert git(repo, "status", "--porcelain", "--untracked-files=no").strip() in ("", "A  dvc.lock")

    work = tmp_path / "reproduced"
    out = run_ok(repo, "reproduce", "grpoflow-policy", "1", "--workdir", str(work), env=baseline.env())
    assert "nothing known that would keep it from reproducing exactly" in out
    report = json.loads((work / "reproduce.json").read_text())
    compared = [r for r in report["metrics"] if r["status"] != "timing"]
    assert [r for r in compared if r["status"] != "same"] == []
    assert {"grpo", "sft"} == {r["model"] for r in compared} and len(compared) >= 30  # sampled metrics too
    assert {"maj_at_k_strict", "pass_at_k_flexible", "sampled_accuracy_strict"} <= {r["key"] for r in compared}
    # Every output but the summaries (which hold timings) is byte-identical: data, model weights, items,
    # the headline DVC metrics.
    differ = {p: s for p, s in report["outputs"].items() if s != "identical"}
    assert differ and all(s == "differs (a summary: timings)" for s in differ.values()), differ
    assert "reports/eval/metrics/grpo.json" in set(report["outputs"]) - set(differ)
    assert {"models/sft", "models/grpo", "reports/eval/grpo.items.jsonl"} <= set(report["outputs"]) - set(differ)
    assert git(repo, "status", "--porcelain") == status_before  # reproducing changed nothing in the checkout
