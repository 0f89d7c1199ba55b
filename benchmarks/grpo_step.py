"""Where one GRPO step's seconds go, against this machine's arithmetic floor, measured in one run.

Builds, in a fresh temporary folder, the data and base model of the embedded defaults or a preset (`python -m
components.data` and `components.model`, what `dvc repro` runs), then trains the GRPO stage's own
trainer (components/grpo.py: the same TRL config, LoRA, rewards, prompts and trainer class; no
MLflow, no checkpoints) from the base model for `--warmup` + `--steps` steps and times the parts of
each measured step:

  generation                 the rollouts (TRL's `_generate`: every completion of the step)
  reference_forward          log-probabilities under the frozen reference (and the old policy, when
                             the step needs them) while the batch is scored
  policy_forward_backward    the loss's forward and backward passes
  optimizer                  the optimizer step (gradient clipping included)
  other                      the rest of the step (rewards, advantages, padding, logging)

In the same run it measures this machine's matrix-product rate (a 2048 x 2048 float32 product;
bfloat16 too, on a 256 x 256 product first, because CPUs without native bf16 run it at a small
fraction of float32) and turns the step's useful FLOPs into a floor: 2 N per token for a forward
pass (prompt and completion tokens; N = the parameters of every linear layer, LoRA included, plus
attention's 4 x layers x width x context), 2 N more per token for LoRA's backward pass (4 N for full
fine-tuning), at the measured rate of the dtype the path computes in.

Decoding a few sequences is bound by reading the weights, not by arithmetic: each decode step reads
every linear layer's weights (and the KV cache) once for a handful of tokens. The run also measures
this machine's memory read rate (a sum over 1 GiB) and reports a roofline floor beside the FLOP
floor: generation at the larger of its FLOP time and its read time (decode steps x (weight bytes in
the rollouts' dtype + KV-cache bytes at the mean context)). Prints JSON:

  step_seconds, parts{...}      mean seconds per measured step, and per part
  tokens{prompt, completion, decode_steps}
                                mean tokens per step (real ones, no padding); sequential decode steps
  floor_seconds, floor_ratio    the step's FLOPs at the measured rate; step_seconds / floor_seconds
  roofline_seconds, roofline_ratio
                                the same with generation's weight and KV-cache reads at the read rate
  matmul_gflops{...}, read_gbps, threads, native_bf16, precision, settings

Throughput over the measured steps (`--steps` counts generation batches, each
trainer.steps_per_generation optimizer steps, so that every measured step's completions were generated
in the measured window):

  completions_per_second, completion_tokens_per_second
                                every completion sampled and scored, over the steps' wall seconds
  cpu_completions_per_second    the same over the process's CPU seconds (less moved by other jobs)
  informative_groups, informative_completions_per_second
                                the share of groups with a reward spread (the only ones that teach),
                                and their completions a second

With `--compare` it runs the GRPO path of smollm2-135m-cpu-rl before issue 41 (PATHS["before"]: 2
prompts x 8 completions a step, one `generate` call each, per-sequence log-probs, bf16 rollouts on
merged LoRA weights) and the embedded defaults' path (or the preset's) side by side (the same prompts, seed, machine and
max_completion_length) and prints `{"before": {...}, "after": {...}, "throughput_speedup": after /
before completions a second, "informative_speedup", "cpu_throughput_speedup", "speedup": before /
after seconds a step}`. The paths are params overrides, so that what is measured is what the stage runs.

    python benchmarks/grpo_step.py --compare
    python benchmarks/grpo_step.py --compare --steps 1 -S grpo.trainer.max_completion_length=64
    python benchmarks/grpo_step.py --preset smollm2-135m-cpu-rl --path after

Results: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.grpo_gain import OFFLINE_ENV, kept_workdir, run_stage  # noqa: E402 (the same environment and stage runner)
from benchmarks.step_clock import PARTS, StepClock, bench_args, step_flops, throughput  # noqa: E402

# What --compare puts side by side (overrides on top of the preset): the GRPO path of
# smollm2-135m-cpu-rl before issue 41 (2 prompts x 8 completions a step, one generate call each,
# per-sequence log-probs, bf16 rollouts on merged LoRA weights) and the defaults (or preset) as they are.
PATHS: dict[str, list[str]] = {
    "before": ["grpo.rollout_engine=generate", "grpo.informative_groups_only=false", "grpo.lean_logps=false",
               "grpo.logps_batching=per_sequence", "grpo.rollout_merge_lora=true",
               "grpo.trainer.per_device_train_batch_size=16", "grpo.trainer.steps_per_generation=null",
               "grpo.trainer.generation_batch_size=null", "grpo.trainer.gradient_accumulation_steps=1"],
    "after": [],  # the embedded defaults (or the preset) as they are
}


def figure(seconds: float) -> float:
    """Four significant figures: a tiny model's floor of a few milliseconds keeps its digits."""
    return float(f"{seconds:.4g}")


