"""The `training-pipeline` Prefect flow: dvc pull → one task per dvc.yaml stage → dvc push →
register → promote, with one MLflow parent run per pipeline run.

    grpoflow run                         # the embedded defaults (what `make demo` runs)
    grpoflow run -S grpo.beta=0.0        # apply an override to params.yaml, as `dvc exp run -S` does
    python -m pipelines.training --help

The stage list and order come from `dvc.yaml` (DVC's own graph, topologically sorted, ties
in file order); each stage task runs `dvc repro --single-item <stage>` in a subprocess with
cwd = the repo root, so `dvc.lock` stays the only cache: a stage whose inputs did not
change is skipped by DVC, and the task reports `ran` or `skipped` by comparing the stage's
`dvc.lock` entry before and after. Stage tasks retry transient failures (DVC's lock held by
another process, a failed spawn) but never a stage command that failed.

Tracking: the flow opens an MLflow parent run whose id it passes to the stages in
GRPOFLOW_PARENT_RUN_ID (each stage's `components.tracking.stage_run` nests under it). The
parent records git commit and dirty flag, all params, package versions, the Prefect flow
run id, and at the end `dvc.lock` (artifact and md5), the sha256 of the data files, and per
stage `stage.<name>.status` (ran | skipped) and `stage.<name>.run_id` (for a skipped stage:
the earlier run that produced its current outputs, found by the md5 of its dvc.lock entry).

One pipeline at a time per checkout: the flow holds an exclusive lock file in `.dvc/tmp/`;
a second run waits up to `tracking.run_lock_timeout` seconds, then fails naming the holder.
"""

from __future__ import annotations

import argparse
import codecs
import collections
import contextlib
import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from components.config import ConfigError, load_params, parse_override
from components.tracking import (
    PARENT_ENV,
    STAGE_TAG,
    configure,
    file_md5,
    flatten,
    git_state,
    package_versions,
    repo_root,
    resolve_tracking_uri,
    sha256_tree,
)

FLOW_NAME = "training-pipeline"
LOCK_MD5_TAG = "grpoflow.lock_md5"
LOCK_FILE = ".dvc/tmp/grpoflow-pipeline.lock"
TELEMETRY_OFF = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}
# DVC's messages for contention with another DVC process: worth a retry.
TRANSIENT_MARKERS = ("Unable to acquire lock", "is busy", "database is locked")


class StageFailed(RuntimeError):
    """A stage command (or DVC on it) failed for a reason a retry will not fix."""


class TransientError(RuntimeError):
    """Worth retrying: DVC's lock was held by another process, or the subprocess did not start."""


class PipelineLocked(RuntimeError):
    """Another pipeline run holds this checkout."""


# --------------------------------------------------------------------------- DVC helpers


def stage_order(root: str | os.PathLike) -> list[str]:
    """Pipeline stages of the repo in dependency order (ties keep their dvc.yaml order)."""
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
    data = yaml.safe_load(path.read_text()) or {}
    return (data.get("stages") or {}).get(stage.split(":")[-1])


def entry_md5(entry: dict[str, Any] | None) -> str:
    return hashlib.md5(json.dumps(entry, sort_keys=True).encode()).hexdigest() if entry else ""


