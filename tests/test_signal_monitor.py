"""The GRPO signal monitor on synthetic TRL logs: the right warning with the right cause, once;
nothing on a healthy run; and the callback's reports in the terminal log and the MLflow run."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from components.training.signal_monitor import TAG, SignalMonitor, callback, max_reward, window_logs


def logs(rewards, zero_stds, kls=None, every=10):
    kls = kls or [0.01] * len(rewards)
    return [
        {"reward": r, "frac_reward_zero_std": z, "kl": k, "loss": 0.0, "step": (i + 1) * every}
        for i, (r, z, k) in enumerate(zip(rewards, zero_stds, kls, strict=True))
    ]


def feed(monitor, entries):
    return [w for entry in entries for w in monitor.update(entry)]


@pytest.mark.parametrize(
    "reward, weights, cause",
    [
        (0.03, [1.0], "too hard"),
        (0.97, [1.0], "too easy"),
        (1.4, [0.5, 1.0], "too easy"),  # near the max of a weighted sum
        (0.5, [0.5, 1.0], "too hard"),
    ],
)
def test_sustained_zero_std_warns_once_with_the_cause(reward, weights, cause):
    monitor = SignalMonitor(window=10, max_reward=max_reward(weights))
    warnings = feed(monitor, logs([reward] * 40, [0.8] * 40))
    zero_std = [w for w in warnings if w.condition == "zero_std"]
    assert len(zero_std) == 1  # not every log
    assert zero_std[0].step == 100  # as soon as one full window is in
    assert cause in zero_std[0].message and "80%" in zero_std[0].message
    flat = [w for w in warnings if w.condition == "reward_flat"]
    assert len(flat) == 1 and flat[0].step == 200 and cause in flat[0].message
    assert monitor.summary() == {"frac_reward_zero_std_mean": 0.8, "signal_warnings": 2}


def test_healthy_run_does_not_warn():
    # e02-like: reward 0.20 -> 0.23 over 300 steps, zero-std 0.48 -> 0.61, KL below 0.03
    n = 30
    rewards = [0.20 + 0.03 * i / n + (0.05 if i % 2 else -0.05) for i in range(n)]
    zero_stds = [0.48 + 0.13 * i / n + (0.1 if i % 3 == 0 else 0.0) for i in range(n)]
    monitor = SignalMonitor(window=10)
    assert feed(monitor, logs(rewards, zero_stds, [0.02] * n)) == []
    assert monitor.summary()["signal_warnings"] == 0
    assert 0.5 < monitor.summary()["frac_reward_zero_std_mean"] < 0.65


def test_high_zero_std_with_rising_reward_is_not_flat():
    monitor = SignalMonitor(window=5)
    warnings = feed(monitor, logs([0.05 + 0.02 * i for i in range(20)], [0.75] * 20))
    assert [w.condition for w in warnings] == ["zero_std"]


def test_a_short_noisy_spike_does_not_warn():
    zero_stds = [0.5] * 20
    zero_stds[7:9] = [1.0, 1.0]  # two bad logs inside a 10-log window
    assert feed(SignalMonitor(window=10), logs([0.2] * 20, zero_stds)) == []


def test_kl_drift_warns_once():
    monitor = SignalMonitor(window=3)
    warnings = feed(monitor, logs([0.3] * 10, [0.4] * 10, [0.02, 0.05, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]))
    assert [(w.condition, w.step) for w in warnings] == [("kl_drift", 40)]  # (0.05 + 0.2 + 0.3) / 3 > 0.1
    assert "drifting" in warnings[0].message and "grpo.trainer.beta" in warnings[0].message


def test_logs_without_the_signal_are_ignored():
    monitor = SignalMonitor(window=1)
    assert monitor.update({"train_runtime": 9.0, "train_loss": 0.1, "step": 10}) == []
    assert monitor.summary() == {"signal_warnings": 0}  # no mean of nothing (no NaN in the metrics file)


def test_the_signal_window_in_logging_steps_is_at_least_one():
    assert window_logs(100, 10) == 10
    assert window_logs(100, 1) == 100
    assert window_logs(100, 250) == 1


def test_the_callback_reports_to_the_log_and_mlflow(caplog, tmp_path):
    import mlflow

    monitor = SignalMonitor(window=1)
    cb = callback(monitor, window_steps=20)
    state = SimpleNamespace(logging_steps=10, log_history=[], global_step=0, is_world_process_zero=True)
    args = SimpleNamespace(logging_steps=10)
    mlflow.set_experiment("signal-monitor")  # not an experiment id another test left active
    with mlflow.start_run() as run, caplog.at_level(logging.WARNING, logger="grpoflow.grpo"):
        cb.on_train_begin(args, state, None)
        assert monitor.window == 2
        for step, entry in zip((10, 20, 30, 40), logs([0.0] * 4, [0.9] * 4), strict=True):
            state.global_step = step
            cb.on_log(args, state, None, logs=entry)
    messages = [r.getMessage() for r in caplog.records if r.name == "grpoflow.grpo"]
    assert len(messages) == 2 and "too hard" in messages[0]  # zero_std at step 20, reward_flat at step 40
    data = mlflow.get_run(run.info.run_id).data
    assert "too hard" in data.tags[TAG]
    assert data.metrics["signal_warning_zero_std"] == 1.0
    client = mlflow.MlflowClient()
    history = client.get_metric_history(run.info.run_id, "signal_warning_zero_std")
    assert [m.step for m in history] == [20]
    text = mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/grpo_signal_warnings.txt")
    assert text.count("\n") == 2
