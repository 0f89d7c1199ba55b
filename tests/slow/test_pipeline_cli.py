"""`grpoflow run` as users run it, twice at the same time on one checkout (a toy DVC repo,
tests/toy_repo.py): one run does the work, the other waits for the checkout's lock, then
finds nothing to do; the registry ends with exactly one version and one champion.

    pytest -q tests/slow/test_pipeline_cli.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.toy_repo import make_tiny_model, make_toy_repo

pytestmark = pytest.mark.slow


def grpoflow_run(cwd: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "run"], cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT
    )


def test_of_two_concurrent_runs_on_one_checkout_one_works_and_the_other_skips(tmp_path):
    import mlflow

    toy = make_toy_repo(tmp_path / "repo", make_tiny_model(tmp_path / "model"))
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    # Started together: whichever takes the checkout's lock first does the work.
    first, second = grpoflow_run(toy, logs[0]), grpoflow_run(toy, logs[1])
    rcs = [first.wait(timeout=600), second.wait(timeout=600)]
    out = [log.read_text() for log in logs]
    assert rcs == [0, 0], "\n".join(o[-3000:] for o in out)

    # Whichever got the lock first did the work; the other waited, then skipped everything.
    worker, waiter = (0, 1) if "prepare    ran" in out[0] else (1, 0)
    assert "waiting for the pipeline run holding" in out[waiter]
    for stage in ("prepare", "grpo", "evaluate"):
        assert f"{stage:<10} ran" in out[worker] and f"{stage:<10} skipped" in out[waiter]
    assert "grpoflow-policy v1 registered" in out[worker]
    assert "already registered (dvc.lock unchanged), no new version" in out[waiter]
    assert "promotion: promoted" in out[worker] and "ui: `grpoflow ui`" in out[worker]

    versions = mlflow.MlflowClient().search_model_versions("name = 'grpoflow-policy'")
    assert len(versions) == 1 and versions[0].tags["promotion.decision"] == "promoted"
    assert str(mlflow.MlflowClient().get_model_version_by_alias("grpoflow-policy", "champion").version) == "1"
