"""Schedules for real: a `prefect server start` on 127.0.0.1, `grpoflow deploy` applies
infra/prefect.yaml's `training` deployment (cron), a process worker runs a triggered flow
run to completion; then `grpoflow schedule --cron` serves the flow and runs a triggered run
itself. The flow runs on a toy DVC repo (tests/toy_repo.py) with registration off.

    pytest -q tests/slow/test_pipeline_deploy.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.servers import prefect_server, served, stop
from tests.toy_repo import make_tiny_model, make_toy_repo

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture
def server(tmp_path):
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "2"}
    env.pop("PREFECT_API_URL", None)
    with served(prefect_server, "/api/health", tmp_path / "prefect-server.log", env=env, timeout=180) as started:
        yield {**env, "PREFECT_API_URL": started.url + "/api"}


def read(env, fn):
    import asyncio

    from prefect.client.orchestration import PrefectClient

    async def go():
        async with PrefectClient(api=env["PREFECT_API_URL"]) as client:
            return await fn(client)

    return asyncio.run(go())


def wait_final(env, flow_run_id, timeout, procs=()) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read(env, lambda c: c.read_flow_run(flow_run_id)).state
        if state and state.is_final():
            return state.type.value
        for p in procs:
            assert p.poll() is None or p.returncode == 0, f"{p.args} exited {p.returncode}"
        time.sleep(2)
    raise AssertionError(f"flow run {flow_run_id} not finished after {timeout} s")


def trigger(env, name, parameters):
    """Start a run of deployment `name` on the test's server (named explicitly: this process may have a
    Prefect temporary server of its own from an earlier in-process flow, which the client would use)."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        return run_deployment(name, parameters=parameters, timeout=0).id


def test_deploy_then_worker_runs_it_and_serve_runs_its_own(server, tmp_path):
    toy = make_toy_repo(tmp_path / "repo", make_tiny_model(tmp_path / "model"))
    # A checkout with the flow code and the deployments, as a worker machine has: the deployment
    # runs in the folder `grpoflow deploy` ran in (no parameter moves it).
    shutil.copytree(REPO / "pipelines", toy / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    (toy / "infra").mkdir()
    shutil.copy(REPO / "infra" / "prefect.yaml", toy / "infra" / "prefect.yaml")
    params = {"overrides": ["register.enabled=false"]}

    res = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "deploy", "--name", "training", "--name", "evaluation"],
        cwd=toy, env=server, capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    deployment = read(server, lambda c: c.read_deployment_by_name("training-pipeline/training"))
    assert deployment.work_pool_name == "grpoflow-process"
    assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
    evaluation = read(server, lambda c: c.read_deployment_by_name("evaluation/evaluation"))
    assert evaluation.parameters["model"] == "models:/grpoflow-policy@champion"

    run_id = trigger(server, "training-pipeline/training", params)
    worker = subprocess.Popen(
        [str(BIN / "prefect"), "worker", "start", "--pool", "grpoflow-process"],
        cwd=tmp_path, env=server, stdout=open(tmp_path / "worker.log", "wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert wait_final(server, run_id, 400, [worker]) == "COMPLETED", (tmp_path / "worker.log").read_text()[-4000:]
        # A remote caller cannot point a stage at another folder (or load code): the run fails, naming the key.
        bad = trigger(server, "training-pipeline/training", {"overrides": ["sft.checkpoint_dir=elsewhere"]})
        assert wait_final(server, bad, 300, [worker]) == "FAILED"
        assert "sft.checkpoint_dir cannot be set by a remote run" in (tmp_path / "worker.log").read_text()
    finally:
        stop(worker)
    assert "evaluate" in (toy / "dvc.lock").read_text()

    serve = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "schedule", "--cron", "*/30 * * * *"],
        cwd=toy, env=server, stdout=open(tmp_path / "serve.log", "wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                served = read(server, lambda c: c.read_deployment_by_name("training-pipeline/training-scheduled"))
                break
            except Exception:
                assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
                time.sleep(2)
        assert [s.schedule.cron for s in served.schedules] == ["*/30 * * * *"]
        assert "repo" not in served.parameters
        run_id = trigger(server, "training-pipeline/training-scheduled", params)
        assert wait_final(server, run_id, 300, [serve]) == "COMPLETED", (tmp_path / "serve.log").read_text()[-4000:]
    finally:
        stop(serve)
