"""What `grpoflow sweep` concludes and shows: the configuration chosen by its mean dev score over the seeds,
the sweep table (one row per trial: its overrides, seed, status, dev score with its interval, which stages
ran), logged on the sweep's MLflow parent run as `sweep/trials.csv` and a figure `sweep/dev_scores.png`, and
the summary printed at the end (configurations tried, the chosen one's dev and test figures with intervals,
its registered version and the gate's decision).
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.flow.sweep_search import Journal
from pipelines.flow.sweep_trial import SWEEP_TAG, SweepRun
from pipelines.handoff import RunSummary
from pipelines.params.presets import override_list
from pipelines.params.sweep_spec import SweepSpec

TABLE = "sweep/trials.csv"
FIGURE = "sweep/dev_scores.png"


@dataclass(frozen=True)
class Chosen:
    index: int
    config: dict[str, Any]
    overrides: list[str]  # the configuration at its first seed: the run registered
    mean: float
    values: list[float]  # per seed


@dataclass
class SweepSummary:
    name: str
    run_id: str
    metric: str
    configurations: int  # tried (chosen by the search)
    trials: list[dict[str, Any]]  # the journal's records
    chosen: Chosen | None
    final: RunSummary | None = None
    lines: list[str] = field(default_factory=list)


def mean(done: dict[tuple[int, Any], dict[str, Any]], index: int, seeds: list[Any]) -> float | None:
    """A configuration's mean score over its seeds; None unless every seed finished."""
    records = [done.get((index, s)) for s in seeds]
    if not all(r and r["status"] == "finished" for r in records):
        return None
    return statistics.fmean(r["value"] for r in records)


def choose(spec: SweepSpec, journal: Journal) -> Chosen | None:
    """The configuration of best mean dev score over its seeds (the first of equals); None when none finished
    every seed."""
    seeds = list(spec.seeds) or [None]
    done = journal.trials()
    best = None
    for i, config in enumerate(journal.configs()):
        score = mean(done, i, seeds)
        if score is not None and (best is None or score > best.mean):
            seed = {spec.seed_key: seeds[0]} if seeds[0] is not None else {}
            best = Chosen(i, config, override_list({**config, **seed}), score,
                          [done[(i, s)]["value"] for s in seeds])
    return best


def stage_keys(root: str, stages: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """stage -> the params.yaml keys it and every stage upstream of it read (dvc.yaml `params:`)."""
    import yaml

    from pipelines.execution.dvc_ops import upstream_stages

    defs = yaml.safe_load((Path(root) / "dvc.yaml").read_text())["stages"]
    own = {s: tuple(k for item in defs[s].get("params", []) for k in ([item] if isinstance(item, str) else []))
           for s in stages}
    out: dict[str, tuple[str, ...]] = {}
    for stage in stages:  # in graph order: the upstream stages are done
        keys = set(own[stage])
        for up in upstream_stages(root, stage):
            keys |= set(out.get(up, own.get(up, ())))
        out[stage] = tuple(sorted(keys))
    return out


def table(spec: SweepSpec, records: list[dict[str, Any]]) -> str:
    """The sweep table as CSV, one row per trial in trial order."""
    keys = [p.key for p in spec.parameters]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["trial", *keys, spec.seed_key, "status", f"dev.{spec.metric}", "ci95_low", "ci95_high", "n",
                     "stages_ran", "seconds", "error"])
    for r in sorted(records, key=lambda r: r["number"]):
        ci = r.get("ci95") or ["", ""]
        ran = " ".join(s for s, v in r["stages"].items() if v == "ran")
        writer.writerow([r["number"], *(r["config"].get(k) for k in keys), r["seed"], r["status"], r["value"], *ci,
                         r["n"], ran, r["seconds"], r["error"]])
    return buf.getvalue()