def best_seconds(work, repeats: int) -> float:
    """The fastest of `repeats` timed calls of `work`, after one untimed warm-up call."""
    work()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_gflops(dtype_name: str, size: int = 2048, repeats: int = 3) -> float:
    """GFLOP/s of a size x size matrix product in `dtype_name` at torch's thread count (best of `repeats`)."""
    import torch

    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    return 2 * size**3 / best_seconds(lambda: a @ b, repeats) / 1e9


def read_gbps(gib: float = 1.0, repeats: int = 3) -> float:
    """GB/s of reading a `gib` GiB float32 tensor once (a sum) at torch's thread count (best of `repeats`)."""
    import torch

    x = torch.ones(int(gib * (1 << 30)) // 4)
    return x.numel() * 4 / best_seconds(x.sum, repeats) / 1e9


def machine_rates() -> dict[str, float]:
    """float32 on 2048^2; bfloat16 on 256^2 first and on 2048^2 where that ran at over 10 GFLOP/s or
    the CPU has native bf16 (an AVX512_BF16 EPYC ran the 256^2 product at 4 GFLOP/s, the 2048^2 one at 420)."""
    from components.training.precision import native_bf16

    rates = {"float32": matmul_gflops("float32")}
    bf16 = matmul_gflops("bfloat16", size=256, repeats=2)
    rates["bfloat16"] = matmul_gflops("bfloat16") if bf16 > 10 or native_bf16() else bf16
    return {k: round(v, 1) for k, v in rates.items()}


def decode_read_bytes(model: Any, tokens: dict[str, float], linear: int, weight_bytes: int) -> float:
    """Bytes one step's rollouts read: per sequential decode step every one of the `linear` weights
    (step_flops' linear_parameters) once at `weight_bytes` each, and the KV cache of every sequence at
    its mean context."""
    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_per_token = 2 * cfg.num_hidden_layers * getattr(cfg, "num_key_value_heads", heads) * head_dim * weight_bytes
    seqs = max(tokens.get("sequences", 1), 1)
    context = (tokens["prompt"] + tokens["completion"] / 2) / seqs
    return tokens.get("decode_steps", 0) * (linear * weight_bytes + seqs * context * kv_per_token)


def optimizer_steps_per_generation(args: Any) -> int:
    """Optimizer steps that share one generation batch: steps_per_generation micro-batches, of which
    gradient_accumulation_steps make one step (8 and 8: one on-policy step of the whole batch).

    >>> from types import SimpleNamespace as A
    >>> [optimizer_steps_per_generation(A(steps_per_generation=8, gradient_accumulation_steps=g)) for g in (1, 2, 8)]
    [8, 4, 1]
    """
    return max(args.steps_per_generation // args.gradient_accumulation_steps, 1)


def build_trainer(workdir: Path, overrides: list[str], generations: int, clock: StepClock):
    """The GRPO stage's trainer from the base model, as components/grpo.py builds it (no MLflow, no
    checkpoints), for `generations` generation batches (each trainer.steps_per_generation steps)."""
    from components import grpo
    from components.problems.sources import read_split
    from components.training.rewards import build_rewards
    from pipelines.params.config import load_params

    os.chdir(workdir)
    params = load_params("params.yaml", [*overrides, "grpo.init_dir=models/base"])
    args, peft_config = grpo.trainer_settings(params)
    bench_args(args, generations * optimizer_steps_per_generation(args),
               workdir / "checkpoints").log_completions = False
    model, tokenizer, _base, _inputs, (args, peft_config) = grpo.start_model(params, (args, peft_config))
    rows = read_split(Path(params.data.output_dir) / "grpo.jsonl")
    dataset = grpo.prompt_dataset(rows, tokenizer)
    reward_funcs, _ = build_rewards(params.rewards)
    trainer = grpo.trainer_class(params)(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config,
        callbacks=[clock.callback()], reward_funcs=reward_funcs, stage_params=params.grpo,
    )
    clock.instrument(trainer)
    return trainer, params


def measure(
    workdir: Path, overrides: list[str], warmup: int, steps: int, rates: dict[str, float], read_rate: float
) -> dict[str, Any]:
    import torch

    from components.training import precision

    clock = StepClock()
    trainer, params = build_trainer(workdir, overrides, warmup + steps, clock)
    per_generation = optimizer_steps_per_generation(trainer.args)
    seqs = trainer.args.generation_batch_size // per_generation  # completions a step trains (all kept)
    with redirect_stdout(sys.stderr):  # the trainer's log lines: stdout keeps the JSON only
        trainer.train()
    warmup *= per_generation  # whole generation batches: each one's generation falls in its first step
    measured = clock.steps[warmup:]
    mean, tok = clock.mean_step(warmup)
    lora = bool(params.grpo.use_lora)
    reference_passes = (1 if trainer.args.beta else 0) + (1 if trainer.args.num_iterations > 1 else 0)
    flops = step_flops(trainer.model, {**tok, "sequences": seqs}, lora, reference_passes)
    dtype = "bfloat16" if trainer.args.bf16 else "float32"
    rate = rates[dtype] * 1e9
    floor = {k: flops[k] / rate for k in ("generation", "reference_forward", "policy_forward_backward")}
    floor_seconds = sum(floor.values())
    # the rollouts read weights in the dtype they decode in: bf16 where training autocasts on a CPU
    # (components/training/grpo_trainer.py rollout_context), else the model's own
    rollout_bytes = 2 if trainer.args.bf16 else next(trainer.model.parameters()).element_size()
    reads = decode_read_bytes(trainer.model, {**tok, "sequences": seqs * per_generation}, flops["linear_parameters"],
                              rollout_bytes) / (read_rate * 1e9)
    roofline = {**floor, "generation": max(floor["generation"], reads)}
    roofline_seconds = sum(roofline.values())
    return {
        "step_seconds": round(mean["step"], 4),
        "parts": {k: round(mean[k], 4) for k in PARTS},
        "tokens": {k: round(tok[k], 1) for k in ("prompt", "completion", "decode_steps")},
        "floor_seconds": figure(floor_seconds),
        "floor_ratio": round(mean["step"] / floor_seconds, 3),
        "floor_parts": {k: figure(v) for k, v in floor.items()},
        "roofline_seconds": figure(roofline_seconds),
        "roofline_ratio": round(mean["step"] / roofline_seconds, 3),
        "generation_read_seconds": figure(reads),
        **throughput(clock, warmup, trainer.state.log_history),
        "max_completion_length": trainer.args.max_completion_length,
        "generation_batch": trainer.args.generation_batch_size,
        "steps_per_generation": per_generation,
        "precision": dtype,
        "threads": torch.get_num_threads(),
        "native_bf16": precision.native_bf16(),
        "steps_measured": len(measured),
        "per_step": [{k: round(v, 4) for k, v in s.items()} for s in measured],
        "linear_parameters": flops["linear_parameters"],
        "overrides": overrides,
    }


def compared(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Both paths and their ratios: `throughput_speedup` (completions a second, after / before: what
    issue 41 asks), `informative_speedup` (completions of informative groups a second), `speedup`
    (seconds a step, before / after; the steps of the two paths may train different numbers of
    completions)."""
    before, after = results["before"], results["after"]

    def ratio(key: str) -> float | None:
        return round(after[key] / before[key], 2) if before.get(key) and after.get(key) is not None else None

    return {"before": before, "after": after, "throughput_speedup": ratio("completions_per_second"),
            "informative_speedup": ratio("informative_completions_per_second"),
            "cpu_throughput_speedup": ratio("cpu_completions_per_second"),
            "speedup": round(before["step_seconds"] / after["step_seconds"], 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="",
                        help="a preset of presets/ (default: none, the embedded defaults)")
    parser.add_argument("--steps", type=int, default=3,
                        help="measured generation batches per path, each trainer.steps_per_generation steps "
                             "(default 3)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="generation batches run first and not measured (default 1)")
    parser.add_argument("--compare", action="store_true", help="today's path and the new one in one run (PATHS)")
    parser.add_argument("--path", choices=sorted(PATHS), default="after",
                        help="the path without --compare (default after)")
    parser.add_argument("--after-first", action="store_true",
                        help="with --compare, run the new path first "
                             "(the machine's other load then falls on the other)")
    parser.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE", help="a params override")
    parser.add_argument("--keep", default=None, help="build the workspace in this folder (new or empty) and keep it")
    args = parser.parse_args(argv)

    from pipelines.params import presets

    base = [*(presets.overrides(args.preset) if args.preset else []), "data.synthetic_test_size=20",
            "data.synthetic_test_top_band_size=0", *args.set]
    root = kept_workdir(parser, args.keep, "grpo-step-")
    os.environ.update(OFFLINE_ENV)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cwd = os.getcwd()
    try:
        shutil.copy(REPO / "params.yaml", root / "params.yaml")
        run_stage(root, "data", base, env, label="grpo_step")
        run_stage(root, "model", base, env, label="grpo_step")
        rates, read_rate = machine_rates(), round(read_gbps(), 1)
        print(f"grpo_step: matmul GFLOP/s {rates}, memory read {read_rate} GB/s", file=sys.stderr)
        names = (["after", "before"] if args.after_first else ["before", "after"]) if args.compare else [args.path]
        results = {}
        for name in names:
            start = time.monotonic()
            load = round(os.getloadavg()[0], 2)
            results[name] = {**measure(root, [*base, *PATHS[name]], args.warmup, args.steps, rates, read_rate),
                             "matmul_gflops": rates, "read_gbps": read_rate,
                             "load_average_1m": [load, round(os.getloadavg()[0], 2)]}  # at its start and end
            print(f"grpo_step: {name} took {time.monotonic() - start:.0f} s", file=sys.stderr)
            os.chdir(cwd)
        out: dict[str, Any] = {"preset": args.preset or "(embedded defaults)",
                               **(compared(results) if args.compare else results[args.path])}
        out["load_average_1m"] = round(os.getloadavg()[0], 2)
        print(json.dumps(out, indent=2))
    finally:
        os.chdir(cwd)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
