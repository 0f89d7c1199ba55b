"""Helpers for tests that start real servers (Prefect, MLflow, the UI, vLLM) on 127.0.0.1: a context
manager that starts a command on a free port in its own process group, waits for its health URL and
always stops the whole group (starting again on another port if the one it was given was taken in the
meantime), and a port that refuses connections for as long as a test needs it to."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ADDRESS_IN_USE = ("address already in use", "errno 98")


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listened on a moment ago (a server started on it may still
    lose a race for it: `served` starts again on another port when that happens)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port of 127.0.0.1 held bound but not listening: connections to it are refused while the
    context lasts, and nothing else can take it meanwhile."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL it after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass(frozen=True)
class Server:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def answers(url: str) -> bool:
    """True when `url` answers (any 2xx/3xx) within 5 s."""
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def served(
    cmd: Callable[[int], list[str]], health_path: str, log: Path, *, env: dict | None = None, cwd: Path | None = None,
    timeout: float = 120, ready: Callable[[Server], bool] | None = None, attempts: int = 3,
) -> Iterator[Server]:
    """Run `cmd(port)` on a free port (output to `log`) until `health_path` answers (or `ready(server)` is
    true); the log's tail explains a failed start. A start that failed because the port was taken is
    retried on another port, `attempts` times in all."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd(port), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    start_new_session=True)
        server = Server(proc, port)
        up = ready or (lambda s: answers(s.url + health_path))
        try:
            deadline = time.monotonic() + timeout
            while not up(server):
                if proc.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            else:
                yield server
                return
        finally:
            stop(proc)
        text = log.read_text(errors="replace")
        if attempt < attempts and proc.returncode is not None and any(m in text.lower() for m in ADDRESS_IN_USE):
            continue  # another process took the port between free_port() and the bind
        raise AssertionError(f"{cmd(port)[0]} did not start on port {port}:\n{text[-3000:]}")


def prefect_server(port: int) -> list[str]:
    """`prefect server start` on 127.0.0.1:PORT (the venv's own `prefect`)."""
    return [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]


def mlflow_server(port: int, store: Path, *extra: str) -> list[str]:
    """`mlflow server` on 127.0.0.1:PORT with its runs in STORE/mlflow.db and artifacts in STORE/mlartifacts."""
    return [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
            "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}", "--default-artifact-root",
            str(store / "mlartifacts"), "--workers", "1", *extra]
