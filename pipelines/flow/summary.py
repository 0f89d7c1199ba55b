"""What a pipeline run reports at its end: the run summary (pipelines/handoff.py RunSummary, the
flow's return value), its terminal rendering, and the same story in MLflow and Prefect.

    run_summary(run, params, stages, pulled, pushed, registration, decision)   the RunSummary
    format_run_summary(summary)        the table printed by `grpoflow run`
    summary_markdown(summary)      the same as markdown: the parent run's description in MLflow
                                   (tag mlflow.note.content) and the flow run's artifact in Prefect
    publish_mlflow(run, summary, params)  name (`rerun` added when no stage ran), description and
                                   figures (accuracy per model, GRPO's curves) onto the parent run
    publish_failure(run, stages, error)   a failed run's: the description and the Prefect artifact start
                                   with the error line (failure_markdown)
    links(summary)                 {what: URL} of the MLflow run and the registered version
    time_line(total, startup, waited, tasks)   where a run's seconds went, printed last by `grpoflow run`
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.common.params import Params
from components.common.tracking import ui_address
from components.evaluation.reports import (
    ACCURACY_CSV,
    HEADLINE_DIR,
    PAIR_STATISTICS,
    STEPS_CSV,
    band_headlines,
    headline,
    pair_headline_file,
    read_comparison,
    read_metrics,
)
from pipelines.flow.lineage import run_name
from pipelines.handoff import Decision, NotRegistered, PipelineRun, Registration, RunSummary, StageResult

SUMMARY_KEYS = ("accuracy_strict", "accuracy_flexible", "format_rate", "sampled_accuracy_strict", "pass_at_k_strict",
                "maj_at_k_strict", "n")
DESCRIPTION_TAG = "mlflow.note.content"  # what the MLflow UI shows as the run's description


def backend_line(metrics: dict[str, dict[str, Any]]) -> str | None:
    """Which engine produced the evaluation, e.g. 'vllm 0.32.0' (one entry per distinct backend).

    >>> backend_line({"sft": {"backend": "vllm", "vllm_version": "0.32.0"},
    ...               "grpo": {"backend": "vllm", "vllm_version": "0.32.0"}})
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


def run_summary(
    run: PipelineRun,
    params: Params,
    stages: list[StageResult],
    pulled: str,
    pushed: str,
    registration: Registration | NotRegistered,
    decision: Decision | None,
    overrides: list[str] | tuple[str, ...] = (),
) -> RunSummary:
    import mlflow

    exp_id = mlflow.MlflowClient().get_run(run.run_id).info.experiment_id
    eval_dir = Path(run.root) / params.evaluate.output_dir
    nothing_ran = all(s.status == "skipped" for s in stages)
    return RunSummary(
        name=run_name(run.root, overrides, nothing_ran),
        run_id=run.run_id,
        experiment_id=exp_id,
        tracking_uri=run.tracking_uri,
        pull=pulled,
        push=pushed,
        stages=stages,
        metrics=dict(sorted(read_metrics(eval_dir).items(), key=lambda kv: _model_rank(kv[0]))),
        comparison=read_comparison(eval_dir) or {},
        registration=registration,
        decision=decision,
        reports=reports(params),
        alpha=params.register.alpha,
    )


def headlines(s: RunSummary) -> list[tuple[str, str]]:
    """One line per compared pair (GRPO vs SFT first), one per band with a target band (the target band
    first, then the other bands): checked accuracy first, then correctness, each with its interval and
    p-value, the format stated apart, and in words when strict accuracy rose but correctness did not
    ("the gain is format, not correctness")."""
    out = []
    for pair, c in (s.comparison or {}).items():
        a, b = pair.split("_vs_", 1)  # the pair's names (its "a"/"b" keys are McNemar counts)
        if banded := band_headlines(a, b, c, s.metrics, s.alpha):  # evaluate.target_band: the band first
            out += banded
            continue
        fmt = [s.metrics.get(m, {}).get("format_rate") for m in (a, b)]
        by_metric = c.get("by_metric") or {c.get("metric", ""): c}
        out.append((f"{a} vs {b}", headline(a, b, by_metric, *fmt, alpha=s.alpha)))
    return out


def _temperature(metrics: dict[str, dict[str, Any]]) -> Any:
    return next((m["sample_temperature"] for m in metrics.values() if "sample_temperature" in m), "?")


def _model_rank(model: str) -> tuple[int, str]:
    """Pipeline order (base, sft, grpo), then any other model by name."""
    order = ("base", "sft", "grpo")
    return (order.index(model) if model in order else len(order), model)