def figure(spec: SweepSpec, records: list[dict[str, Any]], chosen: Chosen | None) -> Any:
    """Dev score per configuration: each seed's trial with its interval, the chosen one marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * (1 + max((r["index"] for r in records), default=0))), 3.5))
    for r in records:
        if r["status"] != "finished":
            continue
        ci = r.get("ci95") or [r["value"], r["value"]]
        ax.errorbar(r["index"], r["value"], yerr=[[r["value"] - ci[0]], [ci[1] - r["value"]]], fmt="o", capsize=3,
                    color="tab:red" if chosen and r["index"] == chosen.index else "tab:blue")
    ax.set_xlabel("configuration (trial table: sweep/trials.csv)")
    ax.set_ylabel(f"dev {spec.metric}")
    ax.set_title(f"sweep {spec.name}: dev score per seed (red: chosen)")
    fig.tight_layout()
    return fig


def publish_sweep(spec: SweepSpec, sweep: SweepRun, journal: Journal, chosen: Chosen | None,
            final: RunSummary | None) -> SweepSummary:
    """The table and figure on the parent run, the chosen configuration's pipeline run made its child, the
    summary as the parent's description; the parent run ends."""
    import mlflow

    client = mlflow.MlflowClient(sweep.tracking_uri)
    records = list(journal.trials().values())
    summary = SweepSummary(spec.name, sweep.run_id, spec.metric, len(journal.configs()), records, chosen, final)
    summary.lines = summary_lines(summary, spec)
    client.log_text(sweep.run_id, table(spec, records), TABLE)
    client.log_figure(sweep.run_id, figure(spec, records, chosen), FIGURE)
    if chosen:
        client.log_metric(sweep.run_id, f"chosen.dev.{spec.metric}", chosen.mean)
        client.set_tag(sweep.run_id, f"{SWEEP_TAG}.chosen", " ".join(override_list(chosen.config)))
    if final:
        client.set_tag(final.run_id, "mlflow.parentRunId", sweep.run_id)
        client.set_tag(final.run_id, f"{SWEEP_TAG}.role", "chosen")
        client.set_tag(final.run_id, SWEEP_TAG, spec.name)
    client.set_tag(sweep.run_id, "mlflow.note.content", "\n".join(summary.lines))
    client.set_terminated(sweep.run_id, "FINISHED" if chosen else "FAILED")
    return summary


def _pct(value: float, ci: list[float] | None) -> str:
    return f"{value:.1%}" + (f" (95% CI {ci[0]:.1%} to {ci[1]:.1%})" if ci else "")


def summary_lines(s: SweepSummary, spec: SweepSpec) -> list[str]:
    finished = [r for r in s.trials if r["status"] == "finished"]
    failed = [r for r in s.trials if r["status"] == "failed"]
    seeds = f"{len(spec.seeds)} seeds ({spec.seed_key} {', '.join(map(str, spec.seeds))})" if spec.seeds else "1 seed"
    lines = [f"grpoflow sweep summary: {s.name} ({spec.method})",
             f"  {s.configurations} configurations tried, {seeds} each: {len(finished)} trials finished, "
             f"{len(failed)} failed; ranked by the mean dev {s.metric} over the seeds"]
    lines += [f"  trial {r['number']} failed: {r['error']}" for r in sorted(failed, key=lambda r: r["number"])]
    if not s.chosen:
        return [*lines, "  no configuration finished all its seeds: nothing chosen, nothing registered"]
    c = s.chosen
    per_seed = [s_ for s_ in s.trials if s_["index"] == c.index]
    lines.append(f"  chosen: {' '.join(override_list(c.config))}: dev {s.metric} {c.mean:.1%} mean over "
                 f"{len(c.values)} seeds; per seed " + "; ".join(
                     f"{r['seed']}: {_pct(r['value'], r.get('ci95'))}, n = {r['n']}"
                     for r in sorted(per_seed, key=lambda r: r["number"])))
    f = s.final
    if f is not None:
        slice_, _, key = s.metric.rpartition(".")
        for model in ("grpo", "sft"):
            m = f.metrics.get(model, {})
            m = m.get(slice_, {}) if slice_ else m
            if key in m:
                lines.append(f"  test {s.metric} ({model}, {' '.join(c.overrides)}): "
                             f"{_pct(m[key], m.get(f'{key}_ci95'))}, n = {m.get('n')}")
        reg = f.registration
        lines.append(f"  registered: {reg.name} version {reg.version}" if hasattr(reg, "version")
                     else f"  not registered: {reg.reason}")
        if f.decision:
            lines.append(f"  gate: {f.decision.decision} — {f.decision.reason}")
    lines.append(f"  mlflow: sweep parent run {s.run_id} (trials as children; {TABLE}, {FIGURE}); "
                 "`dvc exp show` lists the trials")
    return lines


def format_summary(s: SweepSummary) -> str:
    return "\n".join(["", *s.lines])
