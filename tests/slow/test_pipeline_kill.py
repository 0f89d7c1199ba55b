"""kill -9 of `grpoflow run` during SFT: the stage processes die with it, and a run started at once
succeeds, resuming SFT from its checkpoint (a `dvc repro` child used to outlive the flow, hold DVC's
lock and make the next run fail).

    pytest -q tests/slow/test_pipeline_kill.py
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.project_repo import grpoflow, make_project_repo

pytestmark = pytest.mark.slow


def stage_processes(repo: Path) -> list[int]:
    """Live `dvc` and stage processes (python -m components.<stage>) working in the checkout."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            ours = cwd == str(repo) or cwd.startswith(f"{repo}/")
            if ours and state != "Z" and ("-m dvc" in cmd or "-m components." in cmd):
                pids.append(int(entry.name))
    return pids


def test_kill_9_during_sft_then_an_immediate_run_resumes(tmp_path):
    repo = make_project_repo(tmp_path / "repo", ["sft.trainer.max_steps=150", "sft.trainer.save_steps=5"])
    first = grpoflow(repo, "run", log=tmp_path / "first.log")
    ckpts = repo / "checkpoints" / "sft"
    deadline = time.monotonic() + 900
    while not any(ckpts.glob("checkpoint-*/trainer_state.json")):
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no SFT checkpoint appeared"
        time.sleep(0.5)
    assert stage_processes(repo)  # dvc and the SFT process are running
    os.kill(first.pid, signal.SIGKILL)
    first.wait()

    second = grpoflow(repo, "run", log=tmp_path / "second.log")  # at once
    rc = second.wait(timeout=1200)
    log = (tmp_path / "second.log").read_text()
    assert rc == 0, log[-4000:]
    assert "sft: resuming from checkpoint" in log
    assert "sft        ran" in log and "evaluate   ran" in log
    assert stage_processes(repo) == []
