"""Ctrl-C and SIGTERM during `grpoflow run`'s SFT (on a copy of the session's baseline run,
tests/project_repo.py, with the real temporary Prefect server):

- Ctrl-C is SIGINT to the terminal's process group (the run starts in a session of its own, as a shell
  job does); SIGTERM goes to the main process only (a scheduler, `docker stop`);
- either way the run exits within 20 s with 128 + the signal, prints no traceback and, last, one line
  naming the stage and the checkpoint the next run resumes from; no MLflow run is left RUNNING and no
  process is left behind (DVC, the stage, Prefect's server);
- after Ctrl-C the next run resumes SFT from that checkpoint and completes.

    pytest -q tests/slow/test_pipeline_interrupt.py
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import time

import pytest

from tests.project_repo import grpoflow, prefect_servers, run_ok, stage_processes, wait_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_during_sft_stops_cleanly_in_one_line_and_the_next_run_resumes(baseline, tmp_path, sig):
    copy = baseline.copy(tmp_path / "copy")
    repo, env = copy.repo, copy.env()
    log = tmp_path / "interrupted.log"
    run = grpoflow(repo, "run", "-S", "sft.trainer.max_steps=150", "-S", "sft.trainer.save_steps=5", log=log,
                   env=env, start_new_session=True)
    ckpts = repo / "checkpoints" / "sft"
    wait_for(lambda: any(ckpts.glob("checkpoint-*/trainer_state.json")), 900, "SFT checkpoint", run, log)
    assert stage_processes(repo) and prefect_servers(copy.root / "prefect")

    start = time.monotonic()
    if sig == signal.SIGINT:
        os.killpg(run.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C
    else:
        os.kill(run.pid, signal.SIGTERM)
    try:
        rc = run.wait(timeout=20)
    except Exception:
        os.killpg(run.pid, signal.SIGKILL)
        raise AssertionError(f"still running 20 s after {sig.name}:\n{log.read_text()[-3000:]}") from None
    out = log.read_text()
    assert rc == 128 + sig, out[-3000:]
    assert time.monotonic() - start < 20
    assert "Traceback" not in out, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(rf"interrupted by {sig.name} during sft; `grpoflow run` resumes from checkpoint-\d+", last), \
        out[-3000:]
    with sqlite3.connect(repo / "mlflow.db") as db:
        assert db.execute("SELECT name FROM runs WHERE status = 'RUNNING'").fetchall() == []
        states = dict(db.execute("SELECT name, status FROM runs ORDER BY start_time DESC LIMIT 4").fetchall())
    assert states.get("sft") == "KILLED", states
    wait_for(lambda: not stage_processes(repo) and not prefect_servers(copy.root / "prefect"), 10,
             "end of the interrupted run's processes")

    if sig == signal.SIGINT:  # the next run goes on from where this one stopped
        out = run_ok(repo, "run", "-S", "sft.trainer.max_steps=150", "-S", "sft.trainer.save_steps=5", env=env)
        assert "sft: resuming from checkpoint" in out
        assert "sft        ran" in out and "evaluate   ran" in out
