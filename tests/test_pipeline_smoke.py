"""The smoke test a user most needs: `grpoflow run` on a real (small) checkout of this project
(tests/project_repo.py: every stage for real, Prefect's temporary server, MLflow on SQLite, a local
DVC remote, evaluation on transformers) trains, evaluates, registers and promotes; the terminal, git
and MLflow show what the docs say they show. About two minutes on two cores; the pipeline scenarios
(restore, kill/resume, reproduce, serve, compare, gate) are `make test-slow`'s.

    pytest -q tests/test_pipeline_smoke.py
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.project_repo import git, make_project_repo, prefect_servers, run_ok

PAIR_ROWS = [f"reports/eval/metrics/grpo_vs_sft.{s}.json" for s in ("delta", "ci95_low", "ci95_high", "p_value")]
TRACKED = [  # the headline metrics and the plot data
    "reports/eval/metrics/sft.json", "reports/eval/metrics/grpo.json", *PAIR_ROWS, "reports/eval/accuracy.csv",
    "reports/eval/accuracy_by_steps.csv",
    "reports/train/selection.json", "reports/train/selection_pass_rates.csv", "reports/train/sft_history.csv",
    "reports/train/grpo_history.csv",
]
CACHED = [  # the full summaries: DVC outputs, like the item files and models
    "reports/eval/sft.json", "reports/eval/grpo.json", "reports/eval/comparison.json", "reports/train/sft.json",
    "reports/train/grpo.json", "data/processed/stats.json",
]


def rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_small_pipeline_runs_registers_and_shows_its_results(tmp_path):
    import mlflow

    repo = make_project_repo(tmp_path / "repo")
    out = run_ok(repo, "run")

    # Every stage ran; the version was registered and, the first, became champion.
    for stage in ("data", "model", "sft", "grpo", "evaluate"):
        assert f"{stage:<10} ran" in out, out[-3000:]
    assert "grpoflow-policy v1 registered" in out and "promotion: promoted" in out
    # evaluate.target_band (3 steps): the headline is the band's, checked accuracy first, then correctness, each
    # with its interval and p-value; the other bands' change stated beside it
    checked_then_correctness = (r"accuracy_checked \(right, no equation shown wrong\) sft [\d.]+% -> grpo [\d.]+%, "
                                r"[+-][\d.]+ points \(95% CI [^)]+\), exact McNemar p = [\d.e-]+; correctness \(")
    assert re.search(rf"grpo vs sft, target band \(3 steps\), n = \d+: {checked_then_correctness}", out), out[-3000:]
    assert re.search(rf"grpo vs sft, other bands, n = \d+: {checked_then_correctness}", out), out[-3000:]
    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias("grpoflow-policy", "champion").version) == "1"

    # The terminal: the transformers backend's progress bar per batch (items/s), where the reports are.
    assert re.search(r"generating: 100%\|[^\n\r]*\| 40/40 \[[^\]]*(item/s|s/item)\]", out)
    assert "reports: reports/eval/ (sft.json, grpo.json, comparison.json, accuracy.csv" in out
    assert "evaluation backend: transformers" in out

    # Metrics and plot data are files git tracks (summaries, item files and models are DVC's).
    status = git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()
    assert sorted(f for f in TRACKED if f"?? {f}" in status) == sorted(TRACKED)
    assert not [line for line in status if "items.jsonl" in line or "models/" in line or line[3:] in CACHED]
    # `dvc metrics show` is the headline, readable in a 270-column terminal (one column per key: GRPO's change
    # from SFT is four rows under the models' columns, not columns of its own); a summary is one name away.
    shown = subprocess.run([sys.executable, "-m", "dvc", "metrics", "show"], cwd=repo, capture_output=True,
                           text=True, check=True).stdout
    assert max(len(line) for line in shown.splitlines()) <= 270, shown
    assert {"target_accuracy_checked", "target_accuracy_flexible", "target_accuracy_strict", "target_n",
            "in_band_accuracy_checked", "in_band_accuracy_flexible", "format_rate", "kept",
            "reports/eval/metrics/grpo.json", *PAIR_ROWS} <= set(shown.split()), shown
    full = subprocess.run([sys.executable, "-m", "dvc", "metrics", "show", "reports/eval/grpo.json"], cwd=repo,
                          capture_output=True, text=True, check=True).stdout
    assert "pass_at_k_flexible" in full and "sampled_accuracy_flexible" in full
    grpo_history = rows(repo / "reports/train/grpo_history.csv")
    assert [r["step"] for r in grpo_history] == ["1", "2"]  # grpo.trainer.max_steps=2, logging_steps=1
    for column in ("loss", "reward", "reward_std", "accuracy", "accuracy_std", "kl",
                   "completions/mean_length", "frac_reward_zero_std"):
        assert all(r[column] not in ("", "nan") for r in grpo_history), column
    sft_history = rows(repo / "reports/train/sft_history.csv")
    assert [r["step"] for r in sft_history] == ["5", "10", "15", "20", "25", "30"]
    assert all(float(r["loss"]) > 0 for r in sft_history)
    accuracy = {(r["model"], r["metric"]): r for r in rows(repo / "reports/eval/accuracy.csv")}
    grpo_metrics = json.loads((repo / "reports/eval/grpo.json").read_text())
    assert grpo_metrics["n"] == 40
    assert float(accuracy["grpo", "strict"]["accuracy"]) == grpo_metrics["accuracy_strict"]
    assert ([float(accuracy["grpo", "flexible"][k]) for k in ("ci_low", "ci_high")]
            == grpo_metrics["accuracy_flexible_ci95"])

    # MLflow: the parent run's name, description, datasets and figures; datasets on the stage runs.
    parent = client.search_runs(
        [client.get_experiment_by_name("grpoflow").experiment_id], "tags.`grpoflow.pipeline` = 'training-pipeline'"
    )[0]
    head = git(repo, "rev-parse", "--short=7", "HEAD").strip()
    assert parent.info.run_name == head
    assert "| grpo | " in parent.data.tags["mlflow.note.content"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "figures")} == {
        "figures/accuracy.png", "figures/accuracy_by_steps.png", "figures/grpo_training.png"}
    test_sha = hashlib.sha256((repo / "data/processed/test.jsonl").read_bytes()).hexdigest()
    assert {(d.dataset.name, d.dataset.digest) for d in parent.inputs.dataset_inputs} >= {("test", test_sha[:36])}
    children = {r.data.tags["grpoflow.stage"]: r for r in client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}
    for stage, split in (("sft", "train"), ("grpo", "selected_prompts"), ("evaluate", "test")):
        assert [d.dataset.name for d in children[stage].inputs.dataset_inputs] == [split], stage

    # Nothing changed: a second run skips every stage and registers nothing new.
    again = run_ok(repo, "run")
    for stage in ("data", "model", "sft", "grpo", "evaluate"):
        assert f"{stage:<10} skipped" in again, again[-3000:]
    assert "already registered (dvc.lock unchanged), no new version" in again
    assert len(client.search_model_versions("name = 'grpoflow-policy'")) == 1
    assert re.search(r"^  time: [\d.]+ s = start-up [\d.]+ s", again, re.M), again[-2000:]  # where the seconds went

    # The rerun's figures are the first run's images, logged again from grpoflow's cache (nothing to draw).
    rerun = client.search_runs([parent.info.experiment_id], "tags.`grpoflow.pipeline` = 'training-pipeline'",
                               order_by=["attributes.start_time DESC"])[0]
    assert rerun.info.run_id != parent.info.run_id and rerun.info.run_name == f"{head} rerun"
    for name in ("accuracy.png", "accuracy_by_steps.png", "grpo_training.png"):
        first, second = (Path(client.download_artifacts(r.info.run_id, f"figures/{name}",
                                                        str(tmp_path / r.info.run_id)))
                         for r in (parent, rerun))
        assert first.read_bytes() == second.read_bytes() and first.read_bytes()[:4] == b"\x89PNG"
    assert len(list((repo / ".dvc/tmp/grpoflow-figures").iterdir())) == 3  # accuracy, accuracy by steps, GRPO training

    # The run's temporary Prefect server got the flow run's last log lines before it stopped, and it is
    # gone when the command returns; it served no UI, so no "View at" link was printed.
    db = sqlite3.connect(Path(os.environ["PREFECT_HOME"]) / "prefect.db")
    flow_run_id, name = db.execute("select id, name from flow_run order by created desc limit 1").fetchone()
    assert name == f"{head} rerun" and flow_run_id == rerun.data.tags["grpoflow.prefect.flow_run_id"]
    assert ("Finished in state Completed()",) in db.execute(
        "select message from log where flow_run_id = ? and task_run_id is null", (flow_run_id,)).fetchall()
    assert not prefect_servers(Path(os.environ["PREFECT_HOME"]))
    assert "View at http" not in out + again
