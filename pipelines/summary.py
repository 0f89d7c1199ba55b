"""What a pipeline run reports at its end: a summary dict (the flow's return value) and its
terminal rendering.

    summarize(run, params, stages, pulled, pushed, registration, decision)   the dict
    format_summary(summary)                                                 the table printed by `grpoflow run`
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.reports import read_metrics
from components.tracking import ui_address
from pipelines.lineage import PipelineRun

SUMMARY_KEYS = ("accuracy_strict", "accuracy_flexible", "format_rate", "sampled_accuracy_strict", "pass_at_k_strict",
                "maj_at_k_strict", "n")


def backend_line(metrics: dict[str, dict[str, Any]]) -> str | None:
    """Which engine produced the evaluation, e.g. 'vllm 0.32.0' (one entry per distinct backend).

    >>> backend_line({"sft": {"backend": "vllm", "vllm_version": "0.32.0"}, "grpo": {"backend": "vllm", "vllm_version": "0.32.0"}})
    'vllm 0.32.0'
    >>> backend_line({"grpo": {"backend": "transformers"}}), backend_line({})
    ('transformers', None)
    """
    names = []
    for m in metrics.values():
        if m.get("backend"):
            version = m.get("vllm_version") if m["backend"] == "vllm" else None
            name = " ".join(str(x) for x in (m["backend"], version) if x)
            if name not in names:
                names.append(name)
    return ", ".join(names) or None


def summarize(
    run: PipelineRun,
    params: Any,
    stages: list[dict[str, Any]],
    pulled: str,
    pushed: str,
    registration: dict[str, Any] | None,
    decision: dict[str, Any] | None,
) -> dict[str, Any]:
    import mlflow

    exp_id = mlflow.MlflowClient().get_run(run.run_id).info.experiment_id
    return {
        "run_id": run.run_id,
        "experiment_id": exp_id,
        "tracking_uri": run.tracking_uri,
        "pull": pulled,
        "push": pushed,
        "stages": stages,
        "metrics": read_metrics(Path(run.root) / params.evaluate.output_dir),
        "registration": registration,
        "decision": decision,
    }


def _temperature(metrics: dict[str, dict[str, Any]]) -> Any:
    return next((m["sample_temperature"] for m in metrics.values() if "sample_temperature" in m), "?")


def format_summary(s: dict[str, Any]) -> str:
    lines = ["", "grpoflow run summary"]
    lines.append(f"  dvc pull: {s['pull']}")
    for st in s["stages"]:
        extra = f" (outputs from run {st['produced_by']})" if st.get("produced_by") else ""
        lines.append(f"  {st['stage']:<10} {st['status']:<8} {st['seconds']:>7.1f} s{extra}")
    lines.append(f"  dvc push: {s['push']}")
    if backend := backend_line(s["metrics"]):
        samples = {m.get("num_samples") for m in s["metrics"].values()} - {None}
        extra = f"; {max(samples)} samples per problem at T={_temperature(s['metrics'])}" if any(samples) else ""
        lines.append(f"  evaluation backend: {backend}{extra}")
    for model, m in s["metrics"].items():
        keys = [k for k in SUMMARY_KEYS if k in m]
        if keys:
            lines.append(f"  eval {model:<6} " + "  ".join(f"{k}={m[k]:.4g}" for k in keys))
    reg, dec = s.get("registration"), s.get("decision")
    if reg and "skipped" not in reg:
        what = "registered" if reg["created"] else "already registered (dvc.lock unchanged), no new version"
        lines.append(f"  model: {reg['name']} v{reg['version']} {what}")
    else:
        lines.append(f"  model: not registered ({(reg or {}).get('skipped', 'register.enabled is false')})")
    if dec:
        lines.append(f"  promotion: {dec['decision']} — {dec['reason']}")
    lines.append(f"  mlflow: {s['tracking_uri']} run {s['run_id']}")
    ui = ui_address(s["tracking_uri"])
    page = f"{ui}/#/experiments/{s['experiment_id']}/runs/{s['run_id']}"
    lines.append(f"  ui: {page}" if ui.rstrip("/") == s["tracking_uri"].rstrip("/") else f"  ui: `grpoflow ui`, then {page}")
    return "\n".join(lines)
