"""Stage `evaluate`: GSM8K accuracy of the SFT and GRPO models (and the base model by a flag).

Reads the problems (default: the prepared test split), generates greedy completions on
vLLM or transformers (components/evaluation/generation.py, `evaluate.backend`), scores them with the
project's one scorer (components/evaluation/scoring.py, components/problems/gsm8k.py) and writes into
`evaluate.output_dir` (components/evaluation/reports.py):

- `<model>.json`: `accuracy_strict` (the `<answer>` tag of a well-formed completion),
  `accuracy_flexible` (the last number, lm-evaluation-harness's flexible-extract idea),
  `format_rate`, `mean_completion_tokens`, `n`, Wilson 95% intervals, completions per
  second and the backend (DVC metrics); with `evaluate.num_samples` k > 0 (default 8) also
  the sampled metrics at the training temperature: `sampled_accuracy_*`, `pass_at_k_*`,
  `maj_at_k_*` with their intervals (components/evaluation/scoring.py);
- `<model>.items.jsonl`: per problem `id`, `gold`, `completion`, `extracted`, `correct`
  (+ the flexible and format columns, and the k samples' answers and verdicts); the
  promotion gate pairs models by `id`;
- `comparison.json`: GRPO against SFT (and against base), on the same items:
  `delta`, `ci95` (Newcombe's paired interval), `p_value` (exact McNemar), for
  `evaluate.primary_metric`, plus every metric in `by_metric` (pass@k and maj@k paired
  the same way, mean sampled accuracy by a normal interval over the item differences).

All of it is logged to MLflow in a run named `evaluate` (metrics `<model>/<metric>`, the
reports as artifacts, the items as a table the UI can browse). Files appear atomically:
a failed run leaves the previous reports in place.

A model generated on vLLM in its own venv leaves the engine's own log in `<model>.vllm.log`
beside its reports (not a DVC output: rewritten by each run, gitignored), logged to the
stage's MLflow run under `logs/` whether the stage succeeds or fails; the console shows the
engine's progress, the warnings that matter and its errors (components/evaluation/vllm_backend.py).

The protocol `lm-eval-gsm8k` (components/evaluation/lm_eval_gsm8k.py) swaps in lm-evaluation-harness's
5-shot gsm8k prompts and scoring, for numbers comparable with published ones.

    python -m components.evaluate                                   # the DVC stage
    python -m components.evaluate -S evaluate.backend=transformers -S evaluate.limit=50

To evaluate any other model (a folder, a hub id, models:/NAME@ALIAS): `grpoflow evaluate`
(pipelines/evaluation/any_model.py).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from components.common.entry import stage_main
from components.common.errors import EvaluationError
from components.common.params import Params
from components.evaluation.metrics import compare, compare_bands
from components.evaluation.reports import Results, log_to_mlflow, write_reports
from components.evaluation.scoring import data_source, evaluate_model
from components.models.modelio import is_model_or_adapter_dir
from components.models.resolve import resolve_model
from components.problems.sources import load_problems

log = logging.getLogger("grpoflow.evaluate")

STAGE = "evaluate"
PAIRS = [("grpo", "sft"), ("grpo", "base"), ("sft", "base")]


def stage_models(params: Params) -> dict[str, str]:
    """{name: folder} of the models the stage evaluates, in report order."""
    models = {}
    if params.evaluate.include_base:
        models["base"] = params.model.base_dir
    models["sft"] = params.sft.output_dir
    models["grpo"] = params.grpo.output_dir
    return models


def vllm_log(params: Params, model: str) -> Path:
    """Where the vLLM engine's log of `model`'s generation goes: beside its reports."""
    return Path(params.evaluate.output_dir) / f"{model}.vllm.log"


def comparisons(results: Results, primary: str, target_band: str = "") -> dict[str, Any]:
    """Each pair on all the items, and on the target band, the other bands and per step count."""
    return {
        f"{a}_vs_{b}": {"a": a, "b": b, **compare(results[a][1], results[b][1], primary),
                        **compare_bands(results[a][1], results[b][1], primary, target_band)}
        for a, b in PAIRS
        if a in results and b in results
    }


def score_models(params: Params) -> dict[str, Any]:
    """Evaluate the stage's models, write the reports, return {results, comparison, paths}."""
    cfg = params.evaluate
    data = data_source(params)
    models = {}
    for name, path in stage_models(params).items():
        if not is_model_or_adapter_dir(path):
            stage = {"base": "model"}.get(name, name)
            raise EvaluationError(
                f"{name} model folder {path} is missing or has neither config.json with *.safetensors nor a "
                "LoRA adapter; "
                f"run `dvc repro {stage}` first"
            )
        models[name] = resolve_model(path)
    problems = load_problems(data, cfg.limit)
    results = {
        name: evaluate_model(model, problems, params, protocol=cfg.protocol, backend=cfg.backend, data=data,
                             vllm_log=vllm_log(params, name))
        for name, model in models.items()
    }
    comparison = comparisons(results, cfg.primary_metric, cfg.target_band)
    paths = write_reports(cfg.output_dir, results, comparison)
    return {"results": results, "comparison": comparison, "paths": paths}


def summary(results: Results, comparison: dict[str, Any] | None) -> dict[str, Any]:
    """What the stage prints: the headline metrics per model and each pair's test."""
    keys = ("n", "accuracy_strict", "accuracy_flexible", "format_rate", "mean_completion_tokens",
            "completions_per_second", "backend", "num_samples", "sampled_accuracy_strict", "pass_at_k_strict",
            "maj_at_k_strict")
    out: dict[str, Any] = {name: {k: m[k] for k in keys if k in m} for name, (m, _) in results.items()}
    for name, (m, _) in results.items():  # evaluate.target_band: the band and the others
        for part in ("target", "in_band"):
            if part in m:
                out[name][part] = {k: m[part][k] for k in ("n", "accuracy_flexible", "accuracy_strict") if k in m[part]}
    for pair, res in (comparison or {}).items():
        out[pair] = {k: res[k] for k in ("metric", "delta", "ci95", "p_value")}
        for part in ("target", "in_band"):
            if part in res:
                out[pair][part] = {k: res[part][k] for k in ("metric", "n", "delta", "ci95", "p_value")}
    return out


def run(params: Params) -> dict[str, Any]:
    """The stage inside its MLflow run; prints the summary as JSON."""
    from components.common.tracking import stage_run

    data = data_source(params)
    local = {Path(data[6:]).stem: (data[6:], "evaluation")} if data.startswith("jsonl:") else None
    logs = [vllm_log(params, name) for name in stage_models(params)]
    with stage_run(STAGE, params, datasets=local, logs=logs):
        out = score_models(params)
        log_to_mlflow(out["results"], out["comparison"], out["paths"], params.evaluate.log_items_table)
    print(json.dumps(summary(out["results"], out["comparison"]), indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    return stage_main(STAGE, __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
