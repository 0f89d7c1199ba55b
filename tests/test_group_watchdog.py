"""pipelines/execution/group_watchdog.py: a stage command dies with the flow that started it, even under kill -9, and a
group that outlived its guard is stopped by the next run (not an unrelated one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipelines.execution.group_watchdog import group_members, stop_orphans

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc")


def wait_until(condition, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_guarded_command_dies_when_its_parent_is_killed(tmp_path):
    group_file = tmp_path / "group"
    # A stand-in for the flow: starts `sleep` (a stand-in for dvc + the stage) through the guard.
    flow = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import os, subprocess, sys, time
            env = {{**os.environ, "GRPOFLOW_STAGE_GROUP_FILE": {str(group_file)!r}}}
            subprocess.Popen([sys.executable, "-m", "pipelines.execution.group_watchdog",
                              "sh", "-c", "sleep 300 & sleep 300; wait"],
                             env=env, cwd={str(REPO)!r})
            time.sleep(300)
            """)],
        cwd=REPO,
    )
    assert wait_until(lambda: group_file.is_file() and len(group_members(int(group_file.read_text().split()[0]))) >= 3)
    pgid = int(group_file.read_text().split()[0])
    members = group_members(pgid)
    os.kill(flow.pid, signal.SIGKILL)  # no chance to clean up
    flow.wait()
    assert wait_until(lambda: not any(alive(p) for p in members)), "the stage processes outlived the flow"
    assert wait_until(lambda: not group_file.exists())


def test_next_run_stops_an_orphaned_group_in_its_checkout_only(tmp_path):
    ours, other = tmp_path / "checkout", tmp_path / "elsewhere"
    ours.mkdir()
    other.mkdir()
    procs = [subprocess.Popen(["sleep", "300"], cwd=d, start_new_session=True) for d in (ours, other)]
    try:
        for proc, d in zip(procs, (ours, other), strict=True):
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
            (d / "group").write_text(f"{proc.pid} {stat[stat.rindex(')') + 2:].split()[19]}\n")
        assert stop_orphans(ours / "group", ours) == [procs[0].pid]
        assert procs[0].wait(timeout=30) != 0 and not (ours / "group").exists()
        # A recorded group whose processes work in another folder is not ours to stop.
        assert stop_orphans(other / "group", ours) == [] and procs[1].poll() is None
        # A record whose leader pid was reused by another process (other start time) is ignored too.
        (ours / "group").write_text(f"{procs[1].pid} 1\n")
        assert stop_orphans(ours / "group", other) == [] and procs[1].poll() is None
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_the_group_file_folder_need_not_exist(tmp_path):
    """A fresh working copy has no .dvc/tmp until DVC makes it: the guard creates the folder
    (regression: a stage placed on a work pool failed with FileNotFoundError)."""
    from pipelines.execution.group_watchdog import GROUP_FILE_ENV

    group_file = tmp_path / "fresh" / ".dvc" / "tmp" / "grpoflow-stage.group"
    env = {**os.environ, GROUP_FILE_ENV: str(group_file), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "pipelines.execution.group_watchdog",
                           sys.executable, "-c", "print('ran')"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "ran" in proc.stdout, proc.stderr


def test_a_stage_ended_by_sigint_while_sigint_is_ignored_is_an_interruption_not_a_failed_stage(tmp_path):
    """Started from a script with `&`, the run ignores SIGINT; a SIGINT to its process group reaches
    the stage's watchdog, which stops the stage. The run must see an interruption naming the signal
    (Interrupted, as Ctrl-C: the runs marked KILLED, exit 130), not "stage failed … dvc exit 130"."""
    (tmp_path / "dvc.yaml").write_text("stages:\n  slow:\n    cmd: sleep 60\n")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    script = textwrap.dedent("""
        import os, sys
        from pipelines.execution.dvc_ops import run_dvc
        try:
            print("rc", run_dvc(["repro", "slow"], sys.argv[1], dict(os.environ))[0], flush=True)
        except KeyboardInterrupt as exc:
            print(type(exc).__name__, getattr(exc, "signum", None), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    group = tmp_path / ".dvc" / "tmp" / "grpoflow-stage.group"
    assert wait_until(lambda: group.is_file() and any(
        "sleep" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        for pid in group_members(int(group.read_text().split()[0]))), 120), "the stage never started"
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert out.strip().splitlines()[-1] == f"Interrupted {int(signal.SIGINT)}", out
