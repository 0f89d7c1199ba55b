"""Schedules: apply infra/prefect.yaml's deployments to a Prefect server, or run the flow on a schedule here.

    prefect server start                                   # a server (or the compose stack)
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    grpoflow deploy --name training --name evaluation      # the process-pool deployments
    grpoflow deploy --name stage-process                   # what -S placement.<stage>=process submits to
    prefect worker start --pool grpoflow-process           # runs them (cron: 03:00 UTC daily)

    grpoflow schedule --cron "0 3 * * *"                   # no worker: this process runs the schedule

`grpoflow deploy` checks the server answers, creates the `process` work pools that
infra/prefect.yaml names if they are missing (docker and kubernetes pools need their job
templates: see the commands at the top of infra/prefect.yaml), then runs
`prefect --no-prompt deploy --prefect-file infra/prefect.yaml` from the repo root, so the
process deployments run the flow from this checkout. The stage deployments take the stage as a
parameter: one per pool kind, and on docker and kubernetes per device class
(pipelines/execution/placement.py picks one).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from components.common.errors import GrpoflowError, ServiceUnavailable
from components.common.tracking import repo_root
from pipelines.execution.placement import PREFECT_FILE

SCHEDULED_NAME = "training-scheduled"


def _api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def check_server(api: str) -> str | None:
    """None if the Prefect API at `api` answers its health check, else a message saying what to do."""
    import httpx

    try:
        r = httpx.get(api.rstrip("/") + "/health", timeout=10)
        if r.status_code == 200:
            return None
        problem = f"answered HTTP {r.status_code}"
    except httpx.HTTPError as exc:
        problem = f"is not reachable ({exc.__class__.__name__})"
    return (
        f"the Prefect server at PREFECT_API_URL={api} {problem}. Start one with `prefect server start` "
        f"(or `docker compose -f infra/compose.yaml up -d`) and point PREFECT_API_URL at it."
    )


def process_pools(prefect_file: Path) -> list[str]:
    """Names of the work pools of type process that the file's deployments use (default: none typed)."""
    import yaml

    cfg = yaml.safe_load(prefect_file.read_text()) or {}
    names = []
    for dep in cfg.get("deployments") or []:
        pool = dep.get("work_pool") or {}
        jv = pool.get("job_variables") or {}
        if pool.get("name") and not jv.get("image") and pool["name"] not in names:
            names.append(pool["name"])  # no image: runs as a local process
    return names


def ensure_process_pools(names: list[str]) -> list[str]:
    """Create missing process work pools; returns the names created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    created = []
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                client.read_work_pool(name)
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=name, type="process"))
                created.append(name)
    return created


def cli_deploy(args: argparse.Namespace) -> int:
    """`grpoflow deploy [--name NAME ...]`: apply infra/prefect.yaml to the server at PREFECT_API_URL."""
    root = repo_root()
    prefect_file = root / PREFECT_FILE
    if not prefect_file.is_file():
        raise GrpoflowError(f"{prefect_file} not found; run grpoflow deploy from the repository")
    api = _api_url()
    if not api:
        raise GrpoflowError(
            "PREFECT_API_URL is not set. Deployments need a Prefect server: start one with "
            "`prefect server start` and `export PREFECT_API_URL=http://127.0.0.1:4200/api`"
        )
    if problem := check_server(api):
        raise ServiceUnavailable(problem)
    for name in ensure_process_pools(process_pools(prefect_file)):
        print(f"created work pool {name} (type process); start its worker with: prefect worker start --pool {name}")
    names = ["--all"] if not args.name else [x for n in args.name for x in ("--name", n)]
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--prefect-file", str(prefect_file), *names]
    return subprocess.run(cmd, cwd=root, env={**os.environ, "PREFECT_API_URL": api}).returncode


def cli_schedule(args: argparse.Namespace) -> int:
    """`grpoflow schedule --cron EXPR`: run the training flow from this process on a cron schedule
    (Prefect's `flow.serve`; `grpoflow serve` serves a model, pipelines/registry/serving.py)."""
    from pipelines.execution.runtime import prefect_env_defaults, start_prefect_server
    from pipelines.flow.pipeline import training_pipeline
    from pipelines.params.config import ConfigError, load_params

    prefect_env_defaults()
    root = repo_root()
    load_params(root / "params.yaml" if (root / "params.yaml").exists() else None, args.overrides)
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=args.cron)
    except ValueError as exc:
        raise ConfigError(f"--cron {args.cron!r}: {exc}") from None
    if (api := _api_url()) and (problem := check_server(api)):
        raise ServiceUnavailable(problem)  # before Prefect's runner meets it (a traceback)
    if not api:
        print("note: no PREFECT_API_URL: the schedule lives on a temporary Prefect server for as long as "
              "this process runs", flush=True)
        start_prefect_server().join()
    training_pipeline.serve(
        name=SCHEDULED_NAME,
        cron=args.cron,
        parameters={"overrides": list(args.overrides)},
        tags=["grpoflow", "training", "scheduled"],
        description=f"grpoflow training pipeline on {root}, scheduled by `grpoflow schedule`.",
    )
    return 0
