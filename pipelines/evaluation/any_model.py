"""`grpoflow evaluate` and the `evaluation` Prefect flow: evaluate any model (a folder, a hub id, a
registered version such as models:/grpoflow-policy@champion, or an OpenAI-compatible server's base
URL such as http://127.0.0.1:8000/v1 from `grpoflow serve`) on a dataset.

`evaluate_one` downloads the model from
the MLflow registry (or takes a folder), generates on vLLM or transformers per
`evaluate.backend`, writes `<name>.json` / `<name>.items.jsonl` and logs an MLflow run
named `evaluate`. Use it to re-check the champion on new data or with the
lm-evaluation-harness protocol, on a schedule or by hand. The lm-eval protocol's few-shot
examples come from the data's own train split (`--data jsonl:DIR/test.jsonl` uses
DIR/train.jsonl, `hf:` sources their train split; `evaluate.fewshot_source` overrides), which
is printed and recorded (report key and MLflow tag `fewshot_source`):

    grpoflow evaluate --model models/grpo                           # any folder or models:/NAME@ALIAS
    grpoflow evaluate --model http://127.0.0.1:8000/v1 --limit 20   # a served model (grpoflow serve)
    grpoflow evaluate --model models:/grpoflow-policy@champion --data hf:openai/gsm8k:main --protocol lm-eval-gsm8k
    python -m pipelines.evaluation.any_model --model models:/grpoflow-policy@champion --limit 100
    python -m pipelines.evaluation.any_model --model models:/grpoflow-policy@champion \\
        --data hf:openai/gsm8k:main --protocol lm-eval-gsm8k
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from components.common.entry import one_line_errors
from components.common.errors import EvaluationError
from components.common.params import Params
from components.common.tracking import TAG_PREFIX, stage_run
from components.evaluate import STAGE as EVALUATE
from components.evaluation.endpoint import connect
from components.evaluation.reports import log_to_mlflow, write_reports
from components.evaluation.scoring import data_source, evaluate_model, fewshot_source
from components.models.resolve import is_endpoint, resolve_model
from components.problems.sources import load_problems
from pipelines.execution.services import service_env_defaults
from pipelines.params.config import add_params_args, load_checked, load_params


def _slug(spec: str) -> str:
    """A file and MLflow-metric name for a model spec.

    >>> _slug("models:/grpoflow-policy@champion"), _slug("models/grpo/"), _slug("Qwen/Qwen2.5-0.5B-Instruct")
    ('grpoflow-policy-champion', 'grpo', 'Qwen2.5-0.5B-Instruct')
    >>> _slug("http://127.0.0.1:8000/v1")
    'endpoint-127.0.0.1-8000'
    """
    if is_endpoint(spec):
        return "endpoint-" + re.sub(r"[^\w.-]+", "-", spec.split("://", 1)[1].split("/", 1)[0])
    tail = spec.rstrip("/").split("/")[-1] or "model"
    return re.sub(r"[^\w.-]+", "-", tail)


def evaluate_one(
    params: Params,
    model_spec: str,
    *,
    data: str | None = None,
    protocol: str | None = None,
    backend: str | None = None,
    limit: int | None = None,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Evaluate one model (folder, hub id or models:/NAME@ALIAS) and log an MLflow run `evaluate`.

    Unset arguments come from `params.evaluate`; reports go to `output` (default
    `<evaluate.output_dir>/cli/<name>`), with vLLM's engine log `<name>.vllm.log` when a vLLM
    subprocess generates (also an artifact of the run). Returns the metrics with `output_dir` and
    `mlflow_run_id`.
    """
    cfg = params.evaluate
    protocol = protocol or cfg.protocol
    backend = backend or cfg.backend
    limit = cfg.limit if limit is None else limit
    if limit < 0:
        raise EvaluationError(f"--limit must be >= 0, got {limit}")
    data = data_source(params, data)
    if not data.startswith(("jsonl:", "hf:")):
        raise EvaluationError(f"--data {data!r}: expected jsonl:PATH or hf:NAME[:CONFIG]")
    if protocol == "lm-eval-gsm8k":
        fewshot_source(params, data)  # no train split for the few-shot examples fails here, naming the setting
    name = _slug(model_spec)
    out_dir = Path(output or Path(cfg.output_dir) / "cli" / name)
    extra = {
        "evaluate.model": model_spec,
        "evaluate.data": data,
        "evaluate.protocol": protocol,
        "evaluate.backend": backend,
        "evaluate.limit": limit,
    }
    with tempfile.TemporaryDirectory(prefix="grpoflow-model-") as tmp:
        # Bad input fails here, before an MLflow run is opened.
        model = resolve_model(model_spec, download_dir=tmp, params=params)
        if model.endpoint:  # an unreachable server or unknown served model, too
            connect(model.endpoint, cfg.endpoint_model, cfg.endpoint_timeout, cfg.endpoint_retries)
        problems = load_problems(data, limit)
        vllm_log = out_dir / f"{name}.vllm.log"
        with stage_run(EVALUATE, params, extra_params=extra, logs=[vllm_log]) as run_:
            import mlflow

            mlflow.set_tags({f"{TAG_PREFIX}eval.model": model_spec})
            metrics, items = evaluate_model(
                model, problems, params, protocol=protocol, backend=backend, data=data, vllm_log=vllm_log
            )
            results = {name: (metrics, items)}
            paths = write_reports(out_dir, results, None)
            log_to_mlflow(results, None, paths, cfg.log_items_table)
    return {**metrics, "output_dir": str(out_dir), "mlflow_run_id": run_.info.run_id}



