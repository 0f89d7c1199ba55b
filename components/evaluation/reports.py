"""The evaluation reports on disk and in MLflow: written by the evaluate stage and `grpoflow evaluate`,
read by the registry, the promotion gate and the run summary.

In `evaluate.output_dir`: `<model>.json` (every metric of the model), `<model>.items.jsonl` (one scored row per problem;
the promotion gate pairs items by id), `comparison.json`, `accuracy.csv` (accuracy per model and metric with its Wilson
interval: the data of the accuracy plot in dvc.yaml), `metrics/<model>.json` (the headline: checked accuracy,
correctness, strict accuracy, format and n) and `metrics/<a>_vs_<b>.<statistic>.json` (each pair's paired change of the
same keys: its delta, the ends of its 95% interval, its p-value). These are the DVC metrics files: `dvc metrics show`
puts every key in a column of its own, so the pair's four files are four rows under the models' own columns rather than
a dozen columns more. All files of one evaluation appear together (components/common/files.py `write_files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from components.common.errors import InputError
from components.common.files import JSONLineError, csv_bytes, iter_jsonl, json_bytes, jsonl_bytes, write_files
from components.common.tracking import TAG_PREFIX, metric_key

Results = dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]  # {model: (metrics, items)}
COMPARISON = "comparison"
ACCURACY_CSV = "accuracy.csv"
ACCURACY_METRICS = {"strict": "accuracy_strict", "flexible": "accuracy_flexible", "checked": "accuracy_checked"}
HEADLINE_DIR = "metrics"  # `<eval dir>/metrics/<model>.json`: what dvc.yaml declares as metrics
HEADLINE_KEYS = ("accuracy_checked", "accuracy_flexible", "accuracy_strict", "format_rate", "n")
# With evaluate.target_band the headline is the band's: checked accuracy and correctness there, then on the
# other bands; the format apart.
BAND_HEADLINE_KEYS = {"target_accuracy_checked": ("target", "accuracy_checked"),
                      "target_accuracy_flexible": ("target", "accuracy_flexible"),
                      "target_accuracy_strict": ("target", "accuracy_strict"), "target_n": ("target", "n"),
                      "in_band_accuracy_checked": ("in_band", "accuracy_checked"),
                      "in_band_accuracy_flexible": ("in_band", "accuracy_flexible")}
# `metrics/<a>_vs_<b>.<statistic>.json`: one file per statistic of the pair's paired change (comparison.json's
# `delta`, `ci95` split in its two ends, `p_value`), each under the keys of the models' headline files.
PAIR_STATISTICS = ("delta", "ci95_low", "ci95_high", "p_value")
STEPS_CSV = "accuracy_by_steps.csv"  # flexible accuracy per step count, one column per model: a dvc plot


def write_reports(out_dir: str | os.PathLike, results: Results, comparison: dict[str, Any] | None) -> list[Path]:
    """`<model>.json`, `<model>.items.jsonl` and `metrics/<model>.json` per model (and `comparison.json`),
    all or none."""
    files = {}
    for name, (metrics, items) in results.items():
        files[f"{name}.json"] = json_bytes(metrics)
        files[f"{name}.items.jsonl"] = jsonl_bytes(items)
        files[f"{HEADLINE_DIR}/{name}.json"] = json_bytes(headline_metrics(metrics))
    if comparison is not None:
        files[f"{COMPARISON}.json"] = json_bytes(comparison)
        for pair, res in comparison.items():
            a, b = pair.split("_vs_", 1)
            rows = pair_headline_metrics(res, results[a][0], results[b][0])
            for statistic in PAIR_STATISTICS:
                files[pair_headline_file(pair, statistic)] = json_bytes(rows[statistic])
    files[ACCURACY_CSV] = csv_bytes(accuracy_rows({name: m for name, (m, _) in results.items()}))
    files[STEPS_CSV] = csv_bytes(steps_rows({name: m for name, (m, _) in results.items()}))
    return write_files(out_dir, files)


def headline_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The few metrics `dvc metrics show` lists per model: checked accuracy (where the items carry it),
    correctness, strict accuracy, format and the number of items; with a target band, the accuracies on
    the band and on the other bands instead of over all items.

    >>> headline_metrics({"accuracy_flexible": 0.5, "accuracy_strict": 0.25, "format_rate": 0.5, "n": 4,
    ...                   "load_seconds": 2.0})
    {'accuracy_flexible': 0.5, 'accuracy_strict': 0.25, 'format_rate': 0.5, 'n': 4}
    >>> headline_metrics({"format_rate": 1.0, "target": {"accuracy_checked": 0.1, "accuracy_flexible": 0.2,
    ...     "accuracy_strict": 0.2, "n": 5}, "in_band": {"accuracy_checked": 0.8, "accuracy_flexible": 0.9}})
    {'target_accuracy_checked': 0.1, 'target_accuracy_flexible': 0.2, 'target_accuracy_strict': 0.2, 'target_n': 5, 'in_band_accuracy_checked': 0.8, 'in_band_accuracy_flexible': 0.9, 'format_rate': 1.0}
    """  # noqa: E501
    if "target" in metrics:
        out = {key: metrics[part][name] for key, (part, name) in BAND_HEADLINE_KEYS.items()
               if name in metrics.get(part, {})}
        return {**out, "format_rate": metrics["format_rate"]} if "format_rate" in metrics else out
    return {key: metrics[key] for key in HEADLINE_KEYS if key in metrics}


