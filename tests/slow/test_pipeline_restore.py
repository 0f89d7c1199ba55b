"""DVC's run cache through the remote, and a run killed mid-stage, on the session's baseline run
(tests/project_repo.py):

- a second clone with the same code and params, holding nothing but the remote, restores every stage
  of the baseline (`restored`, no training), byte for byte;
- kill -9 of `grpoflow run` during SFT (on a copy of the baseline): nothing is left running (no `dvc`,
  no stage process, no Prefect server), `dvc checkout sft` brings back the previous SFT model, and the
  next run succeeds, resuming SFT from its checkpoint (a `dvc repro` child used to outlive the flow,
  hold DVC's lock and make the next run fail).

    pytest -q tests/slow/test_pipeline_restore.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from components.common.files import sha256_file
from tests.project_repo import git, grpoflow, pipeline_env, prefect_servers, run_ok, stage_processes, wait_for

pytestmark = pytest.mark.slow
STAGES = ("data", "model", "sft", "grpo", "evaluate")


def test_a_second_clone_restores_every_stage_from_the_remote(baseline, tmp_path):
    first = baseline.repo
    second = tmp_path / "second"
    git(tmp_path, "clone", "-q", str(first), str(second))  # code and params; no outputs, no dvc.lock
    assert not (second / "dvc.lock").exists() and not (second / "models").exists()

    out = run_ok(second, "run", env=pipeline_env(tmp_path))
    for stage in STAGES:
        assert f"{stage:<10} restored" in out, out[-3000:]
    assert "Running stage" not in out  # nothing trained or evaluated again
    for path in ("models/sft/model.safetensors", "models/grpo/model.safetensors", "reports/eval/grpo.items.jsonl"):
        assert sha256_file(second / path) == sha256_file(first / path), path


def test_kill_9_during_sft_leaves_nothing_running_and_the_next_run_resumes(baseline, tmp_path):
    copy = baseline.copy(tmp_path / "copy")
    repo, env = copy.repo, copy.env()
    before = sha256_file(repo / "models/sft/model.safetensors")
    log = tmp_path / "killed.log"
    run = grpoflow(repo, "run", "-S", "sft.trainer.max_steps=150", "-S", "sft.trainer.save_steps=5", log=log, env=env)
    ckpts = repo / "checkpoints" / "sft"
    wait_for(lambda: any(ckpts.glob("checkpoint-*/trainer_state.json")), 900, "SFT checkpoint", run, log)
    assert stage_processes(repo)  # dvc and the SFT process are running
    assert prefect_servers(copy.root / "prefect")  # and the run's temporary Prefect server
    os.kill(run.pid, signal.SIGKILL)
    run.wait()

    # Nothing outlives the killed run: DVC, the stage (the group watchdog's process group) and Prefect's server.
    wait_for(lambda: not stage_processes(repo) and not prefect_servers(copy.root / "prefect"), 60,
             "end of the killed run's processes")

    # DVC removed models/sft when the stage started; dvc.lock still names the previous one.
    restored = subprocess.run([sys.executable, "-m", "dvc", "checkout", "sft"], cwd=repo, capture_output=True,
                              text=True)
    assert restored.returncode == 0, restored.stderr
    assert sha256_file(repo / "models/sft/model.safetensors") == before

    out = run_ok(repo, "run", env=env)  # the same params as the killed run: SFT resumes from its checkpoint
    assert "sft: resuming from checkpoint" in out
    assert "sft        ran" in out and "evaluate   ran" in out
    assert stage_processes(repo) == []
