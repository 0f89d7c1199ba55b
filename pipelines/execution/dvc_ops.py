"""DVC as the flow drives it: the stage graph, `dvc.lock` entries, the default remote, and
`dvc` commands run in a subprocess (cwd = the repo root) with their output streamed.

    stage_order(root)            pipeline stages in dependency order (ties keep dvc.yaml's order)
    lock_entry(root, stage)      the stage's dvc.lock entry; entry_md5() fingerprints it
    default_remote(root)         (name, url) of the default remote
    run_dvc(args, root, env, log)  `dvc ARGS`, output streamed to the terminal and, as whole lines, to
                                 `log` (LineLog: a progress bar is one line, not every redraw); (exit
                                 code, output tail)
    push(root, env, stages, log)   `dvc push --run-cache`, plus the objects of git-tracked outputs
    pull(root, env, stages, log)   `dvc pull --allow-missing`, plus the git-tracked outputs of dvc.lock
    stage_env(...)               the environment a stage runs in
    up_to_date(root)             True when `dvc status` finds nothing changed since dvc.lock
    already_pushed(root) / mark_pushed(root)   whether this dvc.lock was pushed to this remote already
"""

from __future__ import annotations

import codecs
import collections
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.common.errors import CommandFailed
from components.common.tracking import PARENT_ENV
from pipelines.execution.group_watchdog import GRACE_S, GROUP_FILE_ENV
from pipelines.execution.runtime import TELEMETRY_OFF
from pipelines.execution.services import check_remote, remote_settings
from pipelines.handoff import Interrupted

STAGE_GROUP_FILE = ".dvc/tmp/grpoflow-stage.group"  # the process group of the running dvc command
PUSHED_FILE = ".dvc/tmp/grpoflow-pushed"  # dvc.lock's md5 and the remote of the last successful push
# DVC's messages for contention with another DVC process: worth a retry.
TRANSIENT_MARKERS = ("Unable to acquire lock", "is busy", "database is locked")


class StageFailed(CommandFailed):
    """A stage command (or DVC on it) failed for a reason a retry will not fix."""


class TransientError(CommandFailed):
    """Worth retrying: DVC's lock was held by another process, or the subprocess did not start."""


def stage_order(root: str | os.PathLike) -> list[str]:
    """Pipeline stages of the repo in dependency order (ties keep their dvc.yaml order).

    DVC builds its index for this (a second or so): the answer is kept for this process while
    dvc.yaml and params.yaml (its `${...}` values) are unchanged, so the run's pre-flight check and
    the flow read it once."""
    key = (str(Path(root).resolve()), *(_file_stamp(Path(root) / name) for name in ("dvc.yaml", "params.yaml")))
    if key not in _STAGE_ORDERS:
        _STAGE_ORDERS.clear()
        _STAGE_ORDERS[key] = _stage_order(root)
    return list(_STAGE_ORDERS[key])


_STAGE_ORDERS: dict[tuple, list[str]] = {}