def pair_headline_file(pair: str, statistic: str) -> str:
    """Where a pair's statistic goes in the evaluation folder.

    >>> pair_headline_file("grpo_vs_sft", "p_value")
    'metrics/grpo_vs_sft.p_value.json'
    """
    return f"{HEADLINE_DIR}/{pair}.{statistic}.json"


def pair_headline_metrics(pair: dict[str, Any], metrics_a: dict[str, Any], metrics_b: dict[str, Any]
                          ) -> dict[str, dict[str, float]]:
    """{statistic: {key: value}}: the paired change from model b to a (a comparison.json pair) under the
    keys of `headline_metrics`, one row per statistic of PAIR_STATISTICS, so that `dvc metrics show`
    lists it under the models' own columns: the delta, the 95% interval's ends (Newcombe) and the exact
    McNemar p of each accuracy (on the target band and the other bands where there is a band), and the
    format rate's change apart (a difference of the models' rates, no paired test).

    >>> by = {"accuracy_checked": {"delta": 0.15, "ci95": [0.06, 0.24], "p_value": 0.001},
    ...       "accuracy_flexible": {"delta": 0.16, "ci95": [0.07, 0.25], "p_value": 0.0008}}
    >>> rows = pair_headline_metrics({"target": {"by_metric": by}, "in_band": {"by_metric": {"accuracy_flexible":
    ...     {"delta": -0.01, "ci95": [-0.04, 0.02], "p_value": 0.6}}}}, {"format_rate": 1.0}, {"format_rate": 0.75})
    >>> rows["delta"]
    {'target_accuracy_checked': 0.15, 'target_accuracy_flexible': 0.16, 'in_band_accuracy_flexible': -0.01, 'format_rate': 0.25}
    >>> rows["ci95_low"], rows["p_value"]
    ({'target_accuracy_checked': 0.06, 'target_accuracy_flexible': 0.07, 'in_band_accuracy_flexible': -0.04}, {'target_accuracy_checked': 0.001, 'target_accuracy_flexible': 0.0008, 'in_band_accuracy_flexible': 0.6})
    """  # noqa: E501
    if "target" in pair:
        keys = {key: (part, name) for key, (part, name) in BAND_HEADLINE_KEYS.items() if name != "n"}
    else:
        keys = {key: (None, key) for key in HEADLINE_KEYS if key.startswith("accuracy_")}
    rows: dict[str, dict[str, float]] = {statistic: {} for statistic in PAIR_STATISTICS}
    for key, (part, name) in keys.items():
        res = ((pair.get(part) if part else pair) or {}).get("by_metric", {}).get(name)
        if not res:
            continue
        rows["delta"][key] = res["delta"]
        if res.get("ci95"):
            rows["ci95_low"][key], rows["ci95_high"][key] = res["ci95"]
        rows["p_value"][key] = res["p_value"]
    if "format_rate" in metrics_a and "format_rate" in metrics_b:
        rows["delta"]["format_rate"] = metrics_a["format_rate"] - metrics_b["format_rate"]
    return rows


