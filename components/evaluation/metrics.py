"""Metrics over scored evaluation items (components/evaluation/scoring.py writes them): accuracy with intervals,
sampled metrics, paired comparisons, and the same per number of reasoning steps and per band.

    item_metrics(items)                      accuracies with Wilson 95% intervals (+ sampled metrics)
    compare(items_a, items_b, primary)       paired difference on the items both have (matched by id)
    band_metrics(items, target_band)         per step count (`by_steps`), on the target band (`target`)
                                             and on every other problem (`in_band`)
    compare_bands(items_a, items_b, ...)     `compare` on the same slices
"""

from __future__ import annotations

import logging
from typing import Any

from components.evaluation.stats import (
    compare_paired,
    compare_paired_means,
    mean_interval,
    pass_at_k,
    wilson_interval,
)
from components.problems import bands

log = logging.getLogger("grpoflow.scoring")

# Sampled metrics and the per-item value each pairs on: a boolean column (McNemar) or a mean.
SAMPLED_BINARY = {
    "pass_at_k_strict": "pass_at_k",
    "pass_at_k_flexible": "pass_at_k_flexible",
    "maj_at_k_strict": "maj_correct",
    "maj_at_k_flexible": "maj_correct_flexible",
}
SAMPLED_MEANS = {"sampled_accuracy_strict": "samples_correct", "sampled_accuracy_flexible": "samples_correct_flexible"}


