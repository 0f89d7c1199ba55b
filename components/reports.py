"""The evaluation reports on disk and in MLflow: written by the evaluate stage and `grpoflow evaluate`,
read by the registry, the promotion gate and the run summary.

In `evaluate.output_dir`: `<model>.json` (metrics, a DVC metrics file), `<model>.items.jsonl`
(one scored row per problem; the promotion gate pairs items by id), `comparison.json` and
`accuracy.csv` (accuracy per model and metric with its Wilson interval: the data of the accuracy
plot in dvc.yaml).
All files of one evaluation appear together (components/files.py `write_files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from components.errors import InputError
from components.files import JSONLineError, csv_bytes, iter_jsonl, json_bytes, jsonl_bytes, write_files
from components.tracking import TAG_PREFIX, metric_key

Results = dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]  # {model: (metrics, items)}
COMPARISON = "comparison"
ACCURACY_CSV = "accuracy.csv"
ACCURACY_METRICS = {"strict": "accuracy_strict", "flexible": "accuracy_flexible"}


def write_reports(out_dir: str | os.PathLike, results: Results, comparison: dict[str, Any] | None) -> list[Path]:
    """`<model>.json` and `<model>.items.jsonl` per model (and `comparison.json`), all or none."""
    files = {}
    for name, (metrics, items) in results.items():
        files[f"{name}.json"] = json_bytes(metrics)
        files[f"{name}.items.jsonl"] = jsonl_bytes(items)
    if comparison is not None:
        files[f"{COMPARISON}.json"] = json_bytes(comparison)
    files[ACCURACY_CSV] = csv_bytes(accuracy_rows({name: m for name, (m, _) in results.items()}))
    return write_files(out_dir, files)


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
                rows.append({"model": model, "metric": metric, "accuracy": m[key], "ci_low": low, "ci_high": high, "n": m.get("n")})
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


def read_items(path: str | os.PathLike) -> dict[str, bool]:
    """{item id: correct} from an evaluation items file; names the file and line on bad rows."""
    out: dict[str, bool] = {}
    for lineno, row in iter_jsonl(path):
        if isinstance(row, JSONLineError):
            raise InputError(f"{path}:{lineno}: not valid JSON ({row})")
        if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("correct"), bool):
            raise InputError(f"{path}:{lineno}: expected an object with 'id' and boolean 'correct'")
        out[str(row["id"])] = row["correct"]
    return out


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
    for pair, res in (comparison or {}).items():
        for key in ("delta", "p_value"):
            metrics[metric_key(pair, key)] = float(res[key])
        metrics[metric_key(pair, "ci95_low")], metrics[metric_key(pair, "ci95_high")] = map(float, res["ci95"])
        for metric, r in res.get("by_metric", {}).items():  # e.g. grpo_vs_sft/maj_at_k_strict/delta
            for key in ("delta", "p_value"):
                metrics[metric_key(pair, metric, key)] = float(r[key])
            metrics[metric_key(pair, metric, "ci95_low")], metrics[metric_key(pair, metric, "ci95_high")] = map(
                float, r["ci95"]
            )
    mlflow.log_metrics(metrics)
    backends = sorted({m["backend"] for m, _ in results.values()})
    mlflow.set_tags({f"{TAG_PREFIX}eval.backend": ",".join(backends)})
    for path in paths:
        mlflow.log_artifact(str(path), artifact_path="eval")
    if log_table:
        for name, (_, items) in results.items():
            columns = {key: [row[key] for row in items] for key in items[0]} if items else {}
            mlflow.log_table(data=columns, artifact_file=f"eval/{name}_items_table.json")
