"""GRPO's learning-signal monitor: warns, once per condition, when training has little to learn from.

GRPO learns only from groups whose completions earn different rewards; TRL logs the share of
groups with all rewards equal as `frac_reward_zero_std`. The monitor averages TRL's logs over a
window of `grpo.signal_window` training steps (window // logging_steps logs, at least 1) and warns

    zero_std      mean frac_reward_zero_std > grpo.signal_zero_std (0.70): most groups carry no signal
    reward_flat   ... and the window's mean reward moved less than grpo.signal_flat_reward (0.02)
                  from the first window's
    kl_drift      mean KL to the reference > grpo.signal_max_kl (0.1): the policy drifts from the SFT
                  model (reward hacking looked like this)

naming the likely cause of the first two by the window's mean reward: below half the highest
reward (the sum of the positive rewards.weights; every registry reward lies in [0, 1]) the task
is too hard (all 0 in most groups), else too easy (all max). Defaults and reasons:
benchmarks/RESULTS.md, "What the curves say". `SignalMonitor` is plain Python (unit-tested on
synthetic logs); `SignalCallback` feeds it from the Trainer's on_log and reports each warning to
the terminal log and to the MLflow run (tag `grpoflow.grpo.signal_warning`, metric
`signal_warning_<condition>`, text artifact `grpo_signal_warnings.txt`).

    python -m doctest components/training/signal_monitor.py
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("grpoflow.grpo")

TAG = "grpoflow.grpo.signal_warning"
ARTIFACT = "grpo_signal_warnings.txt"


@dataclass(frozen=True)
class SignalWarning:
    condition: str  # zero_std | reward_flat | kl_drift
    step: int
    message: str


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def window_logs(window_steps: int, logging_steps: int) -> int:
    """Logs per window: window_steps // logging_steps, at least 1.

    >>> window_logs(100, 10), window_logs(100, 500), window_logs(5, 0)
    (10, 1, 5)
    """
    return max(1, int(window_steps // max(1, logging_steps)))


class SignalMonitor:
    """Feed it TRL's log dicts with `update`; it returns the warnings that became due at that log.

    >>> m = SignalMonitor(window=2, max_reward=1.0)
    >>> [w.condition for w in m.update({"reward": 0.02, "frac_reward_zero_std": 0.9, "step": 10})]
    []
    >>> [w.message for w in m.update({"reward": 0.01, "frac_reward_zero_std": 0.8, "step": 20})]
    ['GRPO step 20: 85% of the groups had all rewards equal over the last 2 logs (threshold 70%): no learning signal; mean reward 0.015 of 1: the task looks too hard for the model (rewards all 0 in most groups)']
    >>> m.summary()
    {'frac_reward_zero_std_mean': 0.85, 'signal_warnings': 1}
    """  # noqa: E501

    def __init__(
        self, window: int, zero_std: float = 0.70, flat_reward: float = 0.02, max_kl: float = 0.1,
        max_reward: float = 1.0,
    ) -> None:
        self.window, self.zero_std, self.flat_reward, self.max_kl = max(1, window), zero_std, flat_reward, max_kl
        self.max_reward = max_reward
        self.rewards: list[float] = []
        self.zero_stds: list[float] = []
        self.kls: list[float] = []
        self.warnings: list[SignalWarning] = []

    def cause(self, reward: float) -> str:
        """The likely cause of equal rewards, from the mean reward."""
        if reward < self.max_reward / 2:
            return "the task looks too hard for the model (rewards all 0 in most groups)"
        return "the task looks too easy for the model (rewards all at the maximum in most groups)"

    def update(self, logs: dict[str, Any]) -> list[SignalWarning]:
        """Record one training log (others, without frac_reward_zero_std, are ignored); new warnings."""
        if not isinstance(logs.get("frac_reward_zero_std"), (int, float)):
            return []
        self.zero_stds.append(float(logs["frac_reward_zero_std"]))
        self.rewards.append(float(logs.get("reward", math.nan)))
        if isinstance(logs.get("kl"), (int, float)):
            self.kls.append(float(logs["kl"]))
        step = int(logs.get("step") or 0)
        return self._check(step)

    def _due(self, condition: str) -> bool:
        return all(w.condition != condition for w in self.warnings)

    def _warn(self, condition: str, step: int, message: str) -> SignalWarning:
        warning = SignalWarning(condition, step, f"GRPO step {step}: {message}")
        self.warnings.append(warning)
        return warning

    def _check(self, step: int) -> list[SignalWarning]:
        n, out = self.window, []
        if len(self.zero_stds) < n:
            return out
        zero_std, reward = _mean(self.zero_stds[-n:]), _mean(self.rewards[-n:])
        of = f"mean reward {reward:.3g} of {self.max_reward:g}: {self.cause(reward)}"
        if zero_std > self.zero_std and self._due("zero_std"):
            out.append(self._warn(
                "zero_std", step,
                f"{zero_std:.0%} of the groups had all rewards equal over the last {n} logs "
                f"(threshold {self.zero_std:.0%}): no learning signal; {of}",
            ))
        if len(self.rewards) >= 2 * n and zero_std > self.zero_std and self._due("reward_flat"):
            first = _mean(self.rewards[:n])
            if abs(reward - first) < self.flat_reward:
                out.append(self._warn(
                    "reward_flat", step,
                    f"the mean reward moved {reward - first:+.3f} from the first {n} logs to the last {n} "
                    f"(flat: less than {self.flat_reward:g}) while {zero_std:.0%} of the groups had no signal; {of}",
                ))
        if len(self.kls) >= n and self._due("kl_drift"):
            kl = _mean(self.kls[-n:])
            if kl > self.max_kl:
                out.append(self._warn(
                    "kl_drift", step,
                    f"mean KL to the reference model {kl:.3f} over the last {n} logs (threshold {self.max_kl:g}): "
                    "the policy is drifting from the SFT model; check completions for reward hacking, "
                    "or raise grpo.trainer.beta / lower the learning rate",
                ))
        return out

    def summary(self) -> dict[str, Any]:
        """End-of-run metrics: the mean frac_reward_zero_std over all logs (if any) and the number of warnings."""
        mean = {"frac_reward_zero_std_mean": round(_mean(self.zero_stds), 4)} if self.zero_stds else {}
        return {**mean, "signal_warnings": len(self.warnings)}


def max_reward(weights: list[float]) -> float:
    """The highest combined reward when every reward lies in [0, 1]: the sum of the positive weights.

    >>> max_reward([0.5, 1.0, -0.2])
    1.5
    """
    return sum(w for w in weights if w > 0) or 1.0


def callback(monitor: SignalMonitor, window_steps: int):
    """A transformers TrainerCallback feeding `monitor` and reporting its warnings; the window in logs
    is set from `window_steps` and the Trainer's logging_steps when training starts."""
    from transformers import TrainerCallback

    class SignalCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            monitor.window = window_logs(window_steps, state.logging_steps or args.logging_steps)
            # A resumed run's earlier logs count; warnings they raise are reported now.
            new = [w for logs in state.log_history for w in monitor.update(logs)]
            if new and state.is_world_process_zero:
                report(new, monitor.warnings)

        def on_log(self, args, state, control, logs=None, **kwargs):
            new = monitor.update({**(logs or {}), "step": state.global_step})
            if new and state.is_world_process_zero:
                report(new, monitor.warnings)

    return SignalCallback()


def report(new: list[SignalWarning], every: list[SignalWarning]) -> None:
    """Terminal log and the active MLflow run (if any)."""
    for w in new:
        log.warning("%s", w.message)
    import mlflow

    if mlflow.active_run() is None:
        return
    for w in new:
        mlflow.log_metric(f"signal_warning_{w.condition}", 1.0, step=w.step)
    mlflow.set_tag(TAG, " | ".join(w.message for w in every)[:5000])
    mlflow.log_text("\n".join(w.message for w in every) + "\n", ARTIFACT)