def _file_stamp(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _stage_order(root: str | os.PathLike) -> list[str]:
    import networkx as nx
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    with Repo(str(root)) as repo:
        graph = repo.index.graph
        stages = [s for s in repo.index.stages if isinstance(s, PipelineStage)]
        position = {s: i for i, s in enumerate(stages)}
        # DVC's edges point from a stage to the stages it depends on.
        sub = graph.subgraph(stages).reverse(copy=True)
        order = nx.lexicographical_topological_sort(sub, key=lambda s: position[s])
        return [_address(s, root) for s in order]


def upstream_stages(root: str | os.PathLike, stage: str) -> list[str]:
    """The stages whose outputs `stage` reads (its direct dependencies in DVC's graph)."""
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    with Repo(str(root)) as repo:
        graph = repo.index.graph
        node = next(s for s in graph if isinstance(s, PipelineStage) and _address(s, root) == stage)
        return sorted(_address(s, root) for s in graph.successors(node) if isinstance(s, PipelineStage))


def _address(stage: Any, root: str | os.PathLike) -> str:
    """`name` for the root dvc.yaml, `sub/dvc.yaml:name` otherwise, relative to the repo root."""
    rel = os.path.relpath(stage.path, root)
    return stage.name if rel == "dvc.yaml" else f"{rel}:{stage.name}"


def lock_entry(root: str | os.PathLike, stage: str) -> dict[str, Any] | None:
    """The stage's entry in dvc.lock (None if it never ran)."""
    import yaml

    path = Path(root) / "dvc.lock"
    if not path.is_file():
        return None
    # libyaml's loader where PyYAML has it: dvc.lock lists every output file, and the flow reads it
    # twice per stage (the pure-Python loader took 0.1-0.3 s a read).
    data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    return (data.get("stages") or {}).get(stage.split(":")[-1])


def stage_status(tail: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """What `dvc repro --single-item STAGE` did, from its output and the stage's dvc.lock entry before
    and after: `restored` (DVC's run cache had these exact outputs: checked out, not run), `skipped`
    (nothing changed) or `ran`.

    >>> stage_status("Stage 'sft' is cached - skipping run, checking out outputs", {"a": 1}, {"a": 2})
    'restored'
    >>> stage_status("Stage 'sft' didn't change, skipping", {"a": 1}, {"a": 1}), stage_status("", None, {"a": 1})
    ('skipped', 'ran')
    """
    if "is cached - skipping run" in tail:
        return "restored"
    return "skipped" if after == before else "ran"


def entry_md5(entry: dict[str, Any] | None) -> str:
    return hashlib.md5(json.dumps(entry, sort_keys=True).encode()).hexdigest() if entry else ""


def default_remote(root: str | os.PathLike) -> tuple[str | None, str | None]:
    """(name, url) of the repo's default DVC remote, url made absolute for local folders."""
    name, settings = remote_settings(root)
    if not name:
        return None, None
    url = settings.get("url")
    if url and "://" not in url and not os.path.isabs(url):
        url = str((Path(root) / ".dvc" / url).resolve())
    return name, url


def up_to_date(root: str | os.PathLike) -> bool:
    """True when `dvc status` finds every stage's deps, params and outputs as dvc.lock records them
    (outputs present included): then `dvc repro` would skip every stage and there is nothing to pull.
    One in-process status instead of a `dvc` process per stage: a rerun with nothing changed is quick."""
    from dvc.repo import Repo

    if not (Path(root) / "dvc.lock").is_file():
        return False
    with Repo(str(root)) as repo:
        return not repo.status()


def _push_marker(root: str | os.PathLike) -> str:
    lock = Path(root) / "dvc.lock"
    digest = hashlib.md5(lock.read_bytes()).hexdigest() if lock.is_file() else "none"
    return f"{digest} {default_remote(root)[1]}\n"


def already_pushed(root: str | os.PathLike) -> bool:
    """Whether the last successful push sent this very dvc.lock's outputs and run cache to this remote."""
    try:
        return (Path(root) / PUSHED_FILE).read_text() == _push_marker(root)
    except OSError:
        return False


def mark_pushed(root: str | os.PathLike) -> None:
    path = Path(root) / PUSHED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_push_marker(root))


def stage_env(parent_run_id: str | None, tracking_uri: str) -> dict[str, str]:
    """The environment stages run in: this venv first on PATH, the parent run, the tracking URI."""
    env = {**os.environ}
    for key, value in TELEMETRY_OFF.items():
        env.setdefault(key, value)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["MLFLOW_TRACKING_URI"] = tracking_uri
    env.pop("GRPOFLOW_PARAMS", None)  # DVC tracks the repo's params.yaml: stages must read that one
    if parent_run_id:
        env[PARENT_ENV] = parent_run_id
    return env


class LineLog:
    """Terminal output made into log lines: `feed(text)` passes each finished line to `emit`. A line
    redrawn with carriage returns (a progress bar) is emitted once, in its last state, when it ends;
    while it keeps being redrawn, its current state at most every `every_s` seconds (None: never).

    >>> out = []
    >>> log = LineLog(out.append)
    >>> log.feed("Running stage 'sft'\\n  0%|  | 0/9\\r 50%|# | 4/9\\r100%|##| 9/9\\n{'loss': 1.2}\\n\\nlast")
    >>> log.close()
    >>> out
    ["Running stage 'sft'", '100%|##| 9/9', "{'loss': 1.2}", 'last']
    """

    def __init__(self, emit: Callable[[str], object], every_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.emit, self.every_s, self.clock = emit, every_s, clock
        self.partial = ""
        self.last = clock()
        self.sent = ""  # what was last sent of the unfinished line (not sent again when it ends so)

    @staticmethod
    def _shown(line: str) -> str:
        """What a terminal shows of a line drawn with carriage returns: its last non-empty redraw."""
        return next((seg for seg in reversed(line.split("\r")) if seg.strip()), "").rstrip()

    def _line_done(self, line: str) -> None:
        if (shown := self._shown(line)) and shown != self.sent:
            self.emit(shown)
            self.last = self.clock()
        self.sent = ""

    def feed(self, text: str) -> None:
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            self._line_done(line)
        if self.every_s is not None and self.partial and self.clock() - self.last >= self.every_s:
            if (shown := self._shown(self.partial)) and shown != self.sent:
                self.emit(shown)
                self.sent = shown
            self.last = self.clock()

    def close(self) -> None:
        self._line_done(self.partial)
        self.partial = ""


def run_dvc(
    args: list[str], root: str | os.PathLike, env: dict[str, str], log: Callable[[str], object] | None = None,
    log_every_s: float | None = 30.0, out: Any = None,
) -> tuple[int, str]:
    """Run `dvc ARGS`, streaming its output (progress bars included) to `out` (default stdout); returns (rc, tail).
    With `log`, whole lines go there too (LineLog; a running progress bar every `log_every_s` s).

    DVC runs under pipelines/execution/group_watchdog.py: in a process group of its own, stopped when this process
    dies, however it dies, recorded in STAGE_GROUP_FILE for the next run. A signal from outside that ends
    the watchdog (even one this process ignores: `&` in a script) raises Interrupted, as Ctrl-C does."""
    cmd = [sys.executable, "-m", "pipelines.execution.group_watchdog", sys.executable, "-m", "dvc", *args]
    env = {**env, GROUP_FILE_ENV: str(Path(root) / STAGE_GROUP_FILE)}
    tail: collections.deque[str] = collections.deque(maxlen=60)
    if args[0] in ("pull", "push") or "--pull" in args:
        check_remote(root)  # a remote that does not answer: one line within the budget, not DVC's retries
    try:
        proc = subprocess.Popen(cmd, cwd=str(root), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as exc:
        raise TransientError(f"could not start {' '.join(cmd)}: {exc}") from exc
    assert proc.stdout is not None
    partial = ""
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode  # chunks split characters
    # Raw chunks, not lines: progress bars redraw with \r and must reach the terminal as they go.
    lines_log = LineLog(log, log_every_s) if log else None
    try:
        while chunk := proc.stdout.read1(4096):
            text = decode(chunk)
            (out or sys.stdout).write(text)
            (out or sys.stdout).flush()
            if lines_log:
                lines_log.feed(text)
            *lines, partial = (partial + text).replace("\r", "\n").split("\n")
            tail.extend(lines)
    except BaseException:  # Ctrl-C (the watchdog got it too) or SIGTERM to this process only: stop DVC, then go on
        stop_watched(proc)
        raise
    tail.append(partial)
    if lines_log:
        lines_log.close()
    if (rc := proc.wait()) < 0:  # the watchdog ended by a signal from outside (it stopped DVC first)
        raise Interrupted(-rc)
    return rc, "\n".join(line for line in tail if line.strip())


def stop_watched(proc: subprocess.Popen, grace: float = GRACE_S + 5) -> None:
    """SIGTERM to a group watchdog (it stops its command's group: SIGTERM, SIGKILL after its grace) and
    wait for it, so that no stage process outlives an interrupted run."""
    try:
        proc.terminate()
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
    except (OSError, KeyboardInterrupt):
        pass  # gone already; or a second Ctrl-C: the watchdog dies with this process anyway


def push(
    root: str | os.PathLike, env: dict[str, str], stages: list[str] | tuple[str, ...] = (),
    log: Callable[[str], object] | None = None,
) -> tuple[int, str]:
    """`dvc push --run-cache [STAGES]`, then the objects of the stages' `cache: false` outputs.

    DVC's run cache records every output, and a clone restores a stage from it only when all of
    them are in the remote; but `dvc push` sends only cached outputs, so the git-tracked metrics
    and reports (committed to the local cache when the stage ran) never reach the remote and a
    second clone would run those stages again. This sends them too."""
    rc, tail = run_dvc(["push", "--run-cache", *stages], root, env, log)
    if rc != 0:
        return rc, tail
    return _tracked("push-tracked", root, env, stages, log, tail)


def pull(
    root: str | os.PathLike, env: dict[str, str], stages: list[str] | tuple[str, ...] = (),
    log: Callable[[str], object] | None = None,
) -> tuple[int, str]:
    """`dvc pull --allow-missing [STAGES]`, then the stages' `cache: false` outputs as recorded in
    dvc.lock (what a stage that ran elsewhere wrote; `dvc pull` leaves git-tracked outputs alone)."""
    rc, tail = run_dvc(["pull", "--allow-missing", *stages], root, env, log)
    if rc != 0:
        return rc, tail
    return _tracked("pull-tracked", root, env, stages, log, tail)


def _tracked(command: str, root, env, stages, log, tail: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "pipelines.execution.dvc_ops", command, *stages], cwd=str(root),
                          env=env, capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).strip()
    if out:
        print(out)
        if log:
            log(out)
    return proc.returncode, "\n".join(line for line in (tail, out) if line)


def _uncached_outs(repo: Any, stages: list[str]) -> list[Any]:
    return [out for stage in repo.index.stages if not stages or stage.name in stages
            for out in stage.outs if not out.use_cache and out.hash_info and out.hash_info.value]


def _push_tracked(stages: list[str]) -> int:
    """The `cache: false` outputs' objects that are in the local cache, to the default remote."""
    from dvc.repo import Repo

    with Repo(".") as repo:
        objs = {out.hash_info for out in _uncached_outs(repo, stages)}
        objs = {obj for obj in objs if repo.cache.local.exists(obj.value)}
        if not objs:
            return 0
        result = repo.cloud.push(objs)
        if result.failed:
            print(f"dvc push: {len(result.failed)} git-tracked output(s) could not be pushed", file=sys.stderr)
            return 1
        if result.transferred:
            print(f"{len(result.transferred)} git-tracked output(s) pushed for the run cache")
    return 0


def _pull_tracked(stages: list[str]) -> int:
    """The `cache: false` outputs of dvc.lock from the default remote into the workspace (files only)."""
    from dvc.repo import Repo

    from components.common.files import write_bytes  # atomic

    with Repo(".") as repo:
        outs = [out for out in _uncached_outs(repo, stages) if not out.hash_info.isdir]
        missing = {out.hash_info for out in outs if not repo.cache.local.exists(out.hash_info.value)}
        if missing:
            result = repo.cloud.pull(missing)
            if result.failed:
                print(f"dvc pull: {len(result.failed)} git-tracked output(s) not in the remote: "
                      + ", ".join(str(o.def_path) for o in outs if o.hash_info in result.failed), file=sys.stderr)
                return 1
        restored = 0
        for out in outs:
            data = Path(repo.cache.local.oid_to_path(out.hash_info.value)).read_bytes()
            path = Path(out.fs_path)
            if not path.is_file() or path.read_bytes() != data:
                write_bytes(path, data)
                restored += 1
        if restored:
            print(f"{restored} git-tracked output(s) restored from the remote")
    return 0


def last_line(tail: str, rc: int) -> str:
    """The line of DVC's output worth showing in a one-line status (the exit code if it printed none)."""
    return tail.splitlines()[-1] if tail else str(rc)


def is_transient(tail: str) -> bool:
    return any(m in tail for m in TRANSIENT_MARKERS)


# `python -m pipelines.execution.dvc_ops push-tracked|pull-tracked [STAGE...]` (push(), pull())
if __name__ == "__main__":
    commands = {"push-tracked": _push_tracked, "pull-tracked": _pull_tracked}
    if sys.argv[1:2] == [] or sys.argv[1] not in commands:
        sys.exit("usage: python -m pipelines.execution.dvc_ops push-tracked|pull-tracked [STAGE...]")
    sys.exit(commands[sys.argv[1]](sys.argv[2:]))