def reports(params: Params) -> dict[str, list[str]]:
    """Where a run's reports are: {folder: [files]} (summaries, DVC metrics and plot data)."""
    from components.evaluate import PAIRS, stage_models

    ev = params.evaluate.output_dir
    models = list(stage_models(params))
    pairs = [f"{a}_vs_{b}" for a, b in PAIRS if a in models and b in models]
    out: dict[str, list[str]] = {ev: [*(f"{m}.json" for m in models), "comparison.json", ACCURACY_CSV, STEPS_CSV,
                                      *(f"{m}.items.jsonl" for m in models),
                                      *(f"{HEADLINE_DIR}/{m}.json" for m in models),
                                      *(pair_headline_file(p, stat) for p in pairs for stat in PAIR_STATISTICS)]}
    for section in (params.sft, params.selection, params.grpo):
        for path in (section.metrics_file, getattr(section, "history_file", None) or section.histogram_file):
            folder, name = str(Path(path).parent), Path(path).name
            out.setdefault(folder, []).append(name)
    return out


def _model_line(s: RunSummary) -> str:
    reg = s.registration
    if isinstance(reg, Registration):
        what = ("registered (alias challenger)" if reg.created
                else "already registered (dvc.lock unchanged), no new version")
        return f"{reg.name} v{reg.version} {what}"
    return f"not registered ({reg.reason})"


def _page(s: RunSummary) -> str:
    return f"{ui_address(s.tracking_uri)}/#/experiments/{s.experiment_id}/runs/{s.run_id}"


def links(s: RunSummary) -> dict[str, str]:
    """The MLflow UI pages of the run and of the registered version (if any)."""
    out = {"mlflow-run": _page(s)}
    reg = s.registration
    if isinstance(reg, Registration):
        out["model-version"] = f"{ui_address(s.tracking_uri)}/#/models/{reg.name}/versions/{reg.version}"
    return out


def format_run_summary(s: RunSummary) -> str:
    lines = ["", f"grpoflow run summary: {s.name}"]
    lines.append(f"  dvc pull: {s.pull}")
    for st in s.stages:
        extra = f" (outputs from run {st.produced_by})" if st.produced_by else ""
        lines.append(f"  {st.stage:<10} {st.status:<8} {st.seconds:>7.1f} s{extra}")
    lines.append(f"  dvc push: {s.push}")
    if backend := backend_line(s.metrics):
        samples = {m.get("num_samples") for m in s.metrics.values()} - {None}
        extra = f"; {max(samples)} samples per problem at T={_temperature(s.metrics)}" if any(samples) else ""
        lines.append(f"  evaluation backend: {backend}{extra}")
    for model, m in s.metrics.items():
        keys = [k for k in SUMMARY_KEYS if k in m]
        if keys:
            lines.append(f"  eval {model:<6} " + "  ".join(f"{k}={m[k]:.4g}" for k in keys))
    lines += [f"  {pair}: {text}" for pair, text in headlines(s)]
    lines.append(f"  model: {_model_line(s)}")
    dec = s.decision
    if dec:
        lines.append(f"  promotion: {dec.decision} — {dec.reason}")
    for folder, files in s.reports.items():
        lines.append(f"  reports: {folder}/ ({', '.join(files)})")
    lines.append("  compare: `dvc metrics diff`, `dvc plots show` (dvc_plots/index.html), `dvc exp show`")
    lines.append(f"  mlflow: {s.tracking_uri} run {s.run_id}")
    ui = ui_address(s.tracking_uri)
    page = _page(s)
    lines.append(f"  ui: {page}" if ui.rstrip("/") == s.tracking_uri.rstrip("/")
                 else f"  ui: `grpoflow ui`, then {page}")
    return "\n".join(lines)


def _ci(m: dict[str, Any], key: str) -> str:
    ci = m.get(f"{key}_ci95")
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""