def default_remote(root: str | os.PathLike) -> tuple[str | None, str | None]:
    """(name, url) of the repo's default DVC remote, url made absolute for local folders."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        name = repo.config["core"].get("remote")
        if not name:
            return None, None
        url = repo.config["remote"].get(name, {}).get("url")
    if url and "://" not in url and not os.path.isabs(url):
        url = str((Path(root) / ".dvc" / url).resolve())
    return name, url


def stage_env(root: str | os.PathLike, parent_run_id: str | None, tracking_uri: str) -> dict[str, str]:
    """The environment stages run in: this venv first on PATH, the parent run, the tracking URI."""
    env = {**os.environ}
    for key, value in TELEMETRY_OFF.items():
        env.setdefault(key, value)
    bin_dir = os.path.dirname(sys.executable)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["MLFLOW_TRACKING_URI"] = tracking_uri
    env.pop("GRPOFLOW_PARAMS", None)  # DVC tracks the repo's params.yaml: stages must read that one
    if parent_run_id:
        env[PARENT_ENV] = parent_run_id
    return env


def run_dvc(args: list[str], root: str | os.PathLike, env: dict[str, str]) -> tuple[int, str]:
    """Run `dvc ARGS`, streaming its output (progress bars included); returns (rc, output tail)."""
    cmd = [sys.executable, "-m", "dvc", *args]
    tail: collections.deque[str] = collections.deque(maxlen=60)
    try:
        proc = subprocess.Popen(cmd, cwd=str(root), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as exc:
        raise TransientError(f"could not start {' '.join(cmd)}: {exc}") from exc
    assert proc.stdout is not None
    partial = ""
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode  # chunks split characters
    # Raw chunks, not lines: progress bars redraw with \r and must reach the terminal as they go.
    while chunk := proc.stdout.read1(4096):
        text = decode(chunk)
        sys.stdout.write(text)
        sys.stdout.flush()
        *lines, partial = (partial + text).replace("\r", "\n").split("\n")
        tail.extend(lines)
    tail.append(partial)
    return proc.wait(), "\n".join(line for line in tail if line.strip())


# --------------------------------------------------------------------------- tasks


def _last_line(tail: str, rc: int) -> str:
    """The line of DVC's output worth showing in a one-line status (the exit code if it printed none)."""
    return tail.splitlines()[-1] if tail else str(rc)


def _retry_transient(task, task_run, state) -> bool:  # Prefect's retry_condition_fn signature
    return isinstance(state.data, TransientError)


# No Prefect caching anywhere: dvc.lock is the one cache of stage work (DESIGN.md).
@task(name="dvc-pull", retries=2, retry_delay_seconds=5, retry_condition_fn=_retry_transient, cache_policy=NO_CACHE)
def dvc_pull(root: str, run_id: str, tracking_uri: str) -> str:
    """Fetch outputs recorded in dvc.lock from the default remote, if it holds any."""
    env = stage_env(root, run_id, tracking_uri)
    name, url = default_remote(root)
    if not name:
        return "skipped: no default DVC remote"
    if url and "://" not in url and not (Path(url).is_dir() and any(Path(url).iterdir())):
        return f"skipped: remote '{name}' ({url}) holds no data yet"
    if not (Path(root) / "dvc.lock").is_file():
        return "skipped: no dvc.lock yet"
    rc, tail = run_dvc(["pull", "--allow-missing"], root, env)
    if rc != 0:
        if any(m in tail for m in TRANSIENT_MARKERS):
            raise TransientError(f"dvc pull: {_last_line(tail, rc)}")
        # Not fatal: the stages regenerate what could not be fetched.
        return f"failed (stages will rebuild what is missing): {_last_line(tail, rc)}"
    return f"pulled from '{name}'"


@task(retries=2, retry_delay_seconds=10, retry_condition_fn=_retry_transient, cache_policy=NO_CACHE)
def run_stage(stage: str, root: str, run_id: str, tracking_uri: str) -> dict[str, Any]:
    """`dvc repro --single-item STAGE`; ran or skipped is read off the stage's dvc.lock entry."""
    env = stage_env(root, run_id, tracking_uri)  # built here: the environment is no task parameter
    before = lock_entry(root, stage)
    start = time.time()
    print(f"── stage {stage}: dvc repro --single-item {stage}", flush=True)
    rc, tail = run_dvc(["repro", "--single-item", stage], root, env)
    seconds = round(time.time() - start, 2)
    if rc != 0:
        if any(m in tail for m in TRANSIENT_MARKERS) and "failed to run" not in tail:
            raise TransientError(f"stage '{stage}': {_last_line(tail, rc)}")
        raise StageFailed(f"stage '{stage}' failed (dvc exit {rc}):\n{tail}")
    after = lock_entry(root, stage)
    if after == before:
        status = "skipped"
    elif "is cached - skipping run" in tail:
        status = "restored"  # DVC's run cache had these exact outputs: checked out, not run
    else:
        status = "ran"
    return {"stage": stage, "status": status, "seconds": seconds, "lock_md5": entry_md5(after)}


@task(name="dvc-push", retries=2, retry_delay_seconds=5, retry_condition_fn=_retry_transient, cache_policy=NO_CACHE)
def dvc_push(root: str, run_id: str, tracking_uri: str) -> str:
    env = stage_env(root, run_id, tracking_uri)
    name, _ = default_remote(root)
    if not name:
        return "skipped: no default DVC remote"
    rc, tail = run_dvc(["push"], root, env)
    if rc != 0:
        if any(m in tail for m in TRANSIENT_MARKERS):
            raise TransientError(f"dvc push: {_last_line(tail, rc)}")
        return f"failed: {_last_line(tail, rc)}"
    return f"pushed to '{name}'"