def scored_steps(metrics: dict[str, dict[str, Any]]) -> list[int]:
    """The step counts any model was scored on, in order (unbanded problems left out).

    >>> scored_steps({"sft": {"by_steps": {"3": {}, "1": {}, "unbanded": {}}}, "grpo": {"by_steps": {"2": {}}}})
    [1, 2, 3]
    """
    return sorted({int(k) for m in metrics.values() for k in m.get("by_steps", {}) if k.isdigit()})


def steps_rows(metrics: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Flexible accuracy per step count, one column per model (unbanded problems left out).

    >>> steps_rows({"sft": {"by_steps": {"1": {"accuracy_flexible": 0.9}, "3": {"accuracy_flexible": 0.1}}},
    ...             "grpo": {"by_steps": {"1": {"accuracy_flexible": 0.8}, "3": {"accuracy_flexible": 0.2}}}})
    [{'steps': 1, 'sft': 0.9, 'grpo': 0.8}, {'steps': 3, 'sft': 0.1, 'grpo': 0.2}]
    """
    return [{"steps": k, **{model: m["by_steps"][str(k)]["accuracy_flexible"] for model, m in metrics.items()
                            if str(k) in m.get("by_steps", {})}} for k in scored_steps(metrics)]


def accuracy_rows(metrics: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model and metric (strict, flexible): accuracy, Wilson 95% interval, n.

    >>> accuracy_rows({"grpo": {"n": 10, "accuracy_strict": 0.5, "accuracy_strict_ci95": [0.24, 0.76]}})
    [{'model': 'grpo', 'metric': 'strict', 'accuracy': 0.5, 'ci_low': 0.24, 'ci_high': 0.76, 'n': 10}]
    """
    rows = []
    for metric, key in ACCURACY_METRICS.items():
        for model, m in metrics.items():
            if key in m:
                low, high = m.get(f"{key}_ci95") or (None, None)
                rows.append({"model": model, "metric": metric, "accuracy": m[key], "ci_low": low, "ci_high": high,
                             "n": m.get("n")})
    return rows


def read_metrics(eval_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """{model: metrics} from `<eval_dir>/<model>.json` (comparison.json excluded; unreadable files skipped)."""
    out: dict[str, dict[str, Any]] = {}
    folder = Path(eval_dir)
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        if path.stem == COMPARISON:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict):
            out[path.stem] = data
    return out


def read_comparison(eval_dir: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(eval_dir) / f"{COMPARISON}.json"
    return json.loads(path.read_text()) if path.is_file() else None


ITEM_COLUMNS = {"accuracy_strict": "correct", "accuracy_flexible": "correct_flexible"}  # metric -> items column


def read_item_rows(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """{item id: row} from an evaluation items file; names the file and line on bad rows."""
    out: dict[str, dict[str, Any]] = {}
    for lineno, row in iter_jsonl(path):
        if isinstance(row, JSONLineError):
            raise InputError(f"{path}:{lineno}: not valid JSON ({row})")
        if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("correct"), bool):
            raise InputError(f"{path}:{lineno}: expected an object with 'id' and boolean 'correct'")
        out[str(row["id"])] = row
    return out


def item_column(rows: dict[str, dict[str, Any]], metric: str, where: str) -> dict[str, bool]:
    """{item id: correct by `metric`} (accuracy_strict or accuracy_flexible); names `where` when an
    item lacks the metric's column (items written before the column existed)."""
    column = ITEM_COLUMNS[metric]
    for item_id, row in rows.items():
        if not isinstance(row.get(column), bool):
            raise InputError(f"{where}: item {item_id} has no boolean {column!r}, which {metric} needs; "
                             "evaluate the model again")
    return {item_id: row[column] for item_id, row in rows.items()}


def read_items(path: str | os.PathLike, metric: str = "accuracy_strict") -> dict[str, bool]:
    """{item id: correct by `metric`} from an evaluation items file; names the file and line on bad rows."""
    return item_column(read_item_rows(path), metric, str(path))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def verdict(strict: dict[str, Any] | None, flexible: dict[str, Any] | None, alpha: float = 0.05,
            checked: dict[str, Any] | None = None) -> str:
    """What a paired comparison says about correctness, in words: strict accuracy needs the right answer in the
    `<answer>` tag, flexible accuracy only the right answer (correctness), checked accuracy the right answer with no
    equation shown wrong (components/problems/arithmetic.py). A correctness gain of which the checked accuracy shares
    less than half is called what it is: mostly right answers reached by wrong work; a significant change in checked
    accuracy that correctness does not share is named, not called "no significant change".

    >>> verdict({"delta": 0.095, "p_value": 1e-13}, {"delta": -0.012, "p_value": 0.4})
    'the gain is format, not correctness'
    >>> verdict({"delta": 0.05, "p_value": 0.001}, {"delta": 0.04, "p_value": 0.01})
    'correctness rose'
    >>> verdict({"delta": 0.0, "p_value": 1.0}, {"delta": -0.03, "p_value": 0.01})
    'correctness fell'
    >>> verdict({"delta": 0.01, "p_value": 0.5}, {"delta": 0.01, "p_value": 0.5})
    'no significant change in correctness'
    >>> verdict({"delta": 0.04, "p_value": 0.02}, {"delta": 0.04, "p_value": 0.02},
    ...         checked={"delta": 0.008, "p_value": 0.2})
    'correctness rose, but not with work that holds: most new right answers come with wrong equations'
    >>> verdict({"delta": 0.15, "p_value": 0.001}, {"delta": 0.15, "p_value": 0.001},
    ...         checked={"delta": 0.14, "p_value": 0.06})
    'correctness rose'
    >>> verdict({"delta": 0.06, "p_value": 0.09}, {"delta": 0.06, "p_value": 0.09},
    ...         checked={"delta": 0.095, "p_value": 0.0075})
    'work that holds rose (checked accuracy); the rise in correctness alone is not significant'
    """
    def significant(r: dict[str, Any] | None, sign: int) -> bool:
        return bool(r) and sign * r["delta"] > 0 and r["p_value"] < alpha

    if significant(flexible, 1):
        if checked is not None and checked["delta"] < flexible["delta"] / 2:
            return "correctness rose, but not with work that holds: most new right answers come with wrong equations"
        return "correctness rose"
    if significant(flexible, -1):
        if significant(strict, 1):
            return "the gain is format, not correctness (correctness fell)"
        return "correctness fell"
    # correctness did not change significantly; a significant change in checked accuracy (the headline's first
    # clause) is named rather than contradicted
    if significant(checked, 1):
        return "work that holds rose (checked accuracy); the rise in correctness alone is not significant"
    if significant(strict, 1):
        return "the gain is format, not correctness"
    if significant(checked, -1):
        return "work that holds fell (checked accuracy): more right answers come with an equation shown wrong"
    return "no significant change in correctness"


def headline(a: str, b: str, by_metric: dict[str, dict[str, Any]], format_a: float | None = None,
             format_b: float | None = None, alpha: float = 0.05) -> str:
    """One line comparing model `a` with `b` (from b to a) on the same items: checked accuracy first (the
    answer right and no equation shown wrong), then correctness (flexible accuracy), each with its paired
    95% interval and exact McNemar p; format (the answer is tagged) apart, strict accuracy (both), then the
    verdict in words. Items scored before checked accuracy existed start with correctness.

    >>> by = {"accuracy_flexible": {"accuracy_a": 0.12, "accuracy_b": 0.132, "delta": -0.012, "ci95": [-0.04, 0.016],
    ...                             "p_value": 0.4},
    ...       "accuracy_strict": {"accuracy_a": 0.12, "accuracy_b": 0.025, "delta": 0.095, "p_value": 1.4e-13}}
    >>> print(headline("grpo", "sft", by, 0.993, 0.288))
    correctness (accuracy_flexible, the answer is right) sft 13.2% -> grpo 12.0%, -1.2 points (95% CI -4.0 to +1.6), exact McNemar p = 0.4; format (the answer is tagged) 28.8% -> 99.3%; accuracy_strict (right and tagged) 2.5% -> 12.0%, +9.5 points, p = 1.4e-13: the gain is format, not correctness
    >>> by["accuracy_checked"] = {"accuracy_a": 0.09, "accuracy_b": 0.11, "delta": -0.02, "ci95": [-0.05, 0.01],
    ...                           "p_value": 0.21}
    >>> print(headline("grpo", "sft", by, 0.993, 0.288))
    accuracy_checked (right, no equation shown wrong) sft 11.0% -> grpo 9.0%, -2.0 points (95% CI -5.0 to +1.0), exact McNemar p = 0.21; correctness (accuracy_flexible, the answer is right) 13.2% -> 12.0%, -1.2 points (95% CI -4.0 to +1.6), exact McNemar p = 0.4; format (the answer is tagged) 28.8% -> 99.3%; accuracy_strict (right and tagged) 2.5% -> 12.0%, +9.5 points, p = 1.4e-13: the gain is format, not correctness
    """  # noqa: E501
    parts = []
    flex, strict = by_metric.get("accuracy_flexible"), by_metric.get("accuracy_strict")
    checked = by_metric.get("accuracy_checked")
    for label, res in (("accuracy_checked (right, no equation shown wrong)", checked),
                       ("correctness (accuracy_flexible, the answer is right)", flex)):
        if res:
            ci = res.get("ci95")
            interval = f" (95% CI {100 * ci[0]:+.1f} to {100 * ci[1]:+.1f})" if ci else ""
            before, after = (f"{b} ", f"{a} ") if not parts else ("", "")  # the first change names the models
            parts.append(f"{label} {before}{_pct(res['accuracy_b'])} -> {after}{_pct(res['accuracy_a'])}, "
                         f"{100 * res['delta']:+.1f} points{interval}, exact McNemar p = {res['p_value']:.2g}")
    if format_a is not None and format_b is not None:
        parts.append(f"format (the answer is tagged) {_pct(format_b)} -> {_pct(format_a)}")
    if strict:
        parts.append(f"accuracy_strict (right and tagged) {_pct(strict['accuracy_b'])} -> "
                     f"{_pct(strict['accuracy_a'])}, {100 * strict['delta']:+.1f} points, p = {strict['p_value']:.2g}")
    return "; ".join(parts) + f": {verdict(strict, flex, alpha, checked)}"


def band_headlines(a: str, b: str, comparison: dict[str, Any], metrics: dict[str, dict[str, Any]],
                   alpha: float = 0.05) -> list[tuple[str, str]]:
    """(label, headline) for the target band first, then the other bands, each with its own change
    (a loss outside the target band is stated, never pooled away); [] without a target band."""
    from components.problems.bands import band_label, parse_band

    band = parse_band(comparison.get("target_band", ""))
    out = []
    for part, what in (("target", f"target band ({band_label(band)})" if band else ""), ("in_band", "other bands")):
        res = comparison.get(part)
        if band and res:
            fmt = [metrics.get(m, {}).get(part, {}).get("format_rate") for m in (a, b)]
            out.append((f"{a} vs {b}, {what}, n = {res['n']}",
                        headline(a, b, res.get("by_metric") or {res["metric"]: res}, *fmt, alpha=alpha)))
    return out


def steps_table(metrics: dict[str, Any]) -> str:
    """Accuracy per number of reasoning steps (and on the target band and the others), as a text table.

    >>> m = {"by_steps": {"1": {"n": 3, "accuracy_flexible": 1.0, "accuracy_strict": 2 / 3, "format_rate": 1.0}},
    ...      "target_band": "1",
    ...      "target": {"n": 3, "accuracy_flexible": 1.0, "accuracy_strict": 2 / 3, "format_rate": 1.0}}
    >>> print(steps_table(m))
    accuracy per number of reasoning steps (target band: 1 step)
      steps             n  flexible    strict    format
      1                 3    100.0%     66.7%    100.0%
      target band       3    100.0%     66.7%    100.0%
    >>> print(steps_table({"by_steps": {"3": {"n": 4, "accuracy_flexible": 0.5, "accuracy_strict": 0.5,
    ...                                       "format_rate": 1.0, "accuracy_checked": 0.25}}}))
    accuracy per number of reasoning steps
      steps             n  flexible    strict    format   checked
      3                 4     50.0%     50.0%    100.0%     25.0%
    """
    from components.problems.bands import band_label, parse_band

    band = parse_band(metrics.get("target_band", ""))
    rows = list(metrics.get("by_steps", {}).items())
    rows += [(label, metrics[part]) for part, label in (("target", "target band"), ("in_band", "other bands"))
             if band and metrics.get(part, {}).get("n")]
    head = "accuracy per number of reasoning steps" + (f" (target band: {band_label(band)})" if band else "")
    checked = bool(rows) and all("accuracy_checked" in m for _, m in rows)
    lines = [head, f"  {'steps':<12} {'n':>6}  {'flexible':>8}  {'strict':>8}  {'format':>8}"
             + (f"  {'checked':>8}" if checked else "")]
    for label, m in rows:
        lines.append(f"  {label:<12} {m['n']:>6}  {_pct(m['accuracy_flexible']):>8}  {_pct(m['accuracy_strict']):>8}  "
                     f"{_pct(m['format_rate']):>8}" + (f"  {_pct(m['accuracy_checked']):>8}" if checked else ""))
    return "\n".join(lines)


def log_to_mlflow(results: Results, comparison: dict[str, Any] | None, paths: list[Path], log_table: bool) -> None:
    """Metrics `<model>/<key>`, comparison numbers `<pair>/<key>`, report files and item tables,
    into the active MLflow run."""
    import mlflow

    metrics = {}
    for name, (m, _) in results.items():
        for key, value in m.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[metric_key(name, key)] = float(value)
            elif key.endswith("_ci95"):
                metrics[metric_key(name, f"{key}_low")], metrics[metric_key(name, f"{key}_high")] = map(float, value)
        for part, slices in (("target", {"": m.get("target")}), ("in_band", {"": m.get("in_band")}),
                             ("steps", m.get("by_steps", {}))):  # e.g. grpo/target/accuracy_flexible, grpo/steps_3/...
            for label, values in slices.items():
                for key, value in (values or {}).items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        metrics[metric_key(name, f"{part}_{label}" if label else part, key)] = float(value)
    for pair, res in (comparison or {}).items():
        for part in ("target", "in_band"):  # e.g. grpo_vs_sft/target/accuracy_flexible/delta
            for metric, r in res.get(part, {}).get("by_metric", {}).items():
                for key in ("delta", "p_value"):
                    metrics[metric_key(pair, part, metric, key)] = float(r[key])
                if r.get("ci95"):  # e.g. grpo_vs_sft/target/accuracy_checked/ci95_low
                    metrics[metric_key(pair, part, metric, "ci95_low")], \
                        metrics[metric_key(pair, part, metric, "ci95_high")] = map(float, r["ci95"])
        for key in ("delta", "p_value"):
            metrics[metric_key(pair, key)] = float(res[key])
        metrics[metric_key(pair, "ci95_low")], metrics[metric_key(pair, "ci95_high")] = map(float, res["ci95"])
        for metric, r in res.get("by_metric", {}).items():  # e.g. grpo_vs_sft/maj_at_k_strict/delta
            for key in ("delta", "p_value"):
                metrics[metric_key(pair, metric, key)] = float(r[key])
            (metrics[metric_key(pair, metric, "ci95_low")],
             metrics[metric_key(pair, metric, "ci95_high")]) = map(float, r["ci95"])
    mlflow.log_metrics(metrics)
    backends = sorted({m["backend"] for m, _ in results.values()})
    tags = {f"{TAG_PREFIX}eval.backend": ",".join(backends)}
    fewshot = sorted({m["fewshot_source"] for m, _ in results.values() if m.get("fewshot_source")})
    if fewshot:  # lm-eval-gsm8k: which train split the few-shot examples came from
        tags[f"{TAG_PREFIX}eval.fewshot_source"] = ",".join(fewshot)
    mlflow.set_tags(tags)
    for path in paths:
        mlflow.log_artifact(str(path), artifact_path="eval")
    if log_table:
        for name, (_, items) in results.items():
            columns = {key: [row[key] for row in items] for key in items[0]} if items else {}
            mlflow.log_table(data=columns, artifact_file=f"eval/{name}_items_table.json")
