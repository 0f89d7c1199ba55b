"""GRPO's sampled completions in MLflow (components/training/grpo_trainer.py GRPOFlowTrainer.log): each
new generation batch becomes a file of its own, logged without downloading anything and without
rewriting what earlier steps logged, so that a run's logging stays linear in its length.

    pytest -q tests/test_grpo_logging.py
"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd


def batch(step: int) -> dict:
    """A generation batch as GRPOTrainer records it (`_logs`), its text told apart by `step`."""
    return {"prompt": [f"p{step}-{i}" for i in range(4)], "completion": [f"c{step}-{i}" for i in range(4)],
            "rewards": {"accuracy_reward": [1.0, 0.0, float("nan"), 1.0]}, "advantages": [0.5, -0.5, 0.0, 0.5]}


def test_completions_are_logged_step_by_step_without_downloads_or_rewrites(tmp_path, monkeypatch, capfd):
    import mlflow
    from trl import GRPOTrainer

    from components.training.grpo_trainer import GRPOFlowTrainer

    monkeypatch.setattr(GRPOTrainer, "log", lambda self, logs, start_time=None: None)  # TRL's metrics: not here
    trainer = GRPOFlowTrainer.__new__(GRPOFlowTrainer)  # the methods alone: no model, no TRL setup
    trainer.accelerator, trainer.model = SimpleNamespace(is_main_process=True), SimpleNamespace(training=True)
    experiment = mlflow.create_experiment("grpo", artifact_location=(tmp_path / "artifacts").as_uri())
    snapshots = []
    with mlflow.start_run(experiment_id=experiment) as run:
        root = tmp_path / "artifacts" / run.info.run_id / "artifacts"
        for step in range(1, 7):
            if step != 4:  # steps 3 and 4 share a generation batch
                trainer._logs = batch(step)
            trainer.state = SimpleNamespace(global_step=step)
            trainer.log({"loss": 0.0})
            snapshots.append({str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()})
    out = capfd.readouterr()
    assert "Downloading artifacts" not in out.out + out.err
    for before, after in zip(snapshots, snapshots[1:], strict=False):
        assert {name: after.get(name) for name in before} == before  # what a step logged stays as it was
    assert sorted(snapshots[-1]) == [f"completions/step_00000{s}.json" for s in (1, 2, 3, 5, 6)]
    table = pd.read_json(root / "completions/step_000003.json", orient="split")
    assert list(table.columns) == ["step", "prompt", "completion", "reward_accuracy_reward", "advantage"]
    assert table["step"].tolist() == [3] * 4 and table["completion"].tolist() == [f"c3-{i}" for i in range(4)]
    assert table["reward_accuracy_reward"].isna().tolist() == [False, False, True, False]


def test_without_a_run_in_evaluation_or_on_another_process_nothing_is_logged(monkeypatch):
    import mlflow
    from trl import GRPOTrainer

    from components.training.grpo_trainer import GRPOFlowTrainer

    monkeypatch.setattr(GRPOTrainer, "log", lambda self, logs, start_time=None: None)
    monkeypatch.setattr(mlflow, "log_text", lambda *a, **k: (_ for _ in ()).throw(AssertionError("logged")))
    trainer = GRPOFlowTrainer.__new__(GRPOFlowTrainer)
    trainer._logs, trainer.state = batch(1), SimpleNamespace(global_step=1)
    trainer.accelerator, trainer.model = SimpleNamespace(is_main_process=True), SimpleNamespace(training=True)
    trainer.log({})  # no active run
    with mlflow.start_run(experiment_id=mlflow.create_experiment("grpo")):
        trainer.model.training = False  # evaluation
        trainer.log({})
        trainer.model.training, trainer.accelerator.is_main_process = True, False
        trainer.log({})
