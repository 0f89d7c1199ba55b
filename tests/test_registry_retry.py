"""Every registry move is safe to retry: the tracking server is lost after any one of a move's writes
(the gate's decision, `grpoflow promote`, `grpoflow rollback`), the command ends in one line saying what
was done and what is left, and the same command run again, with the server back, completes that move
and starts no other: the registry ends as an uninterrupted move leaves it.

A real `mlflow server` on SQLite, reached through a forwarder on a fixed port: cutting the forwarder is
the server lost (connections refused); killing the server (SIGKILL) and starting it again on its store
behind the same address is done once, for the rollback the issue found rolling back twice. The writes
are counted where MLflow's client sends them (mlflow.utils.rest_utils.http_request), only those to the
model moved; the server is lost right after write k returns. (Every write of the gate: tests/slow/
test_registry_retry_all.py.)

    pytest -q tests/test_registry_retry.py
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from components.common.entry import one_line_errors
from tests.servers import free_port, mlflow_server, served

ITEMS = [{"id": f"q{i}", "completion": "x", "extracted": "1"} for i in range(100)]
STATE_SKIPPED = ("promotion.decided_at",)  # minutes: two runs may straddle one
TTL_S = 10.0  # the registry lease's TTL here (60 s by default)


class Forwarder:
    """127.0.0.1:port forwarded to the server's port; `cut()` drops every connection and refuses new ones
    (the server lost, as a client sees it), `restore()` listens on the same port again."""

    def __init__(self, target: int) -> None:
        self.target, self.port, self.conns = target, free_port(), []
        self.restore()

    def restore(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(64)
        threading.Thread(target=self._accept, args=(self.sock,), daemon=True).start()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                return
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        for s in (self.sock, *self.conns):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self.conns.clear()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One real `mlflow server` for the module, behind a forwarder."""
    store = tmp_path_factory.mktemp("store")
    with served(lambda port: mlflow_server(port, store), "/health", store / "mlflow.log") as srv:
        fwd = Forwarder(srv.port)
        yield {"server": srv, "store": store, "fwd": fwd}
        fwd.cut()


@pytest.fixture
def registry(server, monkeypatch):
    """(client, forwarder, box): writes to the model in `box["model"]` are counted, and after the
    `box["after"]`-th one `box["lose"]()` runs (by default: the forwarder cut)."""
    import mlflow
    from mlflow.utils import rest_utils

    from pipelines.registry import lease

    fwd = server["fwd"]
    box = {"model": None, "after": 0, "writes": 0, "lose": fwd.cut, **server}
    uri = f"http://127.0.0.1:{fwd.port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # a refused call fails at once
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    mlflow.set_tracking_uri(uri)
    # Heartbeats every second, so that a move of a few seconds beats while it runs; a TTL of 10 s, not 60,
    # but ample on a loaded machine (1 s was not: a beat slower than that, and the move stopped on a lost
    # lease before its write k). The ticket a lost command leaves is expired by `expire_left_tickets`.
    lease_function = lease.registry_lease.__wrapped__  # (under contextlib.contextmanager)
    monkeypatch.setattr(lease_function, "__kwdefaults__",
                        {**lease_function.__kwdefaults__, "ttl_s": TTL_S, "heartbeat_s": 1.0})
    real = rest_utils.http_request

    def counted(**kw):
        response = real(**kw)
        body = kw.get("json") or {}
        if kw.get("method") != "GET" and box["model"] and body.get("name") == box["model"]:
            box["writes"] += 1
            if box["writes"] == box["after"]:
                box["lose"]()
        return response

    monkeypatch.setattr(rest_utils, "http_request", counted)
    return mlflow.MlflowClient(), fwd, box


def items_file(root: Path, right: int) -> tuple[str, str]:
    path = root / f"items-{right}.jsonl"
    path.write_text("".join(json.dumps({**r, "correct": i < right}) + "\n" for i, r in enumerate(ITEMS)))
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


def setup(client, name: str, kind: str, root: Path) -> None:
    """`name` as each move finds it: for a rollback v3 champion over v2 over v1; for a forced promotion
    v1 champion and v2; for a gate v1 champion (40 of 100 right) and v2 (80 of 100) to decide."""
    client.create_registered_model(name, tags={"grpoflow.managed": "true"})
    evaluated = {"eval.test_sha256": "f" * 64, "eval.protocol": "grpoflow", "eval.max_new_tokens": "256"}
    for v, right in ((1, 40), (2, 80), (3, 60))[: 3 if kind == "rollback" else 2]:
        uri, sha = items_file(root, right)
        tags = {"lineage.dvc_lock_md5": f"{v}" * 32, "eval.items_uri": uri, "eval.items_sha256": sha, **evaluated}
        if kind == "rollback" and v > 1:
            tags.update({"promotion.previous_champion": str(v - 1), "promotion.decision": "promoted"})
        client.create_model_version(name, source="grpoflow-lease:/none", tags=tags, await_creation_for=0)
    client.set_registered_model_alias(name, "champion", "3" if kind == "rollback" else "1")