def item_metrics(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy metrics with Wilson 95% intervals from scored items (and the sampled metrics when
    the items carry samples, see `sample_metrics`).

    >>> m = item_metrics([{"correct": True, "correct_flexible": True, "format_ok": True, "completion_tokens": 10},
    ...                {"correct": False, "correct_flexible": True, "format_ok": False, "completion_tokens": 30}])
    >>> m["n"], m["accuracy_strict"], m["accuracy_flexible"], m["format_rate"], m["mean_completion_tokens"]
    (2, 0.5, 1.0, 0.5, 20.0)

    `accuracy_checked` (the answer right and no equation shown wrong) where the items carry
    `correct_checked`: a right answer reached by wrong work counts in the flexible accuracy only.
    """
    n = len(items)
    k_strict = sum(i["correct"] for i in items)
    k_flex = sum(i["correct_flexible"] for i in items)
    metrics = {
        "n": n,
        "accuracy_strict": k_strict / n if n else 0.0,
        "accuracy_strict_ci95": list(wilson_interval(k_strict, n)),
        "accuracy_flexible": k_flex / n if n else 0.0,
        "accuracy_flexible_ci95": list(wilson_interval(k_flex, n)),
        "format_rate": sum(i["format_ok"] for i in items) / n if n else 0.0,
        "mean_completion_tokens": sum(i["completion_tokens"] for i in items) / n if n else 0.0,
    }
    if items and all("correct_checked" in i for i in items):  # items files written before it lack the column
        k_checked = sum(i["correct_checked"] for i in items)
        metrics["accuracy_checked"] = k_checked / n
        metrics["accuracy_checked_ci95"] = list(wilson_interval(k_checked, n))
    if items and "samples_correct" in items[0]:
        metrics.update(sample_metrics(items))
    return metrics


SLICE_KEYS = ("n", "accuracy_flexible", "accuracy_flexible_ci95", "accuracy_strict", "accuracy_strict_ci95",
              "accuracy_checked", "accuracy_checked_ci95", "format_rate", "pass_at_k_flexible",
              "sampled_accuracy_flexible")


def slice_metrics(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline metrics of a slice of items (a step count, a band).

    >>> slice_metrics([{"correct": True, "correct_flexible": True, "format_ok": True,
    ...                 "completion_tokens": 3}])["accuracy_flexible"]
    1.0
    """
    m = item_metrics(items)
    return {key: m[key] for key in SLICE_KEYS if key in m}


def band_metrics(items: list[dict[str, Any]], target_band: str) -> dict[str, Any]:
    """Accuracy per step count (`by_steps`) and, with a target band, on the band (`target`) and on
    every other problem together (`in_band`: the demonstrations' band in the default recipe).

    >>> items = [{"correct": s == 1, "correct_flexible": s == 1, "format_ok": True, "completion_tokens": 1, "steps": s}
    ...          for s in (1, 1, 2, 3)]
    >>> m = band_metrics(items, "2+")
    >>> m["target_band"], m["target"]["n"], m["target"]["accuracy_flexible"], m["in_band"]["accuracy_flexible"]
    ('2+', 2, 0.0, 1.0)
    >>> {k: v["n"] for k, v in m["by_steps"].items()}
    {'1': 2, '2': 1, '3': 1}
    """
    out: dict[str, Any] = {"by_steps": {key: slice_metrics(group) for key, group in bands.by_steps(items).items()}}
    band = bands.parse_band(target_band)
    if band:
        target, rest = bands.split_items(items, band)
        out.update(target_band=target_band, target=slice_metrics(target), in_band=slice_metrics(rest))
    return out


def compare_bands(items_a: list[dict[str, Any]], items_b: list[dict[str, Any]], primary: str,
                  target_band: str) -> dict[str, Any]:
    """`compare` on the target band (`target`), on the other problems (`in_band`) and per step count
    (`by_steps`), by the steps of A's items; empty slices are left out."""
    steps = {i["id"]: i.get("steps") for i in items_a}

    def on(keep) -> dict[str, Any] | None:
        a = [i for i in items_a if keep(steps[i["id"]])]
        b = [i for i in items_b if i["id"] in steps and keep(steps[i["id"]])]
        return compare(a, b, primary) if a and b else None

    out: dict[str, Any] = {"by_steps": {}}
    for key in bands.by_steps(items_a):
        if (res := on(lambda s, key=key: bands.step_key(s) == key)) is not None:
            out["by_steps"][key] = res
    band = bands.parse_band(target_band)
    if band:
        out["target_band"] = target_band
        for name, keep in (
            ("target", lambda s: bands.in_band(s, band)),
            ("in_band", lambda s: not bands.in_band(s, band)),
        ):
            if (res := on(keep)) is not None:
                out[name] = res
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def sample_metrics(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Sampled metrics over items with k samples each.

    >>> items = [{"samples_correct": [True, False], "samples_correct_flexible": [True, True], "pass_at_k": True,
    ...           "pass_at_k_flexible": True, "maj_correct": True, "maj_correct_flexible": True,
    ...           "samples_format_ok": [True, False], "samples_tokens": [4, 6]},
    ...          {"samples_correct": [False, False], "samples_correct_flexible": [False, True], "pass_at_k": False,
    ...           "pass_at_k_flexible": True, "maj_correct": False, "maj_correct_flexible": False,
    ...           "samples_format_ok": [True, True], "samples_tokens": [2, 4]}]
    >>> m = sample_metrics(items)
    >>> m["num_samples"], m["sampled_accuracy_strict"], m["sampled_accuracy_flexible"], m["pass_at_k_strict"]
    (2, 0.25, 0.75, 0.5)
    >>> m["maj_at_k_strict"], m["maj_at_k_flexible"], m["sampled_format_rate"], m["sampled_mean_completion_tokens"]
    (0.5, 0.5, 0.75, 4.0)
    """
    n = len(items)
    k = len(items[0]["samples_correct"]) if items else 0
    out: dict[str, Any] = {"num_samples": k}
    for suffix, col in (("strict", "samples_correct"), ("flexible", "samples_correct_flexible")):
        per_item = [_mean(i[col]) for i in items]
        out[f"sampled_accuracy_{suffix}"] = _mean(per_item)
        out[f"sampled_accuracy_{suffix}_ci95"] = list(mean_interval(per_item))
        # Unbiased pass@k from each item's n = k samples: 1.0 or 0.0 per item, so a share of items.
        passes = [pass_at_k(len(i[col]), sum(i[col]), k) for i in items] if k else []
        out[f"pass_at_k_{suffix}"] = _mean(passes)
        out[f"pass_at_k_{suffix}_ci95"] = list(wilson_interval(round(sum(passes)), n))
    for suffix, col in (("strict", "maj_correct"), ("flexible", "maj_correct_flexible")):
        hits = sum(i[col] for i in items)
        out[f"maj_at_k_{suffix}"] = hits / n if n else 0.0
        out[f"maj_at_k_{suffix}_ci95"] = list(wilson_interval(hits, n))
    out["sampled_format_rate"] = _mean([_mean(i["samples_format_ok"]) for i in items])
    out["sampled_mean_completion_tokens"] = _mean([_mean(i["samples_tokens"]) for i in items])
    return out


def compare(items_a: list[dict[str, Any]], items_b: list[dict[str, Any]], primary: str) -> dict[str, Any]:
    """Paired comparison A - B on the items both have (matched by id): greedy accuracies, and when
    both sides have samples, pass@k and maj@k (exact McNemar, Newcombe interval) and mean sampled
    accuracy (normal interval over the per-item differences)."""
    b_by_id = {i["id"]: i for i in items_b}
    shared = [i for i in items_a if i["id"] in b_by_id]
    if len(shared) != len(items_a) or len(shared) != len(items_b):
        log.warning("comparing on %d shared items (%d vs %d)", len(shared), len(items_a), len(items_b))
    pairs = [(i, b_by_id[i["id"]]) for i in shared]
    binary = {"accuracy_strict": "correct", "accuracy_flexible": "correct_flexible"}
    if pairs and all("correct_checked" in x and "correct_checked" in y for x, y in pairs):
        binary["accuracy_checked"] = "correct_checked"
    means: dict[str, str] = {}
    if pairs and all("samples_correct" in x and "samples_correct" in y for x, y in pairs):
        binary.update(SAMPLED_BINARY)
        means.update(SAMPLED_MEANS)
    by_metric = {m: compare_paired([x[c] for x, _ in pairs], [y[c] for _, y in pairs]) for m, c in binary.items()}
    for m, c in means.items():
        by_metric[m] = compare_paired_means([_mean(x[c]) for x, _ in pairs], [_mean(y[c]) for _, y in pairs])
    return {"metric": primary, **by_metric[primary], "by_metric": by_metric}
