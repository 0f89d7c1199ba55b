"""Comparing runs the way a user does after `make demo`, on a real (small) checkout: `grpoflow run`,
commit the outputs as the baseline, `dvc exp run -S grpo.beta=0.0`; then `dvc metrics diff`,
`dvc plots show` / `dvc plots diff`, `dvc exp show --json` compare the two, and the MLflow run of the
pipeline carries its name, description, datasets and figures. The terminal shows the evaluation's
progress bar.

    pytest -q tests/slow/test_pipeline_compare.py
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import subprocess
import sys

import pytest

from tests.project_repo import git, grpoflow, make_project_repo

pytestmark = pytest.mark.slow

DVC = [sys.executable, "-m", "dvc"]
TRACKED = [
    "reports/eval/sft.json", "reports/eval/grpo.json", "reports/eval/comparison.json", "reports/eval/accuracy.csv",
    "reports/train/sft.json", "reports/train/grpo.json", "reports/train/sft_history.csv",
    "reports/train/grpo_history.csv", "data/processed/stats.json",
]


def dvc(repo, *args: str) -> str:
    proc = subprocess.run([*DVC, *args], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, f"dvc {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_two_runs_compared_with_dvc_and_mlflow(tmp_path):
    import mlflow

    repo = make_project_repo(tmp_path / "repo")
    proc = grpoflow(repo, "run")
    out, _ = proc.communicate(timeout=1500)
    assert proc.returncode == 0, out[-4000:]

    # The terminal: the transformers backend's progress bar per batch (items/s), where the reports are.
    assert re.search(r"generating: 100%\|[^\n\r]*\| 40/40 \[[^\]]*(item/s|s/item)\]", out)
    assert "reports: reports/eval/ (sft.json, grpo.json, comparison.json, accuracy.csv" in out

    # Metrics and plot data are files git tracks (item files and models are DVC's).
    status = git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()
    assert sorted(f for f in TRACKED if f"?? {f}" in status) == sorted(TRACKED)
    assert not [line for line in status if "items.jsonl" in line or "models/" in line]
    grpo_history = rows(repo / "reports/train/grpo_history.csv")
    assert [r["step"] for r in grpo_history] == ["1", "2"]  # grpo.trainer.max_steps=2, logging_steps=1
    for column in ("loss", "reward", "reward_std", "seed_combined", "seed_combined_std", "kl",
                   "completions/mean_length", "frac_reward_zero_std"):
        assert all(r[column] not in ("", "nan") for r in grpo_history), column
    sft_history = rows(repo / "reports/train/sft_history.csv")
    assert [r["step"] for r in sft_history] == ["5", "10", "15", "20", "25", "30"] and all(float(r["loss"]) > 0 for r in sft_history)
    accuracy = {(r["model"], r["metric"]): r for r in rows(repo / "reports/eval/accuracy.csv")}
    grpo_metrics = json.loads((repo / "reports/eval/grpo.json").read_text())
    assert float(accuracy["grpo", "strict"]["accuracy"]) == grpo_metrics["accuracy_strict"]
    assert [float(accuracy["grpo", "flexible"][k]) for k in ("ci_low", "ci_high")] == grpo_metrics["accuracy_flexible_ci95"]

    # MLflow: the parent run's name, description, datasets and figures; datasets on the stage runs.
    client = mlflow.MlflowClient()
    parent = client.search_runs(
        [client.get_experiment_by_name("grpoflow").experiment_id], "tags.`grpoflow.pipeline` = 'training-pipeline'"
    )[0]
    head = git(repo, "rev-parse", "--short=7", "HEAD").strip()
    assert parent.info.run_name == head
    assert "| grpo | " in parent.data.tags["mlflow.note.content"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "figures")} == {
        "figures/accuracy.png", "figures/grpo_training.png"}
    test_sha = hashlib.sha256((repo / "data/processed/test.jsonl").read_bytes()).hexdigest()
    assert {(d.dataset.name, d.dataset.digest) for d in parent.inputs.dataset_inputs} >= {("test", test_sha[:36])}
    children = {r.data.tags["grpoflow.stage"]: r for r in client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}
    for stage, split in (("sft", "train"), ("grpo", "train"), ("evaluate", "test")):
        assert [d.dataset.name for d in children[stage].inputs.dataset_inputs] == [split], stage

    # The user's baseline: commit the outputs. Then a DVC experiment with one param changed.
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "baseline run")
    dvc(repo, "exp", "run", "-S", "grpo.beta=0.0")

    shown = json.loads(dvc(repo, "exp", "show", "--json"))
    baseline = next(e for e in shown if e["rev"] != "workspace")
    experiment = baseline["experiments"][0]["revs"][0]["data"]
    assert experiment["params"]["params.yaml"]["data"]["grpo"]["beta"] == 0.0
    new = json.loads((repo / "reports/eval/grpo.json").read_text())  # exp run applied its results here
    assert experiment["metrics"]["reports/eval/grpo.json"]["data"]["accuracy_strict"] == new["accuracy_strict"]
    assert baseline["data"]["metrics"]["reports/eval/grpo.json"]["data"]["accuracy_strict"] == grpo_metrics["accuracy_strict"]

    diff = json.loads(dvc(repo, "metrics", "diff", "--all", "--json"))["reports/eval/grpo.json"]["accuracy_strict"]
    assert (diff["old"], diff["new"]) == (grpo_metrics["accuracy_strict"], new["accuracy_strict"])
    text = dvc(repo, "metrics", "diff", "--all")
    assert re.search(r"reports/eval/grpo\.json\s+accuracy_strict\s+\S+\s+\S+\s+\S+", text)

    # beta 0: no reference model, so TRL logs no KL; the column is there, nan, and plots still render.
    assert all(r["kl"] == "nan" for r in rows(repo / "reports/train/grpo_history.csv"))
    dvc(repo, "plots", "show", "-o", str(tmp_path / "show"))
    html = (tmp_path / "show" / "index.html").read_text()
    assert "GRPO reward per function (mean)" in html and '"field": "seed_combined"' in html
    assert "Accuracy per model (95% Wilson interval)" in html and '"ci_high"' in html
    dvc(repo, "plots", "diff", "HEAD", "-o", str(tmp_path / "diff"))
    html = (tmp_path / "diff" / "index.html").read_text()
    assert '"rev": "HEAD"' in html and '"rev": "workspace"' in html
