"""The pipeline's MLflow parent run and the lineage it records.

    parent_run(params, root)           context manager: opens the parent run with the static lineage
                                       (git commit and dirty flag, all params, package versions, the
                                       Prefect flow run), yields a PipelineRun, closes it with the outcome
    record(run, stages, eval_dir)      at the end: dvc.lock (artifact and md5), sha256 of the data
                                       files, per stage its status, seconds and MLflow run id, and the
                                       evaluation metrics; returns the lineage tags
    failure_recorded(stage, stages, run)   context manager: a failing stage is recorded, then re-raised
    version_tags(lineage, run)         what a registered model version carries from the pipeline run

For a skipped stage the run id is that of the earlier run that produced its current outputs,
found by the md5 of its dvc.lock entry (tag `grpoflow.lock_md5` on stage runs).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.files import md5_file, sha256_tree
from components.reports import read_metrics
from components.tracking import (
    STAGE_TAG,
    TAG_PREFIX,
    configure,
    flatten,
    git_state,
    metric_key,
    package_versions,
    resolve_tracking_uri,
)

FLOW_NAME = "training-pipeline"
# Run tags (all under TAG_PREFIX). On stage runs: the md5 of the stage's dvc.lock entry.
LOCK_MD5_TAG = f"{TAG_PREFIX}lock_md5"
# On the parent run:
PIPELINE_TAG = f"{TAG_PREFIX}pipeline"
FLOW_RUN_TAG = f"{TAG_PREFIX}prefect.flow_run_id"
DVC_LOCK_TAG = f"{TAG_PREFIX}dvc_lock_md5"
DATA_TAG = f"{TAG_PREFIX}data_sha256."
STAGES_TAG = f"{TAG_PREFIX}stages."  # grpoflow.stages.<stage>.status | seconds | run_id


@dataclass(frozen=True)
class PipelineRun:
    """What every task of one pipeline run needs: where the checkout is and where it is tracked."""

    root: str
    run_id: str
    tracking_uri: str


@contextlib.contextmanager
def parent_run(params: Any, root: str | Path) -> Iterator[PipelineRun]:
    """The pipeline's MLflow parent run: opened with the static lineage, closed with the outcome."""
    import mlflow
    from mlflow.entities import Param
    from prefect.runtime import flow_run

    root = Path(root)
    exp_id = configure(params, root)
    client = mlflow.MlflowClient()
    tags = {
        **{f"{TAG_PREFIX}{k}": v for k, v in git_state(root).items()},
        **{f"{TAG_PREFIX}version.{k}": v for k, v in package_versions().items()},
        FLOW_RUN_TAG: str(flow_run.id or ""),
        f"{TAG_PREFIX}prefect.flow_run_name": str(flow_run.name or ""),
        PIPELINE_TAG: FLOW_NAME,
        f"{TAG_PREFIX}repo_root": str(root),
    }
    run = client.create_run(exp_id, run_name=FLOW_NAME, tags=tags)
    run_id = run.info.run_id
    client.log_batch(run_id, params=[Param(k, v) for k, v in flatten(params.to_dict()).items()])
    if (root / "params.yaml").is_file():
        client.log_artifact(run_id, str(root / "params.yaml"), "lineage")
    try:
        yield PipelineRun(str(root), run_id, resolve_tracking_uri(params, root))
    except KeyboardInterrupt:
        client.set_terminated(run_id, "KILLED")
        raise
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    else:
        client.set_terminated(run_id, "FINISHED")


def record(run: PipelineRun, stages: list[dict[str, Any]], eval_dir: str | None = None) -> dict[str, str]:
    """dvc.lock, data hashes, per-stage status and the evaluation metrics onto the parent run;
    returns the lineage tags."""
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
        name = s["stage"]
        tags[f"{STAGES_TAG}{name}.status"] = s["status"]
        tags[f"{STAGES_TAG}{name}.seconds"] = str(s["seconds"])
        run_id = _stage_run_id(client, run.run_id, s)
        if run_id:
            s["run_id"] = run_id
            tags[f"{STAGES_TAG}{name}.run_id"] = run_id
    client.log_dict(run.run_id, {"stages": stages}, "lineage/stages.json")
    for key, value in tags.items():
        client.set_tag(run.run_id, key, value)
    # The evaluation metrics (current outputs, whether evaluate ran or was skipped) and stage
    # durations, so that pipeline runs line up side by side in the MLflow compare view.
    now = int(time.time() * 1000)
    metrics = [Metric(metric_key(s["stage"], "seconds"), float(s["seconds"]), now, 0) for s in stages]
    evaluated = read_metrics(root / eval_dir) if eval_dir else {}
    for model, values in evaluated.items():
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics.append(Metric(metric_key(model, key), float(value), now, 0))
    client.log_batch(run.run_id, metrics=metrics)
    return tags


def _latest_run(client, exp_ids: list[str], filter_string: str):
    runs = client.search_runs(exp_ids, filter_string, order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def _stage_run_id(client, parent_run_id: str, s: dict[str, Any]) -> str | None:
    """The child run of a stage that ran (created here if the stage logged none), or the
    earlier run that produced a skipped stage's outputs (same dvc.lock entry md5)."""
    stage, lock_md5 = s["stage"], s.get("lock_md5", "")
    exp_ids = [client.get_run(parent_run_id).info.experiment_id]
    if s["status"] == "ran":
        found = _latest_run(client, exp_ids, f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.`{STAGE_TAG}` = '{stage}'")
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
    s["produced_by"] = found.info.run_id if found else "unknown (outputs not produced by a tracked pipeline run)"
    return found.info.run_id if found else None


@contextlib.contextmanager
def failure_recorded(stage: str, stages: list[dict[str, Any]], run: PipelineRun) -> Iterator[None]:
    """On a stage failure, record the stages so far and the failed one on the parent run, then re-raise."""
    try:
        yield
    except Exception:
        record(run, [*stages, {"stage": stage, "status": "failed", "seconds": 0.0}])
        raise


def version_tags(lineage: dict[str, str], run: PipelineRun) -> dict[str, str]:
    """What a model version carries from the pipeline run, as `lineage.*` version tags: commit,
    dirty flag, dvc.lock md5, data hashes and the Prefect flow run."""
    import mlflow

    from components.registry import LINEAGE

    tags = {**mlflow.MlflowClient().get_run(run.run_id).data.tags, **lineage}
    wanted = (f"{TAG_PREFIX}git_commit", f"{TAG_PREFIX}git_dirty", FLOW_RUN_TAG, DVC_LOCK_TAG)
    keep = {k: v for k, v in tags.items() if k in wanted or k.startswith(DATA_TAG)}
    return {LINEAGE + k.removeprefix(TAG_PREFIX).replace("prefect.", "prefect_"): v for k, v in keep.items()}
