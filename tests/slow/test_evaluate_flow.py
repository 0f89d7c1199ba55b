"""The `evaluation` Prefect flow (pipelines/evaluation/any_model.py) on a tiny local model: real Prefect
(its temporary local server), real MLflow on SQLite, the transformers backend.

    pytest -q tests/slow/test_evaluate_flow.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.params.config import DataParams, ModelParams

pytestmark = pytest.mark.slow


def test_evaluation_flow_evaluates_a_model_and_logs_a_run(tmp_path, monkeypatch):
    import mlflow

    # No log shipping to the temporary server: it is gone by interpreter exit, and retries stall it.
    monkeypatch.setenv("PREFECT_LOGGING_TO_API_ENABLED", "false")
    monkeypatch.chdir(tmp_path)  # the checkout: stage paths must lie inside it

    from components import data
    from components import model as model_stage
    from components.models.modelio import save_model
    from pipelines.evaluation.any_model import evaluation_pipeline

    data.write_splits(DataParams(output_dir=str(tmp_path / "data"), synthetic_train_size=40, synthetic_test_size=6,
                                 synthetic_test_top_band_size=0))
    cfg = ModelParams(
        seed=5, tiny_hidden_size=64, tiny_num_heads=2, tiny_num_layers=1, tiny_intermediate_size=128
    )
    model, tok = model_stage.build_tiny(cfg, tmp_path / "data/train.jsonl")
    save_model(model, tok, tmp_path / "model")

    result = evaluation_pipeline(
        model=str(tmp_path / "model"),
        backend="transformers",
        output=str(tmp_path / "out"),
        overrides=[f"data.output_dir={tmp_path / 'data'}", "evaluate.max_new_tokens=8"],
    )
    assert result["n"] == 6 and result["backend"] == "transformers"
    assert json.loads(Path(tmp_path / "out" / "model.json").read_text())["n"] == 6
    run = mlflow.get_run(result["mlflow_run_id"])
    assert run.info.run_name == "evaluate" and run.data.tags["grpoflow.eval.model"] == str(tmp_path / "model")
