"""Stage `selection`: the prompts GRPO trains on, chosen by the SFT model's pass rate (offline dynamic
sampling, as in DAPO; TRL's GRPOTrainer does not offer it).

A GRPO group whose completions all earn the same reward has zero advantage: no learning signal.
For a prompt the model never solves, or always solves, that is every group. This stage samples
`selection.num_samples` (k) completions per candidate from `selection.model_dir` (the SFT model GRPO
starts from) at `grpo.trainer.temperature`, on vLLM where available (components/evaluation/generation.py, as the
evaluate stage), scores them with the shared checker (components/problems/gsm8k.py; `selection.mode`:
flexible = the right answer, strict = the right answer in the `<answer>` tag, what the accuracy
reward pays) and keeps the prompts whose pass rate is in the band: by default 0 < p < 1, some but
not all samples right (`selection.keep_unsolved`, `selection.keep_solved`,
`selection.min_pass_rate`, `selection.max_pass_rate`).

Candidates are the first `selection.max_candidates` problems of `<data.output_dir>/grpo.jsonl`.
Writes, each atomically:
- `selection.output_file`: the kept problems with `pass_rate` and `greedy_correct` (GRPO reads it);
- `selection.metrics_file`: candidates, kept, never_solved, always_solved (DVC metrics; the mean pass
  rates, the prompts in between but outside the band, the backend and seconds are MLflow metrics
  and the stage's last log line);
- `selection.histogram_file`: prompts per pass rate, and whether the band keeps it (DVC plot data;
  the same histogram is the MLflow figure `selection/pass_rates.png`).
If fewer than `selection.min_prompts` prompts (or one GRPO step's) are kept, the stage stops with the
counts and the params to turn, and writes nothing: GRPO never trains on (almost) nothing.

    python -m components.selection
    python -m components.selection -S selection.keep_unsolved=true -S selection.max_candidates=400
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from components.common.entry import stage_main
from components.common.errors import DataError
from components.common.params import Params, SelectionParams

STAGE = "selection"
METRICS_KEYS = ("candidates", "kept", "never_solved", "always_solved")  # the DVC metrics file: few keys, so
# that `dvc metrics show` stays readable (its columns are every metrics file's keys together)


def pass_rate_kept(rate: float, cfg: SelectionParams) -> bool:
    """Whether a prompt with this pass rate is kept.

    >>> from components.common.params import SelectionParams
    >>> [pass_rate_kept(p, SelectionParams()) for p in (0.0, 0.125, 0.875, 1.0)]
    [False, True, True, False]
    >>> [pass_rate_kept(p, SelectionParams(keep_unsolved=True, max_pass_rate=0.5)) for p in (0.0, 0.5, 0.625)]
    [True, True, False]
    """
    if rate == 0.0 and not cfg.keep_unsolved:
        return False
    if rate == 1.0 and not cfg.keep_solved:
        return False
    return cfg.min_pass_rate <= rate <= cfg.max_pass_rate


def prompts_per_step(params: Params) -> int:
    """Prompts one GRPO optimizer step consumes: completions per step / the group size G."""
    t = params.grpo.trainer
    completions = int(t.get("per_device_train_batch_size") or 8) * int(t.get("gradient_accumulation_steps") or 1)
    return max(1, completions // t["num_generations"])


def count(rates: list[float | None], kept: list[bool], k: int) -> dict[str, Any]:
    """The stage's metrics from the candidates' pass rates and the keep decisions.

    >>> c = count([0.0, 0.0, 0.5, 1.0], [False, False, True, False], 2)
    >>> c["candidates"], c["kept"], c["never_solved"], c["always_solved"], c["mean_pass_rate"]
    (4, 1, 2, 1, 0.375)
    """
    scored = [r for r in rates if r is not None]
    return {
        "candidates": len(rates),
        "kept": sum(kept),
        "never_solved": sum(r == 0.0 for r in scored),
        "always_solved": sum(r == 1.0 for r in scored),
        "dropped_in_between": sum(1 for r, keep in zip(rates, kept, strict=True)
                                  if r not in (None, 0.0, 1.0) and not keep),
        "mean_pass_rate": sum(scored) / len(scored) if scored else None,
        "kept_mean_pass_rate": (sum(r for r, keep in zip(rates, kept, strict=True) if keep and r is not None)
                                / max(1, sum(kept))) if scored else None,
        "num_samples": k,
    }


def histogram(rates: list[float | None], k: int, cfg: SelectionParams) -> list[dict[str, Any]]:
    """Prompts per pass rate (0, 1/k, ..., 1) and whether the band keeps that rate.

    >>> from components.common.params import SelectionParams
    >>> histogram([0.0, 0.5, 0.5], 2, SelectionParams())
    [{'pass_rate': 0.0, 'prompts': 1, 'kept': False}, {'pass_rate': 0.5, 'prompts': 2, 'kept': True}, {'pass_rate': 1.0, 'prompts': 0, 'kept': False}]
    """  # noqa: E501
    if not k:
        return []
    counts = Counter(round(r * k) for r in rates if r is not None)
    return [{"pass_rate": j / k, "prompts": counts.get(j, 0), "kept": pass_rate_kept(j / k, cfg)} for j in range(k + 1)]


def pass_rates(params: Params, rows: list[dict[str, str]]) -> tuple[list[float], list[bool], str]:
    """(pass rate of the k samples, greedy answer right, backend) per problem."""
    from components.evaluation.generation import GenerationSettings, generate
    from components.models.modelio import load_tokenizer
    from components.models.resolve import resolve_model
    from components.problems import gsm8k

    cfg = params.selection
    model_dir = resolve_model(cfg.model_dir).model_dir  # a LoRA adapter: base + adapter merged
    tokenizer = load_tokenizer(model_dir)
    prompts = [gsm8k.render_prompt(r["question"], tokenizer) for r in rows]
    settings = GenerationSettings(
        max_new_tokens=cfg.max_new_tokens, dtype=params.evaluate.dtype, seed=cfg.seed, num_samples=cfg.num_samples,
        temperature=params.grpo.trainer["temperature"], vllm_python=params.evaluate.vllm_python,
        vllm_args=dict(params.evaluate.vllm_args),
    )
    gen = generate(model_dir, prompts, settings, cfg.backend, tokenizer=tokenizer, vllm_log=engine_log(params))
    rates = [sum(gsm8k.is_correct(s, r["gold"], cfg.mode) for s in samples) / len(samples)
             for samples, r in zip(gen.samples, rows, strict=True)]
    greedy = [gsm8k.is_correct(c, r["gold"], cfg.mode) for c, r in zip(gen.completions, rows, strict=True)]
    return rates, greedy, gen.backend


def engine_log(params: Params) -> Path:
    """Where the vLLM engine's log goes: beside the stage's metrics (not a DVC output; gitignored)."""
    return Path(params.selection.metrics_file).with_suffix(".vllm.log")


def too_few(counts: dict[str, Any], needed: int, per_step: int) -> str:
    return (
        f"selection kept {counts['kept']} of {counts['candidates']} prompts (never solved {counts['never_solved']}, "
        f"always solved {counts['always_solved']}, in between but outside the band {counts['dropped_in_between']}); "
        f"GRPO needs at least {needed} (selection.min_prompts, and one step's {per_step}). Widen the band "
        "(selection.keep_unsolved=true, selection.min_pass_rate / max_pass_rate), raise selection.max_candidates or "
        "selection.num_samples, or lower selection.min_prompts"
    )


def choose_prompts(params: Params) -> dict[str, Any]:
    """Score the candidates, keep the band, write the outputs; returns the metrics."""
    from components.common.files import csv_bytes, json_bytes, jsonl_bytes, write_bytes
    from components.models.modelio import require_model_dir
    from components.problems.sources import read_split

    cfg = params.selection
    require_model_dir(cfg.model_dir, "SFT model", "sft")
    rows = read_split(Path(params.data.output_dir) / "grpo.jsonl", limit=cfg.max_candidates or None)
    start = time.monotonic()
    if cfg.num_samples:
        rates, greedy, backend = pass_rates(params, rows)
        kept = [pass_rate_kept(r, cfg) for r in rates]
    else:  # no sampling: every candidate, no pass rate
        rates, greedy, backend, kept = [None] * len(rows), [None] * len(rows), "none", [True] * len(rows)
    counts = count(rates, kept, cfg.num_samples)
    counts.update(seconds=round(time.monotonic() - start, 1), backend=backend)
    per_step = prompts_per_step(params)
    needed = max(cfg.min_prompts, per_step)
    if counts["kept"] < needed:
        raise DataError(too_few(counts, needed, per_step))
    selected = [{**row, "pass_rate": rate, "greedy_correct": g}
                for row, rate, g, keep in zip(rows, rates, greedy, kept, strict=True) if keep]
    hist = histogram(rates, cfg.num_samples, cfg)
    write_bytes(cfg.output_file, jsonl_bytes(selected))
    write_bytes(cfg.histogram_file, csv_bytes(hist, ["pass_rate", "prompts", "kept"]))
    write_bytes(cfg.metrics_file, json_bytes({key: counts[key] for key in METRICS_KEYS}))
    return {"metrics": counts, "histogram": hist}


def histogram_figure(hist: list[dict[str, Any]], k: int):
    """Bar chart of prompts per pass rate, kept rates in one colour, dropped ones in another."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([h["pass_rate"] for h in hist], [h["prompts"] for h in hist], width=0.8 / k,
           color=["tab:green" if h["kept"] else "tab:gray" for h in hist])
    ax.set_xlabel(f"pass rate of the SFT model ({k} samples per prompt)")
    ax.set_ylabel("prompts")
    ax.set_title("GRPO prompt selection: kept (green), no signal or outside the band (gray)")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    return fig


def run(params: Params) -> dict[str, Any]:
    """The stage inside its MLflow run: counts as metrics, the histogram as a figure."""
    import mlflow

    from components.common.tracking import stage_run

    with stage_run(STAGE, params, logs=[engine_log(params)]):
        out = choose_prompts(params)
        m = out["metrics"]
        mlflow.log_metrics(
            {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        )
        mlflow.log_artifact(params.selection.histogram_file, artifact_path=STAGE)
        if out["histogram"]:
            fig = histogram_figure(out["histogram"], params.selection.num_samples)
            mlflow.log_figure(fig, f"{STAGE}/pass_rates.png")
    print(
        f"selection: kept {m['kept']} of {m['candidates']} prompts (never solved {m['never_solved']}, always solved "
        f"{m['always_solved']}) -> {params.selection.output_file} ({m['seconds']} s, {m['backend']})"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    return stage_main(STAGE, __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
