"""The champion's moves, each made while holding the registry lease (pipelines/registry/lease.py):
a decision written and the alias moved (the gate's last step), `grpoflow promote` (forced),
`grpoflow rollback`, and the repair of what a race of older grpoflow versions left behind.

Each move records its intent before its first write (pipelines/registry/journal.py), so that a rerun
after any failure completes that same move and starts no other. Its writes, in order: a decision's
numbers and reason first, then the alias (only if the champion is still the one the decision was
made against and this process still holds the lease), then `promotion.decision` last, which the next
gate checks. A rollback checks everything before its first write (a champion, the version it
replaced, still in the registry), then moves the alias and tags the two.
"""

from __future__ import annotations

import calendar
import dataclasses
import getpass
import time

from components.common.errors import RegistryError
from components.common.params import Params
from components.common.params_rules import check_model_name
from pipelines.handoff import Decision
from pipelines.registry import journal
from pipelines.registry.journal import Move
from pipelines.registry.lease import Lease, registry_lease
from pipelines.registry.register import (
    CHALLENGER,
    CHAMPION,
    DECISION_TAG,
    PREVIOUS_TAG,
    REASON_TAG,
    alias_version,
    check_owned,
    client_for,
)

# Who decided and when (version tags, written with the decision): what a later no-op run reports.
DECIDED_BY_TAG = "promotion.decided_by_run"
DECIDED_AT_TAG = "promotion.decided_at"
GATE_REASON_TAG = "promotion.gate_reason"  # a superseded version's reason before it was superseded
ROLLBACK_REASON_TAG = "rollback.reason"
RESTORED_FROM_TAG = "rollback.restored_from"
TIME_FORMAT = "%Y-%m-%d %H:%M UTC"
RACE_WINDOW_S = 120  # two promotions over one champion decided this close together: an older race


def _missing(exc: Exception) -> bool:
    return "RESOURCE_DOES_NOT_EXIST" in str(getattr(exc, "error_code", ""))


def model_version(client, name: str, version: str):
    """The registered version, or RegistryError naming it and the registry."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version(name, str(version))
    except MlflowException as exc:
        if not _missing(exc):
            raise
        raise RegistryError(f"{name} version {version} does not exist in {mlflow.get_tracking_uri()}") from None


def tag_value(value) -> str:
    """Version tags as people read them: strings as they are, booleans as true/false, the rest as JSON."""
    import json

    return value if isinstance(value, str) else json.dumps(value)


def unmoved(name: str, read: str | None, now: str | None, command: str) -> None:
    """RegistryError when the champion read before taking the lease is no longer champion in this
    process's turn: the user asked about the one they saw; nothing is moved or written."""
    if read != now:
        was, is_ = (f"v{x}" if x else "no version" for x in (read, now))
        raise RegistryError(
            f"{name}: the champion moved from {was} to {is_} while `{command}` waited for the registry "
            f"lease; nothing moved. Check the champion, then run the command again if it still applies")


def decision_move(decision: Decision, move_alias: bool, run_id: str | None = None, challenger: bool = False,
                  command: str = "") -> Move:
    """A decision's writes: numbers and reason, who and when, then (if `move_alias`) the previous champion
    and the alias, then the decision tag (what the next gate checks); with `challenger`, the challenger
    alias on the version first."""
    name, version = decision.name, decision.version
    kind = "gate" if decision.decision != "forced" else "forced"
    move = Move(kind, version, command or f"grpoflow run (the gate of {name} v{version})",
                f"the {'gate' if kind == 'gate' else 'forced promotion'} of {name} v{version} ({decision.decision})",
                decision={"name": name, "version": version, "decision": decision.decision,
                          "champion_before": decision.champion_before})
    if challenger:
        move.alias(CHALLENGER, version, any_from=True)
    for key, value in decision.numbers.items():
        move.tag(version, f"promotion.{key}", tag_value(value))
    move.tag(version, REASON_TAG, decision.reason)
    if run_id:
        move.tag(version, DECIDED_BY_TAG, run_id)
    move.tag(version, DECIDED_AT_TAG, time.strftime(TIME_FORMAT, time.gmtime()))
    if move_alias:
        if decision.champion_before and decision.champion_before != version:
            move.tag(version, PREVIOUS_TAG, decision.champion_before)
        move.alias(CHAMPION, version, decision.champion_before)
    move.tag(version, DECISION_TAG, decision.decision)
    return move


