"""Figures of a pipeline run, logged as images on its MLflow parent run (matplotlib, no display).

    accuracy_figure(metrics)                 strict and flexible accuracy per model, Wilson 95% intervals
    steps_figure(metrics)                    flexible accuracy per number of reasoning steps, SFT beside
                                             GRPO, the target band shaded
    training_curves_figure(history, rewards) GRPO's per-step curves from its history CSV
                                             (reward total and per function, reward std, KL,
                                             completion length, groups without signal, loss)
    read_history(path)                       a history CSV as {column: [float or nan]}
    log_figures(client, run_id, ...)         the figures that have data, onto a run; drawn once per
                                             content (CACHE_DIR keeps the last run's images)

The same numbers are in reports/ (dvc.yaml's plots draw them with `dvc plots show`); these
images put them on the run page, where the MLflow UI shows artifacts.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

DPI = 110
CACHE_DIR = ".dvc/tmp/grpoflow-figures"  # in the checkout: the images of the last run (log_figures)
ACCURACY_KEYS = (("accuracy_strict", "strict (<answer> tag)"), ("accuracy_flexible", "flexible (last number)"))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, and no GUI toolkit started by a flow or test
    import matplotlib.pyplot as plt

    return plt


def accuracy_figure(metrics: dict[str, dict[str, Any]]):
    """One panel per metric: each model's accuracy as a point with its Wilson 95% interval as a bar."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(ACCURACY_KEYS), figsize=(9, 3.8), sharey=True)
    models = list(metrics)
    highs = [float((m.get(f"{k}_ci95") or [m.get(k, 0)])[-1]) for m in metrics.values() for k, _ in ACCURACY_KEYS]
    top = min(1.0, max([0.1, *highs]) * 1.15)  # room above the highest interval, at most 100%
    for ax, (key, title) in zip(axes, ACCURACY_KEYS, strict=True):
        for i, model in enumerate(models):
            m = metrics[model]
            if key not in m:
                continue
            value = float(m[key])
            low, high = m.get(f"{key}_ci95") or (value, value)
            ax.errorbar([i], [value], yerr=[[value - low], [high - value]], fmt="o", capsize=6, markersize=7)
            ax.annotate(f"{value:.1%}", (i, value), textcoords="offset points", xytext=(10, -3), fontsize=9)
        ax.set_xticks(range(len(models)), models)
        ax.set_xlim(-0.6, len(models) - 0.4)
        ax.set_ylim(0, top)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("accuracy (95% Wilson interval)")
    n = sorted({int(m["n"]) for m in metrics.values() if "n" in m})
    fig.suptitle(f"GSM8K accuracy per model (n = {', '.join(map(str, n)) or '?'})", fontsize=11)
    fig.tight_layout()
    return fig


