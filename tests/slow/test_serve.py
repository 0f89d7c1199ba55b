"""`grpoflow serve` for real: a tiny model (a short SFT run, so that it answers in the tag format and
stops on EOS) registered in MLflow (SQLite) as grpoflow-policy@champion, the evaluate stage run on
vLLM for 20 problems, then `grpoflow serve` (vLLM's OpenAI-compatible server from `.venv-vllm`)
asked by the official `openai` client and evaluated with `grpoflow evaluate --model http://...`:
the greedy answers through the server are the evaluate stage's, item for item, and so are the
seeded samples.

Needs `make venv-vllm`; about 4-6 minutes on two busy cores (three vLLM engine starts).

    pytest -q tests/slow/test_serve.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from components.generation import resolve_vllm_python, vllm_importable
from tests.servers import free_port, stop

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
PARAMS = {
    "data": {"synthetic_train_size": 400, "synthetic_test_size": 20, "seed": 5},
    "model": {"tiny_hidden_size": 64, "tiny_intermediate_size": 128, "tiny_num_layers": 2, "tiny_num_heads": 2,
              "tiny_vocab_size": 300},
    "sft": {"demo_untagged_rate": 0.0, "sample_size": 2,
            "trainer": {"max_steps": 150, "per_device_train_batch_size": 16, "learning_rate": 3.0e-3,
                        "logging_steps": 50, "save_steps": 1000, "seed": 0}},
    "evaluate": {"limit": 20, "max_new_tokens": 64, "num_samples": 2, "backend": "vllm"},
}


def run(args: list[str], cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args[:4]} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def items(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_served_champion_answers_like_the_evaluate_stage(tmp_path):
    if not (vllm_importable() or resolve_vllm_python(".venv-vllm/bin/python", REPO)):
        if os.environ.get("CI"):
            pytest.fail("CI must provide vLLM for this test: run `make venv-vllm` before the tests")
        pytest.skip("no vLLM here: run `make venv-vllm`")
    openai = pytest.importorskip("openai")
    work = tmp_path / "work"
    work.mkdir()
    (work / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    env["PYTHONPATH"] = str(REPO)
    py = sys.executable
    for stage in ("data", "model", "sft"):
        run([py, "-m", f"components.{stage}"], work, env)
    shutil.copytree(work / "models/sft", work / "models/grpo")  # no GRPO run: the stage scores the SFT model twice
    run([py, "-m", "components.evaluate"], work, env)
    stage_items = items(work / "reports/eval/sft.items.jsonl")
    assert json.loads((work / "reports/eval/sft.json").read_text())["backend"] == "vllm"
    assert len(stage_items) == 20 and any(i["format_ok"] for i in stage_items)

    # Register the SFT folder as grpoflow-policy v1, alias champion (the transformers flavour, as the registry does).
    register = """
import mlflow, transformers
from components.registry import pip_requirements
mlflow.set_experiment("serve-test")
parts = {"model": transformers.AutoModelForCausalLM.from_pretrained("models/sft"),
          "tokenizer": transformers.AutoTokenizer.from_pretrained("models/sft")}
with mlflow.start_run():
    info = mlflow.transformers.log_model(transformers_model=parts, name="model", task="text-generation",
                                         pip_requirements=pip_requirements())
client = mlflow.MlflowClient()
client.create_registered_model("grpoflow-policy")
mv = client.create_model_version("grpoflow-policy", source=f"models:/{info.model_id}", model_id=info.model_id)
client.set_registered_model_alias("grpoflow-policy", "champion", str(mv.version))
"""
    run([py, "-c", register], work, env)

    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([py, "-m", "pipelines.cli", "serve", "--port", str(port)], cwd=work, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while "is ready at" not in log.read_text(errors="replace"):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(2)
        printed = log.read_text()
        assert "grpoflow-policy/1 is ready at " + base in printed
        assert "curl -s " + base + "/chat/completions" in printed and "from openai import OpenAI" in printed
        with urllib.request.urlopen(base + "/models", timeout=10) as resp:
            assert [m["id"] for m in json.loads(resp.read())["data"]] == ["grpoflow-policy/1"]

        # The official client, with the messages of the training prompt: the stage's greedy answer.
        from components.gsm8k import build_messages
        from components.sources import load_problems

        problems = load_problems(f"jsonl:{work / 'data/processed/test.jsonl'}", 20)
        client = openai.OpenAI(base_url=base, api_key="unused")
        for problem, item in list(zip(problems, stage_items, strict=True))[:3]:
            reply = client.chat.completions.create(
                model="grpoflow-policy/1", messages=build_messages(problem["question"]), temperature=0, max_tokens=64,
            )
            assert reply.choices[0].message.content == item["completion"]

        # The endpoint evaluated like a model: every greedy answer, token count and sample as in the stage.
        run([py, "-m", "pipelines.cli", "evaluate", "--model", base, "--limit", "20", "--output", str(tmp_path / "ep")],
            work, env)
    finally:
        stop(server)
    served = items(tmp_path / "ep" / f"endpoint-127.0.0.1-{port}.items.jsonl")
    assert [i["id"] for i in served] == [i["id"] for i in stage_items]
    diff = [(a["id"], a["completion"][:50], b["completion"][:50]) for a, b in zip(stage_items, served, strict=True)
            if a["completion"] != b["completion"]]
    assert not diff, f"{len(diff)} of 20 greedy answers differ, e.g. {diff[:3]}"
    assert [i["completion_tokens"] for i in served] == [i["completion_tokens"] for i in stage_items]
    assert [i["samples_extracted_flexible"] for i in served] == [i["samples_extracted_flexible"] for i in stage_items]
    metrics = json.loads((tmp_path / "ep" / f"endpoint-127.0.0.1-{port}.json").read_text())
    stage_metrics = json.loads((work / "reports/eval/sft.json").read_text())
    for key in ("accuracy_strict", "accuracy_flexible", "format_rate", "maj_at_k_strict", "sampled_accuracy_flexible"):
        assert metrics[key] == stage_metrics[key], key
