"""Flow-wiring tests for pipelines/flow/pipeline.py on a throw-away DVC repo with trivial stages
(tests/toy_repo.py): real DVC (repo, dvc.lock, local remote), real Prefect (its temporary
local server, once for this process), real MLflow on SQLite with the registry.

    pytest -q tests/test_flow.py
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pipelines.execution.dvc_ops import LineLog, StageFailed, stage_order
from pipelines.flow.pipeline import run_stage, training_pipeline
from pipelines.flow.runlock import PipelineLocked, pipeline_lock
from pipelines.handoff import PipelineRun
from pipelines.params.config import ConfigError, write_overrides
from tests.toy_repo import make_tiny_model, make_toy_repo, write_toy_params

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def toy(tmp_path, tiny_model, monkeypatch):
    repo = make_toy_repo(tmp_path / "repo", tiny_model)
    monkeypatch.chdir(repo)  # the flow runs on the checkout it is started in
    return repo


def test_stage_order_is_the_dvc_graph_order(toy):
    # toy dvc.yaml declares evaluate, grpo, prepare: the flow must sort by dependencies.
    assert stage_order(toy) == ["prepare", "grpo", "evaluate"]


def test_project_stage_order_matches_dvc_yaml():
    import yaml

    declared = list(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])
    order = stage_order(REPO)
    assert sorted(order) == sorted(declared)
    assert order[0] == "data"


def test_stage_output_reaches_the_log_as_lines_and_a_long_progress_bar_now_and_then():
    now = [0.0]
    lines: list[str] = []
    log = LineLog(lines.append, every_s=30, clock=lambda: now[0])
    log.feed("Running stage 'grpo':\n")
    for step in range(1, 10):  # a bar redrawn in place, 10 s per step
        now[0] = step * 10.0
        log.feed(f"\r{step}/9 steps")
    log.feed("\n{'loss': 0.5}\n")
    assert lines == ["Running stage 'grpo':", "3/9 steps", "6/9 steps", "9/9 steps", "{'loss': 0.5}"]


def test_write_overrides_keeps_comments_and_validates(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text('register:\n  alpha: 0.05   # gate level\n  min_delta: 0.0\nevaluate:\n  data: ""  # x\n')
    write_overrides(p, ["register.alpha=0.01"])
    assert p.read_text() == 'register:\n  alpha: 0.01   # gate level\n  min_delta: 0.0\nevaluate:\n  data: ""  # x\n'
    with pytest.raises(ConfigError, match="register.alpha"):
        write_overrides(p, ["register.min_delta=0.1", "register.alpha=2"])
    assert "min_delta: 0.0" in p.read_text()  # nothing written when one override is bad


def test_write_overrides_round_trips_the_project_params_yaml(tmp_path):
    text = (REPO / "params.yaml").read_text()
    (tmp_path / "params.yaml").write_text(text)
    write_overrides(tmp_path / "params.yaml", ["register.min_delta=0.0"])  # the default value: nothing may change
    assert (tmp_path / "params.yaml").read_text() == text


def test_pipeline_lock_waits_then_fails_naming_the_holder(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            sys.path.insert(0, {str(REPO)!r})
            from pipelines.flow.runlock import pipeline_lock
            with pipeline_lock({str(tmp_path)!r}, 0):
                print("held", flush=True)
                time.sleep(float(sys.argv[1]))
            print("released", flush=True)
            """), "3"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(PipelineLocked, match=rf"pid {holder.pid} .*run_lock_timeout"):
            with pipeline_lock(tmp_path, 0):
                pass
        with pipeline_lock(tmp_path, 60):  # waits for the holder to release, then proceeds
            assert holder.stdout.readline().strip() == "released"
    finally:
        holder.kill()


def test_flow_fails_clearly_when_the_checkout_is_locked(toy):
    (toy / "params.yaml").write_text("tracking:\n  run_lock_timeout: 0\n")
    with pipeline_lock(toy, 0):  # another run holds the checkout
        with pytest.raises(PipelineLocked, match="another pipeline run holds"):
            training_pipeline()
    assert not (toy / "dvc.lock").exists()


