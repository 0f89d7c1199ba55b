"""`grpoflow run [--preset NAME] [-S section.key=value ...]`: the training flow here (a preset:
presets/NAME.yaml, applied as -S overrides written into params.yaml), then its summary and time line.

Before any work: the params load, the tracking server answers, the placement is possible and, with -S,
TRL accepts the trainer settings. A checkout held by another run exits 3; a failed stage, DVC or MLflow 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from components.common.entry import fail
from components.common.tracking import repo_root, resolve_tracking_uri
from pipelines.params.config import load_checked


def cli_run(args: argparse.Namespace) -> int:
    """`grpoflow run [--preset NAME] [-S section.key=value ...]`: run the flow here and print a summary."""
    from pipelines.execution.runtime import prefect_env_defaults

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

    from pipelines.execution.placement import check_placement
    from pipelines.execution.runtime import TemporaryServer

    if getattr(args, "preset", None):
        from pipelines.params.presets import overrides

        args.overrides = [*overrides(args.preset, root / "presets"), *args.overrides]  # -S comes last: it wins
    params = load_checked(args, root)
    check_placement(params, root, resolve_tracking_uri(params, root))
    server = TemporaryServer.launch()  # boots while Prefect, MLflow and DVC import (None: PREFECT_API_URL is set)
    if args.overrides:  # TRL's own checks of the trainer settings, before -S changes params.yaml
        from components import grpo, sft

        sft.trainer_settings(params)  # (without -S the stages check them: no torch import here)
        grpo.trainer_settings(params)
    import dvc.repo  # noqa: F401  (imports overlap with the server's start-up)
    import mlflow  # noqa: F401

    from pipelines.execution.dvc_ops import StageFailed, TransientError, stage_order
    from pipelines.flow.pipeline import training_pipeline
    from pipelines.flow.runlock import PipelineLocked
    from pipelines.flow.summary import format_run_summary, task_seconds, time_line

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
