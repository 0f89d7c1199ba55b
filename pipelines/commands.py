"""Handlers of the `grpoflow` subcommands that run the pipeline and move the registry
(pipelines/cli.py parses the arguments and calls them):

    grpoflow run [--preset NAME] [-S k=v ...]   the training flow here (a preset: presets/NAME.yaml), then its summary
    grpoflow evaluate --model PATH_OR_URI       one model on GSM8K-style data (pipelines/evaluation.py)
    grpoflow promote NAME VERSION --reason T    force the champion alias onto a version
    grpoflow rollback NAME                      the previous champion back
    grpoflow stage NAME --commit SHA ...        one stage in a clean working copy (pipelines/stage.py)

Errors are one line on stderr, never a traceback (components/common/entry.py one_line_errors, around every
subcommand): exit code 2 for input to fix (components/common/errors.py), 1 for a service that does not answer
or a stage/DVC/MLflow failure, 3 for a checkout held by another run.
A tracking server that does not answer is found before any work starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from components.common.entry import fail
from components.common.tracking import check_reachable, repo_root, resolve_tracking_uri
from pipelines.params.config import load_params, params_in

if TYPE_CHECKING:  # the promotion module loads MLflow: only when a command needs it
    from components.common.params import Params
    from pipelines.promotion import Decision


def _load_checked(args: argparse.Namespace, root: Path | None = None) -> Params:
    """Params (file, -S overrides) and a tracking server that answers, or a GrpoflowError."""
    params = load_params(params_in(root) if root else args.params, args.overrides)
    check_reachable(resolve_tracking_uri(params, root))
    return params


def cli_run(args: argparse.Namespace) -> int:
    """`grpoflow run [--preset NAME] [-S section.key=value ...]`: run the flow here and print a summary."""
    from pipelines.runtime import prefect_env_defaults

    prefect_env_defaults()
    root = repo_root()
    if args.params and Path(args.params).resolve() != (root / "params.yaml").resolve():
        return fail("--params: the pipeline runs on the repo's params.yaml, which DVC tracks; "
                     "use -S section.key=value to change values", 2)
    if not (root / "dvc.yaml").is_file():
        return fail(f"{root}: no dvc.yaml here; run grpoflow from the repository", 2)
    return _run(args, root)


def _run(args: argparse.Namespace, root: Path) -> int:
    import time

    from pipelines.placement import check_placement
    from pipelines.runtime import TemporaryServer

    if getattr(args, "preset", None):
        from pipelines.presets import overrides

        args.overrides = [*overrides(args.preset, root / "presets"), *args.overrides]  # -S comes last: it wins
    params = _load_checked(args, root)
    check_placement(params, root, resolve_tracking_uri(params, root))
    server = TemporaryServer.launch()  # boots while Prefect, MLflow and DVC import (None: PREFECT_API_URL is set)
    if args.overrides:  # TRL's own checks of the trainer settings, before -S changes params.yaml
        from components import grpo, sft

        sft.trainer_settings(params)  # (without -S the stages check them: no torch import here)
        grpo.trainer_settings(params)
    import dvc.repo  # noqa: F401  (imports overlap with the server's start-up)
    import mlflow  # noqa: F401

    from pipelines.dvc_ops import StageFailed, TransientError, stage_order
    from pipelines.runlock import PipelineLocked
    from pipelines.summary import format_run_summary, task_seconds, time_line
    from pipelines.training import training_pipeline

    stage_order(root)  # DVC reads dvc.yaml and dvc.lock: a broken one fails here, in one line
    waited = time.perf_counter()
    if server is not None:
        server.use()
    ready, startup = time.perf_counter(), _process_age()
    try:
        summary = training_pipeline(overrides=list(args.overrides))
    except PipelineLocked as exc:
        return fail(exc, 3)
    except (StageFailed, TransientError) as exc:
        return fail(exc, 1)
    print(format_run_summary(summary))
    print(time_line(_process_age(), startup, ready - waited, task_seconds(summary.run_id)))
    return 0


def _process_age() -> float:
    """Seconds since this process started (the interpreter's own start-up included), from /proc."""
    import os
    import time

    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return max(uptime - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return time.process_time()


def cli_evaluate(args: argparse.Namespace) -> int:
    """`grpoflow evaluate`: one model (folder or MLflow URI) on a data source; prints the metrics JSON."""
    from pipelines.evaluation import evaluate_one

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    metrics = evaluate_one(
        _load_checked(args), args.model, data=args.data, protocol=args.protocol, backend=args.backend,
        limit=args.limit, output=args.output,
    )
    from components.evaluation.reports import steps_table

    print(steps_table(metrics), file=sys.stderr, flush=True)  # stdout stays one JSON object
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


def _registry_command(args: argparse.Namespace, action: Callable[[Params], Decision]) -> int:
    from pipelines.promotion import print_decision

    print_decision(action(_load_checked(args)))
    return 0


def cli_promote(args: argparse.Namespace) -> int:
    """`grpoflow promote NAME VERSION --reason TEXT`."""
    from pipelines.promotion import force_promote

    return _registry_command(args, lambda p: force_promote(p, args.name, str(args.version), args.reason))


def cli_rollback(args: argparse.Namespace) -> int:
    """`grpoflow rollback NAME`."""
    from pipelines.promotion import rollback

    return _registry_command(args, lambda p: rollback(p, args.name))


def cli_stage(args: argparse.Namespace) -> int:
    """`grpoflow stage NAME --commit SHA ...`: run one stage here; prints its result as JSON."""
    import os

    from pipelines.stage import run_stage_here

    result = run_stage_here(
        args.name, args.commit, Path(args.params_file).read_text(),
        Path(args.lock_file).read_text() if args.lock_file else "", args.remote, args.parent_run_id,
        args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", ""), workdir=args.workdir, keep=args.keep,
    )
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0
