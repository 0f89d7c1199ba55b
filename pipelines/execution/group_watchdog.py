"""Run a command in a process group of its own that dies with the process that started it.

    python -m pipelines.execution.group_watchdog COMMAND [ARGS...]
    python -m pipelines.execution.group_watchdog --poll-parent COMMAND [ARGS...]

The flow runs every `dvc` command through this watchdog. A flow killed with SIGKILL gets no chance
to stop its children, and a `dvc repro` left running would hold DVC's lock and keep writing the
stage's checkpoints under the next run. The watchdog does it for the flow: Linux signals it
when its parent dies (PR_SET_PDEATHSIG), and the watchdog then stops the command's whole process
group (DVC and the stage command DVC started): SIGTERM, then SIGKILL after a grace period. The
same happens when the watchdog itself gets SIGTERM, SIGINT or SIGHUP (Ctrl-C in the terminal).

Linux sends that signal when the *thread* that started the watchdog ends, not only its process: a
watchdog started from a thread that finishes before the process does (Prefect's temporary server,
booted from a background thread) runs with `--poll-parent` instead, which checks every
POLL_S seconds whether its parent is still the process that started it.

With GRPOFLOW_STAGE_GROUP_FILE set, the watchdog records the group there while the command runs, so
that a later run can find and stop a group whose watchdog was killed too (`stop_orphans`).
Only the standard library is used. Exit code: the command's. Stopped by a signal (SIGINT to the
terminal's process group, even when the run started with SIGINT ignored, as `&` in a script does),
the watchdog ends by that same signal once the group is stopped, so the process that started it sees
the signal (return code -N), not a command that failed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GROUP_FILE_ENV = "GRPOFLOW_STAGE_GROUP_FILE"
GRACE_S = 10.0
POLL_S = 0.5
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask Linux to send `sig` to this process when its parent dies; False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None when there is no such process
    (or no /proc): index 0 is the state (field 3; "Z" a zombie), 2 the process group (field 5),
    19 the start time in clock ticks after boot (field 22). `pid` may be "self".

    >>> proc_stat("self")[0], proc_stat(os.getpid())[2] == str(os.getpgrp()), proc_stat(-1)
    ('R', True, None)
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces and ")"


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid`, to tell a reused pid apart."""
    fields = proc_stat(pid)
    return fields[19] if fields else None


def group_members(pgid: int) -> list[int]:
    """Pids of the live processes in process group `pgid` (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if entry.name.isdigit() and (fields := proc_stat(entry.name)):
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def stop_group(pgid: int, grace: float = GRACE_S) -> None:
    """SIGTERM to every process of the group, then SIGKILL to what is left after `grace` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_orphans(group_file: str | os.PathLike, cwd: str | os.PathLike) -> list[int]:
    """Stop the group a killed run left behind (recorded in `group_file`, its processes working in
    `cwd`); returns the pids that were stopped. Called with the checkout's lock held."""
    path = Path(group_file)
    try:
        pgid_text, started = path.read_text().split()
        pgid = int(pgid_text)
    except (OSError, ValueError):
        return []
    root = os.path.realpath(cwd)
    ours = []
    for pid in group_members(pgid):
        try:
            here = os.path.realpath(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        same_leader = pid != pgid or _start_time(pid) == started
        if same_leader and (here == root or here.startswith(root + os.sep)):
            ours.append(pid)
    if ours:
        stop_group(pgid)
    path.unlink(missing_ok=True)
    return ours


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    poll_parent = bool(argv) and argv[0] == "--poll-parent"
    argv = argv[1:] if poll_parent else argv
    if not argv:
        print("usage: python -m pipelines.execution.group_watchdog [--poll-parent] COMMAND [ARGS...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    if not poll_parent:
        die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request took effect
        return 128 + signal.SIGTERM
    proc = subprocess.Popen(argv, start_new_session=True)
    group_file = os.environ.get(GROUP_FILE_ENV)
    if group_file:
        Path(group_file).parent.mkdir(parents=True, exist_ok=True)  # a fresh copy has no .dvc/tmp yet
        Path(group_file).write_text(f"{proc.pid} {_start_time(proc.pid)}\n")

    def stop(signum, frame):
        stop_group(proc.pid)
        if group_file:
            Path(group_file).unlink(missing_ok=True)
        sys.stdout.flush()
        signal.signal(signum, signal.SIG_DFL)  # die by the signal itself: the parent sees which
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # (a signal whose default is not to end the process)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    while poll_parent:
        try:
            rc = proc.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:  # re-parented: the process that started us is gone
                stop(signal.SIGTERM, None)
    else:
        rc = proc.wait()
    if group_file:
        Path(group_file).unlink(missing_ok=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
