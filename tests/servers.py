"""Helpers for tests that start real servers (Prefect, MLflow, the UI) on 127.0.0.1: a free port,
and a context manager that starts a command in its own process group, waits for its health URL
and always stops the whole group."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL it after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def served(
    cmd: list[str], health_url: str, log: Path, *, env: dict | None = None, cwd: Path | None = None,
    timeout: float = 120,
) -> Iterator[subprocess.Popen]:
    """Run `cmd` (output to `log`) until `health_url` answers; the log's tail explains a failed start."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with urllib.request.urlopen(health_url, timeout=5):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise AssertionError(f"{cmd[0]} did not start:\n{log.read_text()[-3000:]}") from None
                    time.sleep(1)
            yield proc
        finally:
            stop(proc)