def test_transient_dvc_lock_contention_is_retried(toy, monkeypatch):
    """DVC's own lock held by another process: the first attempt fails on it, the task retries
    and succeeds once the lock is gone (released only after DVC reported the contention)."""
    import zc.lockfile

    class Watch(io.StringIO):
        contention = threading.Event()

        def write(self, text):
            if "Unable to acquire lock" in text:
                self.contention.set()
            return super().write(text)

    out = Watch()
    monkeypatch.setattr(sys, "stdout", out)  # run_dvc streams DVC's output to sys.stdout
    lock = zc.lockfile.LockFile(str(toy / ".dvc" / "tmp" / "lock"))
    threading.Thread(target=lambda: (out.contention.wait(300), lock.close()), daemon=True).start()
    task = run_stage.with_options(retries=3, retry_delay_seconds=1)
    result = task("prepare", PipelineRun(str(toy), "", os.environ["MLFLOW_TRACKING_URI"]))
    assert out.contention.is_set() and result.status == "ran"
    assert out.getvalue().count("Running stage 'prepare'") == 1  # the command itself ran once


def test_the_flow_runs_skips_reruns_what_changed_and_stops_on_a_failing_stage(toy):
    import mlflow

    # Run 1: everything runs, v1 is registered and becomes champion.
    s1 = training_pipeline()
    assert [(s.stage, s.status) for s in s1.stages] == [("prepare", "ran"), ("grpo", "ran"), ("evaluate", "ran")]
    assert s1.registration.created and s1.registration.version == "1"
    assert s1.decision.decision == "promoted"
    assert s1.push.startswith("pushed") and any((toy.parent / "dvc-remote").iterdir())

    client = mlflow.MlflowClient()
    parent = client.get_run(s1.run_id)
    lock_md5 = hashlib.md5((toy / "dvc.lock").read_bytes()).hexdigest()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=toy, capture_output=True, text=True).stdout.strip()
    tags = parent.data.tags
    assert parent.info.status == "FINISHED"
    assert tags["grpoflow.git_commit"] == head and tags["grpoflow.git_dirty"] == "false"  # as committed
    assert tags["grpoflow.dvc_lock_md5"] == lock_md5
    assert tags["grpoflow.prefect.flow_run_id"]
    assert all(f"grpoflow.version.{p}" in tags
               for p in ("torch", "transformers", "trl", "peft", "vllm", "prefect", "mlflow", "dvc"))
    assert tags["grpoflow.data_sha256.data/processed/items.jsonl"] == hashlib.sha256(
        (toy / "data/processed/items.jsonl").read_bytes()).hexdigest()
    assert parent.data.params["register.alpha"] == "0.05"
    artifacts = {a.path for a in client.list_artifacts(s1.run_id, "lineage")}
    assert {"lineage/dvc.lock", "lineage/params.yaml", "lineage/stages.json", "lineage/data_sha256.json"} <= artifacts
    children = {
        r.data.tags["grpoflow.stage"]: r
        for r in client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{s1.run_id}'")
    }
    assert set(children) == {"prepare", "grpo", "evaluate"}  # prepare's made by the flow
    assert children["grpo"].data.params["toy.skill"] == "30"
    assert children["evaluate"].data.metrics["accuracy_strict"] == pytest.approx(0.3)
    assert tags["grpoflow.stages.grpo.run_id"] == children["grpo"].info.run_id
    mv = client.get_model_version("grpoflow-policy", "1")
    assert mv.tags["lineage.git_commit"] == head and mv.tags["lineage.dvc_lock_md5"] == lock_md5
    assert mv.tags["lineage.prefect_flow_run_id"] == tags["grpoflow.prefect.flow_run_id"]
    assert mv.tags["lineage.pipeline_run_id"] == s1.run_id

    # Run 2, nothing changed: all skipped, each pointing at the run that made its outputs; no version.
    s2 = training_pipeline()
    assert [s.status for s in s2.stages] == ["skipped"] * 3
    assert {s.stage: s.produced_by for s in s2.stages} == {
        k: v.info.run_id for k, v in children.items()
    }
    assert not s2.registration.created
    assert len(client.search_model_versions("name = 'grpoflow-policy'")) == 1
    # ... and started no DVC process: one in-process `dvc status`, no pull, no push of the same dvc.lock.
    assert s2.pull.startswith("skipped: nothing changed") and s2.push.startswith("skipped: this dvc.lock")
    assert client.get_run(s2.run_id).data.tags["grpoflow.stages.grpo.status"] == "skipped"

    # Run 3, grpo changed but no better: prepare skipped, grpo + evaluate ran; v2 not promoted.
    write_toy_params(toy, skill=31)
    s3 = training_pipeline()
    assert [s.status for s in s3.stages] == ["skipped", "ran", "ran"]
    assert s3.registration.version == "2" and s3.decision.decision == "rejected"
    assert "champion v1 kept" in client.get_model_version("grpoflow-policy", "2").tags["promotion.reason"]
    assert str(client.get_model_version_by_alias("grpoflow-policy", "champion").version) == "1"

    # Run 4, a failing stage command: no retry, parent FAILED, previous outputs intact.
    runs_log = toy.parent / "grpo-runs.log"
    before = runs_log.read_text().count("ran")
    write_toy_params(toy, fail=True)
    with pytest.raises(StageFailed, match="stage 'grpo' failed") as raised:
        training_pipeline()
    first = "stage 'grpo' failed: toy grpo: failing on purpose"  # its own error line, not the chatter after it
    assert str(raised.value).splitlines()[0] == first
    assert runs_log.read_text().count("ran") == before + 1  # exactly one attempt
    assert (toy / "models/grpo/skill.txt").read_text() == "31"
    failed = client.search_runs(
        [parent.info.experiment_id], "tags.`grpoflow.pipeline` = 'training-pipeline'",
        order_by=["attributes.start_time DESC"], max_results=1,
    )[0]
    assert failed.info.status == "FAILED" and failed.data.tags["grpoflow.stages.grpo.status"] == "failed"
    assert failed.data.tags["grpoflow.error"] == first
    assert failed.data.tags["mlflow.note.content"].startswith(f"**Failed:** {first}\n")
    assert len(client.search_model_versions("name = 'grpoflow-policy'")) == 2


