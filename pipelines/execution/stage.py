"""One stage anywhere the image runs: `grpoflow stage NAME --commit SHA`, and the `grpoflow-stage`
flow that infra/prefect.yaml's stage deployments run, the stage a parameter (pipelines/execution/placement.py
submits to them).

    grpoflow stage sft --commit 3f2c1ab --params-file params.yaml --lock-file dvc.lock \\
        --remote /shared/dvc-remote --parent-run-id RUN_ID

In a clean working copy of the code at SHA (a git clone of the checkout it starts in, or, in an
image without .git, a copy of the image's code, whose commit must be SHA) with the pipeline's
params.yaml and dvc.lock, it pulls the outputs of the stages this one depends on from the DVC
remote, runs `dvc repro --single-item NAME --pull` (DVC's run cache restores a run it knows),
pushes the outputs and the run cache, and returns the stage's dvc.lock entry and its MLflow run
(a child of the pipeline's parent run on the shared tracking server), whose tags record the
working copy, host and process it ran in and whose artifact `stage_result.json` holds the result.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from prefect import flow

from components.common.errors import GrpoflowError, InputError
from components.common.files import repo_root, write_text
from components.common.tracking import STAGE_TAG, TAG_PREFIX
from pipelines.execution import dvc_ops
from pipelines.execution.dvc_ops import (
    StageFailed,
    entry_md5,
    lock_entry,
    run_dvc,
    stage_env,
    stage_status,
    upstream_stages,
)
from pipelines.execution.gitrepo import own_workdir, working_copy
from pipelines.execution.services import service_env_defaults
from pipelines.handoff import failure_message

STAGE_FLOW = "grpoflow-stage"
RESULT_ARTIFACT = "stage_result.json"


class StageSetupError(GrpoflowError):
    """The working copy for a stage could not be set up (its DVC remote)."""


def _stage_run_id(parent_run_id: str, stage: str, since_ms: int, status: str) -> str:
    """The MLflow run the stage opened in this invocation, or one made here for a restored stage."""
    import mlflow

    client = mlflow.MlflowClient()
    exp_id = client.get_run(parent_run_id).info.experiment_id
    runs = client.search_runs(
        [exp_id], f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.`{STAGE_TAG}` = '{stage}' "
        f"and attributes.start_time >= {since_ms}", order_by=["attributes.start_time DESC"], max_results=1,
    )
    if runs:
        return runs[0].info.run_id
    run = client.create_run(exp_id, run_name=stage, tags={"mlflow.parentRunId": parent_run_id, STAGE_TAG: stage,
                                                          f"{TAG_PREFIX}status": status})
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def check_parent_run(parent_run_id: str, tracking_uri: str) -> None:
    """InputError (exit 2) when the tracking server has no run `parent_run_id`: the stage's run would
    be made a child of nothing, and only after the stage ran."""
    import mlflow
    from mlflow.exceptions import MlflowException

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    try:
        mlflow.MlflowClient().get_run(parent_run_id)
    except MlflowException as exc:
        if not any(code in str(exc.error_code) for code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")):
            raise
        raise InputError(f"--parent-run-id {parent_run_id}: no such run in {mlflow.get_tracking_uri()}; give the "
                         "pipeline's MLflow parent run (its run id, as `grpoflow run` prints it)") from None


def run_in_working_copy(
    stage: str,
    commit: str,
    params_yaml: str,
    dvc_lock: str,
    remote_url: str,
    parent_run_id: str,
    tracking_uri: str,
    *,
    source: str | os.PathLike | None = None,
    workdir: str | os.PathLike | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    """Run one stage in a clean working copy; returns {stage, status, seconds, lock_entry, lock_md5,
    run_id, workdir, host, pid}."""
    source = Path(source or repo_root()).resolve()
    start = time.time()
    # Removed afterwards (unless keep) only as far as it was made here: a user's folder is never deleted.
    with own_workdir(workdir, f"grpoflow-stage-{stage}-", keep) as work:
        check_parent_run(parent_run_id, tracking_uri)  # before the working copy: a wrong id leaves nothing
        working_copy(source, commit, work)
        write_text(work / "params.yaml", params_yaml)
        if dvc_lock:
            write_text(work / "dvc.lock", dvc_lock)
        env = stage_env(parent_run_id, tracking_uri)
        rc, tail = run_dvc(["remote", "add", "--local", "--default", "--force", "grpoflow-shared", remote_url],
                           work, env)
        if rc != 0:
            raise StageSetupError(f"DVC remote {remote_url}: {tail[-300:]}")
        upstream = upstream_stages(work, stage)
        if upstream and dvc_lock:
            rc, tail = run_dvc(["pull", "--allow-missing", *upstream], work, env)
            if rc != 0:
                raise StageFailed(f"stage '{stage}': pulling its inputs ({', '.join(upstream)}) failed:\n{tail}")
        before = lock_entry(work, stage)
        rc, tail = run_dvc(["repro", "--single-item", stage, "--pull"], work, env)
        if rc != 0:
            raise StageFailed(failure_message(stage, rc, tail, f" in {work}"))
        status = stage_status(tail, before, lock_entry(work, stage))
        rc, tail = dvc_ops.push(work, env, [stage])
        if rc != 0:
            raise StageFailed(f"stage '{stage}': dvc push failed:\n{tail}")
        entry = lock_entry(work, stage)
        import mlflow

        run_id = _stage_run_id(parent_run_id, stage, int(start * 1000), status)
        result = {
            "stage": stage, "status": status, "seconds": round(time.time() - start, 2), "lock_entry": entry,
            "lock_md5": entry_md5(entry), "run_id": run_id, "workdir": str(work), "host": socket.gethostname(),
            "pid": os.getpid(), "commit": commit,
        }
        client = mlflow.MlflowClient()
        for key in ("workdir", "host", "pid", "commit"):
            client.set_tag(run_id, f"{TAG_PREFIX}runner.{key}", str(result[key]))
        client.log_dict(run_id, result, RESULT_ARTIFACT)
        return result


@flow(name=STAGE_FLOW, log_prints=True, flow_run_name="{stage}@{commit}")
def stage_flow(
    stage: str, commit: str, params_yaml: str, dvc_lock: str, remote_url: str, parent_run_id: str, tracking_uri: str
) -> dict[str, Any]:
    """One dvc.yaml stage in a clean working copy of `commit` (what the stage deployments run)."""
    service_env_defaults()  # MLflow gives up on a server that does not answer within the budget
    return run_in_working_copy(stage, commit, params_yaml, dvc_lock, remote_url, parent_run_id, tracking_uri)


def _read(path: str, option: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{option} {path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None


def cli_stage(args: argparse.Namespace) -> int:
    """`grpoflow stage NAME --commit SHA ...`: run one stage here; prints its result as JSON."""
    result = run_in_working_copy(
        args.name, args.commit, _read(args.params_file, "--params-file"),
        _read(args.lock_file, "--lock-file") if args.lock_file else "", args.remote, args.parent_run_id,
        args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", ""), workdir=args.workdir, keep=args.keep,
    )
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0
