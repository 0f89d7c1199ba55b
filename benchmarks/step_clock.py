"""Where a training step's seconds go: a clock for TRL trainers, and the useful FLOPs of a step.

Shared by benchmarks/grpo_step.py (a GRPO step against the machine's floors) and
benchmarks/gpu_check.py (the SFT and GRPO stages' trainers on a GPU):

    StepClock          seconds per optimizer step and per part of it, from wrappers around the
                       trainer's methods and a callback: any Trainer's training_step and optimizer
                       step; a GRPO trainer's rollouts, reference log-probs and scoring too; on a GPU
                       each reading waits for the queued kernels (`sync`)
    step_flops         useful FLOPs of a step's parts (2 N per token and forward pass, N the linear
                       layers' weights, plus attention; a backward pass 2 N more with LoRA, 4 N without)
    bench_args         a stage's TRL arguments for a measured run: no MLflow, no checkpoints
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PARTS = ("generation", "reference_forward", "policy_forward_backward", "optimizer", "other")
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
        """Time `trainer.training_step`; for a GRPO trainer also its rollouts, scoring and log-prob passes."""
        clock = self
        training_step = trainer.training_step

        def _training_step(*args, **kwargs):
            with clock.timed("_training_step"):
                return training_step(*args, **kwargs)

        trainer.training_step = _training_step
        if hasattr(trainer, "_generate_and_score_completions"):
            self._instrument_grpo(trainer)

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


def step_flops(model: Any, tokens: dict[str, float], lora: bool, reference_passes: int) -> dict[str, float]:
    """Useful FLOPs of one step's parts (see the module docstring)."""
    import torch

    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    cfg = model.config
    layers, width = (cfg.num_hidden_layers,
                     cfg.num_attention_heads * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads))
    seqs = max(tokens.get("sequences", 1), 1)
    per_seq = (tokens["prompt"] + tokens["completion"]) / seqs
    attention = 4 * layers * width * per_seq / 2  # per token, at the mean causal context

    def forward(n_tokens: float) -> float:
        return n_tokens * (2 * linear + attention)

    all_tokens = tokens["prompt"] + tokens["completion"]
    return {
        "generation": forward(all_tokens),
        "reference_forward": reference_passes * forward(all_tokens),
        "policy_forward_backward": forward(all_tokens) * (2 if lora else 3),
        "linear_parameters": linear,
    }



def bench_args(args: Any, steps: int, output_dir: Path) -> Any:
    """A stage's TRL arguments for a measured run: `steps` steps, logged every step, nothing reported
    or saved (no MLflow, no checkpoints)."""
    for key, value in {"max_steps": steps, "report_to": [], "save_strategy": "no", "logging_steps": 1,
                       "output_dir": str(output_dir)}.items():
        setattr(args, key, value)
    return args



def throughput(clock: StepClock, warmup: int, log_history: list[dict[str, Any]]) -> dict[str, Any]:
    """Completions and completion tokens a second over the steps after the first `warmup` (every
    completion sampled and scored in them, over their seconds), the mean share of informative groups
    (the trainer's `informative_groups` metric: groups whose rewards are not all equal), and the
    completions of those groups a second. `cpu_completions_per_second`: completions per CPU second of
    the process (every thread's): on a machine shared with other jobs, less sensitive to their load
    than the wall-clock figure."""
    seconds = sum(s["step"] for s in clock.steps[warmup:])
    cpu = sum(clock.cpu[warmup:])
    counts = clock.tokens[warmup:]
    completions = sum(t.get("completions", 0) for t in counts)
    tokens = sum(t.get("completion", 0) for t in counts)
    shares = [e["informative_groups"] for e in log_history
              if e.get("step", 0) > warmup and e.get("informative_groups") is not None]
    share = statistics.fmean(shares) if shares else None
    return {
        "completions": completions,
        "completions_per_second": round(completions / seconds, 4) if seconds else 0.0,
        "completion_tokens_per_second": round(tokens / seconds, 2) if seconds else 0.0,
        "cpu_completions_per_second": round(completions / cpu, 4) if cpu else 0.0,
        "informative_groups": round(share, 4) if share is not None else None,
        "informative_completions_per_second": (round(share * completions / seconds, 4)
                                               if seconds and share is not None else None),
    }