def steps_figure(metrics: dict[str, dict[str, Any]]):
    """Flexible accuracy per number of reasoning steps, one line per model (SFT beside GRPO), with
    Wilson 95% intervals; the target band shaded."""
    from components.evaluation.reports import scored_steps
    from components.problems.bands import band_label, parse_band

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4))
    steps = scored_steps(metrics)
    band = next((parse_band(m["target_band"]) for m in metrics.values() if m.get("target_band")), None)
    if band:
        ax.axvspan(band[0] - 0.4, (band[1] or max(steps, default=band[0])) + 0.4, color="tab:orange", alpha=0.12,
                   label=f"target band ({band_label(band)})")
    for i, (model, m) in enumerate(metrics.items()):
        points = [(k, m["by_steps"][str(k)]) for k in steps if str(k) in m.get("by_steps", {})]
        if not points:
            continue
        xs = [k + (i - (len(metrics) - 1) / 2) * 0.08 for k, _ in points]  # side by side, not on top
        ys = [float(p["accuracy_flexible"]) for _, p in points]
        lows = [y - float((p.get("accuracy_flexible_ci95") or [y, y])[0])
                for y, (_, p) in zip(ys, points, strict=True)]
        highs = [float((p.get("accuracy_flexible_ci95") or [y, y])[1]) - y
                 for y, (_, p) in zip(ys, points, strict=True)]
        ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=4, label=model)
    ax.set_xticks(steps, [str(k) for k in steps])
    ax.set_xlabel("reasoning steps of the problem")
    ax.set_ylabel("accuracy, flexible (95% Wilson interval)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    ax.set_title("Accuracy by number of reasoning steps", fontsize=11)
    fig.tight_layout()
    return fig


def read_history(path: str | os.PathLike) -> dict[str, list[float]]:
    """{column: values} of a training history CSV; empty or non-numeric cells are nan."""

    def number(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            return math.nan

    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    columns = list(rows[0]) if rows else []
    return {c: [number(r.get(c) or "") for r in rows] for c in columns}


def training_curves_figure(history: dict[str, list[float]], reward_funcs: list[str]):
    """GRPO's curves against the optimizer step; a panel whose column is missing or empty says so."""
    plt = _pyplot()
    panels = [
        ("reward (weighted total) and per function", ["reward", *reward_funcs]),
        ("reward std within groups", ["reward_std"]),
        ("KL to the reference model", ["kl"]),
        ("completion length (mean tokens)", ["completions/mean_length"]),
        ("share of groups with equal rewards", ["frac_reward_zero_std"]),
        ("loss", ["loss"]),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    steps = history.get("step", [])
    for ax, (title, columns) in zip(axes.flat, panels, strict=True):
        drawn = False
        for column in dict.fromkeys(columns):
            values = history.get(column, [])
            if values and not all(math.isnan(v) for v in values):
                ax.plot(steps, values, marker="o", markersize=3, label=column)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
        elif len(columns) > 1:
            ax.legend(fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle("GRPO training (the Trainer's log history)", fontsize=11)
    fig.tight_layout()
    return fig


def log_figures(client: Any, run_id: str, metrics: dict[str, dict[str, Any]], grpo_history: Path | None,
                reward_funcs: list[str], cache_dir: Path) -> list[str]:
    """Log the figures that have data onto the run (artifacts under figures/); returns their paths.

    Each image is kept in `cache_dir` under a hash of what it is drawn from (the numbers,
    the history file, this module's code, matplotlib's version): a rerun with nothing changed logs
    the same bytes without importing matplotlib or drawing. The folder is grpoflow's own: entries
    this run did not use are removed."""
    figures = []
    if any(k in m for m in metrics.values() for k, _ in ACCURACY_KEYS):
        figures.append(("figures/accuracy.png", metrics, lambda: accuracy_figure(metrics)))
    if any(m.get("by_steps") for m in metrics.values()):
        by_steps = {model: {k: m.get(k) for k in ("by_steps", "target_band")} for model, m in metrics.items()}
        figures.append(("figures/accuracy_by_steps.png", by_steps, lambda: steps_figure(metrics)))
    if grpo_history is not None and grpo_history.is_file():
        figures.append(("figures/grpo_training.png",
                        [hashlib.sha256(grpo_history.read_bytes()).hexdigest(), reward_funcs],
                        lambda: training_curves_figure(read_history(grpo_history), reward_funcs)))
    logged, used = [], set()
    for path, inputs, make in figures:
        key = _figure_key(path, inputs)
        cached = cache_dir / key / Path(path).name
        if not cached.is_file():
            _draw_to(cached, make)
        client.log_artifact(run_id, str(cached), str(Path(path).parent))
        used.add(key)
        logged.append(path)
    if cache_dir.is_dir():
        for entry in cache_dir.iterdir():
            if entry.name not in used and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
    return logged


def _draw_to(target: Path, make) -> None:
    """Draw the figure into `target` (written whole: a temporary name, then renamed)."""
    plt = _pyplot()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{os.getpid()}-{target.name}")
    fig = make()
    try:
        fig.savefig(tmp, dpi=DPI, format="png")
    finally:
        plt.close(fig)
    os.replace(tmp, target)


def _figure_key(path: str, inputs: Any) -> str:
    from importlib.metadata import version

    payload = json.dumps([path, inputs, version("matplotlib"), Path(__file__).read_text()], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]
