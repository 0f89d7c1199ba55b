"""Tests for pipelines/registry/lease.py on a real MLflow SQLite store: a second holder waits for the
first, a killed holder's ticket expires, a holder stalled past its TTL finds out before it writes,
and a registered model of the lock's name that grpoflow did not create is refused. (Eight processes
racing through a real `mlflow server`: tests/slow/test_registry_race.py.)

    pytest -q tests/test_registry_lease.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from components.common.errors import RegistryError
from pipelines.registry.lease import registry_lease

REPO = Path(__file__).resolve().parents[1]
# A second process holding the lease with a short TTL: says `held`, then on each stdin line says
# whether it still holds it (Lease.check).
HOLDER = textwrap.dedent("""
    import sys, mlflow
    from pipelines.registry.lease import registry_lease
    with registry_lease(mlflow.MlflowClient(), "m", "the other process", ttl_s=2, heartbeat_s=0.5) as lease:
        print("held", flush=True)
        for _ in sys.stdin:
            try:
                lease.check()
                print("still held", flush=True)
            except Exception as exc:
                print(f"{type(exc).__name__}: {exc}", flush=True)
""")


@pytest.fixture
def client():
    import mlflow

    return mlflow.MlflowClient()


@pytest.fixture
def holder():
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait()


def tickets(client) -> list[str]:
    return [v.description for v in client.search_model_versions("name = 'm.registry-lock'")]


def test_a_second_holder_waits_until_the_first_releases(client, capsys):
    held, release, order = threading.Event(), threading.Event(), []

    def first():
        with registry_lease(client, "m", "the first"):
            order.append("first holds")
            held.set()
            release.wait(30)
            order.append("first releases")

    def second():
        import mlflow

        with registry_lease(mlflow.MlflowClient(), "m", "the second"):
            order.append("second holds")

    a = threading.Thread(target=first)
    a.start()
    assert held.wait(30)
    b = threading.Thread(target=second)
    b.start()
    time.sleep(2)
    assert order == ["first holds"]  # the second is waiting
    release.set()
    a.join(30)
    b.join(30)
    assert order == ["first holds", "first releases", "second holds"]
    assert f"pid {os.getpid()}: the first" in capsys.readouterr().out  # the waiter said whom it waited for
    assert tickets(client) == []  # both released


def test_a_killed_holders_ticket_expires_after_its_ttl(client, holder):
    with pytest.raises(RegistryError, match=rf"waited 1 s for the registry lease, held by .*pid {holder.pid}: "
                                            "the other process.*frees it within 2 s"):
        with registry_lease(client, "m", "too early", wait_s=1):
            pass
    holder.kill()
    holder.wait()
    start = time.monotonic()
    with registry_lease(client, "m", "after the kill"):
        waited = time.monotonic() - start
        assert [t.split(": ")[-1] for t in tickets(client)] == ["after the kill"]  # the dead ticket deleted
    assert waited < 10


def test_a_holder_stalled_past_its_ttl_finds_out_before_it_writes(client, holder):
    holder.stdin.write("check\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "still held"
    os.kill(holder.pid, signal.SIGSTOP)  # a frozen laptop, a paused VM: no heartbeat
    with registry_lease(client, "m", "while it is stopped"):
        os.kill(holder.pid, signal.SIGCONT)
        holder.stdin.write("check\n")
        holder.stdin.flush()
        said = holder.stdout.readline().strip()
    assert said.startswith("RegistryError: m.registry-lock: this process lost the registry lease"), said


def test_a_model_of_the_locks_name_not_made_by_grpoflow_is_refused(client):
    client.create_registered_model("m.registry-lock")
    with pytest.raises(RegistryError, match="exists without the tag grpoflow.kind=registry-lock"):
        with registry_lease(client, "m", "x"):
            pass


def test_a_hung_tracking_server_inside_the_lease_ends_the_command_within_one_calls_budget(tmp_path, monkeypatch):
    """The server stops answering (SIGSTOP: connections are accepted, nothing answers) while this
    process holds the lease: the failing call gives up within the budget, and releasing the lease
    adds no wait for the heartbeat thread and no delete that would wait a budget again."""
    import mlflow

    from pipelines.execution.services import mlflow_http_settings, unavailable
    from tests.servers import mlflow_server, served

    budget = 6.0
    for key, value in mlflow_http_settings(budget).items():
        monkeypatch.setenv(key, value)
    with served(lambda port: mlflow_server(port, tmp_path), "/health", tmp_path / "mlflow.log") as server:
        client = mlflow.MlflowClient(tracking_uri=server.url, registry_uri=server.url)
        monkeypatch.setattr(mlflow, "get_tracking_uri", lambda: server.url)  # unavailable() names this server
        with pytest.raises(Exception) as err:
            with registry_lease(client, "m", "a gate", heartbeat_s=1):
                os.killpg(server.proc.pid, signal.SIGSTOP)
                start = time.monotonic()
                client.get_registered_model("m")
        seconds = time.monotonic() - start
        os.killpg(server.proc.pid, signal.SIGCONT)
    assert unavailable(err.value) is not None, err.value
    assert seconds < budget + 3, seconds


def test_lock_rows_stay_bounded_after_50_moves(client):
    """MLflow keeps a deleted version's row: one ticket per move would pile up for ever. The last holder
    in the queue deletes the lock model with its rows, so 50 forced promotions leave none."""
    import sqlite3

    import mlflow

    from pipelines.params.config import load_params
    from pipelines.registry.moves import force_promote

    client.create_registered_model("m", tags={"grpoflow.managed": "true"})
    for _ in range(2):
        client.create_model_version("m", source="grpoflow-lease:/none", await_creation_for=0)
    params = load_params()
    for i in range(50):
        force_promote(params, "m", str(1 + i % 2), f"move {i}")
    db = mlflow.get_tracking_uri().removeprefix("sqlite:///")
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT count(*) FROM model_versions WHERE name = 'm.registry-lock'").fetchone()[0]
        champion = con.execute("SELECT version FROM registered_model_aliases WHERE name = 'm'").fetchone()[0]
    assert rows <= 1 and champion == 2, rows
