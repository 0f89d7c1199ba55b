"""The registry lease: one process at a time moves a registered model's aliases (gate, `grpoflow
promote`, `grpoflow rollback`, a new version's `challenger`), whatever checkout or machine it runs
from. The MLflow tracking server's own database is the arbiter; nothing else needs to be shared.

A process that wants the lease takes a ticket: a new version of the registered model
`<name>.registry-lock` (tagged `grpoflow.kind: registry-lock`, its mark). MLflow's SQL store
creates a version in one transaction that numbers it max + 1 under the table's unique key, so
tickets are unique and increasing, and a ticket exists only after every lower one was committed.
The lowest live ticket holds the lease; the others wait for it. A process touches its ticket every
`heartbeat_s` seconds (`update_model_version`: the server's clock stamps `last_updated_timestamp`,
so clocks of other machines do not matter); a ticket untouched for its `lease.ttl_s` (60 s) is
dead, its process killed or stalled, and the next waiter deletes it. Releasing deletes one's own
ticket; the last holder in the queue deletes the lock model instead, and with it every ticket row
(MLflow keeps a deleted version's row, so tickets would pile up, one per move): the rows stay as many
as the processes queued at once. A waiter whose ticket goes with it (it queued in between) takes a
new one in the lock model made again. A holder calls `Lease.check()` right before a write that must
not land after it lost the lease: a ticket deleted as dead means another process may hold the lease now.

What this guarantees, and where (docs/registry.md, "One champion across checkouts"): on a tracking
store backed by SQL (a `sqlite:` file, an `mlflow server` on SQLite; PostgreSQL and MySQL number
versions the same way, untested here), as long as no holder stalls for longer than the ticket's TTL
between its check and its write. A file store (a bare folder as `tracking.uri`) numbers versions
without a transaction: no guarantee there.

    with registry_lease(client, "grpoflow-policy", "gate v3") as lease:
        ...             # read, compare
        lease.check()
        ...             # move the alias
"""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import socket
import threading
import time
from collections.abc import Iterator

from components.common.errors import RegistryError

LOCK_SUFFIX = ".registry-lock"
KIND_TAG, LOCK_KIND = "grpoflow.kind", "registry-lock"  # the mark that the lock model is grpoflow's
HOLDER_TAG, PURPOSE_TAG, TTL_TAG = "lease.holder", "lease.purpose", "lease.ttl_s"
TICKET_SOURCE = "grpoflow-lease:/"  # a ticket holds no model; MLflow wants a source that names nothing local
TTL_S = 60.0  # a ticket untouched for this long is dead
HEARTBEAT_S = 10.0
POLL_S = 0.1  # a waiter looks every POLL_S seconds per ticket ahead of it (at most every second)
WAIT_S = 300.0  # how long a process waits for the lease before it gives up, naming the holder


def lock_name(name: str) -> str:
    return f"{name}{LOCK_SUFFIX}"


def holder() -> str:
    """Who a ticket belongs to, as people read it: user@host pid N."""
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"


def _missing(exc: Exception) -> bool:
    """The server's answer for a version that does not exist (or was deleted)."""
    return "RESOURCE_DOES_NOT_EXIST" in str(getattr(exc, "error_code", ""))


def _ensure_lock_model(client, lock: str) -> None:
    """Create the lock model once (concurrent creators: one wins, the others find it); refuse a
    registered model of that name that grpoflow did not create."""
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(lock)
    except MlflowException as exc:
        if not _missing(exc):
            raise
        try:
            client.create_registered_model(
                lock, tags={KIND_TAG: LOCK_KIND},
                description="grpoflow's registry lease: each version is a waiting or holding process's ticket "
                            "(pipelines/registry/lease.py). Not a model.")
            return
        except MlflowException as exc:
            if "ALREADY_EXISTS" not in str(exc.error_code):
                raise
        model = client.get_registered_model(lock)
    if model.tags.get(KIND_TAG) != LOCK_KIND:
        raise RegistryError(f"{lock}: a registered model of this name exists without the tag {KIND_TAG}={LOCK_KIND}; "
                            "grpoflow uses this name for its registry lease: rename that model")


