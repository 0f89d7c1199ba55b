"""The process environment of a pipeline run: telemetry off, and Prefect's temporary server.

    prefect_env_defaults()     telemetry off for this process and the stages it starts
    TemporaryServer.launch()   `grpoflow run`'s temporary Prefect API server (when PREFECT_API_URL is not
                               in the environment), started before Prefect is imported, so that it boots
                               while the run imports Prefect, MLflow and DVC; `use()` then points Prefect's
                               settings at it (unless a Prefect profile names a server)
    start_prefect_server()     Prefect's own temporary server object booted in the background (the
                               long-lived `grpoflow schedule` process)
                               Both servers run under pipelines.execution.group_watchdog and die with this process, even
                               when it is killed with SIGKILL (Prefect's own stops it only at exit)
    prefect_api_log()          a function that sends a line to the current Prefect run's log (the UI)
                               and not to the terminal, which shows the stages' own output already
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

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


# Prefect's own environment for its temporary server (SubprocessASGIServer._run_uvicorn_command).
SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
LAUNCH_ATTEMPTS = 3  # a port taken between choosing it and uvicorn binding it: start again on another


def prefect_server_command(port: int, prefect_dir: str, poll_parent: bool = False) -> list[str]:
    """Prefect's command for its temporary server (SubprocessASGIServer._run_uvicorn_command), watched
    by pipelines.execution.group_watchdog (`--poll-parent` when started from a thread that ends before the process)."""
    return [
        sys.executable, "-m", "pipelines.execution.group_watchdog", *(["--poll-parent"] if poll_parent else []),
        sys.executable, "-m", "uvicorn", "--app-dir", prefect_dir,
        "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "error", "--lifespan", "on",
    ]


class TemporaryServer:
    """The temporary Prefect API server of one `grpoflow run`.

    Prefect starts its own temporary server when its client first needs one, after importing
    `prefect.server.api.server` in the caller (seconds, holding the GIL). This one is started with
    Prefect's command before Prefect is imported at all, so it boots while the run imports Prefect,
    MLflow and DVC; `use()` then makes it the API server of Prefect's settings, as if PREFECT_API_URL
    named it. It is started from the main thread under pipelines.execution.group_watchdog, which dies with this
    process (PR_SET_PDEATHSIG) and stops the server, even after SIGKILL; at a normal exit it is stopped
    after Prefect has sent its last logs (this exit hook is registered before Prefect's)."""

    def __init__(self) -> None:
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._prefect_dir = ""

    @classmethod
    def launch(cls) -> TemporaryServer | None:
        """Start it, or None when PREFECT_API_URL is set in the environment (that server is used)."""
        if os.environ.get("PREFECT_API_URL") or "prefect" in sys.modules:
            return None  # (Prefect imported already: its settings were read; its own temporary server serves)
        spec = importlib.util.find_spec("prefect")
        if spec is None or not spec.submodule_search_locations:
            return None
        server = cls()
        server._prefect_dir = str(Path(next(iter(spec.submodule_search_locations))).parent)
        server._start()
        atexit.register(server.stop)
        return server

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _start(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        # A session of its own: Ctrl-C in the terminal reaches the run, not its server, which records the
        # interrupted run and takes its last logs before stop() ends it (it still dies with this process).
        self.proc = subprocess.Popen(prefect_server_command(self.port, self._prefect_dir),
                                     env={**os.environ, **SERVER_ENV}, start_new_session=True)

    def use(self, timeout: float = SERVER_STARTUP_TIMEOUT_S) -> bool:
        """Wait until it answers, then point Prefect's settings at it; False (and stopped) when a Prefect
        profile names a server already, which is then the one used."""
        from prefect.context import refresh_global_settings_context
        from prefect.settings import PREFECT_API_URL

        if PREFECT_API_URL.value():
            self.stop()
            return False
        self.wait(timeout)
        saved = {key: os.environ.get(key) for key in ("PREFECT_API_URL", "PREFECT_UI_URL")}
        # No UI link: the temporary server serves no UI and is gone after the run.
        os.environ.update(PREFECT_API_URL=self.api_url, PREFECT_UI_URL="")
        try:
            refresh_global_settings_context()  # Prefect read its settings at import; every thread sees these
        finally:
            for key, value in saved.items():  # the stages' environment stays as it was
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return True

    def wait(self, timeout: float) -> None:
        """Until GET /api/health answers 200; a server that exits first is started again on another port."""
        deadline = time.monotonic() + timeout
        attempts = 1
        while True:
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self.proc is not None and self.proc.poll() is not None:
                if attempts >= LAUNCH_ATTEMPTS:
                    raise RuntimeError(f"Prefect's temporary server exited with code {self.proc.returncode} "
                                       f"({attempts} starts); its error is printed above")
                attempts += 1
                self._start()
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"Prefect's temporary server did not answer at {self.api_url} within {timeout:.0f} s"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Send Prefect's pending logs and events to it, then SIGTERM to the watchdog, which stops the
        server's process group (SIGKILL after its grace). Without the drain, logging's own flush at
        exit (after this hook) would wait 5 s on a server that is gone."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if "prefect.logging.handlers" in sys.modules:
            from prefect.events.worker import EventsWorker
            from prefect.logging.handlers import APILogWorker

            for worker in (APILogWorker, EventsWorker):
                try:
                    worker.drain_all(timeout=5)
                except Exception:  # noqa: BLE001 (best effort: the server stops either way)
                    pass
        proc.terminate()
        proc.wait()


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
    uvicorn process started under `pipelines.execution.group_watchdog --poll-parent`.

    Prefect starts the server as a plain child and stops it from an exit hook, which SIGKILL (the
    OOM killer, `kill -9`) skips: the server then runs on, holding a port, forever. Under the watchdog
    it is stopped within a second of this process's death. The subclass instance is registered as
    Prefect's own (SubprocessASGIServer() returns it), so the flow's client uses this server."""
    from prefect.server.api.server import SubprocessASGIServer

    class GuardedServer(SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen:
            import prefect
            from prefect.settings import get_current_settings

            env = {**os.environ, **SERVER_ENV, **get_current_settings().to_environment_variables(exclude_unset=True)}
            command = prefect_server_command(self.port, str(prefect.__module_path__.parent), poll_parent=True)
            return subprocess.Popen(command, env=env)

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