@task(name="evaluate", task_run_name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(
    params: Params,
    model: str,
    data: str | None,
    protocol: str | None,
    backend: str | None,
    limit: int | None,
    output: str | None,
) -> dict[str, Any]:
    return evaluate_one(
        params, model, data=data, protocol=protocol, backend=backend, limit=limit, output=output
    )


@flow(name="evaluation")
def evaluation_pipeline(
    model: str = "models:/grpoflow-policy@champion",
    data: str | None = None,
    protocol: str | None = None,
    backend: str | None = None,
    limit: int | None = None,
    output: str | None = None,
    params_file: str | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Evaluate `model` on `data` (default: the prepared test split); returns its metrics."""
    service_env_defaults()  # MLflow gives up on a server that does not answer within the budget
    params = load_params(params_file, overrides or [])
    return evaluate_task(params, model, data, protocol, backend, limit, output)


def cli_evaluate(args: argparse.Namespace) -> int:
    """`grpoflow evaluate`: one model (folder or MLflow URI) on a data source; prints the metrics JSON."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    metrics = evaluate_one(
        load_checked(args), args.model, data=args.data, protocol=args.protocol, backend=args.backend,
        limit=args.limit, output=args.output,
    )
    from components.evaluation.reports import steps_table

    print(steps_table(metrics), file=sys.stderr, flush=True)  # stdout stays one JSON object
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.evaluation.any_model", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--model", default="models:/grpoflow-policy@champion", help="folder or models:/NAME@ALIAS"
    )
    parser.add_argument(
        "--data", default=None, help="jsonl:PATH or hf:NAME[:CONFIG] (default: the prepared test split)"
    )
    parser.add_argument("--protocol", choices=["grpoflow", "lm-eval-gsm8k"], default=None)
    parser.add_argument("--backend", choices=["auto", "vllm", "transformers", "batched"], default=None)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--output", default=None)
    add_params_args(parser)
    args = parser.parse_args(argv)
    options = {key: getattr(args, key) for key in ("model", "data", "protocol", "backend", "limit", "output")}

    def evaluate() -> int:
        result = evaluation_pipeline(**options, params_file=args.params, overrides=args.overrides)
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0

    return one_line_errors(evaluate)


if __name__ == "__main__":
    raise SystemExit(main())
