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

REPO = Path(__file__).resolve().parents[1]


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


BAD_FLAGS = [["run", "--bogus"], ["evaluate"], ["grade", "--input", "x"], ["promote", "m", "1", "--reason"],
             ["rollback"], ["stage", "data"], ["deploy", "--bogus"], ["schedule", "--cron"], ["serve", "--port", "x"],
             ["reproduce"], ["export"], ["ui", "--port", "x"]]
TRACKING_GONE = [["run"], ["evaluate", "--model", "models:/m@champion"], ["promote", "m", "1", "--reason", "x"],
                 ["rollback", "m"], ["serve"], ["reproduce", "m", "1"], ["export", "models:/m/1", "out"]]


def test_every_command_fails_in_one_line_without_a_traceback(checkout, tmp_path):
    """Each command's expected failures: a bad flag (argparse's usage, exit 2); the tracking server
    gone (exit 1, within seconds, naming it; nothing written); the Prefect server gone (deploy,
    schedule: 1); and `grpoflow stage`'s own: a --parent-run-id that is no run (2), a stage that fails
    (1). Each is one `error:` line and no traceback."""
    import mlflow

    from pipelines.params.config import write_overrides

    def check(proc: subprocess.CompletedProcess, code: int, *args: str) -> str:
        assert "Traceback" not in proc.stdout + proc.stderr, (args, proc.stderr[-3000:])
        assert proc.returncode == code, (args, proc.returncode, proc.stderr[-3000:])
        lines = [line for line in proc.stderr.splitlines() if "error: " in line and not line.startswith(" ")]
        assert len(lines) == 1, (args, proc.stderr[-3000:])
        return lines[0]

    for args in BAD_FLAGS:
        check(grpoflow(checkout, *args), 2, *args)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(GRPOFLOW_SERVICE_TIMEOUT_S="5", MLFLOW_HTTP_REQUEST_MAX_RETRIES="0")  # a refused call fails at once
    before = (checkout / "params.yaml").read_bytes()
    with refused_port() as port:
        uri = f"http://127.0.0.1:{port}"
        for args in [*TRACKING_GONE, stage_args(params_file=str(checkout / "params.yaml"), tracking_uri=uri)]:
            start = time.monotonic()
            line = check(grpoflow(checkout, *args, *(["-S", f"tracking.uri={uri}"] if args[0] != "stage" else []),
                                  env={**env, "MLFLOW_TRACKING_URI": uri}), 1, *args)
            assert uri in line and time.monotonic() - start < 60, (args, line)
        for args in (["deploy"], ["schedule"]):
            line = check(grpoflow(REPO, *args, env={**env, "PREFECT_API_URL": f"{uri}/api"}), 1, *args)
            assert f"the Prefect server at PREFECT_API_URL={uri}/api is not reachable" in line
    assert (checkout / "params.yaml").read_bytes() == before  # nothing written, nothing ran

    line = check(grpoflow(checkout, *stage_args(params_file=str(checkout / "params.yaml"),
                                                workdir=str(tmp_path / "w1"))), 2, "stage")
    assert line.startswith("error: --parent-run-id x: no such run in sqlite:") and not (tmp_path / "w1").exists()
    client = mlflow.MlflowClient()
    parent = client.create_run(client.create_experiment("stage-test")).info.run_id
    (checkout / "data").mkdir(exist_ok=True)
    (checkout / "data" / "bad.jsonl").write_text('{"question": "2 + 2?"}\n')
    subprocess.run(["git", "add", "data/bad.jsonl"], cwd=checkout, check=True)
    subprocess.run(["git", "commit", "-qm", "a bad row"], cwd=checkout, check=True)
    params = tmp_path / "params.yaml"
    params.write_bytes(before)
    write_overrides(params, ["data.train_source=jsonl:data/bad.jsonl"])
    args = ["stage", "data", "--commit", "HEAD", "--params-file", str(params), "--remote", str(tmp_path / "remote"),
            "--parent-run-id", parent, "--workdir", str(tmp_path / "w2")]
    proc = grpoflow(checkout, *args)
    assert "Traceback" not in proc.stdout + proc.stderr and proc.returncode == 1, proc.stderr[-3000:]
    assert "error: stage 'data' failed in " in proc.stderr and ": 1 bad row(s) in the train source:" in proc.stderr
    assert not (tmp_path / "w2").exists()


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

    from pipelines.registry.register import MANAGED_TAG

    client = mlflow.MlflowClient()
    client.create_registered_model("it's", tags={MANAGED_TAG: "true"})  # grpoflow's: refused for its name alone
    client.create_model_version("it's", source="grpoflow-lease:/none", await_creation_for=0)
    before = (checkout / "params.yaml").read_bytes()
    proc = grpoflow(checkout, *command)
    assert proc.returncode == 2 and "\"it's\" cannot be a registered model's name" in one_line(proc)
    assert [m.name for m in client.search_registered_models()] == ["it's"]
    assert (checkout / "params.yaml").read_bytes() == before


def test_a_forced_promotion_needs_a_reason_and_a_model_grpoflow_did_not_make_is_refused_unless_adopted(checkout):
    """`promote --reason ""` would record "forced by USER:" and nothing else. A registered model grpoflow
    did not make (here the user's own) is not grpoflow's to move: refused before anything is written,
    its lock model included; `--adopt` marks it, and the move goes ahead."""
    import mlflow

    client = mlflow.MlflowClient()
    client.create_registered_model("theirs")
    client.create_model_version("theirs", source="grpoflow-lease:/none", await_creation_for=0)
    proc = grpoflow(checkout, "promote", "theirs", "1", "--reason", " ")
    assert proc.returncode == 2 and "theirs: --reason is empty" in one_line(proc)
    for command in (["promote", "theirs", "1", "--reason", "hand-checked"], ["rollback", "theirs"]):
        proc = grpoflow(checkout, *command)
        assert proc.returncode == 2, proc.stderr
        line = one_line(proc)
        assert line.startswith("error: theirs: a registered model grpoflow did not make") and "--adopt" in line
    assert [m.name for m in client.search_registered_models()] == ["theirs"]  # no theirs.registry-lock
    assert client.get_registered_model("theirs").tags == {} and client.get_registered_model("theirs").aliases == {}
    proc = grpoflow(checkout, "promote", "theirs", "1", "--reason", "hand-checked", "--adopt")
    assert proc.returncode == 0, proc.stderr
    assert client.get_registered_model("theirs").tags == {"grpoflow.managed": "true"}
    assert str(client.get_model_version_by_alias("theirs", "champion").version) == "1"
