"""`grpoflow ui`: the MLflow UI for this checkout's tracking store, on 127.0.0.1.

    grpoflow ui                      # http://127.0.0.1:5000 (pipeline runs, stage runs, the registry)
    grpoflow ui --port 5001
    grpoflow ui --host 0.0.0.0 --app-name basic-auth   # for a team: every request needs a user

A `--host` other than loopback puts the runs and the registry on the network, so it needs MLflow's
authentication: `--app-name basic-auth` (MLflow's basic-auth app: the first admin from
MLFLOW_AUTH_ADMIN_USERNAME / MLFLOW_AUTH_ADMIN_PASSWORD, settings from MLFLOW_AUTH_CONFIG_PATH, as
infra/compose.yaml runs it) or another auth app MLflow has installed; without one it is refused in one
line, exit 2, before anything starts.

It runs `mlflow server` on the resolved tracking URI (MLFLOW_TRACKING_URI, else
`tracking.uri`, a relative sqlite path made absolute against the repo root), with new
experiments' artifacts under `tracking.artifact_location`. When the tracking URI is
already a server (http[s]://), there is nothing to start: it prints that address.

The server (mlflow, its uvicorn supervisor and worker) runs under `pipelines.execution.group_watchdog`, in a process
group that stops with `grpoflow ui`: Ctrl-C, SIGTERM (a service manager, `kill`) or even SIGKILL
leave no server behind holding the port. MLflow's job runner (GenAI jobs) is off unless
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from typing import Any

from components.common.tracking import resolve_artifact_location, resolve_tracking_uri
from pipelines.execution.services import require_auth_beyond_loopback
from pipelines.params.config import load_params


def mlflow_server_command(uri: str, artifact_root: str | None, host: str, port: int, app_name: str | None = None,
                          ) -> list[str]:
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
    if artifact_root:
        cmd += ["--default-artifact-root", artifact_root]
    if app_name:
        cmd += ["--app-name", app_name]
    return cmd


def cli_ui(args: argparse.Namespace) -> int:
    require_auth_beyond_loopback(args.host, bool(args.app_name),
                                 "turn on MLflow's authentication with --app-name basic-auth "
                                 "(the first admin from MLFLOW_AUTH_ADMIN_USERNAME / MLFLOW_AUTH_ADMIN_PASSWORD)")
    params = load_params(args.params, args.overrides)
    uri = resolve_tracking_uri(params)
    if uri.startswith(("http://", "https://")):
        print(f"tracking URI {uri} is an MLflow server already: open it in a browser")
        return 0
    cmd = mlflow_server_command(uri, resolve_artifact_location(params, uri), args.host, args.port, args.app_name)
    print(f"MLflow UI for {uri} on http://{args.host}:{args.port} (Ctrl-C stops it)", flush=True)
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": os.environ.get("MLFLOW_DISABLE_TELEMETRY", "true"),
        # MLflow's job runner (seven huey consumer processes) serves GenAI jobs (judges, trace rollups),
        # which training runs do not use; without it the UI starts sooner. Set it to true to have it.
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"),
    }
    guard = subprocess.Popen([sys.executable, "-m", "pipelines.execution.group_watchdog", *cmd], env=env)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return guard.wait()
    except KeyboardInterrupt:
        guard.send_signal(signal.SIGTERM)  # the watchdog stops the server's whole process group
        guard.wait()
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the UI the way Ctrl-C does
