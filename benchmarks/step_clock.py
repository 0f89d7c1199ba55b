"""A training step's useful FLOPs and a measured run's settings, beside the stages' clock.

Shared by benchmarks/grpo_step.py (a GRPO step against the machine's floors) and
benchmarks/gpu_check.py (the SFT and GRPO stages' trainers on a GPU):

    StepClock          components/training/step_clock.py: seconds per optimizer step and per part of
                       it (the training stages report its run totals)
    step_flops         useful FLOPs of a step's parts (2 N per token and forward pass, N the linear
                       layers' weights, plus attention; a backward pass 2 N more with LoRA, 4 N without)
    bench_args         a stage's TRL arguments for a measured run: no MLflow, no checkpoints
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from components.training.step_clock import PARTS, StepClock  # noqa: F401 (re-exported for the benchmarks)


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
