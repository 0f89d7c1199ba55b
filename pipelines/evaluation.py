"""The `evaluation` Prefect flow: evaluate a registered model version (e.g. @champion) on a dataset.

One task, `evaluate`, runs components.evaluate.evaluate_one: it downloads the model from
the MLflow registry (or takes a folder), generates on vLLM or transformers per
`evaluate.backend`, writes `<name>.json` / `<name>.items.jsonl` and logs an MLflow run
named `evaluate`. Use it to re-check the champion on new data or with the
lm-evaluation-harness protocol, on a schedule or by hand:

    python -m pipelines.evaluation --model models:/grpoflow-policy@champion --limit 100
    python -m pipelines.evaluation --model models:/grpoflow-policy@champion \\
        --data hf:openai/gsm8k:main --protocol lm-eval-gsm8k
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from components.config import ConfigError, add_params_args, load_params


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(
    params: Any,
    model: str,
    data: str | None,
    protocol: str | None,
    backend: str | None,
    limit: int | None,
    output: str | None,
) -> dict[str, Any]:
    from components.evaluate import evaluate_one

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
    params = load_params(params_file, overrides or [])
    return evaluate_task(params, model, data, protocol, backend, limit, output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.evaluation", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--model", default="models:/grpoflow-policy@champion", help="folder or models:/NAME@ALIAS"
    )
    parser.add_argument(
        "--data", default=None, help="jsonl:PATH or hf:NAME[:CONFIG] (default: the prepared test split)"
    )
    parser.add_argument("--protocol", choices=["grpoflow", "lm-eval-gsm8k"], default=None)
    parser.add_argument("--backend", choices=["auto", "vllm", "transformers"], default=None)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--output", default=None)
    add_params_args(parser)
    args = parser.parse_args(argv)
    from components.evaluate import EvaluationError
    from components.generation import BackendError

    try:
        result = evaluation_pipeline(
            model=args.model,
            data=args.data,
            protocol=args.protocol,
            backend=args.backend,
            limit=args.limit,
            output=args.output,
            params_file=args.params,
            overrides=args.overrides,
        )
    except (ConfigError, EvaluationError, BackendError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
