"""Where a training stage's seconds go: a clock for TRL trainers, by part of each optimizer step and over
the whole run. The training stages report its run totals (`<stage>.metrics_file`, MLflow: `generation_seconds`,
...); benchmarks/grpo_step.py and benchmarks/gpu_check.py read its per-step parts.

    StepClock            seconds per optimizer step and per part of it, from wrappers around the trainer's
                         methods and a callback: any Trainer's training_step and optimizer step; a GRPO
                         trainer's rollouts and log-prob passes too; and over the run, the seconds of
                         logging (metrics and completions to MLflow), checkpoints and callbacks (a dev
                         split's evaluation) between the steps; on a GPU each reading waits for the queued
                         kernels (`sync`)
    StepClock.report(s)  the run's seconds by part (RUN_PARTS), `other_seconds` what the parts leave of `s`
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Any

PARTS = ("generation", "reference_forward", "policy_forward_backward", "optimizer", "other")  # of a step
# Of a run: a step's parts and what runs between the steps (the Trainer's `log`, `_save_checkpoint` and the
# callbacks' step-end and train-begin events). `reference_forward`: every log-prob pass while a generation
# batch is scored (the KL reference's, and the old policy's where it is not taken from the rollouts).
RUN_PARTS = ("generation", "reference_forward", "policy_forward_backward", "optimizer", "logging", "checkpoint",
             "callbacks", "other")
BETWEEN_STEPS = {"log": "logging", "_save_checkpoint": "checkpoint"}
TIMED_EVENTS = ("on_train_begin", "on_step_end")
TOKENS = ("prompt", "completion", "decode_steps", "completions")  # StepClock's counts per step


def sync() -> None:
    """Wait for the GPU's queued work, so that a wall-clock reading holds the kernels launched before
    it (CUDA runs them asynchronously); nothing on a CPU."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class StepClock:
    """Seconds per part of each optimizer step, from wrappers around the trainer's methods and a callback.
    Any Trainer's steps (total, training_step, optimizer); a GRPO trainer's parts too (`instrument`)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self.cpu: list[float] = []  # the process's CPU seconds of each step (all threads)
        self.tokens: list[dict[str, int]] = []
        self._cur: dict[str, float] = {}
        self._tok: dict[str, int] = {}
        self.totals: dict[str, float] = dict.fromkeys(RUN_PARTS, 0.0)  # over the run (`report`)
        self._scoring = False
        self._step_start = self._opt_start = self._cpu_start = 0.0

    def add(self, part: str, seconds: float) -> None:
        self._cur[part] = self._cur.get(part, 0.0) + seconds

    def count(self, key: str, n: int) -> None:
        """Add `n` to this step's count `key` (tokens, completions, sequences)."""
        self._tok[key] = self._tok.get(key, 0) + n

    @contextmanager
    def timed(self, part: str):
        sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            sync()
            self.add(part, time.perf_counter() - start)

    def instrument(self, trainer: Any) -> None:
        """Time `trainer.training_step`, its logging, checkpoints and callback events between steps; for a
        GRPO trainer also its rollouts, scoring and log-prob passes. The clock's `callback()` must be among
        the trainer's callbacks, before any whose events it should count as `callbacks`."""
        clock = self
        training_step = trainer.training_step

        def _training_step(*args, **kwargs):
            with clock.timed("_training_step"):
                return training_step(*args, **kwargs)

        trainer.training_step = _training_step
        for name, part in BETWEEN_STEPS.items():
            if hasattr(trainer, name):
                setattr(trainer, name, self._between_steps(getattr(trainer, name), part))
        handler = trainer.callback_handler
        call_event = handler.call_event

        def _call_event(event, *args, **kwargs):
            if event not in TIMED_EVENTS:
                return call_event(event, *args, **kwargs)
            sync()
            start = time.perf_counter()
            try:
                return call_event(event, *args, **kwargs)
            finally:
                sync()
                clock.totals["callbacks"] += time.perf_counter() - start

        handler.call_event = _call_event
        if hasattr(trainer, "_generate_and_score_completions"):
            self._instrument_grpo(trainer)

    def _between_steps(self, method: Any, part: str) -> Any:
        clock = self

        def timed(*args, **kwargs):
            sync()
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                sync()
                clock.totals[part] += time.perf_counter() - start

        return timed

    def report(self, seconds: float) -> dict[str, float]:
        """The run's seconds by part as `<part>_seconds` (RUN_PARTS), `other_seconds` being what the
        others leave of `seconds` (the train call's wall time: data loading, rewards, the Trainer's own
        work). The step-end events time the clock's own callback too: a few microseconds a step.

        >>> clock = StepClock()
        >>> clock.totals.update(generation=6.0, optimizer=1.0, logging=0.5)
        >>> clock.report(10.0)["other_seconds"], clock.report(10.0)["generation_seconds"]
        (2.5, 6.0)
        """
        parts = {f"{p}_seconds": round(self.totals[p], 3) for p in RUN_PARTS if p != "other"}
        return {**parts, "other_seconds": round(max(0.0, seconds - sum(self.totals[p] for p in RUN_PARTS
                                                                             if p != "other")), 3)}

    def _instrument_grpo(self, trainer: Any) -> None:
        clock = self
        generate, score = trainer._generate, trainer._generate_and_score_completions
        logps = trainer._get_per_token_logps_and_entropies

        def _generate(prompts):
            with clock.timed("generation"):
                out = generate(prompts)
            prompt_ids, completion_ids = out[0], out[1]
            clock.count("prompt", sum(len(p) for p in prompt_ids))
            clock.count("completion", sum(len(c) for c in completion_ids))
            clock.count("completions", len(completion_ids))
            # one generate call decodes its longest completion's length in sequential forward passes
            clock.count("decode_steps", max((len(c) for c in completion_ids), default=0))
            return out

        def _score(batch):
            clock._scoring = True
            try:
                with clock.timed("_scoring"):
                    return score(batch)
            finally:
                clock._scoring = False

        def _logps(*args, **kwargs):
            if not clock._scoring:
                return logps(*args, **kwargs)
            with clock.timed("reference_forward"):
                return logps(*args, **kwargs)

        trainer._generate, trainer._generate_and_score_completions = _generate, _score
        trainer._get_per_token_logps_and_entropies = _logps

    def callback(self):
        from transformers import TrainerCallback

        clock = self

        class Clock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                clock._cur, clock._tok = {}, {}
                sync()
                clock._step_start, clock._cpu_start = time.perf_counter(), time.process_time()

            def on_pre_optimizer_step(self, args, state, control, **kw):
                sync()
                clock._opt_start = time.perf_counter()

            def on_optimizer_step(self, args, state, control, **kw):
                sync()
                clock.add("optimizer", time.perf_counter() - clock._opt_start)

            def on_step_end(self, args, state, control, **kw):
                c = clock._cur
                sync()
                total = time.perf_counter() - clock._step_start
                scoring = c.get("_scoring", 0.0)
                parts = {
                    "generation": c.get("generation", 0.0),
                    "reference_forward": c.get("reference_forward", 0.0),
                    "policy_forward_backward": c.get("_training_step", 0.0) - scoring,
                    "optimizer": c.get("optimizer", 0.0),
                }
                parts["other"] = total - sum(parts.values())
                for part, seconds in parts.items():
                    clock.totals[part] += seconds
                clock.steps.append({"step": total, **parts})
                clock.cpu.append(time.process_time() - clock._cpu_start)
                clock.tokens.append(dict(clock._tok))

        return Clock()

    def mean_step(self, warmup: int, counts: tuple[str, ...] = TOKENS) -> tuple[dict[str, float], dict[str, float]]:
        """(mean seconds of the step and of each of PARTS, mean of each count in `counts`) over the
        steps after the first `warmup`."""
        measured, tokens = self.steps[warmup:], self.tokens[warmup:]
        if not measured:
            raise RuntimeError(f"no step measured: {len(self.steps)} steps ran, {warmup} of them warm-up")
        mean = {k: statistics.fmean(s[k] for s in measured) for k in ("step", *PARTS)}
        return mean, {k: statistics.fmean(t.get(k, 0) for t in tokens) for k in counts}
