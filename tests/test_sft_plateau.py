"""SFT to its plateau: a real (tiny) SFT run holds out a dev split, records dev accuracy as the SFT
curve (history CSV, MLflow) and stops once it stops rising; settings that cannot work fail early.

    pytest -q tests/test_sft_plateau.py
"""

from __future__ import annotations

import csv
import json
import math

import pytest

from components.common.errors import ConfigError
from components.common.params import DataParams, ModelParams
from pipelines.params.config import load_params

TINY = dict(tiny_hidden_size=32, tiny_num_heads=2, tiny_num_layers=1, tiny_intermediate_size=64, tiny_vocab_size=300)


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    from components import data
    from components import model as model_stage
    from components.models.modelio import save_model

    data.write_splits(DataParams(output_dir=str(tmp_path / "data/processed"), synthetic_train_size=40,
                                 synthetic_test_size=4))
    model, tok = model_stage.build_tiny(ModelParams(seed=0, **TINY), tmp_path / "data/processed/train.jsonl")
    save_model(model, tok, tmp_path / "models/base")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_sft_stops_at_the_plateau_of_its_dev_accuracy_and_records_the_curve(workspace):
    import mlflow

    from components import sft

    root = workspace
    params = load_params(None, [
        f"data.output_dir={root / 'data/processed'}", f"model.base_dir={root / 'models/base'}",
        f"sft.output_dir={root / 'models/sft'}", f"sft.checkpoint_dir={root / 'checkpoints/sft'}",
        f"sft.metrics_file={root / 'reports/train/sft.json'}",
        f"sft.history_file={root / 'reports/train/sft_history.csv'}",
        "sft.sample_size=0", "sft.trainer.max_steps=8", "sft.trainer.per_device_train_batch_size=4",
        "sft.trainer.logging_steps=2", "sft.trainer.save_steps=100", "sft.trainer.warmup_steps=0",
        # a rise of more than 100% never happens: the 2nd measurement is a plateau
        "sft.dev_size=6", "sft.dev_every=2", "sft.dev_max_new_tokens=16", "sft.plateau_patience=1",
        "sft.plateau_min_delta=1.5",
    ])
    sft.run(params)
    report = json.loads((root / "reports/train/sft.json").read_text())
    assert report["global_step"] == 4 and report["stopped_at_plateau"] is True  # of max_steps 8
    assert report["demos"] == 34 and report["dev_size"] == 6  # the dev rows are not trained on
    with open(root / "reports/train/sft_history.csv") as fh:
        curve = [(int(r["step"]), float(r["dev_accuracy"])) for r in csv.DictReader(fh)
                 if not math.isnan(float(r["dev_accuracy"]))]
    assert [step for step, _ in curve] == [2, 4]
    assert report["dev_accuracy_final"] == curve[-1][1] and 0.0 <= report["dev_accuracy_best"] <= 1.0
    run = mlflow.search_runs(search_all_experiments=True, filter_string="tags.`grpoflow.stage` = 'sft'",
                             output_format="list")[0]
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "dev_accuracy")
    assert [m.step for m in history] == [2, 4]


def test_plateau_settings_fail_early():
    with pytest.raises(ConfigError, match="sft.plateau_patience needs a dev split to watch: set sft.dev_size"):
        load_params(None, ["sft.plateau_patience=2"])