def as_decided(client, mv) -> str:
    """What is true now about a version an earlier run decided: who is champion, which run decided
    and when (a version decided before these tags were written names its registering run)."""
    champion = alias_version(client, mv.name, CHAMPION)
    if champion is None:
        now = "no version is champion"
    elif str(champion.version) == str(mv.version):
        now = f"v{mv.version} is champion"
    else:
        now = f"v{champion.version} is champion, v{mv.version} was {mv.tags[DECISION_TAG]}"
    run = mv.tags.get(DECIDED_BY_TAG) or mv.tags.get("lineage.pipeline_run_id") or "unknown"
    when = mv.tags.get(DECIDED_AT_TAG) or time.strftime(TIME_FORMAT, time.gmtime(mv.last_updated_timestamp / 1000))
    return f"{now}, decided by run {run} on {when}; nothing changed since"


def force_promote(params: Params, name: str, version: str, reason: str, adopt: bool = False) -> Decision:
    """Put `champion` on a version by hand; the reason and who did it are tagged."""
    check_model_name(name, "the model name")
    version = str(version)
    if not version.isdecimal():
        raise RegistryError(f"{name}: version {version!r} is not a version number (1, 2, …)")
    if not reason.strip():
        raise RegistryError(f"{name}: --reason is empty; say why v{version} is forced past the gate (it is recorded)")
    client = client_for(params)
    check_owned(client, name, adopt, f"grpoflow promote {name} {version} --reason TEXT")
    command = f"grpoflow promote {name} {version} --reason {reason!r}"

    def champion_now() -> str | None:
        champion = alias_version(client, name, CHAMPION)
        if champion is not None and champion.version == version:
            raise RegistryError(f"{name} v{version} is already the champion")
        return champion.version if champion else None

    if journal.pending(client, name) is None:  # before taking the lease: a mistake fails at once, touching nothing
        model_version(client, name, version)
        champion_now()
    with registry_lease(client, name, f"grpoflow promote v{version}") as lease:
        done = journal.complete(client, lease, name)
        if done is not None and (done.kind, done.version) == ("forced", version):
            return done.result()  # this command's own move, left unfinished: completed, no other started
        model_version(client, name, version)
        # A forced promotion names its version, not the champion it replaces: it goes ahead over the
        # champion of its turn, which it records (a rollback, which undoes a champion, refuses instead).
        before = champion_now()
        decision = Decision(name, version, "forced", f"forced by {getpass.getuser()}: {reason}", before)
        journal.run(client, lease, name, decision_move(decision, move_alias=True, command=command))
    return decision


def _rollback_target(client, name: str) -> tuple[str, str]:
    """(champion, the version it replaced), both in the registry, or RegistryError saying why not."""
    champion = alias_version(client, name, CHAMPION)
    if champion is None:
        raise RegistryError(f"{name} has no champion alias to roll back")
    previous = champion.tags.get(PREVIOUS_TAG)
    if not previous:
        raise RegistryError(f"{name} v{champion.version} replaced no earlier champion; nothing to roll back to")
    try:
        model_version(client, name, previous)
    except RegistryError:
        raise RegistryError(
            f"{name} v{champion.version} replaced v{previous}, which is no longer in the registry (deleted); "
            f"nothing moved. Put champion on a version by hand: grpoflow promote {name} VERSION --reason TEXT"
        ) from None
    return champion.version, previous


def rollback(params: Params, name: str, adopt: bool = False) -> Decision:
    """Move `champion` back to the version it replaced (its `promotion.previous_champion` tag)."""
    check_model_name(name, "the model name")
    client = client_for(params)
    check_owned(client, name, adopt, f"grpoflow rollback {name}")
    # Before taking the lease, a mistake fails at once, touching nothing (unless a rollback is to be completed).
    read = _rollback_target(client, name)[0] if journal.pending(client, name) is None else None
    with registry_lease(client, name, "grpoflow rollback") as lease:
        done = journal.complete(client, lease, name)
        if done is not None and done.kind == "rollback":
            return done.result()  # the rollback this command left unfinished: completed, not a second one
        champion, previous = _rollback_target(client, name)  # again, in this process's turn
        if read is not None:
            unmoved(name, read, champion, f"grpoflow rollback {name}")
        user = getpass.getuser()
        decision = Decision(name, previous, "rollback", f"champion moved back from v{champion} to v{previous}",
                            champion)
        move = Move("rollback", previous, f"grpoflow rollback {name}",
                    f"the rollback of {name} (champion v{champion} -> v{previous})",
                    decision=dataclasses.asdict(decision))
        move.alias(CHAMPION, previous, champion)
        move.tag(champion, ROLLBACK_REASON_TAG, f"rolled back by {user} to v{previous}")
        move.tag(previous, RESTORED_FROM_TAG, champion)
        journal.run(client, lease, name, move)
    return decision


