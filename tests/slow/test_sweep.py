"""`grpoflow sweep` end to end on the tiny model: a 2 x 2 grid over two GRPO settings, 2 data seeds each,
2 trials at once, stopped by Ctrl-C during a trial and continued by the same command. Data, model and SFT
run once per data seed (the run cache restores them for the other trials), MLflow holds one sweep parent with
the 8 trial runs, `dvc exp show` lists them, only the chosen configuration is evaluated on the test split,
registered and gated, and the summary gives its dev and test figures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

from tests.project_repo import grpoflow, make_project_repo, pipeline_env, run_ok, wait_for

pytestmark = pytest.mark.slow

SPEC = """
parameters:
  grpo.trainer.beta: [0.0, 0.1]
  grpo.trainer.learning_rate: [1.0e-5, 5.0e-5]
seeds: {key: data.seed, values: [1234, 7]}
parallel: 2
dev_size: 8
"""
FASTER = ["sft.trainer.max_steps=10", "selection.max_candidates=24", "sft.sample_size=0", "grpo.sample_size=0"]


def test_a_sweep_reuses_unchanged_stages_survives_ctrl_c_and_registers_the_configuration_chosen_on_dev(tmp_path):
    repo = make_project_repo(tmp_path / "repo", FASTER, with_flows=True)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SPEC)
    env = pipeline_env(tmp_path)
    journal = repo / ".dvc" / "tmp" / "sweeps" / "sweep" / "journal.jsonl"

    def records() -> list[dict]:
        lines = journal.read_text().splitlines() if journal.is_file() else []
        return [r for r in map(json.loads, lines) if r["event"] == "trial"]

    log = tmp_path / "interrupted.log"
    proc = grpoflow(repo, "sweep", str(spec), log=log, env=env, start_new_session=True)
    wait_for(lambda: any(r["status"] == "finished" for r in records()), 600, "a finished trial", proc, log)

    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole process group
    assert proc.wait(timeout=120) == 130
    err = [line for line in log.read_text().splitlines() if "interrupted" in line]
    assert len(err) == 1 and "the same command continues it" in err[0], log.read_text()[-3000:]
    before = {r["number"] for r in records() if r["status"] == "finished"}

    out = run_ok(repo, "sweep", str(spec), env=env, timeout=900)
    finished = [r for r in records() if r["status"] == "finished"]
    assert Counter(r["number"] for r in finished) == Counter(range(1, 9))  # each trial finished once, none twice
    runs = Counter(line.split("components.")[-1] for entry in (repo / ".dvc" / "cache" / "runs").rglob("*")
                   if entry.is_file() for line in entry.read_text().splitlines() if line.startswith("cmd:"))
    # DVC's run cache: data, model, SFT and selection ran once per data seed (the other trials, and the chosen
    # configuration's run, restored them), GRPO once per trial, the test split's evaluation once (the chosen one)
    assert runs == {"data": 2, "model": 2, "sft": 2, "selection": 2, "grpo": 8, "evaluate": 1}, runs

    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("grpoflow").experiment_id
    parents = client.search_runs([exp], "tags.`grpoflow.sweep.role` = 'parent'")
    assert len(parents) == 1
    parent = parents[0].info.run_id
    trials = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}' and tags.`grpoflow.sweep.role` = "
                                "'trial' and attributes.status = 'FINISHED'")
    assert sorted(int(t.data.tags["grpoflow.sweep.trial"]) for t in trials) == list(range(1, 9))
    for t in trials:
        assert "grpo.trainer.beta=" in t.data.tags["grpoflow.sweep.overrides"]
        assert t.data.tags["grpoflow.sweep.seed"] in ("data.seed=1234", "data.seed=7")
        assert "dev.target.accuracy_checked" in t.data.metrics and "grpo.trainer.beta" in t.data.params
    every_run = client.search_runs([exp], "tags.`grpoflow.sweep.role` = 'trial'")
    again = [t for t in every_run if int(t.data.tags["grpoflow.sweep.trial"]) in before
             and t.info.status == "FINISHED"]
    assert len(again) == len(before)  # a trial finished before Ctrl-C was not run again
    artifacts = {a.path for a in client.list_artifacts(parent, "sweep")}
    assert artifacts == {"sweep/trials.csv", "sweep/dev_scores.png"}

    shown = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--csv", "--no-pager"], cwd=repo, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert {f"sweep-t{n}" for n in range(1, 9)} <= {line.split(",")[0] for line in shown.splitlines()}

    versions = client.search_model_versions("name = 'grpoflow-policy'")
    assert len(versions) == 1 and versions[0].tags.get("promotion.decision") in ("promoted", "rejected")
    chosen = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}' and tags.`grpoflow.sweep.role` = "
                                "'chosen'")
    assert len(chosen) == 1 and versions[0].run_id in {chosen[0].info.run_id, *[
        r.info.run_id for r in client.search_runs([exp], f"tags.mlflow.parentRunId = '{chosen[0].info.run_id}'")]}
    assert "4 configurations tried, 2 seeds (data.seed 1234, 7) each: 8 trials finished, 0 failed" in out
    assert "chosen: grpo.trainer." in out and "dev target.accuracy_checked" in out and "95% CI" in out
    assert "test target.accuracy_checked (grpo" in out and "registered: grpoflow-policy version 1" in out
    assert "gate: " in out
