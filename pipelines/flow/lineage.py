"""The pipeline's MLflow parent run and the lineage it records.

    run_name(root, overrides)          what a run is called in MLflow and Prefect: the short commit and
                                       the overrides (`3f2a1bc grpo.trainer.beta=0.0`), `rerun` added when no
                                       stage ran; flow_run_name() is the same for Prefect's decorator
    parent_run(params, root, overrides)  context manager: marks runs whose process is gone KILLED, opens
                                       the parent run with the static lineage (git commit and dirty flag,
                                       all params, package versions, the Prefect flow run, host and pid),
                                       yields a PipelineRun, closes it with the outcome
    record(run, stages, params)        at the end: dvc.lock (artifact and md5), sha256 of the data files
                                       (tags, and the splits as MLflow datasets), per stage its status,
                                       seconds and MLflow run id, and the evaluation metrics (accuracy
                                       first, so compare views lead with it); returns the lineage tags
    failure_recorded(stage, stages, run, describe)   context manager: a failing stage is recorded, its
                                       error line tagged (grpoflow.error) and described, then re-raised
    version_tags(lineage, run)         what a registered model version carries from the pipeline run
                                       (the base model's origin included: lineage.base.*)
    lineage_versions(params)           package versions for the `grpoflow.version.*` tags, vLLM's the one
                                       evaluation uses (its own venv on CPU), not this venv's

The vLLM version tag is first the vLLM the evaluate stage would use (importable here, else
`evaluate.vllm_python`'s); `record` then sets it to the version the evaluation reports name, the
vLLM that produced the numbers (and `grpoflow.eval.backend` to the backends they ran on).

For a skipped stage the run id is that of the earlier run that produced its current outputs,
found by the md5 of its dvc.lock entry (tag `grpoflow.lock_md5` on stage runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from components.common.files import md5_file, sha256_tree
from components.common.params import Params
from components.common.tracking import (
    ERROR_TAG,
    HOST_TAG,
    MAX_TAG_CHARS,
    PID_TAG,
    STAGE_TAG,
    TAG_PREFIX,
    configure,
    data_splits,
    flatten,
    log_datasets,
    metric_key,
    package_versions,
    process_tags,
    resolve_tracking_uri,
)
from components.evaluation.reports import read_metrics
from pipelines.execution.gitrepo import git_state
from pipelines.execution.group_watchdog import proc_stat
from pipelines.execution.vllm_version import vllm_engine_version
from pipelines.handoff import STAGE_ATTR, PipelineRun, StageResult, interrupted_stage

FLOW_NAME = "training-pipeline"
# Run tags (all under TAG_PREFIX). On stage runs: the md5 of the stage's dvc.lock entry.
LOCK_MD5_TAG = f"{TAG_PREFIX}lock_md5"
# On the parent run:
PIPELINE_TAG = f"{TAG_PREFIX}pipeline"
FLOW_RUN_TAG = f"{TAG_PREFIX}prefect.flow_run_id"
DVC_LOCK_TAG = f"{TAG_PREFIX}dvc_lock_md5"
DATA_TAG = f"{TAG_PREFIX}data_sha256."
BASE_TAG = f"{TAG_PREFIX}base."  # where models/base came from (grpoflow_source.json): name, GGUF sha256, ...
BASE_SOURCE = "grpoflow_source.json"
STAGES_TAG = f"{TAG_PREFIX}stages."  # grpoflow.stages.<stage>.status | seconds | run_id
# On a run found RUNNING whose process is gone: why it was marked KILLED.
KILLED_TAG = f"{TAG_PREFIX}killed"
VLLM_VERSION_TAG = f"{TAG_PREFIX}version.vllm"
EVAL_BACKEND_TAG = f"{TAG_PREFIX}eval.backend"
STAGE_SECONDS = "stage_seconds"  # metric stage_seconds/<stage>: after the accuracies in compare views
RERUN = "rerun"


def run_name(root: str | Path, overrides: list[str] | tuple[str, ...] = (), nothing_ran: bool = False) -> str:
    """`<short commit> <overrides...>`, plus `rerun` when no stage ran: what a run is called in MLflow
    and Prefect, so that a list of runs says what each one changed."""
    commit = git_state(root)["git_commit"]
    return " ".join([commit[:7] if commit != "unknown" else "no-git", *overrides, *([RERUN] if nothing_ran else [])])


def flow_run_name() -> str:
    """run_name for Prefect's `flow_run_name` (called in the flow run's context, before the body)."""
    from prefect.runtime import flow_run

    from components.common.tracking import repo_root

    return run_name(repo_root(), list((flow_run.parameters or {}).get("overrides") or []))


def _alive(pid: int) -> bool:
    """Whether a process with this pid exists here (and is not a zombie waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    fields = proc_stat(pid)
    return fields is None or fields[0] != "Z"


def close_stale_runs(client: Any, exp_id: str, by_run_id: str) -> list[str]:
    """Mark KILLED (with a `grpoflow.killed` tag saying why) every RUNNING run of the experiment that
    a process of this host opened and that process is gone: a pipeline or stage killed before it
    could close its run. Runs of other hosts are left alone (their processes cannot be checked).
    Returns a line per run it closed."""
    host = socket.gethostname()
    runs = client.search_runs([exp_id], f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'",
                              max_results=1000)
    closed = []
    for r in runs:
        pid = r.data.tags.get(PID_TAG, "")
        if r.info.run_id == by_run_id or not pid.isdigit() or _alive(int(pid)):
            continue
        reason = f"process {pid} on {host} was gone when pipeline run {by_run_id} started"
        client.set_tag(r.info.run_id, KILLED_TAG, reason)
        client.set_terminated(r.info.run_id, "KILLED")
        closed.append(f"MLflow run {r.info.run_name} ({r.info.run_id}) marked KILLED: {reason}")
    return closed


def close_interrupted(client: Any, exp_id: str, run_id: str, stage: str) -> None:
    """An interrupted run's MLflow runs marked KILLED: its stages' runs still RUNNING (the stage process
    stopped before it could close its own), then the parent. Best effort: the tracking server may be
    what went away."""
    reason = f"interrupted during {stage or 'the pipeline run'}"
    try:
        running = client.search_runs(
            [exp_id], f"attributes.status = 'RUNNING' and tags.`mlflow.parentRunId` = '{run_id}'"
        )
        for r in [*running, client.get_run(run_id)]:
            client.set_tag(r.info.run_id, KILLED_TAG, reason)
            client.set_terminated(r.info.run_id, "KILLED")
    except Exception as exc:  # noqa: BLE001 (the interrupt is what the user hears about)
        print(f"warning: MLflow runs not marked KILLED ({type(exc).__name__}: {str(exc)[:200]})", flush=True)


@contextlib.contextmanager
def parent_run(params: Params, root: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Iterator[PipelineRun]:
    """The pipeline's MLflow parent run: opened with the static lineage, closed with the outcome."""
    import mlflow
    from mlflow.entities import Param
    from prefect.exceptions import ExternalSignal
    from prefect.runtime import flow_run

    root = Path(root)
    exp_id = configure(params, root)
    client = mlflow.MlflowClient()
    tags = {
        **{f"{TAG_PREFIX}{k}": v for k, v in git_state(root).items()},
        **{f"{TAG_PREFIX}version.{k}": v for k, v in lineage_versions(params).items()},
        FLOW_RUN_TAG: str(flow_run.id or ""),
        f"{TAG_PREFIX}prefect.flow_run_name": str(flow_run.name or ""),
        PIPELINE_TAG: FLOW_NAME,
        f"{TAG_PREFIX}repo_root": str(root),
        **process_tags(),
    }
    run = client.create_run(exp_id, run_name=run_name(root, overrides), tags=tags)
    run_id = run.info.run_id
    try:
        for line in close_stale_runs(client, exp_id, run_id):
            print(line, flush=True)
        client.log_batch(run_id, params=[Param(k, v) for k, v in flatten(params.to_dict()).items()])
        if (root / "params.yaml").is_file():
            client.log_artifact(run_id, str(root / "params.yaml"), "lineage")
        yield PipelineRun(str(root), run_id, resolve_tracking_uri(params, root))
    except (KeyboardInterrupt, ExternalSignal) as exc:  # Ctrl-C; SIGTERM (Prefect's TerminationSignal)
        close_interrupted(client, exp_id, run_id, interrupted_stage(exc))
        raise
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    else:
        client.set_terminated(run_id, "FINISHED")


def lineage_versions(params: Params | None) -> dict[str, str]:
    """package_versions(), with vLLM's taken from the engine evaluation uses (found as the evaluate
    stage finds it: under the working directory's checkout, then this code's)."""
    versions = package_versions()
    if "vllm" in versions and params is not None:
        versions["vllm"] = vllm_engine_version(params.evaluate.vllm_python)
    return versions


def engine_tags(evaluated: dict[str, dict[str, Any]]) -> dict[str, str]:
    """What the evaluation reports say produced their numbers: the backends, and vLLM's version.

    >>> engine_tags({"sft": {"backend": "vllm", "vllm_version": "0.32.0"},
    ...              "grpo": {"backend": "vllm", "vllm_version": "0.32.0"}})
    {'grpoflow.eval.backend': 'vllm', 'grpoflow.version.vllm': '0.32.0'}
    >>> engine_tags({"sft": {"backend": "transformers"}})
    {'grpoflow.eval.backend': 'transformers'}
    """
    backends = sorted({str(m["backend"]) for m in evaluated.values() if m.get("backend")})
    versions = sorted({str(m["vllm_version"]) for m in evaluated.values() if m.get("vllm_version")})
    tags = {EVAL_BACKEND_TAG: ",".join(backends)} if backends else {}
    if versions:
        tags[VLLM_VERSION_TAG] = ",".join(versions)
    return tags


def record(run: PipelineRun, stages: list[StageResult], params: Params | None = None) -> dict[str, str]:
    """dvc.lock, data hashes (and the splits as datasets), per-stage status and the evaluation metrics
    onto the parent run; returns the lineage tags."""
    import mlflow
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()
    root = Path(run.root)
    lock = root / "dvc.lock"
    tags: dict[str, str] = {}
    if lock.is_file():
        tags[DVC_LOCK_TAG] = md5_file(lock)
        client.log_artifact(run.run_id, str(lock), "lineage")
    data_dir = root / "data"
    data_hashes = {
        k: v for k, v in (sha256_tree(data_dir) if data_dir.is_dir() else {}).items()
        if not k.endswith((".gitignore", ".dvc"))
    }
    client.log_dict(run.run_id, data_hashes, "lineage/data_sha256.json")
    for path, digest in data_hashes.items():
        tags[f"{DATA_TAG}{path}"] = digest
    for s in stages:
        tags[f"{STAGES_TAG}{s.stage}.status"] = s.status
        tags[f"{STAGES_TAG}{s.stage}.seconds"] = str(s.seconds)
        run_id = _stage_run_id(client, run.run_id, s)
        if run_id:
            s.run_id = run_id
            tags[f"{STAGES_TAG}{s.stage}.run_id"] = run_id
    client.log_dict(run.run_id, {"stages": [s.as_dict() for s in stages]}, "lineage/stages.json")
    reports = read_metrics(root / params.evaluate.output_dir) if params is not None else {}
    source = root / (params.model.base_dir if params is not None else "models/base") / BASE_SOURCE
    if source.is_file():  # the base model's origin: for a GGUF import, the file's sha256
        for key, value in json.loads(source.read_text()).items():
            tags[f"{BASE_TAG}{key}"] = str(value)
    for key, value in {**tags, **engine_tags(reports)}.items():
        client.set_tag(run.run_id, key, value)
    if params is not None:
        log_datasets(run.run_id, data_splits(params, train="training", test="evaluation"))
    # The evaluation metrics (current outputs, whether evaluate ran or was skipped), then the stage
    # durations, so that pipeline runs line up side by side in the MLflow compare view. MLflow's
    # compare page starts its parallel-coordinates plot on the first metric a run logged: accuracy.
    now = int(time.time() * 1000)
    evaluated = _headline_first(reports, params) if params is not None else []
    metrics = [Metric(metric_key(model, key), value, now, 0) for model, key, value in evaluated]
    metrics += [Metric(metric_key(STAGE_SECONDS, s.stage), float(s.seconds), now, 0) for s in stages]
    client.log_batch(run.run_id, metrics=metrics)
    return tags


def _headline_first(evaluated: dict[str, dict[str, Any]], params: Params) -> list[tuple[str, str, float]]:
    """(model, key, value) of the numeric evaluation metrics: the primary metric of every model first
    (the registered model's first), then the other accuracy, then the rest."""
    first = [params.evaluate.primary_metric, "accuracy_strict", "accuracy_flexible"]
    keys = list(dict.fromkeys(first))
    models = sorted(evaluated, key=lambda m: m != params.register.model_stage)
    numbers = [
        (model, key, float(value)) for model in models for key, value in evaluated[model].items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    ]
    return sorted(numbers, key=lambda t: keys.index(t[1]) if t[1] in keys else len(keys))


def _latest_run(client, exp_ids: list[str], filter_string: str):
    runs = client.search_runs(exp_ids, filter_string, order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def _stage_run_id(client, parent_run_id: str, s: StageResult) -> str | None:
    """The child run of a stage that ran (created here if the stage logged none), or the
    earlier run that produced a skipped stage's outputs (same dvc.lock entry md5)."""
    stage, lock_md5 = s.stage, s.lock_md5
    exp_ids = [client.get_run(parent_run_id).info.experiment_id]
    if s.status == "ran":
        found = _latest_run(client, exp_ids,
                            f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.`{STAGE_TAG}` = '{stage}'")
        if found:
            run_id = found.info.run_id
        else:  # a stage without its own tracking still gets its child run
            run_id = client.create_run(
                exp_ids[0], run_name=stage, tags={"mlflow.parentRunId": parent_run_id, STAGE_TAG: stage}
            ).info.run_id
            client.set_terminated(run_id, "FINISHED")
        client.set_tag(run_id, LOCK_MD5_TAG, lock_md5)
        return run_id
    if not lock_md5:
        return None
    found = _latest_run(client, exp_ids, f"tags.`{STAGE_TAG}` = '{stage}' and tags.`{LOCK_MD5_TAG}` = '{lock_md5}'")
    s.produced_by = found.info.run_id if found else "unknown (outputs not produced by a tracked pipeline run)"
    return found.info.run_id if found else None


@contextlib.contextmanager
def failure_recorded(
    stage: str, stages: list[StageResult], run: PipelineRun,
    describe: Callable[[PipelineRun, list[StageResult], BaseException], object] | None = None,
) -> Iterator[None]:
    """On a stage failure, record the stages so far and the failed one on the parent run, tag it with
    the error's first line (ERROR_TAG: the failed stage's own error line, pipelines/handoff.py
    failure_message), let `describe` write the run's description, then re-raise."""
    try:
        yield
    except BaseException as exc:
        if not isinstance(exc, Exception):  # Ctrl-C or SIGTERM: marked, recorded by parent_run
            setattr(exc, STAGE_ATTR, stage)
            raise
        done = [*stages, StageResult(stage, "failed")]
        record(run, done)
        import mlflow

        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        mlflow.MlflowClient().set_tag(run.run_id, ERROR_TAG, first[:MAX_TAG_CHARS])
        if describe is not None:
            try:
                describe(run, done, exc)
            except Exception as why:  # noqa: BLE001 (the stage's error is the one to raise)
                print(f"warning: the failed run's description was not written: {why}", flush=True)
        raise


def version_tags(lineage: dict[str, str], run: PipelineRun) -> dict[str, str]:
    """What a model version carries from the pipeline run, as `lineage.*` version tags: commit,
    dirty flag, dvc.lock md5, data hashes and the Prefect flow run."""
    import mlflow

    from pipelines.registry.register import LINEAGE

    tags = {**mlflow.MlflowClient().get_run(run.run_id).data.tags, **lineage}
    wanted = (f"{TAG_PREFIX}git_commit", f"{TAG_PREFIX}git_dirty", FLOW_RUN_TAG, DVC_LOCK_TAG)
    keep = {k: v for k, v in tags.items() if k in wanted or k.startswith((DATA_TAG, BASE_TAG))}
    return {LINEAGE + k.removeprefix(TAG_PREFIX).replace("prefect.", "prefect_"): v for k, v in keep.items()}
