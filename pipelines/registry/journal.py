"""A registry move's intent, recorded before its first write, so that a rerun after any failure
completes that same move instead of starting another: the gate's decision, `grpoflow promote`,
`grpoflow rollback` (pipelines/registry/moves.py).

A move is a list of writes: version tags, and alias moves (`champion` from the version it was on to
another). Under the registry lease, before the first write, the whole list is written as the
registered model's tag `grpoflow.move` (JSON): the intent. Then each write in order; deleting the
intent is the commit. Each write has the same result when made again (a tag set to its value; an
alias put on its version, or found there), so completing a move makes its writes again from the first.

Every move, in its turn under the lease, first completes a move that an earlier command left unfinished
(`complete`); a rerun of that same command then returns the move it completed and starts no other
(a rollback never rolls back twice). A failure between two writes ends the command with its cause and
what was done and what is left, e.g.

    error: the MLflow tracking server at http://127.0.0.1:5000 stopped answering (…); start it …; the
    rollback of grpoflow-policy (champion v4 -> v3) stopped after 1 of 3 writes: done: champion v4 -> v3;
    left: rollback.reason on v4, rollback.restored_from on v3. Run `grpoflow rollback grpoflow-policy`
    again: it completes this rollback and starts no other

An alias found on neither of its versions was moved outside the lease (by hand, in the MLflow UI or
API): the move cannot be completed as decided, so it is abandoned (its intent deleted) and the line
says so; a gate's next run decides again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from components.common.errors import CommandFailed, GrpoflowError, RegistryError
from pipelines.handoff import Decision
from pipelines.registry.lease import Lease
from pipelines.registry.register import REASON_TAG, alias_version

MOVE_TAG = "grpoflow.move"  # a registered model's tag: the move under way (JSON), deleted when it is done


class AliasMoved(RegistryError):
    """An alias was on neither the version a move expected nor the one it moves to."""


class Abandoned(RegistryError):
    """A move that cannot be completed as decided (an alias moved by hand): its intent was deleted."""


@dataclass
class Move:
    kind: str  # gate | forced | rollback: what a rerun of the same command completes
    version: str  # the version decided on (a rollback: the one restored)
    command: str  # what the user runs again, e.g. `grpoflow rollback grpoflow-policy`
    summary: str  # e.g. "the rollback of grpoflow-policy (champion v4 -> v3)"
    writes: list[dict[str, Any]] = field(default_factory=list)  # {version, tag, value} | {alias, from?, to}
    # The Decision the move returns: its reason, when left out, is the one its writes tag (a tag value of a
    # registered model holds 5000 characters on PostgreSQL: a gate's reason is written once, not twice).
    decision: dict[str, Any] = field(default_factory=dict)

    def tag(self, version: str, key: str, value: str) -> None:
        self.writes.append({"version": str(version), "tag": key, "value": value})

    def alias(self, alias: str, to: str, expected: str | None = None, any_from: bool = False) -> None:
        """Put `alias` on `to`, only from `expected` (None: no version) unless `any_from`."""
        self.writes.append({"alias": alias, "to": str(to), **({} if any_from else {"from": expected})})

    def result(self) -> Decision:
        reason = next((w["value"] for w in self.writes if w.get("tag") == REASON_TAG), "")
        return Decision(**{"reason": reason, **self.decision})


def _describe(write: dict[str, Any]) -> str:
    """One write as the error line names it.

    >>> _describe({"alias": "champion", "from": "4", "to": "3"}), _describe({"version": "3", "tag": "k", "value": "v"})
    ('champion v4 -> v3', 'k on v3')
    """
    if "alias" in write:
        was = f"v{write['from']}" if write.get("from") else ("no version" if "from" in write else "")
        return f"{write['alias']} {was + ' -> ' if was else 'on '}v{write['to']}"
    return f"{write['tag']} on v{write['version']}"


def _apply(client, lease: Lease, name: str, write: dict[str, Any]) -> None:
    if "alias" not in write:
        client.set_model_version_tag(name, write["version"], write["tag"], write["value"])
        return
    now = alias_version(client, name, write["alias"])
    now = now.version if now else None
    if now == write["to"]:
        return  # made by an earlier try
    if "from" in write and now != write["from"]:
        was, is_ = (f"v{x}" if x else "no version" for x in (write["from"], now))
        raise AliasMoved(f"{name}: {write['alias']} moved from {was} to {is_} outside grpoflow's registry lease "
                         "(by hand?)")
    lease.check()
    client.set_registered_model_alias(name, write["alias"], write["to"])


def pending(client, name: str) -> Move | None:
    """The move an earlier command left unfinished on `name`, or None."""
    from mlflow.exceptions import MlflowException

    try:
        raw = client.get_registered_model(name).tags.get(MOVE_TAG)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc.error_code):
            return None
        raise
    return Move(**json.loads(raw)) if raw else None


def run(client, lease: Lease, name: str, move: Move) -> None:
    """Record the move's intent, make its writes, delete the intent."""
    lease.check()
    try:
        client.set_registered_model_tag(name, MOVE_TAG, json.dumps(asdict(move)))
    except Exception as exc:
        raise _stopped(exc, move, None) from None
    _finish(client, lease, name, move)


def complete(client, lease: Lease, name: str) -> Move | None:
    """Complete the move an earlier command left unfinished (call holding the lease); returns it, or
    None when there was none or it had to be abandoned (an alias moved by hand since: said in a line)."""
    move = pending(client, name)
    if move is None:
        return None
    print(f"registry: completing {move.summary}, left unfinished by an earlier command", flush=True)
    try:
        _finish(client, lease, name, move)
    except Abandoned as exc:
        print(f"registry: {exc}", flush=True)
        return None
    return move


def _finish(client, lease: Lease, name: str, move: Move) -> None:
    done = 0
    try:
        for write in move.writes:
            _apply(client, lease, name, write)
            done += 1
        client.delete_registered_model_tag(name, MOVE_TAG)
    except AliasMoved as moved:
        try:
            client.delete_registered_model_tag(name, MOVE_TAG)  # abandoned: the next gate decides again
        except Exception as exc:
            raise _stopped(exc, move, done) from None
        raise Abandoned(f"{moved}; {move.summary} was abandoned after {done} of {len(move.writes)} writes"
                            f"{_lists(move, done)}. Check the champion, then run the command again if it still "
                            "applies") from moved
    except Exception as exc:
        raise _stopped(exc, move, done) from None


def _lists(move: Move, done: int) -> str:
    made = ", ".join(_describe(w) for w in move.writes[:done]) or "nothing"
    left = ", ".join(_describe(w) for w in move.writes[done:])
    return f": done: {made}" + (f"; left: {left}" if left else "")


def _stopped(exc: Exception, move: Move, done: int | None) -> Exception:
    """The error for a move stopped by `exc` after `done` writes (None: at its intent): the cause's
    line, what was done and what is left, and the command that completes it."""
    from pipelines.execution.services import unavailable

    gone = unavailable(exc)
    cause = str(gone) if gone else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if done is None:
        where = f"{move.summary} stopped at its first write, the record of its intent ({MOVE_TAG}); nothing else "
        where += f"was written. Run `{move.command}` again"
    else:
        n = len(move.writes)
        where = (f"{move.summary} stopped after {done} of {n} writes{_lists(move, done)}" if done < n else
                 f"{move.summary} made all its {n} writes; the record of its intent ({MOVE_TAG}) is left")
        where += f". Run `{move.command}` again: it completes this move and starts no other"
    kind = type(gone) if gone else RegistryError if isinstance(exc, GrpoflowError) else CommandFailed
    return kind(f"{cause}; {where}")
