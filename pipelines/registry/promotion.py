"""Promotion: the gate that decides whether a registered version becomes `champion` (the flow's
`promote` step); the commands `grpoflow promote` and `grpoflow rollback` (pipelines/registry/moves.py).

`gate()` is the promotion step. `champion` moves to the challenger only if there is no
champion yet, or if on the same evaluation items (paired by item id, at least
`register.min_items` of them) the challenger's accuracy beats the champion's by more than zero
and at least `register.min_delta`, with an exact McNemar p-value below `register.alpha`.

The items are the ones registered with each version (`eval.items_uri`, checked against
`eval.items_sha256`: register.registered_items), not a checkout's local files. Like with like: each
version carries what it was evaluated on (`eval.test_sha256` over the items' id, question and gold,
`eval.protocol`, `eval.max_new_tokens`). When the champion's differ from the challenger's (another
`data.seed`, test size, source, protocol or token budget), the gate first re-evaluates the
champion, downloaded from the registry, on the challenger's items with the challenger's settings,
then compares; `promotion.test_sha256`, `promotion.n` and `promotion.champion_reevaluated` record
what it compared.

With `evaluate.target_band` set, the gate pairs only the items of that band (by the challenger's
items' `steps`; `promotion.target_band` records it): the problems the user named as the goal.

One champion across checkouts: the gate reads the champion, compares and writes while holding the
registry lease (pipelines/registry/lease.py), so gates, forced promotions and rollbacks of every
checkout sharing the registry take turns, and each gate compares against the champion of its turn.
A re-evaluation (minutes) runs outside the lease; if the champion moved meanwhile, the gate
re-evaluates the new one, and after REEVALUATIONS moves it records `superseded`. The numbers and the
decision are written as version tags (`promotion.*`) and printed, in the order moves.decision_move
gives (`promotion.decision` last), its intent recorded first (pipelines/registry/journal.py), so an
interrupted gate is completed by the next run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.common.errors import RegistryError
from components.common.params import Params
from components.common.tracking import repo_root
from components.evaluation.reports import ITEM_COLUMNS, headline, item_column
from components.problems.bands import band_label, in_band, parse_band
from pipelines.handoff import Decision, Registration
from pipelines.params.config import load_checked
from pipelines.registry import journal
from pipelines.registry.lease import registry_lease
from pipelines.registry.moves import (
    DECIDED_BY_TAG,
    as_decided,
    decision_move,
    force_promote,
    model_version,
    reconcile,
    repair_strays,
    rollback,
)
from pipelines.registry.register import (
    CHAMPION,
    DECISION_TAG,
    EVAL_KEYS,
    ITEMS_TAG,
    PREVIOUS_TAG,
    REASON_TAG,
    alias_version,
    client_for,
    registered_items,
)

REEVALUATIONS = 3  # champions re-evaluated by one gate before it gives up the race as superseded


def correctness_and_format(challenger: dict[str, dict[str, Any]], champion: dict[str, dict[str, Any]],
                           version: str, champion_version: str, alpha: float) -> str | None:
    """The gate's numbers restated on the shared items as the run summary states them (reports.headline):
    checked accuracy first (where both versions' items carry it), then correctness (flexible accuracy),
    each with its 95% interval and exact McNemar p, the format (tagged answers) apart, strict accuracy and
    the verdict in words; None when the items lack the flexible column.

    >>> ch = {str(i): {"correct": i < 30, "correct_flexible": i < 30, "format_ok": True} for i in range(100)}
    >>> old = {str(i): {"correct": i < 5, "correct_flexible": i < 32, "format_ok": i < 10} for i in range(100)}
    >>> correctness_and_format(ch, old, "2", "1", 0.05).endswith("the gain is format, not correctness")
    True
    >>> print(correctness_and_format({k: {**r, "correct_checked": int(k) < 20} for k, r in ch.items()},
    ...                              {k: {**r, "correct_checked": int(k) < 25} for k, r in old.items()},
    ...                              "2", "1", 0.05))
    accuracy_checked (right, no equation shown wrong) champion v1 25.0% -> v2 20.0%, -5.0 points (95% CI -10.2 to -0.1), exact McNemar p = 0.062; correctness (accuracy_flexible, the answer is right) 32.0% -> 30.0%, -2.0 points (95% CI -5.6 to +1.6), exact McNemar p = 0.5; format (the answer is tagged) 10.0% -> 100.0%; accuracy_strict (right and tagged) 5.0% -> 30.0%, +25.0 points, p = 6e-08: the gain is format, not correctness
    """  # noqa: E501
    from components.evaluation.stats import compare_paired

    shared = sorted(set(challenger) & set(champion))
    rows = [(challenger[i], champion[i]) for i in shared]
    if not rows or not all(ITEM_COLUMNS["accuracy_flexible"] in x and ITEM_COLUMNS["accuracy_flexible"] in y
                           for x, y in rows):
        return None
    columns = dict(ITEM_COLUMNS)
    if all("correct_checked" in x and "correct_checked" in y for x, y in rows):  # older items files lack it
        columns["accuracy_checked"] = "correct_checked"
    by_metric = {m: compare_paired([bool(x[c]) for x, _ in rows], [bool(y[c]) for _, y in rows])
                 for m, c in columns.items()}
    formats = [None, None]
    if all("format_ok" in x and "format_ok" in y for x, y in rows):
        formats = [sum(bool(r[k]["format_ok"]) for r in rows) / len(rows) for k in (0, 1)]
    return headline(f"v{version}", f"champion v{champion_version}", by_metric, *formats, alpha=alpha)


def compare_with_champion(
    challenger: dict[str, bool], champion: dict[str, bool], alpha: float, min_delta: float, min_items: int = 1
) -> tuple[bool, dict[str, Any]]:
    """Paired comparison on the shared items; (promote?, numbers).

    >>> ok, n = compare_with_champion({str(i): i < 60 for i in range(100)}, {str(i): i < 40 for i in range(100)},
    ...                               0.05, 0.0)
    >>> ok, n["delta"], n["b"], n["c"], n["p_value"] < 1e-5
    (True, 0.2, 20, 0, True)
    >>> compare_with_champion({str(i): i < 60 for i in range(100)}, {str(i): i < 40 for i in range(100)},
    ...                       0.05, 0.0, 200)[0]
    False
    """
    from components.evaluation.stats import compare_paired

    shared = sorted(set(challenger) & set(champion))
    if not shared:
        return False, {"n": 0, "min_items": min_items}
    res = compare_paired([challenger[i] for i in shared], [champion[i] for i in shared])
    numbers = {
        "n": res["n"],
        "challenger_accuracy": res["accuracy_a"],
        "champion_accuracy": res["accuracy_b"],
        "delta": res["delta"],
        "ci95": res["ci95"],
        "p_value": res["p_value"],
        "b": res["b"],
        "c": res["c"],
        "alpha": alpha,
        "min_delta": min_delta,
        "min_items": min_items,
    }
    ok = res["n"] >= min_items and res["delta"] > 0 and res["delta"] >= min_delta and res["p_value"] < alpha
    return ok, numbers


def _reason(version: str, champion: str, ok: bool, x: dict[str, Any], metric: str = "accuracy_strict") -> str:
    if x.get("n", 0) == 0:
        return f"v{version} and champion v{champion} share no evaluation items: not comparable, champion kept"
    verdict = []
    if x["n"] < x.get("min_items", 1):
        verdict.append(f"only {x['n']} shared items, fewer than register.min_items {x['min_items']}")
    if x["delta"] <= 0:
        verdict.append("not more accurate")
    elif x["delta"] < x["min_delta"]:
        verdict.append(f"gain below min_delta {x['min_delta']}")
    if x["p_value"] >= x["alpha"]:
        verdict.append(f"p >= alpha {x['alpha']}")
    lo, hi = x["ci95"]
    head = (
        f"v{version} {metric} {x['challenger_accuracy']:.4f} vs champion v{champion} "
        f"{x['champion_accuracy']:.4f} on {x['n']} shared items: delta {x['delta']:+.4f} "
        f"(95% CI {lo:+.4f}..{hi:+.4f}), discordant {x['b']} vs {x['c']}, exact McNemar p={x['p_value']:.4g}"
    )
    if ok:
        return f"{head} < alpha {x['alpha']} and delta >= min_delta {x['min_delta']}: promoted"
    return f"{head}: {', '.join(verdict)}; champion v{champion} kept"


def eval_settings(tags: dict[str, str]) -> dict[str, str | None]:
    """What a version was evaluated on (`eval.*` tags); None for what it does not record."""
    return {k: tags.get(f"eval.{k}") for k in EVAL_KEYS}


def reevaluate(
    params: Params, name: str, version: str, root: Path, test_sha256: str | None
) -> dict[str, dict[str, Any]]:
    """Evaluate registered `version` on the challenger's items with the challenger's settings
    (`params.evaluate`); {item id: scored item}."""
    from components.evaluation.scoring import data_source, evaluate_model
    from components.models.resolve import resolve_model
    from components.problems.sources import load_problems, problems_sha256

    cfg = params.evaluate
    data = data_source(params)
    if data.startswith("jsonl:") and not os.path.isabs(data[6:]):
        data = f"jsonl:{root / data[6:]}"
    problems = load_problems(data, cfg.limit)
    if test_sha256 and problems_sha256(problems) != test_sha256:
        raise RegistryError(
            f"{data}: these are not the items the challenger was evaluated on (eval.test_sha256 {test_sha256}); "
            "the test split changed after the evaluate stage ran: run the pipeline again"
        )
    print(f"promotion: re-evaluating champion {name} v{version} on the challenger's {len(problems)} items", flush=True)
    with tempfile.TemporaryDirectory(prefix="grpoflow-champion-") as tmp:
        model = resolve_model(f"models:/{name}/{version}", download_dir=tmp, params=params)
        _, items = evaluate_model(model, problems, params, protocol=cfg.protocol, backend=cfg.backend, data=data)
    return {str(i["id"]): i for i in items}


def needs_reevaluation(challenger_tags: dict[str, str], champion_tags: dict[str, str]) -> bool:
    """Whether the champion must be evaluated again to be compared: evaluated on other items or
    settings, or registered without its items."""
    theirs = eval_settings(champion_tags)
    return eval_settings(challenger_tags) != theirs or None in theirs.values() or not champion_tags.get(ITEMS_TAG)


def _compare(
    params: Params, mv, champion, challenger_rows, champion_rows, reevaluated: bool, checked: bool
) -> Decision:
    """The gate's decision on the shared items (the target band's, when set); nothing written."""
    name, version, reg = mv.name, str(mv.version), params.register
    metric = params.evaluate.primary_metric  # the gate's metric (docs/registry.md says why strict by default)
    band = parse_band(params.evaluate.target_band)
    if band and not any("steps" in r for r in challenger_rows.values()):
        band = None  # items scored before problems carried their steps: every item, and the reason says so
        print("promotion: the challenger's items carry no step counts; the gate compares every item, not "
              f"evaluate.target_band={params.evaluate.target_band}", flush=True)
    others: tuple[dict, dict] | None = None  # the other bands' shared items, whose change the reason states too
    if band:  # the gate compares on the target band (docs/registry.md): the items whose steps are in it
        rest = {i: r for i, r in challenger_rows.items() if not in_band(r.get("steps"), band)}
        others = (rest, {i: r for i, r in champion_rows.items() if i in rest})
        challenger_rows = {i: r for i, r in challenger_rows.items() if in_band(r.get("steps"), band)}
        champion_rows = {i: r for i, r in champion_rows.items() if i in challenger_rows}
    ok, numbers = compare_with_champion(
        item_column(challenger_rows, metric, f"{name} v{version} items {mv.tags[ITEMS_TAG]}"),
        item_column(champion_rows, metric, f"{name} v{champion.version} items "
                                           + ("(re-evaluated)" if reevaluated else champion.tags[ITEMS_TAG])),
        reg.alpha, reg.min_delta, reg.min_items,
    )
    numbers.update(metric=metric, test_sha256=eval_settings(mv.tags)["test_sha256"] or "unknown",
                   champion_reevaluated=reevaluated, items_checked=checked,
                   target_band=params.evaluate.target_band if band else "all")
    reason = _reason(version, champion.version, ok, numbers, f"{metric} on {band_label(band)}" if band else metric)
    if numbers["n"] and (story := correctness_and_format(challenger_rows, champion_rows, version, champion.version,
                                                         reg.alpha)):
        reason += f". Target band ({band_label(band)}), n = {numbers['n']}: {story}" if band else f". {story}"
        if others and others[1] and (
                rest := correctness_and_format(others[0], others[1], version, champion.version, reg.alpha)):
            reason += f". Other bands, n = {len(others[1])}: {rest}"
    return Decision(name, version, "promoted" if ok else "rejected", reason, champion.version, numbers)


def _decided(client, mv) -> Decision:
    return Decision(mv.name, str(mv.version), mv.tags[DECISION_TAG], as_decided(client, mv), mv.tags.get(PREVIOUS_TAG))


def gate(params: Params, registration: Registration, root: str | os.PathLike | None = None) -> Decision:
    """Move `champion` to the challenger if the gate passes; the decision is tagged and returned.

    Bad input (a version not in the registry, items that cannot be read or do not match their
    registered hash) is a RegistryError raised before anything is written."""
    root = Path(root or repo_root())
    name, version = registration.name, str(registration.version)
    client = client_for(params, root)
    mv = model_version(client, name, version)
    by = f"the gate of v{version}"
    unfinished = journal.pending(client, name)
    if DECISION_TAG in mv.tags and unfinished is None:  # decided by an earlier run: only an older race's tags
        repair_strays(client, name, by)
        return _decided(client, client.get_model_version(name, version))
    challenger_rows, checked = registered_items(name, version, mv.tags)
    reevaluated: dict[str, dict[str, dict[str, Any]]] = {}  # champion version -> its rows on our items
    while True:
        with registry_lease(client, name, by) as lease:
            done = journal.complete(client, lease, name)
            if done is not None and (done.kind, done.version) == ("gate", version):
                return done.result()  # this gate's own move, left unfinished by an earlier run: completed
            mv = client.get_model_version(name, version)
            if DECISION_TAG in mv.tags:  # another checkout gated this version meanwhile
                return _decided(client, mv)
            champion = alias_version(client, name, CHAMPION)
            if champion is not None and champion.version == version:  # an interrupted gate had moved the alias
                client.set_model_version_tag(name, version, DECISION_TAG, "promoted")
                return Decision(name, version, "promoted", mv.tags.get(REASON_TAG, "champion alias already on it"))
            again = (champion is not None and champion.version not in reevaluated
                     and needs_reevaluation(mv.tags, champion.tags))
            if champion is None:
                decision = Decision(name, version, "promoted", f"no champion yet: v{version} becomes champion")
            elif again and len(reevaluated) == REEVALUATIONS:
                decision = _superseded(champion, mv, list(reevaluated))
            elif not again:
                rows, champion_checked = (reevaluated[champion.version], True) if champion.version in reevaluated \
                    else registered_items(name, champion.version, champion.tags)
                decision = _compare(params, mv, champion, challenger_rows, rows, champion.version in reevaluated,
                                    checked and champion_checked)
            if not again or len(reevaluated) == REEVALUATIONS:
                reconcile(client, lease, name, by)
                journal.run(client, lease, name, decision_move(
                    decision, move_alias=decision.decision == "promoted", run_id=registration.run_id, challenger=True))
                return decision
        # outside the lease: a re-evaluation takes minutes, and the others need not wait for it
        rows = reevaluate(params, name, champion.version, root, eval_settings(mv.tags)["test_sha256"])
        reevaluated[champion.version] = rows
        if registration.run_id:  # the pipeline run keeps what the champion scored
            client.log_dict(registration.run_id, {i: r["correct"] for i, r in rows.items()},
                            f"promotion/champion_v{champion.version}_items.json")


def _superseded(champion, mv, tried: list[str]) -> Decision:
    """The champion moved during each of the gate's re-evaluations: the race is lost, said so."""
    run = champion.tags.get(DECIDED_BY_TAG)
    how = f"by run {run}" if run else "by hand"
    return Decision(mv.name, str(mv.version), "superseded",
                    f"superseded: v{champion.version} was promoted first, {how}, while this gate re-evaluated "
                    f"{', '.join('v' + v for v in tried)}; v{mv.version} was not compared with it "
                    f"(`grpoflow promote {mv.name} {mv.version} --reason TEXT` promotes it by hand)",
                    champion.version)


def print_decision(d: Decision, file=None) -> None:
    print(f"promotion: {d.name} v{d.version}: {d.decision} — {d.reason}", file=file or sys.stdout)


def _registry_command(args: argparse.Namespace, action: Callable[[Params], Decision]) -> int:
    print_decision(action(load_checked(args)))
    return 0


def cli_promote(args: argparse.Namespace) -> int:
    """`grpoflow promote NAME VERSION --reason TEXT`."""
    return _registry_command(args, lambda p: force_promote(p, args.name, str(args.version), args.reason, args.adopt))


def cli_rollback(args: argparse.Namespace) -> int:
    """`grpoflow rollback NAME`."""
    return _registry_command(args, lambda p: rollback(p, args.name, args.adopt))
