"""Difficulty as a slice: bands of reasoning steps, and accuracy per step count and per band.

Every problem carries `steps`, its number of reasoning steps (components/problems/sources.py `count_steps`:
the synthetic generator's count, GSM8K's `<<...>>` annotations, else its reasoning lines; None for
an answer-only row with neither: unbanded). A band is written `N` (exactly N steps), `N-M` or `N+`;
`evaluate.target_band` names the one the user cares about, `data.demo_max_steps` and
`data.answer_only_min_steps` split the train rows into demonstrations and answer-only problems.
`parse_band` itself is a params-value parser and lives below the schema (components/common/params_rules.py).

    parse_band("3-4") -> (3, 4)      in_band(steps, band)      split_items(items, band) -> (target, rest)
    by_steps(items) -> {"1": [...], ..., "unbanded": [...]}   (items grouped by their step count)
"""

from __future__ import annotations

from typing import Any

from components.common.params_rules import Band, parse_band

__all__ = ["Band", "UNBANDED", "parse_band", "band_label", "in_band", "split_items", "step_key", "by_steps"]

UNBANDED = "unbanded"


def band_label(band: Band) -> str:
    """The band as people read it.

    >>> band_label((3, 3)), band_label((2, 4)), band_label((5, None))
    ('3 steps', '2-4 steps', '5+ steps')
    """
    low, high = band
    if high is None:
        return f"{low}+ steps"
    return f"{low} step{'s' if low != 1 else ''}" if low == high else f"{low}-{high} steps"


def in_band(steps: int | None, band: Band) -> bool:
    """Whether a problem of `steps` steps is in `band` (an unbanded problem never is).

    >>> in_band(3, (3, 3)), in_band(4, (3, None)), in_band(2, (3, None)), in_band(None, (1, None))
    (True, True, False, False)
    """
    low, high = band
    return steps is not None and steps >= low and (high is None or steps <= high)


def split_items(items: list[dict[str, Any]], band: Band) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(items in the band, the others), by each item's `steps`.

    >>> split_items([{"steps": 1}, {"steps": 3}, {"steps": None}], (3, 3))
    ([{'steps': 3}], [{'steps': 1}, {'steps': None}])
    """
    target = [i for i in items if in_band(i.get("steps"), band)]
    rest = [i for i in items if not in_band(i.get("steps"), band)]
    return target, rest


def step_key(steps: int | None) -> str:
    return UNBANDED if steps is None else str(steps)


def by_steps(items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Items grouped by step count, in increasing order, unbanded last.

    >>> list(by_steps([{"steps": 2}, {"steps": None}, {"steps": 10}, {"steps": 2}]))
    ['2', '10', 'unbanded']
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for item in sorted(items, key=lambda i: (i.get("steps") is None, i.get("steps") or 0)):
        groups.setdefault(step_key(item.get("steps")), []).append(item)
    return groups
