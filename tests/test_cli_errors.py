"""Errors a user meets in the first hour are one line, never a traceback, with the right exit code:
bad params (2), a tracking server that does not answer (1, within seconds, naming its URI), registry
mistakes (2), DVC refusing the checkout (1)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.project_repo import make_project_repo
from tests.servers import refused_port


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return make_project_repo(tmp_path_factory.mktemp("cli") / "repo")


def grpoflow(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=env or os.environ, timeout=300)


def one_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("command", [["run"], ["evaluate", "--model", "models/grpo"],
                                     ["promote", "grpoflow-policy", "1", "--reason", "x"],
                                     ["rollback", "grpoflow-policy"]])
def test_unreachable_tracking_server_is_one_line_naming_it(checkout, command):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    before = (checkout / "params.yaml").read_bytes()
    start = time.monotonic()
    with refused_port() as port:
        uri = f"http://127.0.0.1:{port}"
        proc = grpoflow(checkout, *command, "-S", f"tracking.uri={uri}", env=env)
    assert time.monotonic() - start < 60  # MLflow's own client retries for minutes
    assert proc.returncode == 1
    assert uri in one_line(proc) and "not reachable" in proc.stderr
    assert (checkout / "params.yaml").read_bytes() == before  # nothing written, nothing ran


def test_run_rejects_bad_params_before_touching_params_yaml(checkout):
    before = (checkout / "params.yaml").read_bytes()
    for override, message in [("sft.checkpoint_dir=.", "sft.checkpoint_dir"),
                              ("grpo.trainer.beta=-1", "grpo.trainer.beta"), ("sft.trainer.max_steps=x", "sft.trainer"),
                              ("grpo.beta=0.1", "now grpo.trainer.beta")]:
        proc = grpoflow(checkout, "run", "-S", override)
        assert proc.returncode == 2 and message in one_line(proc)
    assert (checkout / "params.yaml").read_bytes() == before
    assert (checkout / ".git").is_dir() and (checkout / "components").is_dir()


def test_registry_mistakes_are_one_line(checkout):
    proc = grpoflow(checkout, "promote", "grpoflow-policy", "7", "--reason", "x")
    assert proc.returncode == 2 and "version 7 does not exist" in one_line(proc)
    proc = grpoflow(checkout, "rollback", "no-such-model")
    assert proc.returncode == 2 and "no champion alias" in one_line(proc)
    import mlflow

    assert mlflow.MlflowClient().search_registered_models() == []  # a mistake creates nothing, no registry lease


def test_dvc_refusing_the_checkout_is_one_line(checkout, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(checkout, broken)
    (broken / "dvc.yaml").write_text((broken / "dvc.yaml").read_text() + "\n  bad:\n    cmd: [unclosed\n")
    proc = grpoflow(broken, "run")
    assert proc.returncode == 1 and "DVC:" in one_line(proc)


def test_a_dvc_remote_that_does_not_answer_is_one_line_naming_it_before_any_work(checkout, tmp_path):
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(checkout, repo)
    before = (repo / "params.yaml").read_bytes()
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}/dvc"
        subprocess.run([sys.executable, "-m", "dvc", "remote", "add", "--local", "-d", "down", url], cwd=repo,
                       check=True, capture_output=True)
        start = time.monotonic()
        proc = grpoflow(repo, "run")
        seconds = time.monotonic() - start
    assert proc.returncode == 1
    line = one_line(proc)
    assert f"the DVC remote 'down' ({url}) does not answer at 127.0.0.1:{port}" in line and "start it" in line
    assert seconds < 60, seconds
    assert (repo / "params.yaml").read_bytes() == before and not (repo / "data" / "processed").exists()


def test_serve_on_the_network_without_a_key_is_refused_naming_the_option(checkout):
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        proc = grpoflow(checkout, "serve", "--host", host, env=env)
        assert proc.returncode == 2
        line = one_line(proc)
        assert f"--host {host}" in line and "--api-key" in line and "VLLM_API_KEY" in line
    # Loopback needs no key, and a key (option or variable) lets a network bind through: each then gets as
    # far as the model, which does not exist here.
    for args, extra in [(["--host", "127.0.0.1"], {}), (["--host", "0.0.0.0", "--api-key", "s3cret"], {}),
                        (["--host", "0.0.0.0"], {"VLLM_API_KEY": "s3cret"})]:
        proc = grpoflow(checkout, "serve", "no-such-folder/", *args, env={**env, **extra})
        assert proc.returncode == 2
        line = one_line(proc)
        assert "--api-key" not in line and "no-such-folder" in line


def test_ui_on_the_network_without_authentication_is_refused_naming_the_option(checkout):
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        proc = grpoflow(checkout, "ui", "--host", host)
        assert proc.returncode == 2
        line = one_line(proc)
        assert f"--host {host}" in line and "--app-name basic-auth" in line and "127.0.0.1" in line
    # With an auth app the refusal lets it through: on a tracking URI that is a server already, there is
    # nothing to start (tests/test_infra_auth.py starts the UI with basic-auth).
    proc = grpoflow(checkout, "ui", "--host", "0.0.0.0", "--app-name", "basic-auth",
                    env={**os.environ, "MLFLOW_TRACKING_URI": "http://127.0.0.1:1"})
    assert proc.returncode == 0 and "is an MLflow server already" in proc.stdout, proc.stderr


def test_a_failing_stage_states_its_own_error_line_first(tmp_path):
    """The flow's error (what `grpoflow run` prints), the failed run's summary (its MLflow description)
    and its MLflow error tag start with the failed stage's own `error:` line, not with the last lines of
    its output (DVC's `ERROR: failed to reproduce`, an engine's shutdown chatter). The stage's own run
    carries that line too."""
    import mlflow

    repo = make_project_repo(tmp_path / "repo")
    (repo / "data").mkdir(exist_ok=True)
    (repo / "data" / "bad.jsonl").write_text('{"question": "1 + 1?", "answer": "#### 2"}\n{"question": "2 + 2?"}\n')
    proc = grpoflow(repo, "run", "-S", "data.train_source=jsonl:data/bad.jsonl")
    assert proc.returncode == 1, proc.stderr[-3000:]
    out = (proc.stdout + proc.stderr).splitlines()
    failed = [line for line in out if line.startswith("error: stage 'data' failed: ")]
    assert len(failed) == 1, "\n".join(out[-40:])
    # The data stage's own error (the first `error:` line: the stage's output streams first), whose
    # next line names the file and row; the flow's error, printed last, starts with it.
    own = next(i for i, line in enumerate(out) if line.startswith("error: "))
    assert out[own] == "error: 1 bad row(s) in the train source:" and "data/bad.jsonl:2" in out[own + 1]
    first = f"stage 'data' failed: {out[own].removeprefix('error: ')}"
    assert failed[0] == f"error: {first}"

    client = mlflow.MlflowClient()  # the test's store (MLFLOW_TRACKING_URI)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`grpoflow.pipeline` = 'training-pipeline'")
    assert len(runs) == 1
    parent = runs[0]
    assert parent.info.status == "FAILED"
    assert parent.data.tags["grpoflow.error"] == first
    assert parent.data.tags["mlflow.note.content"].splitlines()[0] == f"**Failed:** {first}"
    stage_run = client.search_runs([parent.info.experiment_id], "tags.`grpoflow.stage` = 'data'")[0]
    assert stage_run.info.status == "FAILED" and stage_run.data.tags["grpoflow.error"] == first.split(": ", 1)[1]


def stage_args(**files: str) -> list[str]:
    return ["stage", "data", "--commit", "HEAD", "--remote", "unused", "--parent-run-id", "x",
            *(arg for option, path in files.items() for arg in (f"--{option.replace('_', '-')}", path))]


@pytest.mark.parametrize("missing", ["params_file", "lock_file"])
def test_stage_with_a_params_or_lock_file_that_does_not_exist_is_one_line_naming_it(checkout, tmp_path, missing):
    files = {"params_file": str(checkout / "params.yaml"), missing: str(tmp_path / "missing.yaml"),
             "workdir": str(tmp_path / "work")}
    proc = grpoflow(checkout, *stage_args(**files))
    assert proc.returncode == 2
    line = one_line(proc)
    assert f"--{missing.replace('_', '-')} {tmp_path / 'missing.yaml'}: cannot be read" in line
    assert not (tmp_path / "work").exists()


def test_stage_with_a_workdir_under_a_file_is_one_line_and_leaves_the_file(checkout, tmp_path):
    (tmp_path / "afile").write_text("the user's\n")
    proc = grpoflow(checkout, *stage_args(params_file=str(checkout / "params.yaml"),
                                          workdir=str(tmp_path / "afile/sub")))
    assert proc.returncode == 2
    assert f"{tmp_path / 'afile/sub'}: cannot make this folder" in one_line(proc)
    assert (tmp_path / "afile").read_text() == "the user's\n"


def test_promote_of_a_version_that_is_not_a_number_is_one_line_creating_nothing(checkout):
    import mlflow

    proc = grpoflow(checkout, "promote", "grpoflow-policy", "abc", "--reason", "x")
    assert proc.returncode == 2 and "version 'abc' is not a version number" in one_line(proc)
    assert mlflow.MlflowClient().search_registered_models() == []


@pytest.mark.parametrize("command", [["promote", "it's", "1", "--reason", "x"], ["rollback", "it's"],
                                     ["run", "-S", "register.model_name=it's"]])
def test_a_model_name_with_a_quote_is_refused_in_one_line_before_anything_is_created(checkout, command):
    """MLflow's search filters (`name = '...'`) cannot express it: the registry lease and the
    version lookups would fail half-way, after creating the lease's lock model."""
    import mlflow

    client = mlflow.MlflowClient()
    client.create_registered_model("it's")
    client.create_model_version("it's", source="grpoflow-lease:/none", await_creation_for=0)
    before = (checkout / "params.yaml").read_bytes()
    proc = grpoflow(checkout, *command)
    assert proc.returncode == 2 and "\"it's\" cannot be a registered model's name" in one_line(proc)
    assert [m.name for m in client.search_registered_models()] == ["it's"]
    assert (checkout / "params.yaml").read_bytes() == before