def test_nested_override_lands_nested_and_keeps_comments(tmp_path):
    """`-S sft.trainer.max_steps=10` once wrote a literal key `trainer.max_steps:` into params.yaml,
    which then failed to load (and so did every later command)."""
    from components.common.params import GRPO_TRAINER_DEFAULTS
    from pipelines.params.config import load_params
    from pipelines.params.overrides import yaml_float

    p = tmp_path / "params.yaml"
    p.write_text("sft:\n  trainer:\n    max_steps: 1500   # steps\n    seed: 0\ngrpo:\n  dev_size: 4  # dev\n")
    write_overrides(p, ["sft.trainer.max_steps=10", "grpo.trainer.max_steps=2", "grpo.lora.r=4"])
    text = p.read_text()
    assert "trainer.max_steps" not in text
    assert re.search(r"\n  trainer:\n    max_steps: 10 +# steps\n    seed: 0\n", text)  # nested in place, comment kept
    params = load_params(p)
    assert params.sft.trainer == {"max_steps": 10, "seed": 0}
    # Not in the file yet: the section's mapping starts from its defaults, as on the command line.
    # 5e-05 was once written as `5e-05`, which YAML 1.1 (PyYAML, DVC) reads back as a string
    lr = GRPO_TRAINER_DEFAULTS["learning_rate"]
    assert params.grpo.trainer["max_steps"] == 2 and params.grpo.trainer["learning_rate"] == lr
    assert isinstance(params.grpo.trainer["learning_rate"], float)
    assert f"learning_rate: {yaml_float(lr)}" in p.read_text()
    assert params.grpo.lora["r"] == 4 and params.grpo.lora["lora_alpha"] == 32
    assert params.grpo == load_params(None, ["grpo.dev_size=4", "grpo.trainer.max_steps=2", "grpo.lora.r=4"]).grpo


def test_rejected_nested_override_leaves_params_yaml_byte_identical(tmp_path):
    p = tmp_path / "params.yaml"
    original = (REPO / "params.yaml").read_bytes()
    p.write_bytes(original)
    for bad in (["sft.trainer.max_steps=10", "sft.resume=maybe"], ["sft.lora=3", "sft.lora.r=2"],
                ["grpo.trainer.num_generations=3"], ["grpo.beta=0.1"], ["sft.trainer.max_steps=5", "nosection.x=1"]):
        with pytest.raises(ConfigError):
            write_overrides(p, bad)
        assert p.read_bytes() == original, bad


