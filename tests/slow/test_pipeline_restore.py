"""DVC's run cache through the remote: a second clone with the same code and params, holding nothing
but the remote, restores every stage from an earlier run (`restored`, no training); and a stage
killed mid-run leaves its previous outputs restorable with `dvc checkout`.

    pytest -q tests/slow/test_pipeline_restore.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from components.files import sha256_file
from tests.project_repo import git, grpoflow, make_project_repo

pytestmark = pytest.mark.slow
STAGES = ("data", "model", "sft", "grpo", "evaluate")


def run_ok(repo, *args) -> str:
    proc = grpoflow(repo, "run", *args)
    out, _ = proc.communicate(timeout=1500)
    assert proc.returncode == 0, out[-4000:]
    return out


def test_a_second_clone_restores_every_stage_from_the_remote(tmp_path):
    first = make_project_repo(tmp_path / "first")
    run_ok(first)
    second = tmp_path / "second"
    git(tmp_path, "clone", "-q", str(first), str(second))  # code and params; no outputs, no dvc.lock
    assert not (second / "dvc.lock").exists() and not (second / "models").exists()

    out = run_ok(second)
    for stage in STAGES:
        assert f"{stage:<10} restored" in out, out[-3000:]
    assert "Running stage" not in out  # nothing trained or evaluated again
    for path in ("models/sft/model.safetensors", "models/grpo/model.safetensors", "reports/eval/grpo.items.jsonl"):
        assert sha256_file(second / path) == sha256_file(first / path), path


def test_a_killed_stage_leaves_its_previous_outputs_restorable(tmp_path):
    repo = make_project_repo(tmp_path / "repo")
    run_ok(repo)
    before = sha256_file(repo / "models/sft/model.safetensors")
    proc = grpoflow(repo, "run", "-S", "sft.trainer.max_steps=150", "-S", "sft.trainer.save_steps=5",
                    log=tmp_path / "killed.log")
    deadline = time.monotonic() + 900
    while not any((repo / "checkpoints/sft").glob("checkpoint-*/trainer_state.json")):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "killed.log").read_text()[-3000:]
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(2)  # the guard stops DVC and the stage (tests/test_guard.py)

    # DVC removed models/sft when the stage started; dvc.lock still names the previous one.
    restored = subprocess.run([sys.executable, "-m", "dvc", "checkout", "sft"], cwd=repo, capture_output=True, text=True)
    assert restored.returncode == 0, restored.stderr
    assert sha256_file(repo / "models/sft/model.safetensors") == before

    out = run_ok(repo)  # the same params as the killed run: SFT resumes from its checkpoint
    assert "sft: resuming from checkpoint" in out and "sft        ran" in out
