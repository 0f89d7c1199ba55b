"""Handlers of the `grpoflow` subcommands that run the pipeline and move the registry
(pipelines/cli.py parses the arguments and calls them):

    grpoflow run [-S section.key=value ...]     the training flow here, then its summary
    grpoflow evaluate --model PATH_OR_URI       one model on GSM8K-style data (pipelines/evaluation.py)
    grpoflow promote NAME VERSION --reason T    force the champion alias onto a version
    grpoflow rollback NAME                      the previous champion back

Errors a user can act on (components/errors.py) are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.config import load_params, params_in
from components.errors import GrpoflowError
from components.tracking import repo_root


def _fail(exc: BaseException, code: int = 2) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return code


def cli_run(args: argparse.Namespace) -> int:
    """`grpoflow run [-S section.key=value ...]`: run the flow here and print a summary."""
    from pipelines.runtime import prefect_env_defaults, start_prefect_server

    prefect_env_defaults()
    root = repo_root()
    if args.params and Path(args.params).resolve() != (root / "params.yaml").resolve():
        return _fail("--params: the pipeline runs on the repo's params.yaml, which DVC tracks; "
                     "use -S section.key=value to change values")
    if not (root / "dvc.yaml").is_file():
        return _fail(f"{root}: no dvc.yaml here; run grpoflow from the repository")
    try:
        load_params(params_in(root), args.overrides)
    except GrpoflowError as exc:
        return _fail(exc)
    booting = start_prefect_server()
    import dvc.repo  # noqa: F401
    import mlflow  # noqa: F401

    from pipelines.dvc_ops import StageFailed, TransientError
    from pipelines.runlock import PipelineLocked
    from pipelines.summary import format_summary
    from pipelines.training import training_pipeline

    if booting is not None:
        booting.join()
    try:
        summary = training_pipeline(repo=str(root), overrides=list(args.overrides))
    except PipelineLocked as exc:
        return _fail(exc, 3)
    except (StageFailed, TransientError) as exc:
        return _fail(exc, 1)
    print(format_summary(summary))
    return 0


def cli_evaluate(args: argparse.Namespace) -> int:
    """`grpoflow evaluate`: one model (folder or MLflow URI) on a data source; prints the metrics JSON."""
    from pipelines.evaluation import evaluate_one

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        params = load_params(args.params, args.overrides)
        metrics = evaluate_one(
            params, args.model, data=args.data, protocol=args.protocol, backend=args.backend,
            limit=args.limit, output=args.output,
        )
    except GrpoflowError as exc:
        return _fail(exc)
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


def _registry_command(args: argparse.Namespace, action: Callable[[Any], Any]) -> int:
    from components.promotion import print_decision

    try:
        decision = action(load_params(args.params, args.overrides))
    except GrpoflowError as exc:
        return _fail(exc)
    print_decision(decision)
    return 0


def cli_promote(args: argparse.Namespace) -> int:
    """`grpoflow promote NAME VERSION --reason TEXT`."""
    from components.promotion import force_promote

    return _registry_command(args, lambda p: force_promote(p, args.name, str(args.version), args.reason))


def cli_rollback(args: argparse.Namespace) -> int:
    """`grpoflow rollback NAME`."""
    from components.promotion import rollback

    return _registry_command(args, lambda p: rollback(p, args.name))
