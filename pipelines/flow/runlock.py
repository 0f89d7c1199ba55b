"""One pipeline run at a time per checkout: an exclusive lock file in `.dvc/tmp/`.

A second run waits up to `tracking.run_lock_timeout` seconds, then fails naming the holder
(pid, host, start time). The lock is an flock: it is released when its holder exits, however
it exits. Its stage processes die with it (pipelines/execution/group_watchdog.py); a group that outlived its guard
is stopped by the next run once it holds the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from pipelines.execution.dvc_ops import STAGE_GROUP_FILE
from pipelines.execution.group_watchdog import stop_orphans

LOCK_FILE = ".dvc/tmp/grpoflow-pipeline.lock"


class PipelineLocked(RuntimeError):
    """Another pipeline run holds this checkout."""


@contextlib.contextmanager
def pipeline_lock(root: str | os.PathLike, timeout: float | None = None) -> Iterator[None]:
    """Exclusive per-checkout lock; waits up to `timeout` s (default: `tracking.run_lock_timeout`
    of the checkout's params.yaml), then raises PipelineLocked naming the holder."""
    if timeout is None:
        from pipelines.params.config import load_params, params_in

        timeout = load_params(params_in(root)).tracking.run_lock_timeout
    path = Path(root) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+")
    try:
        deadline = time.monotonic() + timeout
        announced = False
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                fh.seek(0)
                holder = fh.read().strip() or "unknown process"
                if time.monotonic() >= deadline:
                    raise PipelineLocked(
                        f"another pipeline run holds {path} ({holder}); it did not finish within "
                        f"{timeout:g} s (tracking.run_lock_timeout). Wait for it, or stop that process."
                    ) from None
                if not announced:
                    print(f"waiting for the pipeline run holding {path} ({holder}), up to {timeout:g} s", flush=True)
                    announced = True
                time.sleep(1.0)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        fh.flush()
        stopped = stop_orphans(Path(root) / STAGE_GROUP_FILE, root)
        if stopped:
            print(f"stopped the stage processes {stopped} left running by a killed pipeline run", flush=True)
        yield
    finally:
        fh.close()  # releases the flock