# --------------------------------------------------------------------------- an older race's stray tags


def _decided_at(mv) -> float | None:
    try:
        return calendar.timegm(time.strptime(mv.tags[DECIDED_AT_TAG], TIME_FORMAT))
    except (KeyError, ValueError):
        return None


def stray_promotions(versions, champion: str | None) -> list[tuple[object, object]]:
    """(stray, winner) pairs: two versions promoted (or forced) over the same champion within
    RACE_WINDOW_S of each other, of which the winner took the alias (it is champion, or a later
    promotion or rollback replaced it) and the stray never did. Only a race before the registry
    lease leaves this: a version replaced later names the version it replaced (its
    `promotion.previous_champion`), a rolled-back one says so (`rollback.reason`).

    >>> from types import SimpleNamespace as V
    >>> at = {"promotion.decided_at": "2026-12-01 04:39 UTC"}
    >>> v2 = V(version="2", tags={"promotion.decision": "promoted", "promotion.previous_champion": "1", **at})
    >>> v3 = V(version="3", tags={"promotion.decision": "promoted", "promotion.previous_champion": "1", **at})
    >>> [(s.version, w.version) for s, w in stray_promotions([v2, v3], champion="3")]
    [('2', '3')]
    >>> stray_promotions([v2, v3], champion="1")  # neither took the alias: not this repair's to guess
    []
    """
    promoted = [v for v in versions if v.tags.get(DECISION_TAG) in ("promoted", "forced")]
    replaced = {v.tags.get(PREVIOUS_TAG) for v in versions}

    def held_the_alias(v) -> bool:
        return str(v.version) == champion or str(v.version) in replaced or ROLLBACK_REASON_TAG in v.tags

    pairs = []
    for stray in (v for v in promoted if not held_the_alias(v)):
        when = _decided_at(stray)
        for winner in promoted:
            other = _decided_at(winner)
            if (winner is not stray and held_the_alias(winner) and when is not None and other is not None
                    and winner.tags.get(PREVIOUS_TAG) == stray.tags.get(PREVIOUS_TAG)
                    and abs(when - other) <= RACE_WINDOW_S):
                pairs.append((stray, winner))
                break
    return pairs


def reconcile(client, lease: Lease, name: str, by: str) -> list[str]:
    """Give each stray of an older race (`stray_promotions`) its decision: superseded, naming the
    winner and the run that promoted it; its gate's reason is kept as `promotion.gate_reason`.
    Call while holding the lease; returns the reasons written."""
    champion = alias_version(client, name, CHAMPION)
    versions = client.search_model_versions(f"name = '{name}'")
    written = []
    for stray, winner in stray_promotions(versions, champion.version if champion else None):
        run = winner.tags.get(DECIDED_BY_TAG)
        how = f"by run {run}" if run else f"by hand ({winner.tags.get(REASON_TAG, 'forced')})"
        replaced = winner.tags.get(PREVIOUS_TAG)
        reason = (f"superseded: v{winner.version} was promoted first, {how}; an older race left v{stray.version} "
                  f"tagged {stray.tags[DECISION_TAG]} over {'v' + replaced if replaced else 'no champion'} as well "
                  f"(repaired by {by})")
        lease.check()
        client.set_model_version_tag(name, stray.version, GATE_REASON_TAG, stray.tags.get(REASON_TAG, ""))
        client.set_model_version_tag(name, stray.version, REASON_TAG, reason)
        client.set_model_version_tag(name, stray.version, DECISION_TAG, "superseded")
        print(f"promotion: {name} v{stray.version}: superseded — {reason}", flush=True)
        written.append(reason)
    return written


def repair_strays(client, name: str, by: str) -> None:
    """`reconcile` under the lease, taken only when a read without it finds a stray."""
    champion = alias_version(client, name, CHAMPION)
    if stray_promotions(client.search_model_versions(f"name = '{name}'"), champion.version if champion else None):
        with registry_lease(client, name, by) as lease:
            reconcile(client, lease, name, by)
