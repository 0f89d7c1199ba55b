"""Nothing is left running after the process that started it is gone: a flow killed with SIGKILL
leaves no Prefect temporary server, and `grpoflow ui` stopped with SIGTERM (a service manager,
`kill`) leaves no MLflow server or uvicorn worker holding its port.

Slow tier: each boots a real server (37 s and 44 s on the shared 2-core machine, about a third of
that on an idle one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.project_repo import wait_for
from tests.servers import answers, free_port

pytestmark = pytest.mark.slow

DEADLINE_S = 180.0

FLOW = """
import sys
from pipelines.execution.runtime import start_prefect_server
start_prefect_server().join()
from prefect import flow
from prefect.server.api.server import SubprocessASGIServer

@flow
def waiting():
    print(SubprocessASGIServer().api_url, flush=True)
    sys.stdin.readline()  # until the test kills this process

waiting()
"""


def descendants(pid: int) -> dict[int, str]:
    """pid -> start time of every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = {}, list(children.get(pid, []))
    while todo:
        p = todo.pop()
        if (started := start_time(p)) is not None:
            found[p] = started
            todo += children.get(p, [])
    return found


def start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def still_running(procs: dict[int, str]) -> dict[int, str]:
    return {p: cmdline(p) for p, started in procs.items() if start_time(p) == started}


def wait_gone(procs: dict[int, str], timeout: float = 30.0) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while (left := still_running(procs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_a_flow_killed_with_sigkill_leaves_no_prefect_server(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    proc = subprocess.Popen([sys.executable, "-c", FLOW], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path)
    try:
        api_url = proc.stdout.readline().strip()  # printed from inside the flow run: the server is up
        assert api_url.startswith("http://127.0.0.1:"), f"the flow did not start (exit {proc.poll()})"
        below = descendants(proc.pid)
        servers = [p for p in below if "prefect.server.api.server:create_app" in cmdline(p)]
        assert servers and answers(api_url + "/health")
    finally:
        proc.kill()
        proc.wait()
    assert wait_gone(below) == {}, "left running after kill -9 of the flow"
    assert not answers(api_url + "/health")


def test_ui_stopped_with_sigterm_leaves_no_server(tmp_path):
    port = free_port()
    (tmp_path / "params.yaml").write_text("")
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ui", "--port", str(port)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/health"
        wait_for(lambda: answers(url), DEADLINE_S, "the MLflow UI answering", proc)
        below = descendants(proc.pid)
        assert len(below) >= 3, below  # the guard, mlflow server, its uvicorn
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_gone(below) == {}, "left running after SIGTERM of grpoflow ui"
    assert not answers(url)
