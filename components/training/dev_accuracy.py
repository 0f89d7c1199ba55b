"""Greedy accuracy on a dev split while a training stage runs: the SFT curve (and its plateau stop)
and GRPO's curve on problems beyond the demonstrations, so a user sees when training stops paying.

    Plateau(patience, min_delta)      the stop rule: no rise of min_delta over the best for N measurements
    dev_callback(rows, tokenizer, every, max_new_tokens, plateau, at_start)
                                      a TrainerCallback: flexible accuracy on `rows` every `every` steps and
                                      at the last (and before the first with at_start), into the Trainer's log
                                      history (the stage's history CSV: `dvc plots`) and MLflow (`dev_accuracy`)

Answers come from the model in memory with components/training/train_samples.py's greedy loop, not the
evaluation engine, so that evaluation code never enters a training stage's deps.
"""

from __future__ import annotations

from typing import Any


class Plateau:
    """Dev accuracy every `dev_every` steps; stop after `patience` measurements without a rise of
    `min_delta` over the best (0 = never stop).

    >>> p = Plateau(patience=2, min_delta=0.01)
    >>> [p.update(a) for a in (0.10, 0.20, 0.205, 0.208, 0.30)]
    [False, False, False, True, False]
    >>> p.best, p.curve[-1]
    (0.3, 0.3)
    """

    def __init__(self, patience: int = 0, min_delta: float = 0.0) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best: float | None = None
        self.since_best = 0
        self.curve: list[float] = []

    def update(self, accuracy: float) -> bool:
        """Record one measurement; True when training should stop."""
        self.curve.append(accuracy)
        if self.best is None or accuracy >= self.best + self.min_delta:
            self.best, self.since_best = accuracy if self.best is None else max(accuracy, self.best), 0
        else:
            self.since_best += 1
        return bool(self.patience) and self.since_best >= self.patience


def dev_callback(rows: list[dict[str, Any]], tokenizer: Any, every: int, max_new_tokens: int,
                 plateau: Plateau | None = None, at_start: bool = False) -> Any:
    """A TrainerCallback that measures greedy flexible accuracy on the dev rows every `every` steps
    and at the last (and before training with `at_start`), logs it as `dev_accuracy` (history and
    MLflow) and stops training at the plateau (`plateau` with a patience)."""
    from transformers import TrainerCallback

    from components.problems import gsm8k
    from components.training.train_samples import greedy

    prompts = [gsm8k.render_prompt(r["question"], tokenizer) for r in rows]
    rule = plateau or Plateau()

    class DevAccuracy(TrainerCallback):
        stopped_early = False

        def measure(self, state, model) -> float:
            completions = greedy(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
            accuracy = sum(gsm8k.is_correct(c, r["gold"], "flexible") for c, r in zip(completions, rows, strict=True))
            accuracy /= len(rows)
            state.log_history.append({"dev_accuracy": accuracy, "step": state.global_step})
            if state.is_world_process_zero:
                import mlflow

                if mlflow.active_run():
                    mlflow.log_metric("dev_accuracy", accuracy, step=state.global_step)
            print(f"dev accuracy at step {state.global_step}: {accuracy:.1%} of {len(rows)} problems", flush=True)
            return accuracy

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if at_start and state.global_step == 0:
                rule.curve.append(self.measure(state, model))

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % every and state.global_step < state.max_steps:
                return
            if rule.update(self.measure(state, model)) and state.global_step < state.max_steps:
                self.stopped_early = control.should_training_stop = True

        def summary(self) -> dict[str, Any]:
            curve = rule.curve
            return {"dev_size": len(rows), "dev_accuracy_best": max(curve) if curve else None,
                    "dev_accuracy_first": curve[0] if curve else None,
                    "dev_accuracy_final": curve[-1] if curve else None, "stopped_at_plateau": self.stopped_early}

    return DevAccuracy()
