"""Tests for components/common/tracking.py: URI resolution, nesting under the flow's parent run,
params logging and FAILED status, against a real MLflow SQLite store.

    pytest -q tests/test_tracking.py
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from components.common.tracking import (
    PARENT_ENV,
    STAGE_TAG,
    flatten,
    repo_root,
    resolve_artifact_location,
    resolve_tracking_uri,
    stage_run,
    stage_sections,
)
from pipelines.params.config import load_params

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "dvc.yaml").write_text(
        textwrap.dedent(
            """
            stages:
              grpo:
                cmd: python -c pass
                params: [model.name_or_path, grpo, rewards]
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_flatten_joins_nested_keys_with_dots_and_writes_lists_as_text():
    assert flatten({"a": {"b": {"c": 1}, "d": [1, 2]}, "e": {}}) == {"a.b.c": "1", "a.d": "[1, 2]", "e": "{}"}


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("sqlite:///mlflow.db", "sqlite:///{root}/mlflow.db"),
        ("sqlite:///sub/../x.db", "sqlite:///{root}/x.db"),
        ("sqlite:////abs/x.db", "sqlite:////abs/x.db"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("mlruns", "{root}/mlruns"),
    ],
)
def test_a_relative_tracking_uri_resolves_against_the_repo_root(repo, monkeypatch, uri, expected):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    params = load_params(overrides=[f"tracking.uri={uri}"])
    root = repo_root()
    (root / "sub").mkdir(exist_ok=True)
    monkeypatch.chdir(root / "sub")  # the root is found from a subfolder too
    assert resolve_tracking_uri(params) == expected.format(root=root)


def test_env_uri_wins_and_server_has_no_artifact_location(repo, monkeypatch):
    params = load_params()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    uri = resolve_tracking_uri(params)
    assert uri == "http://127.0.0.1:9"
    assert resolve_artifact_location(params, uri) is None
    assert resolve_artifact_location(params, "sqlite:///x.db") == (repo / "mlartifacts").as_uri()


def test_a_stages_params_sections_are_read_from_dvc_yaml(repo):
    params = load_params()
    assert stage_sections("grpo", params) == ["model", "grpo", "rewards"]
    assert stage_sections("evaluate", params) == ["evaluate"]  # not in dvc.yaml: its own section
    assert stage_sections("unknown", params) == []


def test_stage_run_nests_under_parent_and_logs_params(repo, monkeypatch):
    import mlflow

    params = load_params()
    from components.common.tracking import configure

    exp_id = configure(params)
    client = mlflow.MlflowClient()
    parent = client.create_run(exp_id, run_name="pipeline")
    monkeypatch.setenv(PARENT_ENV, parent.info.run_id)

    with stage_run("grpo", params, extra_params={"note": {"x": 1}}) as run:
        mlflow.log_metric("m", 1.0)
    child = client.get_run(run.info.run_id)
    assert child.info.status == "FINISHED"
    assert child.info.run_name == "grpo"
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.tags[STAGE_TAG] == "grpo"
    assert child.data.params["grpo.output_dir"] == params.grpo.output_dir
    assert child.data.params["model.name_or_path"] == params.model.name_or_path
    assert child.data.params["note.x"] == "1"
    assert "data.seed" not in child.data.params  # only the stage's sections
    assert mlflow.active_run() is None
    exp = client.get_experiment(exp_id)
    assert exp.artifact_location == (repo / "mlartifacts").as_uri()


def test_the_experiment_opens_on_its_training_runs(repo):
    import mlflow

    from components.common.tracking import EXPERIMENT_KIND_TAG, configure

    params = load_params()
    client = mlflow.MlflowClient()
    exp_id = configure(params)  # created here
    assert client.get_experiment(exp_id).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    # An existing experiment with no kind, or one MLflow only inferred, gets it; a chosen kind stays.
    for before, after in [(None, "custom_model_development"),
                          ("genai_development_inferred", "custom_model_development"),
                          ("genai_development", "genai_development")]:
        if before is None:
            client.delete_experiment_tag(exp_id, EXPERIMENT_KIND_TAG)
        else:
            client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, before)
        assert configure(params) == exp_id
        assert client.get_experiment(exp_id).tags.get(EXPERIMENT_KIND_TAG) == after


