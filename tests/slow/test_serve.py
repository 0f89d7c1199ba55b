"""`grpoflow serve` for real, on the session's baseline run (tests/project_repo.py): the version the
pipeline itself registered and promoted (grpoflow-policy@champion, v1, in the checkout's MLflow store)
behind vLLM's OpenAI-compatible server from `.venv-vllm`, asked by the official `openai` client and
evaluated with `grpoflow evaluate --model http://...`: the greedy answers through the server are the
evaluate stage's, item for item, and so are the seeded samples and the metrics.

Needs `make venv-vllm`; a few minutes on two cores (one engine start for the server, after the baseline).

    pytest -q tests/slow/test_serve.py
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest

from components.evaluation.generation import resolve_vllm_python, vllm_importable
from tests.project_repo import run_ok
from tests.servers import served

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]


def items(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_served_champion_answers_like_the_evaluate_stage(baseline, tmp_path):
    if not (vllm_importable() or resolve_vllm_python(".venv-vllm/bin/python", REPO)):
        if os.environ.get("CI"):
            pytest.fail("CI must provide vLLM for this test: run `make venv-vllm` before the tests")
        pytest.skip("no vLLM here: run `make venv-vllm`")
    openai = pytest.importorskip("openai")
    repo = baseline.repo
    stage_items = items(repo / "reports/eval/grpo.items.jsonl")
    stage_metrics = json.loads((repo / "reports/eval/grpo.json").read_text())
    assert stage_metrics["backend"] == "vllm" and len(stage_items) == stage_metrics["n"] == 40

    log = tmp_path / "serve.log"

    def cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "pipelines.cli", "serve", "--port", str(port)]

    def ready(server) -> bool:
        return "is ready at" in log.read_text(errors="replace")

    with served(cmd, "", log, env=baseline.env(), cwd=repo, timeout=900, ready=ready) as server:
        port, base = server.port, server.url + "/v1"
        printed = log.read_text()
        assert "grpoflow-policy/1 is ready at " + base in printed
        assert "curl -s " + base + "/chat/completions" in printed and "from openai import OpenAI" in printed
        with urllib.request.urlopen(base + "/models", timeout=10) as resp:
            assert [m["id"] for m in json.loads(resp.read())["data"]] == ["grpoflow-policy/1"]

        # The official client, with the messages of the training prompt: the stage's greedy answer.
        from components.problems.gsm8k import build_messages
        from components.problems.sources import load_problems

        problems = load_problems(f"jsonl:{repo / 'data/processed/test.jsonl'}", 3)
        client = openai.OpenAI(base_url=base, api_key="unused")
        for problem, item in zip(problems, stage_items[:3], strict=True):
            reply = client.chat.completions.create(
                model="grpoflow-policy/1", messages=build_messages(problem["question"]), temperature=0,
                max_tokens=48,
            )
            assert reply.choices[0].message.content == item["completion"]

        # The endpoint evaluated like a model (logged to a store of its own: the baseline stays as it was):
        # every greedy answer, token count and sample as in the stage.
        env = baseline.env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
        run_ok(repo, "evaluate", "--model", base, "--output", str(tmp_path / "ep"), env=env, timeout=900)
    answered = items(tmp_path / "ep" / f"endpoint-127.0.0.1-{port}.items.jsonl")
    assert [i["id"] for i in answered] == [i["id"] for i in stage_items]
    diff = [(a["id"], a["completion"][:50], b["completion"][:50]) for a, b in zip(stage_items, answered, strict=True)
            if a["completion"] != b["completion"]]
    assert not diff, f"{len(diff)} of {len(answered)} greedy answers differ, e.g. {diff[:3]}"
    assert [i["completion_tokens"] for i in answered] == [i["completion_tokens"] for i in stage_items]
    assert [i["samples_extracted_flexible"] for i in answered] == [i["samples_extracted_flexible"] for i in stage_items]
    metrics = json.loads((tmp_path / "ep" / f"endpoint-127.0.0.1-{port}.json").read_text())
    for key in ("accuracy_strict", "accuracy_flexible", "format_rate", "maj_at_k_strict", "sampled_accuracy_flexible"):
        assert metrics[key] == stage_metrics[key], key
