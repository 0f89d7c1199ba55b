"""GRPO's dev curve: a real (tiny) GRPO run holds out the last `grpo.dev_size` problems of grpo.jsonl
in the target band, never trains on them, and records greedy dev accuracy before training, every
`grpo.dev_every` steps and at the last (history CSV, MLflow, the stage's summary). The same run's
report says where its seconds went, part by part (components/training/step_clock.py).

    pytest -q tests/test_grpo_dev.py
"""

from __future__ import annotations

import csv
import json
import math

from components.common.files import jsonl_bytes
from components.common.params import DataParams, ModelParams
from pipelines.params import presets
from pipelines.params.config import load_params

TINY = dict(tiny_hidden_size=32, tiny_num_heads=2, tiny_num_layers=1, tiny_intermediate_size=64, tiny_vocab_size=300)


def test_grpo_records_its_dev_curve_on_held_out_target_band_problems_and_its_seconds_by_part(tmp_path, monkeypatch):
    import mlflow

    from components import data, grpo
    from components import model as model_stage
    from components.models.modelio import save_model

    monkeypatch.chdir(tmp_path)
    data.write_splits(DataParams(output_dir=str(tmp_path / "data/processed"), synthetic_train_size=40,
                                 synthetic_test_size=4, synthetic_answer_only_size=30,
                                 synthetic_answer_only_min_steps=3))
    model, tok = model_stage.build_tiny(ModelParams(seed=0, **TINY), tmp_path / "data/processed/train.jsonl")
    save_model(model, tok, tmp_path / "models/sft")
    problems = [json.loads(line) for line in (tmp_path / "data/processed/grpo.jsonl").read_text().splitlines()]
    assert {p["steps"] for p in problems} == {3}  # the tiny preset's answer-only band: beyond the demonstrations
    selected = tmp_path / "data/selected/prompts.jsonl"
    selected.parent.mkdir(parents=True)
    selected.write_bytes(jsonl_bytes(problems))  # every problem "selected": the dev ones must still be left out
    root = tmp_path
    params = load_params(None, [
        *presets.overrides("tiny"),
        f"data.output_dir={root / 'data/processed'}", f"grpo.init_dir={root / 'models/sft'}",
        f"grpo.output_dir={root / 'models/grpo'}", f"grpo.checkpoint_dir={root / 'checkpoints/grpo'}",
        f"grpo.metrics_file={root / 'reports/train/grpo.json'}",
        f"grpo.history_file={root / 'reports/train/grpo_history.csv'}",
        f"selection.output_file={selected}", "grpo.sample_size=0", "grpo.trainer.num_generations=2",
        "grpo.trainer.max_steps=2", "grpo.trainer.per_device_train_batch_size=4",
        "grpo.trainer.max_completion_length=8",
        "grpo.trainer.logging_steps=1", "grpo.trainer.save_steps=100",
        "grpo.dev_size=5", "grpo.dev_every=2", "evaluate.target_band=3",
    ])
    assert [r["id"] for r in grpo.dev_split(problems, 5, "3")] == [p["id"] for p in problems[-5:]]
    grpo.run(params)
    report = json.loads((root / "reports/train/grpo.json").read_text())
    assert report["dev_size"] == 5 and 0.0 <= report["dev_accuracy_final"] <= 1.0
    with open(root / "reports/train/grpo_history.csv") as fh:
        curve = [(int(r["step"]), float(r["dev_accuracy"])) for r in csv.DictReader(fh)
                 if not math.isnan(float(r["dev_accuracy"]))]
    assert [step for step, _ in curve] == [0, 2]  # before training, then every dev_every steps (2 is the last)
    assert report["dev_accuracy_first"] == curve[0][1] and report["dev_accuracy_final"] == curve[-1][1]
    run = mlflow.search_runs(search_all_experiments=True, filter_string="tags.`grpoflow.stage` = 'grpo'",
                             output_format="list")[0]
    assert [m.step for m in mlflow.MlflowClient().get_metric_history(run.info.run_id, "dev_accuracy")] == [0, 2]

    # Where the seconds went: every part measured, the dev evaluations among the callbacks, and the parts
    # adding up to the train call's seconds (`other` is what is left), in the report and in MLflow.
    parts = {k: v for k, v in report.items() if k.endswith("_seconds") and k != "train_seconds"}
    assert set(parts) == {f"{p}_seconds" for p in ("generation", "reference_forward", "policy_forward_backward",
                                                    "optimizer", "logging", "checkpoint", "callbacks", "other")}
    for part in ("generation", "policy_forward_backward", "optimizer", "logging", "callbacks"):
        assert parts[f"{part}_seconds"] > 0, (part, parts)
    assert abs(sum(parts.values()) - report["train_seconds"]) < 0.2 + 0.01 * report["train_seconds"], parts
    assert run.data.metrics["generation_seconds"] == parts["generation_seconds"]