def test_checkouts_opening_an_untagged_experiment_at_once_all_open_it(repo):
    """Eight processes' first `configure` on an experiment created without its kind (by someone
    else, or an older grpoflow) each set the kind: the losers of that write must not fail (MLflow's
    store raises an IntegrityError for the second insert of one tag; tests/slow/test_registry_race.py
    met it)."""
    import threading

    import mlflow

    from components.common.tracking import EXPERIMENT_KIND_TAG, configure

    client = mlflow.MlflowClient(resolve_tracking_uri(load_params()))
    errors = []
    for attempt in range(8):
        params = load_params(overrides=[f"tracking.experiment=shared-{attempt}"])
        exp_id = client.create_experiment(f"shared-{attempt}")
        start = threading.Barrier(8)

        def open_it(params=params, start=start):
            start.wait()
            try:
                configure(params)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")

        threads = [threading.Thread(target=open_it) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert client.get_experiment(exp_id).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert not errors, errors


def test_stage_run_marks_failed_and_reraises(repo):
    import mlflow

    params = load_params()
    with pytest.raises(RuntimeError, match="boom"):
        with stage_run("grpo", params) as run:
            mlflow.start_run(run_name="inner", nested=True)  # left open by the body
            raise RuntimeError("boom")
    client = mlflow.MlflowClient()
    assert client.get_run(run.info.run_id).info.status == "FAILED"
    assert client.get_run(run.info.run_id).data.tags["grpoflow.error"] == "RuntimeError: boom"
    assert mlflow.active_run() is None


@pytest.mark.parametrize("fails", [False, True])
def test_stage_run_logs_the_engine_logs_it_wrote_success_or_failure(repo, fails):
    """An engine's log the body wrote is an artifact under logs/ (on failure too: that is when it is
    read); one left by an earlier run, not rewritten by this one, is not."""
    import time

    import mlflow

    from components.common.errors import DataError

    old, new = repo / "reports/old.vllm.log", repo / "reports/new.vllm.log"
    old.parent.mkdir()
    old.write_text("an earlier run's\n")
    os.utime(old, (time.time() - 60, time.time() - 60))
    with pytest.raises(DataError) if fails else contextlib.nullcontext():
        with stage_run("grpo", load_params(), logs=[old, new, repo / "reports/none.vllm.log"]) as run:
            new.write_text("INFO engine started\n")
            if fails:
                raise DataError("data/x.jsonl line 2: no 'question'\nset data.on_bad_rows=skip")
    client = mlflow.MlflowClient()
    assert [a.path for a in client.list_artifacts(run.info.run_id, "logs")] == ["logs/new.vllm.log"]
    tags = client.get_run(run.info.run_id).data.tags
    assert tags.get("grpoflow.error") == ("data/x.jsonl line 2: no 'question'" if fails else None)


def test_stage_run_in_a_child_process_finds_parent(repo, monkeypatch):
    """A DVC stage runs in another process: it finds the parent through the environment only."""
    import mlflow

    from components.common.tracking import configure

    params = load_params()
    exp_id = configure(params)
    client = mlflow.MlflowClient()
    parent = client.create_run(exp_id, run_name="pipeline")
    monkeypatch.setenv(PARENT_ENV, parent.info.run_id)
    code = (
        "from pipelines.params.config import load_params\n"
        "from components.common.tracking import stage_run\n"
        "with stage_run('grpo', load_params()) as r: print(r.info.run_id)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout.strip().splitlines()[-1]
    assert client.get_run(out).data.tags["mlflow.parentRunId"] == parent.info.run_id


def test_summary_links_to_the_tracking_servers_own_ui():
    import dataclasses

    from pipelines.flow.summary import format_run_summary
    from pipelines.handoff import NotRegistered, RunSummary

    summary = RunSummary(name="", run_id="r1", experiment_id="3", tracking_uri="", pull="skipped", push="skipped",
                         stages=[], metrics={}, comparison={}, registration=NotRegistered("register.enabled is false"),
                         decision=None, reports={})
    remote = format_run_summary(dataclasses.replace(summary, tracking_uri="https://mlflow.example.org:5000/"))
    assert "ui: https://mlflow.example.org:5000/#/experiments/3/runs/r1" in remote and "grpoflow ui" not in remote
    local = format_run_summary(dataclasses.replace(summary, tracking_uri="sqlite:////tmp/mlflow.db"))
    assert "ui: `grpoflow ui`, then http://127.0.0.1:5000/#/experiments/3/runs/r1" in local


GIVE_UP = """
import time
from pipelines.execution import services
services.service_env_defaults()
import mlflow
start = time.monotonic()
try:
    services.one_line_service_errors(lambda: mlflow.MlflowClient().search_experiments())
except Exception as exc:
    print(f"{time.monotonic() - start:.1f}", type(exc).__name__, exc)
"""


@pytest.mark.parametrize("server", ["refuses", "never answers"])
def test_an_mlflow_call_to_a_server_that_stopped_answering_gives_up_within_the_budget_in_one_line(server):
    """GRPOFLOW_SERVICE_TIMEOUT_S bounds a call to a dead server (connection refused) and to a hung one
    (the connection accepted, no answer ever): TrackingUnavailable naming it, within the budget."""
    import socket

    budget = 8
    env = {**os.environ, "GRPOFLOW_SERVICE_TIMEOUT_S": str(budget), "PYTHONPATH": str(REPO)}
    for key in [k for k in env if k.startswith("MLFLOW_HTTP_REQUEST_")]:
        del env[key]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        if server == "never answers":
            s.listen(8)  # the kernel accepts the connections; nothing reads the requests
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
        proc = subprocess.run([sys.executable, "-c", GIVE_UP], capture_output=True, text=True, timeout=120,
                              env={**env, "MLFLOW_TRACKING_URI": uri})
    seconds, kind, message = proc.stdout.strip().split(" ", 2)
    assert kind == "TrackingUnavailable", proc.stdout + proc.stderr
    assert float(seconds) <= budget
    assert message.startswith(f"the MLflow tracking server at {uri} stopped answering (")
    assert "mlflow server --port PORT" in message and "\n" not in message