def summary_markdown(s: RunSummary) -> str:
    """The run as markdown: accuracy per model with intervals, the paired comparisons, the registered
    version and the promotion decision, then the stages and where the reports are."""
    out = [f"### grpoflow run `{s.name or s.run_id}`"]
    if s.metrics:
        out += ["", "| model | accuracy strict | 95% CI | accuracy flexible | 95% CI | format rate | n |",
                "|---|---:|---|---:|---|---:|---:|"]
        for model, m in s.metrics.items():
            def num(key: str, m=m) -> str:
                return f"{m[key]:.3f}" if isinstance(m.get(key), (int, float)) else ""

            out.append(f"| {model} | {num('accuracy_strict')} | {_ci(m, 'accuracy_strict')} | "
                       f"{num('accuracy_flexible')} | {_ci(m, 'accuracy_flexible')} | {num('format_rate')} | "
                       f"{m.get('n', '')} |")
    for pair, text in headlines(s):
        out += ["", f"**{pair}** (same items): {text}"]
    out += ["", f"**Model:** {_model_line(s)}"]
    dec = s.decision
    if dec:
        out.append(f"**Promotion:** {dec.decision} — {dec.reason}")
    out += ["", "| stage | status | seconds | note |", "|---|---|---:|---|"]
    for st in s.stages:
        note = f"outputs from run {st.produced_by}" if st.produced_by else ""
        out.append(f"| {st.stage} | {st.status} | {st.seconds:.1f} | {note} |")
    out += ["", f"dvc pull: {s.pull}; dvc push: {s.push}"]
    for folder, files in s.reports.items():
        out.append(f"Reports: `{folder}/` ({', '.join(files)})")
    out.append("Compare with other runs: `dvc metrics diff`, `dvc plots show`, `dvc exp show`.")
    return "\n".join(out) + "\n"


def failure_markdown(error: BaseException | str, stages: list[StageResult]) -> str:
    """A failed run's description: the error's first line first (a failed stage's own error line,
    pipelines/handoff.py failure_message), then the stages so far.

    >>> print(failure_markdown("stage 'data' failed: data/x.jsonl line 3: no 'question'\\n(dvc exit 1)",
    ...                        [StageResult("data", "failed")]))
    **Failed:** stage 'data' failed: data/x.jsonl line 3: no 'question'
    <BLANKLINE>
    | stage | status | seconds |
    |---|---|---:|
    | data | failed | 0.0 |
    <BLANKLINE>
    """
    first = (str(error).splitlines() or [type(error).__name__])[0]
    out = [f"**Failed:** {first}", "", "| stage | status | seconds |", "|---|---|---:|"]
    out += [f"| {st.stage} | {st.status} | {st.seconds:.1f} |" for st in stages]
    return "\n".join(out) + "\n"


def publish_failure(run: PipelineRun, stages: list[StageResult], error: BaseException) -> None:
    """A failed run's summary where users look: the MLflow run's description and the Prefect flow run's
    markdown artifact, both starting with the error line."""
    import mlflow
    from prefect.artifacts import create_markdown_artifact

    text = failure_markdown(error, stages)
    mlflow.MlflowClient().set_tag(run.run_id, DESCRIPTION_TAG, text)
    create_markdown_artifact(text, key="training-summary", description="grpoflow run failed")


def publish_mlflow(run: PipelineRun, s: RunSummary, params: Params) -> list[str]:
    """Name, description and figures of the parent run; returns the figures' artifact paths."""
    import mlflow

    from pipelines.flow.figures import CACHE_DIR, log_figures

    client = mlflow.MlflowClient()
    client.update_run(s.run_id, name=s.name)
    client.set_tag(s.run_id, DESCRIPTION_TAG, summary_markdown(s))
    history = Path(run.root) / params.grpo.history_file
    return log_figures(client, s.run_id, s.metrics, history, list(params.rewards.funcs), Path(run.root) / CACHE_DIR)


def time_line(total: float, startup: float, waited: float, tasks: list[tuple[str, float]]) -> str:
    """Where the seconds of `grpoflow run` went: start-up (imports, checks, and the wait for Prefect's
    temporary server), each task of the flow run, and the rest (Prefect's bookkeeping, MLflow's run).

    >>> time_line(9.0, 3.0, 0.5, [("dvc-status", 0.8), ("data", 0.0), ("publish", 1.5)])
    '  time: 9.0 s = start-up 3.0 s (0.5 s of it waiting for the Prefect server) + dvc-status 0.8 + publish 1.5 + other 3.7 s'
    """  # noqa: E501
    shown = [(name, s) for name, s in tasks if s >= 0.05]
    rest = max(total - startup - sum(s for _, s in tasks), 0.0)
    parts = [f"start-up {startup:.1f} s"
             + (f" ({waited:.1f} s of it waiting for the Prefect server)" if waited >= 0.05 else "")]
    parts += [f"{name} {s:.1f}" for name, s in shown]
    return f"  time: {total:.1f} s = " + " + ".join(parts) + f" + other {rest:.1f} s"


def task_seconds(parent_run_id: str) -> list[tuple[str, float]]:
    """(name, seconds) of each task run of the pipeline run's Prefect flow run, in start order."""
    import mlflow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    from pipelines.flow.lineage import FLOW_RUN_TAG

    flow_run_id = mlflow.MlflowClient().get_run(parent_run_id).data.tags.get(FLOW_RUN_TAG)
    if not flow_run_id:
        return []
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
        )
    return [(r.name, r.total_run_time.total_seconds()) for r in runs]
