"""The process environment of a pipeline run: telemetry off, and Prefect's temporary server.

    prefect_env_defaults()     telemetry off for this process and the stages it starts
    start_prefect_server()     boot Prefect's temporary API server in the background when no
                               PREFECT_API_URL is set, so that it starts while MLflow and DVC import;
                               the server runs under pipelines.group_watchdog and dies with this process, even
                               when it is killed with SIGKILL (Prefect's own stops it only at exit)
    prefect_api_log()          a function that sends a line to the current Prefect run's log (the UI)
                               and not to the terminal, which shows the stages' own output already
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable

TELEMETRY_OFF = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}
# Prefect's 20 s default start-up timeout for its temporary server is too short on 2 busy cores.
SERVER_STARTUP_TIMEOUT_S = 120


def prefect_env_defaults() -> None:
    """Telemetry off for this process and everything it starts (values already set win)."""
    for key, value in TELEMETRY_OFF.items():
        os.environ.setdefault(key, value)


def start_prefect_server() -> threading.Thread | None:
    """Boot Prefect's temporary server (used when PREFECT_API_URL is unset) in the background.

    Its module is imported here, in the caller's thread: imports hold the GIL and would not
    overlap anyway; the server's own start-up (a separate process, seconds) then overlaps
    with MLflow's and DVC's imports in the caller."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    thread = _Booting(target=guarded_server().start, kwargs={"timeout": SERVER_STARTUP_TIMEOUT_S}, daemon=True)
    thread.start()
    return thread


def guarded_server():
    """Prefect's temporary server object (the one its client uses when PREFECT_API_URL is unset), its
    uvicorn process started under `pipelines.group_watchdog --poll-parent`.

    Prefect starts the server as a plain child and stops it from an exit hook, which SIGKILL (the
    OOM killer, `kill -9`) skips: the server then runs on, holding a port, forever. Under the watchdog
    it is stopped within a second of this process's death. The subclass instance is registered as
    Prefect's own (SubprocessASGIServer() returns it), so the flow's client uses this server."""
    from prefect.server.api.server import SubprocessASGIServer

    class GuardedServer(SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen:
            import prefect
            from prefect.settings import get_current_settings

            # Prefect's own command and environment (SubprocessASGIServer._run_uvicorn_command), watched.
            command = [
                sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent),
                "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                "--log-level", "error", "--lifespan", "on",
            ]
            env = {
                **os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
                **get_current_settings().to_environment_variables(exclude_unset=True),
            }
            return subprocess.Popen([sys.executable, "-m", "pipelines.group_watchdog", "--poll-parent", *command], env=env)

    existing = SubprocessASGIServer._instances.get(None)
    if existing is not None:
        return existing  # already created (and maybe started) in this process
    return GuardedServer()


class _Booting(threading.Thread):
    """The server's start-up thread. Its failure is raised by join() in the caller, not printed as a
    thread traceback, which is also what happens when the process exits (a pre-flight error) while
    the server is still starting and Prefect's exit hook stops it."""

    error: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as exc:  # noqa: BLE001 (handed to join())
            self.error = exc

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


STAGE_OUTPUT_LOGGER = "grpoflow.stage_output"


def prefect_api_log() -> Callable[[str], None]:
    """`logger.info` of a logger whose only handler is Prefect's API handler: lines reach the flow
    run's log in the Prefect UI (linked to the task run they are sent from) without being printed a
    second time on the terminal. Call it, and the function it returns, inside a flow or task run."""
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger(STAGE_OUTPUT_LOGGER)
    if not any(isinstance(h, APILogHandler) for h in logger.handlers):
        logger.addHandler(APILogHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger.info