def test_no_registration_when_dvc_push_failed(toy):
    """A version whose outputs never reached the remote could not be restored: not registered."""
    import mlflow

    remote = toy.parent / "dvc-remote"
    if remote.is_dir():
        import shutil

        shutil.rmtree(remote)
    remote.write_text("not a folder: every push fails\n")
    s = training_pipeline()
    assert s.push.startswith("failed")
    assert "dvc push failed" in s.registration.reason and s.decision is None
    assert mlflow.MlflowClient().search_model_versions("name = 'grpoflow-policy'") == []
    from pipelines.flow.summary import format_run_summary

    assert "model: not registered (dvc push failed" in format_run_summary(s)


def test_summary_names_the_evaluation_backend():
    from pipelines.flow.summary import format_run_summary
    from pipelines.handoff import NotRegistered, RunSummary

    metrics = {
        name: {"backend": "vllm", "vllm_version": "0.32.0", "num_samples": 8, "sample_temperature": 0.8,
               "accuracy_strict": acc, "maj_at_k_strict": 0.2, "n": 600}
        for name, acc in (("sft", 0.05), ("grpo", 0.12))
    }
    summary = RunSummary(name="", run_id="r", experiment_id="1", tracking_uri="sqlite:///mlflow.db", pull="skipped",
                         push="skipped", stages=[], metrics=metrics, comparison={},
                         registration=NotRegistered("register.enabled is false"), decision=None, reports={})
    text = format_run_summary(summary)
    assert "evaluation backend: vllm 0.32.0; 8 samples per problem at T=0.8" in text
    assert "eval grpo   accuracy_strict=0.12" in text and "maj_at_k_strict=0.2" in text
    metrics["grpo"]["backend"] = metrics["sft"]["backend"] = "transformers"
    assert "evaluation backend: transformers;" in format_run_summary(summary)