class Lease:
    """One process's ticket in the queue of `lock`: its heartbeat thread, and whether it is still live."""

    def __init__(self, client, lock: str, purpose: str, ttl_s: float, heartbeat_s: float):
        self.client, self.lock, self.ttl_s, self.heartbeat_s = client, lock, ttl_s, heartbeat_s
        self.description = f"{holder()}: {purpose}"
        self._sent = time.monotonic()  # local time no later than the server's stamp: for this ticket's own TTL
        mv = client.create_model_version(
            lock, source=TICKET_SOURCE + lock, description=self.description, await_creation_for=0,
            tags={HOLDER_TAG: holder(), PURPOSE_TAG: purpose, TTL_TAG: str(ttl_s)},
        )
        self.ticket = int(mv.version)
        self._beat = (int(mv.last_updated_timestamp), time.monotonic())  # (server ms, local monotonic s)
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name=f"lease-{lock}-{self.ticket}", daemon=True)
        self._thread.start()

    def server_now_ms(self) -> float:
        """The server's clock now, from its stamp on this ticket's last heartbeat (never ahead of it)."""
        server_ms, mono = self._beat
        return server_ms + 1000 * (time.monotonic() - mono)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                sent = time.monotonic()
                mv = self.client.update_model_version(self.lock, str(self.ticket), description=self.description)
                # The server stamped it between `sent` and now: local time after the answer (as in __init__)
                # keeps the estimate of the server's clock from running ahead of it; the time before the
                # request keeps this process from thinking its ticket alive longer than the others do.
                self._beat, self._sent = (int(mv.last_updated_timestamp), time.monotonic()), sent
            except Exception as exc:  # the server said the ticket is gone, or did not answer this time
                if _missing(exc):
                    self._lost = "its ticket was deleted as dead (this process stalled past the lease's TTL)"
                    return
            if time.monotonic() - self._sent > self.ttl_s:
                self._lost = f"no heartbeat reached the server for {self.ttl_s:.0f} s"
                return

    def check(self) -> None:
        """Raise RegistryError when this process no longer holds the lease; call right before a write."""
        if self._lost is None:
            try:
                self.client.get_model_version(self.lock, str(self.ticket))
            except Exception as exc:
                if not _missing(exc):
                    raise
                self._lost = "its ticket was deleted as dead (this process stalled past the lease's TTL)"
        if self._lost:
            raise RegistryError(f"{self.lock}: this process lost the registry lease: {self._lost}; nothing more "
                                "was written. Run the command again")

    def release(self, server_gone: bool = False) -> None:
        """Delete this ticket, or, when no other is queued, the lock model with every ticket row. The
        heartbeat thread is not waited for (a daemon; a beat after the delete finds the ticket gone).
        With `server_gone` (the block failed because the tracking server stopped answering) no call
        is made: the ticket expires after its TTL, and the command ends within one call's budget
        instead of three."""
        self._stop.set()
        if server_gone:
            return
        with contextlib.suppress(Exception):  # gone already: deleted as dead by a waiter
            tickets = self.client.search_model_versions(f"name = '{self.lock}'")
            if {int(t.version) for t in tickets} == {self.ticket}:  # the last in the queue: prune the rows
                self.client.delete_registered_model(self.lock)
                return
            self.client.delete_model_version(self.lock, str(self.ticket))

    def wait(self, wait_s: float, say=print) -> None:
        """Return once this ticket is the lowest live one; RegistryError after `wait_s` seconds."""
        start, said = time.monotonic(), None
        while True:
            tickets = self.client.search_model_versions(f"name = '{self.lock}'")
            if not any(int(t.version) == self.ticket for t in tickets):
                self._stop.set()  # deleted while it waited (as dead, or with the lock model): queue again
                raise _Requeue
            now = self.server_now_ms()
            live = []
            for t in tickets:
                if int(t.version) == self.ticket or now - int(t.last_updated_timestamp) <= 1000 * ttl_of(t):
                    live.append(t)
                else:
                    with contextlib.suppress(Exception):  # another waiter deleted it first
                        self.client.delete_model_version(self.lock, t.version)
            first = min(live, key=lambda t: int(t.version))
            if int(first.version) == self.ticket:
                return
            who = first.description or first.tags.get(HOLDER_TAG, "another process")
            if time.monotonic() - start > wait_s:
                raise RegistryError(
                    f"{self.lock}: waited {wait_s:.0f} s for the registry lease, held by {who}; try again when "
                    f"it is done (a holder that died frees it within {ttl_of(first):.0f} s)")
            if who != said:
                say(f"waiting for the registry lease held by {who}", flush=True)
                said = who
            ahead = sum(int(t.version) < self.ticket for t in live)  # the next in line looks most often
            time.sleep(min(POLL_S * ahead, 1.0) * random.uniform(0.5, 1.5))


class _Requeue(Exception):  # noqa: N818 (not an error: the waiter takes a new ticket)
    """A waiting process's ticket was deleted before it held the lease."""


def ttl_of(ticket) -> float:
    return float(ticket.tags.get(TTL_TAG, TTL_S))


@contextlib.contextmanager
def registry_lease(client, name: str, purpose: str, *, wait_s: float = WAIT_S, ttl_s: float = TTL_S,
                   heartbeat_s: float = HEARTBEAT_S) -> Iterator[Lease]:
    """Hold `name`'s registry lease for the block (see the module docstring); `purpose` is shown to
    processes that wait for it."""
    from mlflow.exceptions import MlflowException

    lock, deadline = lock_name(name), time.monotonic() + wait_s
    while True:
        _ensure_lock_model(client, lock)
        try:
            lease = Lease(client, lock, purpose, ttl_s, heartbeat_s)
        except MlflowException as exc:  # the lock model was deleted in between by the last holder: again
            if not _missing(exc):
                raise
            continue
        try:
            lease.wait(max(deadline - time.monotonic(), 0.0))
            break
        except _Requeue:
            continue
        except BaseException as exc:
            from pipelines.execution.services import unavailable

            lease.release(server_gone=unavailable(exc) is not None)
            raise
    try:
        yield lease
    except BaseException as exc:
        from pipelines.execution.services import unavailable

        lease.release(server_gone=unavailable(exc) is not None)
        raise
    lease.release()
