"""Comparing runs the way a user does after `make demo`, on a copy of the session's baseline run
(tests/project_repo.py): commit the outputs as the baseline, `dvc exp run -S grpo.trainer.beta=0.0`; then
`dvc exp show --json`, `dvc metrics diff` and `dvc plots show` / `dvc plots diff` compare the two.
(What the first run itself shows, in the terminal, in git and in MLflow, is tests/test_pipeline_smoke.py's.)

    pytest -q tests/slow/test_pipeline_compare.py
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys

import pytest

from tests.project_repo import git

pytestmark = pytest.mark.slow

DVC = [sys.executable, "-m", "dvc"]


def dvc(repo, env, *args: str) -> str:
    proc = subprocess.run([*DVC, *args], cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"dvc {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_dvc_experiment_compared_with_the_committed_baseline(baseline, tmp_path):
    copy = baseline.copy(tmp_path / "copy")
    repo, env = copy.repo, copy.env()
    before = json.loads((repo / "reports/eval/grpo.json").read_text())

    # The user's baseline: commit the outputs. Then a DVC experiment with one param changed.
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "baseline run")
    dvc(repo, env, "exp", "run", "-S", "grpo.trainer.beta=0.0")

    shown = json.loads(dvc(repo, env, "exp", "show", "--json"))
    base = next(e for e in shown if e["rev"] != "workspace")
    experiment = base["experiments"][0]["revs"][0]["data"]
    assert experiment["params"]["params.yaml"]["data"]["grpo"]["trainer"]["beta"] == 0.0
    new = json.loads((repo / "reports/eval/grpo.json").read_text())  # exp run applied its results here
    # The headline metrics (reports/eval/metrics/<model>.json) are what DVC compares.
    headline = "reports/eval/metrics/grpo.json"
    assert experiment["metrics"][headline]["data"]["target_accuracy_flexible"] == new["target"]["accuracy_flexible"]
    assert base["data"]["metrics"][headline]["data"]["target_accuracy_strict"] == before["target"]["accuracy_strict"]

    diff = json.loads(dvc(repo, env, "metrics", "diff", "--all", "--json"))[headline]["target_accuracy_strict"]
    assert (diff["old"], diff["new"]) == (before["target"]["accuracy_strict"], new["target"]["accuracy_strict"])
    text = dvc(repo, env, "metrics", "diff", "--all")
    assert re.search(r"reports/eval/metrics/grpo\.json\s+target_accuracy_flexible\s+\S+\s+\S+\s+\S+", text)

    # beta 0: no reference model, so TRL logs no KL; the column is there, nan, and plots still render.
    assert all(r["kl"] == "nan" for r in rows(repo / "reports/train/grpo_history.csv"))
    dvc(repo, env, "plots", "show", "-o", str(tmp_path / "show"))
    html = (tmp_path / "show" / "index.html").read_text()
    assert ("GRPO reward per function (mean)" in html and '"field": "accuracy"' in html
            and "Accuracy (flexible) by number of reasoning steps" in html)
    assert "Accuracy per model (95% Wilson interval)" in html and '"ci_high"' in html
    dvc(repo, env, "plots", "diff", "HEAD", "-o", str(tmp_path / "diff"))
    html = (tmp_path / "diff" / "index.html").read_text()
    assert '"rev": "HEAD"' in html and '"rev": "workspace"' in html
