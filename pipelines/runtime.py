"""The process environment of a pipeline run: telemetry off, and Prefect's temporary server.

    prefect_env_defaults()     telemetry off for this process and the stages it starts
    start_prefect_server()     boot Prefect's temporary API server in the background when no
                               PREFECT_API_URL is set, so that it starts while MLflow and DVC import
    prefect_api_log()          a function that sends a line to the current Prefect run's log (the UI)
                               and not to the terminal, which shows the stages' own output already
"""

from __future__ import annotations

import logging
import os
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
    from prefect.server.api.server import SubprocessASGIServer

    thread = _Booting(target=SubprocessASGIServer().start, kwargs={"timeout": SERVER_STARTUP_TIMEOUT_S}, daemon=True)
    thread.start()
    return thread


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