def expire_left_tickets(client, name: str) -> None:
    """The lost command left its lease ticket (no release with the server gone): its process would be
    gone, and the ticket dead TTL_S after its last heartbeat. Instead of the rerun waiting that out, its
    TTL ends now (tag lease.ttl_s 0): the rerun still finds a dead ticket ahead of its own, deletes it
    and takes the lease, as after the TTL."""
    from pipelines.registry.lease import TTL_TAG, lock_name

    for ticket in client.search_model_versions(f"name = '{lock_name(name)}'"):
        client.set_model_version_tag(ticket.name, ticket.version, TTL_TAG, "0")


def move(kind: str, name: str, root: Path):
    from pipelines.handoff import Registration
    from pipelines.params.config import load_params
    from pipelines.registry.moves import force_promote, rollback
    from pipelines.registry.promotion import gate

    params = load_params()
    if kind == "rollback":
        return rollback(params, name)
    if kind == "promote":
        return force_promote(params, name, "2", "hand-checked")
    return gate(params, Registration(name, "2", created=False, run_id="run-1"), root)


def state(client, name: str) -> dict:
    """What a user can see of the model: its tags and aliases, each version's tags."""
    model = client.get_registered_model(name)
    versions = {v.version: {k: x for k, x in v.tags.items() if k not in STATE_SKIPPED}
                for v in client.search_model_versions(f"name = '{name}'")}
    return {"tags": dict(model.tags), "aliases": dict(model.aliases), "versions": versions}


def writes_of(client, box, kind: str, root: Path) -> tuple[int, dict]:
    """The writes of an uninterrupted move and the state it leaves."""
    box.update(model="ref-" + kind, writes=0, after=0)
    setup(client, box["model"], kind, root)
    box["writes"] = 0
    move(kind, box["model"], root)
    return box["writes"], state(client, box["model"])


def lost_after(client, fwd, box, kind: str, k: int, root: Path, capsys) -> str:
    """The move with the server lost after its write k; the command's line; then the server back and the
    same move run again, which must complete it."""
    name = f"{kind}-{k}"
    box.update(model=None)
    setup(client, name, kind, root)
    box.update(model=name, writes=0, after=k)
    code = one_line_errors(lambda: move(kind, name, root) and 0)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, (kind, k, err)
    if box["lose"] == fwd.cut:
        fwd.restore()
    box.update(after=0)
    expire_left_tickets(client, name)
    move(kind, name, root)  # the rerun
    return [line for line in err.splitlines() if line.startswith("error: ")][0]


@pytest.mark.parametrize("kind", ["promote", "gate", "rollback"])  # rollback last: it kills the server
def test_a_move_stopped_after_any_write_is_completed_by_its_rerun(registry, tmp_path, capsys, kind):
    client, fwd, box = registry
    n, expected = writes_of(client, box, kind, tmp_path)
    points = range(1, n) if kind != "gate" else sorted({1, 2, n // 2, n - 3, n - 2, n - 1})
    for k in points:
        line = lost_after(client, fwd, box, kind, k, tmp_path, capsys)
        assert "stopped answering" in line and "again: it completes this move and starts no other" in line \
            or "stopped at its first write" in line, (k, line)
        got = state(client, f"{kind}-{k}")
        assert got == expected, (k, line)
    if kind == "rollback":  # the case the issue met: server killed after the alias moved v3 -> v2
        line, got = rollback_with_the_server_killed(client, fwd, box, tmp_path, capsys)
        assert "stopped after 1 of 3 writes: done: champion v3 -> v2; left: rollback.reason on v3, " in line, line
        assert got == expected


def rollback_with_the_server_killed(client, fwd, box, root: Path, capsys) -> tuple[str, dict]:
    from tests.servers import stop

    holder = {}

    def kill() -> None:
        os.killpg(box["server"].proc.pid, signal.SIGKILL)
        box["server"].proc.wait()
        fwd.cut()

    def back() -> None:  # the same store, a new process behind the same address
        holder["cm"] = served(lambda port: mlflow_server(port, box["store"]), "/health", root / "mlflow2.log")
        server = holder["cm"].__enter__()
        fwd.target = server.port
        fwd.restore()

    box.update(lose=kill)
    name = "rollback-killed"
    box.update(model=None)
    setup(client, name, "rollback", root)
    box.update(model=name, writes=0, after=2)  # the intent, then the alias
    code = one_line_errors(lambda: move("rollback", name, root) and 0)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    back()
    box.update(after=0)
    expire_left_tickets(client, name)
    decision = move("rollback", name, root)
    assert (decision.decision, decision.version, decision.champion_before) == ("rollback", "2", "3")
    got = state(client, name)
    holder["cm"].__exit__(None, None, None)  # the forwarder's target is gone: later tests need none
    stop(box["server"].proc)
    return [line for line in err.splitlines() if line.startswith("error: ")][0], got