@task(name="lineage", cache_policy=NO_CACHE)
def record_lineage(
    root: str, parent_run_id: str, stages: list[dict[str, Any]], eval_dir: str | None = None
) -> dict[str, str]:
    """dvc.lock, data hashes, per-stage status and the evaluation metrics onto the parent run;
    returns the lineage tags."""
    import mlflow
    from mlflow.entities import Metric

    from components.registry import read_metrics

    client = mlflow.MlflowClient()
    root_p = Path(root)
    lock = root_p / "dvc.lock"
    tags: dict[str, str] = {}
    if lock.is_file():
        tags["dvc_lock_md5"] = file_md5(lock)
        client.log_artifact(parent_run_id, str(lock), "lineage")
    data_dir = root_p / "data"
    data_hashes = {
        k: v for k, v in (sha256_tree(data_dir) if data_dir.is_dir() else {}).items()
        if not k.endswith((".gitignore", ".dvc"))
    }
    client.log_dict(parent_run_id, data_hashes, "lineage/data_sha256.json")
    for path, digest in data_hashes.items():
        tags[f"data_sha256.{path}"] = digest
    for s in stages:
        name = s["stage"]
        tags[f"stage.{name}.status"] = s["status"]
        tags[f"stage.{name}.seconds"] = str(s["seconds"])
        run_id = _stage_run_id(client, parent_run_id, s)
        if run_id:
            s["run_id"] = run_id
            tags[f"stage.{name}.run_id"] = run_id
    client.log_dict(parent_run_id, {"stages": stages}, "lineage/stages.json")
    for key, value in tags.items():
        client.set_tag(parent_run_id, key, value)
    # The evaluation metrics (current outputs, whether evaluate ran or was skipped) and stage
    # durations, so that pipeline runs line up side by side in the MLflow compare view.
    now = int(time.time() * 1000)
    metrics = [Metric(f"stage.{s['stage']}.seconds", float(s["seconds"]), now, 0) for s in stages]
    evaluated = read_metrics(root_p / eval_dir) if eval_dir else {}
    for model, values in evaluated.items():
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics.append(Metric(f"{model}.{key}", float(value), now, 0))
    client.log_batch(parent_run_id, metrics=metrics)
    return tags