def _killed_stage_run(toy) -> str:
    """A stage run whose process was killed (kill -9) before it could close its run: left RUNNING."""
    code = textwrap.dedent(
        """
        import os, signal
        from pipelines.params.config import load_params
        from components.common.tracking import stage_run
        with stage_run("grpo", load_params()) as run:
            print(run.info.run_id, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=toy, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    return proc.stdout.split()[0]


def _task_run_names(flow_run_id: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(r.name for r in runs)


def _prefect_story(flow_run_id: str) -> tuple[str, dict[str, object], list[str]]:
    """(flow run name, {artifact key: artifact}, log messages) of a flow run, read back from the API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all()
    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        name = client.read_flow_run(flow_run_id).name
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
        # The server writes logs in batches, later under load: read until two reads agree.
        messages: list[str] = []
        deadline = time.monotonic() + 60
        while True:
            page, read = [], None
            while read is None or len(read) == 200:
                read = client.read_logs(log_filter=log_filter, limit=200, offset=len(page))
                page += [log.message for log in read]
            if (page and page == messages) or time.monotonic() > deadline:
                break
            messages = page
            time.sleep(2)
    return name, {a.key: a for a in artifacts}, messages


def test_the_run_tells_its_story_in_mlflow_and_prefect(toy):
    """Names that say what changed, the summary as the MLflow description and a Prefect artifact,
    datasets and a figure on the MLflow run, stage output in the Prefect log, stale runs closed."""
    import mlflow
    from prefect.logging.handlers import APILogWorker

    # Prefect keys its log worker by PREFECT_API_URL, unset for temporary servers: a worker another
    # test module left running still sends to that module's (stopped) server. Start from a fresh one.
    APILogWorker.drain_all()
    killed = _killed_stage_run(toy)
    client = mlflow.MlflowClient()
    exp_id = client.get_run(killed).info.experiment_id
    elsewhere = client.create_run(exp_id, tags={"grpoflow.host": "another-host", "grpoflow.pid": "999999999"})
    assert client.get_run(killed).info.status == "RUNNING"

    s1 = training_pipeline(overrides=["register.alpha=0.05"])
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=toy, capture_output=True,
                          text=True).stdout.strip()
    assert s1.name == f"{head} register.alpha=0.05"

    # The killed run is closed at the next start, with the reason; another host's run is left alone.
    stale = client.get_run(killed)
    assert stale.info.status == "KILLED"
    assert stale.data.tags["grpoflow.killed"].startswith(f"process {stale.data.tags['grpoflow.pid']} on ")
    assert s1.run_id in stale.data.tags["grpoflow.killed"]
    assert client.get_run(elsewhere.info.run_id).info.status == "RUNNING"

    parent = client.get_run(s1.run_id)
    assert parent.info.run_name == s1.name and parent.data.tags["grpoflow.pid"] == str(os.getpid())
    description = parent.data.tags["mlflow.note.content"]
    assert f"### grpoflow run `{s1.name}`" in description
    assert "| grpo | 0.300 |" in description and "| evaluate | ran |" in description
    assert "**Model:** grpoflow-policy v1 registered" in description and "**Promotion:** promoted" in description
    assert list(parent.data.metrics)[0] == "grpo/accuracy_strict"  # what MLflow's compare view starts on
    grpo_seconds = next(st.seconds for st in s1.stages if st.stage == "grpo")
    assert parent.data.metrics["stage_seconds/grpo"] == grpo_seconds > 0  # the stage's own wall time
    datasets = {d.dataset.name: d for d in parent.inputs.dataset_inputs}
    assert set(datasets) == {"train", "test"}
    train_sha = hashlib.sha256((toy / "data/processed/train.jsonl").read_bytes()).hexdigest()
    assert datasets["train"].dataset.digest == train_sha[:36]
    assert ({t.key: t.value for t in datasets["train"].tags}
            == {"mlflow.data.context": "training", "grpoflow.sha256": train_sha})
    assert "figures/accuracy.png" in {a.path for a in client.list_artifacts(s1.run_id, "figures")}
    grpo_run = client.get_run(s1.stages[1].run_id)
    assert grpo_run.data.tags["grpoflow.host"] == parent.data.tags["grpoflow.host"]
    assert grpo_run.data.tags["grpoflow.pid"] != str(os.getpid())  # the stage's own process

    name, artifacts, logs = _prefect_story(parent.data.tags["grpoflow.prefect.flow_run_id"])
    assert name == s1.name
    # Task runs are named plainly, as the run graph shows them: no random suffixes.
    stage_names = [s.stage for s in s1.stages]
    assert _task_run_names(parent.data.tags["grpoflow.prefect.flow_run_id"]) == sorted(
        ["params", "dvc-status", "dvc-pull", *stage_names, "dvc-push", "lineage", "register", "promote", "summary",
         "publish"]
    )
    assert artifacts["training-summary"].type == "markdown" and artifacts["training-summary"].data == description
    assert re.search(rf"\]\(http://127\.0\.0\.1:5000/#/experiments/{exp_id}/runs/{s1.run_id}\)",
                     artifacts["mlflow-run"].data)
    assert "/#/models/grpoflow-policy/versions/1)" in artifacts["model-version"].data  # Prefect keeps links as markdown
    assert "Running stage 'grpo':" in logs and "> python toy.py grpo" in logs
    assert "toy training 5/5" in logs  # a progress bar reaches the log once, in its final state
    assert not any("toy training 2/5" in m for m in logs)

    # Nothing changed: every stage skipped, and the name says so.
    s2 = training_pipeline()
    assert s2.name == f"{head} rerun"
    assert client.get_run(s2.run_id).info.run_name == s2.name
    flow_run_id = client.get_run(s2.run_id).data.tags["grpoflow.prefect.flow_run_id"]
    assert _prefect_story(flow_run_id)[0] == s2.name


