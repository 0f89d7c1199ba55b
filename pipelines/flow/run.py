"""`grpoflow run [--preset NAME] [-S section.key=value ...]`: the training flow here (a preset:
presets/NAME.yaml, applied as -S overrides written into params.yaml), then its summary and time line.

Before any work: the params load, the tracking server answers, the placement is possible and, with -S,
TRL accepts the trainer settings. A checkout held by another run exits 3; a failed stage, DVC or MLflow 1.

Ctrl-C (SIGINT to the terminal's process group) and SIGTERM (to this process: a scheduler, `docker
stop`) take one path: the running stage is stopped, the pipeline's MLflow runs are marked KILLED, the
flow run's state is recorded while Prefect's server still answers (the temporary server runs in a
session of its own, out of the terminal's reach), one line says where the run stopped and how the next
one goes on, and the exit code is 130 or 143.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from components.common.entry import fail
from components.common.params import Params
from components.common.tracking import repo_root, resolve_tracking_uri
from pipelines.execution.group_watchdog import proc_stat
from pipelines.handoff import Interrupted, interrupted_stage
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
    from prefect.exceptions import (
        ExternalSignal,  # (after the server's launch: Prefect reads its settings at import)
    )

    from pipelines.execution.dvc_ops import StageFailed, TransientError, stage_order
    from pipelines.execution.services import check_remote, no_service_failure_lines
    from pipelines.flow.pipeline import training_pipeline
    from pipelines.flow.runlock import PipelineLocked
    from pipelines.flow.summary import format_run_summary, task_seconds, time_line

    stage_order(root)  # DVC reads dvc.yaml and dvc.lock: a broken one fails here, in one line
    check_remote(root)  # and its default remote answers (pull and push check again)
    waited = time.perf_counter()
    if server is not None:
        server.use()
    ready, startup = time.perf_counter(), _process_age()
    signal.signal(signal.SIGTERM, _raise_interrupted)  # Prefect's flow engine hands SIGTERM back to it
    for name in ("prefect.task_runs", "prefect.flow_runs"):  # the interrupt, a lost service: one line each
        logging.getLogger(name).addFilter(_no_interrupt_crash_lines)
        logging.getLogger(name).addFilter(no_service_failure_lines)
    try:
        summary = training_pipeline(overrides=list(args.overrides))
    except PipelineLocked as exc:
        return fail(exc, 3)
    except (StageFailed, TransientError) as exc:
        return fail(exc, 1)
    except (KeyboardInterrupt, ExternalSignal) as exc:
        signum = getattr(exc, "signum", getattr(exc, "signal", signal.SIGINT))
        # on a line of its own: the stage's progress bar may have left the cursor mid-line (\r, no \n)
        print(f"\ninterrupted by {signal.Signals(signum).name} during "
              f"{resume_hint(load_checked(args, root), root, interrupted_stage(exc))}", file=sys.stderr, flush=True)
        return 128 + signum
    print(format_run_summary(summary))
    print(time_line(_process_age(), startup, ready - waited, task_seconds(summary.run_id)))
    return 0


def _no_interrupt_crash_lines(record: logging.LogRecord) -> bool:
    """Prefect's "Crash detected!" and "Finished in state Crashed" lines for an interrupt, which the
    one line `grpoflow run` prints says better (a crash for any other reason is still shown)."""
    message = record.getMessage()
    return not ("aborted by an interrupt signal" in message or "aborted by a termination signal" in message)


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def resume_hint(params: Params, root: Path, stage: str) -> str:
    """Where an interrupted run stopped and how the next `grpoflow run` goes on: a training stage resumes
    from its newest complete checkpoint (when `<stage>.resume` is on); stages that finished are skipped."""
    if not stage:
        return "the pipeline run; `grpoflow run` completes it (finished stages are skipped)"
    cfg = getattr(params, stage, None)
    if getattr(cfg, "checkpoint_dir", None) and cfg.resume:
        from components.training.finetune import complete_checkpoints

        saved = complete_checkpoints(root / cfg.checkpoint_dir)
        if saved:
            return f"{stage}; `grpoflow run` resumes from {saved[-1].name}"
    return f"{stage}; `grpoflow run` runs it again (finished stages are skipped)"


def _process_age() -> float:
    """Seconds since this process started (the interpreter's own start-up included), from /proc."""
    import os
    import time

    try:
        ticks = int((proc_stat("self") or [])[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return max(uptime - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return time.process_time()