def _stage_run_id(client, parent_run_id: str, s: dict[str, Any]) -> str | None:
    """The child run of a stage that ran (created here if the stage logged none), or the
    earlier run that produced a skipped stage's outputs (same dvc.lock entry md5)."""
    stage, lock_md5 = s["stage"], s.get("lock_md5", "")
    exp_ids = [client.get_run(parent_run_id).info.experiment_id]
    if s["status"] == "ran":
        runs = client.search_runs(
            exp_ids,
            f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.`{STAGE_TAG}` = '{stage}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if runs:
            run_id = runs[0].info.run_id
        else:  # a stage without its own tracking still gets its child run
            run_id = client.create_run(
                exp_ids[0], run_name=stage, tags={"mlflow.parentRunId": parent_run_id, STAGE_TAG: stage}
            ).info.run_id
            client.set_terminated(run_id, "FINISHED")
        client.set_tag(run_id, LOCK_MD5_TAG, lock_md5)
        return run_id
    if not lock_md5:
        return None
    runs = client.search_runs(
        exp_ids,
        f"tags.`{STAGE_TAG}` = '{stage}' and tags.`{LOCK_MD5_TAG}` = '{lock_md5}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if runs:
        s["produced_by"] = runs[0].info.run_id
        return runs[0].info.run_id
    s["produced_by"] = "unknown (outputs not produced by a tracked pipeline run)"
    return None


@task(name="register", cache_policy=NO_CACHE)
def register_model(params: Any, lineage: dict[str, str], parent_run_id: str, root: str) -> dict[str, Any]:
    from components.registry import as_dict, register

    return as_dict(register(params, lineage, parent_run_id, root))


@task(name="promote", cache_policy=NO_CACHE)
def promote_model(params: Any, registration: dict[str, Any], root: str) -> dict[str, Any]:
    from components.registry import Registration, as_dict, gate, print_decision

    decision = gate(params, Registration(**registration), root)
    print_decision(decision)
    return as_dict(decision)


# --------------------------------------------------------------------------- flow plumbing


@contextlib.contextmanager
def pipeline_lock(root: str | os.PathLike, timeout: float) -> Iterator[None]:
    """Exclusive per-checkout lock; waits up to `timeout` s, then raises PipelineLocked naming the holder."""
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
        yield
    finally:
        fh.close()  # releases the flock


def apply_overrides(root: str | os.PathLike, overrides: list[str]) -> None:
    """Write `section.key=value` overrides into params.yaml, as `dvc exp run -S` does, so that DVC
    sees them; comments, quoting and layout of the file are kept (ruamel round trip)."""
    if not overrides:
        return
    import io

    from ruamel.yaml import YAML

    path = Path(root) / "params.yaml"
    load_params(path if path.exists() else None, overrides)  # validate all before writing any
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.representer.add_representer(
        type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    data = yaml.load(path.read_text()) if path.exists() else None
    if data is None:
        data = {}
    for text in overrides:
        section, key, value = parse_override(text)
        if data.get(section) is None:
            data[section] = {}
        data[section][key] = value
    buf = io.StringIO()
    yaml.dump(data, buf)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(buf.getvalue())
    os.replace(tmp, path)
    print(f"params.yaml updated: {', '.join(overrides)}", flush=True)


@contextlib.contextmanager
def parent_run(params: Any, root: Path) -> Iterator[str]:
    """The pipeline's MLflow parent run: opened with the static lineage, closed with the outcome."""
    import mlflow
    from mlflow.entities import Param

    exp_id = configure(params, root)
    client = mlflow.MlflowClient()
    tags = {
        **git_state(root),
        **{f"version.{k}": v for k, v in package_versions().items()},
        "prefect.flow_run_id": str(flow_run.id or ""),
        "prefect.flow_run_name": str(flow_run.name or ""),
        "grpoflow.pipeline": FLOW_NAME,
        "repo_root": str(root),
    }
    run = client.create_run(exp_id, run_name=FLOW_NAME, tags=tags)
    run_id = run.info.run_id
    client.log_batch(run_id, params=[Param(k, v) for k, v in flatten(params.to_dict()).items()])
    if (root / "params.yaml").is_file():
        client.log_artifact(run_id, str(root / "params.yaml"), "lineage")
    try:
        yield run_id
    except KeyboardInterrupt:
        client.set_terminated(run_id, "KILLED")
        raise
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    else:
        client.set_terminated(run_id, "FINISHED")


@flow(name=FLOW_NAME, log_prints=True)
def training_pipeline(repo: str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """dvc pull → every dvc.yaml stage in graph order → dvc push → register → promote."""
    root = Path(repo).resolve() if repo else repo_root()
    params = load_params(root / "params.yaml" if (root / "params.yaml").exists() else None)
    with pipeline_lock(root, params.tracking.run_lock_timeout):
        apply_overrides(root, list(overrides or []))
        params = load_params(root / "params.yaml" if (root / "params.yaml").exists() else None)
        with parent_run(params, root) as run_id:
            where = (str(root), run_id, resolve_tracking_uri(params, root))
            pulled = dvc_pull(*where)
            stages: list[dict[str, Any]] = []
            for stage in stage_order(root):
                with failed_stage_recorded(stage, stages, where):
                    stages.append(run_stage.with_options(name=stage, task_run_name=stage)(stage, *where))
            pushed = dvc_push(*where)
            lineage = record_lineage(str(root), run_id, stages, params.evaluate.output_dir)
            registration = decision = None
            if params.register.enabled:
                registration = register_model(params, _version_tags(lineage, run_id), run_id, str(root))
                decision = promote_model(params, registration, str(root))
    return summarize(root, params, run_id, stages, pulled, pushed, registration, decision)


@contextlib.contextmanager
def failed_stage_recorded(stage: str, stages: list[dict[str, Any]], where: tuple[str, str, str]) -> Iterator[None]:
    """On a stage failure, record the stages so far and the failed one on the parent run, then re-raise."""
    try:
        yield
    except Exception:
        record_lineage(where[0], where[1], [*stages, {"stage": stage, "status": "failed", "seconds": 0.0}])
        raise


def _version_tags(lineage: dict[str, str], run_id: str) -> dict[str, str]:
    """What a model version carries from the pipeline run: commit, dirty flag, dvc.lock md5, ids."""
    import mlflow

    tags = mlflow.MlflowClient().get_run(run_id).data.tags
    keep = {k: v for k, v in tags.items() if k in ("git_commit", "git_dirty", "prefect.flow_run_id")}
    keep.update({k: v for k, v in lineage.items() if k == "dvc_lock_md5" or k.startswith("data_sha256.")})
    return keep


def summarize(root, params, run_id, stages, pulled, pushed, registration, decision) -> dict[str, Any]:
    import mlflow

    from components.registry import read_metrics

    exp_id = mlflow.MlflowClient().get_run(run_id).info.experiment_id
    return {
        "run_id": run_id,
        "experiment_id": exp_id,
        "tracking_uri": resolve_tracking_uri(params, root),
        "pull": pulled,
        "push": pushed,
        "stages": stages,
        "metrics": read_metrics(root / params.evaluate.output_dir),
        "registration": registration,
        "decision": decision,
    }


# --------------------------------------------------------------------------- CLI


def format_summary(s: dict[str, Any], ui: str = "http://127.0.0.1:5000") -> str:
    lines = ["", "grpoflow run summary"]
    lines.append(f"  dvc pull: {s['pull']}")
    for st in s["stages"]:
        extra = f" (outputs from run {st['produced_by']})" if st.get("produced_by") else ""
        lines.append(f"  {st['stage']:<10} {st['status']:<8} {st['seconds']:>7.1f} s{extra}")
    lines.append(f"  dvc push: {s['push']}")
    for model, m in s["metrics"].items():
        keys = [k for k in ("accuracy_strict", "accuracy_flexible", "format_rate", "n") if k in m]
        if keys:
            lines.append(f"  eval {model:<6} " + "  ".join(f"{k}={m[k]:.4g}" for k in keys))
    reg, dec = s.get("registration"), s.get("decision")
    if reg:
        what = "registered" if reg["created"] else "already registered (dvc.lock unchanged), no new version"
        lines.append(f"  model: {reg['name']} v{reg['version']} {what}")
    else:
        lines.append("  model: not registered (register.enabled is false)")
    if dec:
        lines.append(f"  promotion: {dec['decision']} — {dec['reason']}")
    lines.append(f"  mlflow: {s['tracking_uri']} run {s['run_id']}")
    lines.append(f"  ui: `grpoflow ui`, then {ui}/#/experiments/{s['experiment_id']}/runs/{s['run_id']}")
    return "\n".join(lines)


def start_prefect_server() -> threading.Thread | None:
    """Boot Prefect's temporary server (used when PREFECT_API_URL is unset) in the background.

    Its module is imported here, in the caller's thread: imports hold the GIL and would not
    overlap anyway; the server's own start-up (a separate process, seconds) then overlaps
    with MLflow's and DVC's imports in the caller."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer

    # 120 s: Prefect's 20 s default start-up timeout is too short on 2 busy cores.
    thread = threading.Thread(target=SubprocessASGIServer().start, kwargs={"timeout": 120}, daemon=True)
    thread.start()
    return thread


def prefect_env_defaults() -> None:
    """Telemetry off for this process and everything it starts (values already set win)."""
    for key, value in TELEMETRY_OFF.items():
        os.environ.setdefault(key, value)


def cli_run(args: argparse.Namespace) -> int:
    """`grpoflow run [-S section.key=value ...]`: run the flow here and print a summary."""
    prefect_env_defaults()
    root = repo_root()
    if args.params and Path(args.params).resolve() != (root / "params.yaml").resolve():
        print("error: --params: the pipeline runs on the repo's params.yaml, which DVC tracks; "
              "use -S section.key=value to change values", file=sys.stderr)
        return 2
    if not (root / "dvc.yaml").is_file():
        print(f"error: {root}: no dvc.yaml here; run grpoflow from the repository", file=sys.stderr)
        return 2
    try:
        load_params(root / "params.yaml" if (root / "params.yaml").exists() else None, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    booting = start_prefect_server()
    import dvc.repo  # noqa: F401
    import mlflow  # noqa: F401

    if booting is not None:
        booting.join()
    try:
        summary = training_pipeline(repo=str(root), overrides=list(args.overrides))
    except PipelineLocked as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except (StageFailed, TransientError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    from pipelines.cli import main as grpoflow

    return grpoflow(["run", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