def test_summary_states_correctness_and_format_apart():
    """The demo's situation: GRPO tags every answer (strict accuracy up) while its answers are no
    more often right. The terminal summary and the MLflow description say so in words."""
    from components.evaluate import comparisons
    from components.evaluation.metrics import item_metrics as score
    from pipelines.flow.summary import format_run_summary, summary_markdown
    from pipelines.handoff import NotRegistered, RunSummary

    def items(right: int, tagged: int) -> list[dict[str, object]]:
        return [{"id": f"q{i}", "correct": i < min(right, tagged), "correct_flexible": i < right,
                 "format_ok": i < tagged, "completion_tokens": 10} for i in range(600)]

    results = {"sft": (None, items(right=80, tagged=15)), "grpo": (None, items(right=72, tagged=596))}
    results = {m: (score(it), it) for m, (_, it) in results.items()}
    summary = RunSummary(
        name="abc1234", run_id="r", experiment_id="1", tracking_uri="sqlite:///mlflow.db", pull="skipped",
        push="skipped", stages=[], metrics={m: r[0] for m, r in results.items()},
        comparison=comparisons(results, "accuracy_strict"), registration=NotRegistered("register.enabled is false"),
        decision=None, reports={}, alpha=0.05,
    )
    text = format_run_summary(summary)
    line = next(x for x in text.splitlines() if x.startswith("  grpo vs sft:"))
    assert "correctness (accuracy_flexible, the answer is right) sft 13.3% -> grpo 12.0%, -1.3 points" in line
    assert "format (the answer is tagged) sft 2.5% -> grpo 99.3%" not in line  # formats carry no model names
    assert "format (the answer is tagged) 2.5% -> 99.3%" in line
    assert line.endswith("the gain is format, not correctness (correctness fell)")
    assert "**grpo vs sft** (same items): correctness" in summary_markdown(summary)
    assert "the gain is format, not correctness" in summary_markdown(summary)

    results["grpo"] = (score(items(right=120, tagged=596)), items(right=120, tagged=596))
    summary.metrics["grpo"], summary.comparison = results["grpo"][0], comparisons(results, "accuracy_strict")
    assert format_run_summary(summary).split("grpo vs sft: ")[1].splitlines()[0].endswith(": correctness rose")


def test_summary_states_the_target_bands_checked_accuracy_first_with_its_interval_and_p_value():
    """With a target band, each band's line starts with the change in checked accuracy (the answer right and
    no equation shown wrong), then correctness, each with its 95% interval and exact McNemar p, the format
    stated apart; the target band's line comes first, the other bands' after it. The MLflow description
    says the same."""
    from components.evaluate import comparisons
    from components.evaluation.metrics import band_metrics, item_metrics
    from pipelines.flow.summary import format_run_summary, summary_markdown
    from pipelines.handoff import NotRegistered, RunSummary

    def items(right: int, checked: int, right_other: int) -> list[dict[str, object]]:
        """100 problems of 3 steps (the target band), then 300 of 1 or 2 steps."""
        rows = []
        for i in range(400):
            band = i < 100
            ok = i < right if band else i - 100 < right_other
            rows.append({"id": f"q{i}", "steps": 3 if band else 1 + i % 2, "correct": ok, "correct_flexible": ok,
                         "correct_checked": ok and (i < checked or not band), "format_ok": True,
                         "completion_tokens": 10})
        return rows

    results = {"sft": items(right=15, checked=12, right_other=270),
               "grpo": items(right=31, checked=27, right_other=272)}
    results = {m: ({**item_metrics(it), **band_metrics(it, "3")}, it) for m, it in results.items()}
    summary = RunSummary(
        name="abc1234", run_id="r", experiment_id="1", tracking_uri="sqlite:///mlflow.db", pull="skipped",
        push="skipped", stages=[], metrics={m: r[0] for m, r in results.items()},
        comparison=comparisons(results, "accuracy_strict", "3"),
        registration=NotRegistered("register.enabled is false"),
        decision=None, reports={}, alpha=0.05,
    )
    lines = [x for x in format_run_summary(summary).splitlines() if x.startswith("  grpo vs sft")]
    change = r"\+[\d.]+ points \(95% CI \+[\d.]+ to \+[\d.]+\), exact McNemar p = [\d.e-]+"
    assert re.fullmatch(
        r"  grpo vs sft, target band \(3 steps\), n = 100: "
        rf"accuracy_checked \(right, no equation shown wrong\) sft 12\.0% -> grpo 27\.0%, {change}; "
        rf"correctness \(accuracy_flexible, the answer is right\) 15\.0% -> 31\.0%, {change}; "
        r"format \(the answer is tagged\) 100\.0% -> 100\.0%; accuracy_strict .*: correctness rose", lines[0]), lines
    assert lines[1].startswith("  grpo vs sft, other bands, n = 300: accuracy_checked (right, no equation shown wrong) "
                               "sft 90.0% -> grpo 90.7%, +0.7 points (95% CI "), lines
    assert len(lines) == 2
    description = summary_markdown(summary)
    assert "**grpo vs sft, target band (3 steps), n = 100** (same items): accuracy_checked (right, no equation " \
           "shown wrong) sft 12.0% -> grpo 27.0%" in description
