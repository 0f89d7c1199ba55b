"""Every stage but `selection` in its own working copy and process, placed on a Prefect work pool,
with the artifacts handed over through the DVC remote and the tracking on a shared MLflow server
(`selection` runs in the flow's checkout: the placed `grpo` after it pulls what it made); then the
same params locally: the evaluation metrics must be equal to the last digit.

Real services, no Docker: a `prefect server start`, a `process` work pool with a worker, an
`mlflow server` on SQLite and a folder DVC remote.

    make test-distributed          # sets GRPOFLOW_TEST_DISTRIBUTED=1
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.project_repo import grpoflow, make_project_repo
from tests.servers import mlflow_server, prefect_server, served, stop

pytestmark = pytest.mark.skipif(
    os.environ.get("GRPOFLOW_TEST_DISTRIBUTED") != "1", reason="distributed test: run `make test-distributed`"
)
BIN = Path(sys.executable).parent
STAGES = ("data", "model", "sft", "grpo", "evaluate")  # placed on the pool; selection stays local
SAME = ("n", "accuracy_strict", "accuracy_flexible", "format_rate", "mean_completion_tokens", "test_sha256")


@pytest.fixture
def services(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with served(prefect_server, "/api/health", tmp_path / "prefect.log", env=env, timeout=180) as prefect, \
            served(lambda port: mlflow_server(port, tmp_path), "/health", tmp_path / "mlflow.log", env=env,
                   timeout=180) as tracking:
        yield {**env, "PREFECT_API_URL": prefect.url + "/api", "MLFLOW_TRACKING_URI": tracking.url}


def metrics(repo: Path) -> dict[str, dict]:
    return {m: json.loads((repo / "reports/eval" / f"{m}.json").read_text()) for m in ("sft", "grpo")}


def test_every_stage_on_a_work_pool_gives_the_local_result(services, tmp_path):
    import mlflow

    repo = make_project_repo(tmp_path / "distributed" / "repo", with_flows=True)
    deployed = subprocess.run([sys.executable, "-m", "pipelines.cli", "deploy", "--name", "stage-process"], cwd=repo,
                              env=services, capture_output=True, text=True, timeout=600)
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "grpoflow-process"], cwd=repo,
                              env=services, stdout=open(tmp_path / "worker.log", "wb"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        placed = [x for s in STAGES for x in ("-S", f"placement.{s}=process")]
        run = grpoflow(repo, "run", *placed, env=services)
        out, _ = run.communicate(timeout=3000)
        assert run.returncode == 0, out[-5000:] + (tmp_path / "worker.log").read_text()[-5000:]
    finally:
        stop(worker)
    for stage in STAGES:
        assert f"── stage {stage}: submitted to deployment grpoflow-stage/stage-process" in out
        assert f"{stage:<10} ran" in out
    assert "grpoflow-policy v1 registered" in out and "promotion: promoted" in out

    mlflow.set_tracking_uri(services["MLFLOW_TRACKING_URI"])
    client = mlflow.MlflowClient()
    runs = {r.data.tags["grpoflow.stage"]: r for r in client.search_runs(
        [client.get_experiment_by_name("grpoflow").experiment_id], "tags.`grpoflow.runner.workdir` != ''")}
    assert set(runs) == set(STAGES)
    workdirs = {r.data.tags["grpoflow.runner.workdir"] for r in runs.values()}
    pids = {r.data.tags["grpoflow.runner.pid"] for r in runs.values()}
    assert len(workdirs) == len(pids) == len(STAGES) and str(repo) not in workdirs
    parent = runs["sft"].data.tags["mlflow.parentRunId"]
    assert {r.data.tags["mlflow.parentRunId"] for r in runs.values()} == {parent}
    version = client.get_model_version("grpoflow-policy", "1")
    assert version.tags["promotion.decision"] == "promoted"
    mlflow.set_tracking_uri(None)

    local = make_project_repo(tmp_path / "local" / "repo")  # its own remote: nothing to restore
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL",)}
    run = grpoflow(local, "run", env=env)
    out_local, _ = run.communicate(timeout=3000)
    assert run.returncode == 0, out_local[-4000:]
    assert "sft        ran" in out_local
    got, want = metrics(repo), metrics(local)
    for model in ("sft", "grpo"):
        assert {k: got[model][k] for k in SAME} == {k: want[model][k] for k in SAME}, model
    items = [(repo / "reports/eval" / "grpo.items.jsonl").read_text(),
             (local / "reports/eval/grpo.items.jsonl").read_text()]
    assert items[0] == items[1]
