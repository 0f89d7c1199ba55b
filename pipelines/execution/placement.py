"""Stage placement: where each dvc.yaml stage runs (params `placement.<stage>`) and how the flow
hands a stage to a work pool.

`local` runs the stage in the flow's checkout, as `dvc repro --single-item` in a subprocess.
`process`, `docker` or `kubernetes` submit it with Prefect's `run_deployment` to that pool kind's stage
deployment of infra/prefect.yaml, the stage a parameter (`grpoflow-stage/stage-process`; on docker and
kubernetes `grpoflow-stage/stage-<kind>-cpu` or `-gpu`, as the file's `stage_resources` says for the
stage), and wait: a worker of that pool runs pipelines/execution/stage.py in a clean working copy of the
checkout's commit, with the flow's params.yaml and dvc.lock. What travels: code by git commit (or the
image of that commit), params and the lock as parameters, data and models through the DVC remote
(outputs and run cache), metrics and the stage's result through the shared MLflow server. The stage's
dvc.lock entry comes back and is merged into this checkout's dvc.lock, and its outputs are pulled, so
lineage, skip detection and registration work as in the local mode. Credentials come from each pool's
environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.common.errors import ConfigError
from components.common.params import Params
from pipelines.execution import dvc_ops
from pipelines.execution.dvc_ops import StageFailed, default_remote, entry_md5, stage_env
from pipelines.execution.gitrepo import changed_files, head_commit
from pipelines.handoff import PipelineRun, StageResult

PREFECT_FILE = "infra/prefect.yaml"
DEVICE_CLASSES = ("cpu", "gpu")  # the values of its stage_resources: the image and resources of a container


def placements(params: Params) -> dict[str, str]:
    """{stage: placement} of every stage placed on a work pool (the `local` ones left out)."""
    return {stage: kind for stage, kind in vars(params.placement).items() if kind != "local"}


def stage_deployment(stage: str, kind: str, root: str | Path) -> str:
    """The deployment (of the `grpoflow-stage` flow) that runs `stage` on a `kind` pool: `stage-process`, or
    `stage-<kind>-<device class>` with the class infra/prefect.yaml's `stage_resources` gives the stage."""
    if kind == "process":
        return "stage-process"
    import yaml

    path = Path(root) / PREFECT_FILE
    try:
        resources = ((yaml.safe_load(path.read_text()) or {}).get("definitions") or {}).get("stage_resources") or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"placement.{stage}={kind}: {path} cannot be read ({exc.__class__.__name__}); "
                          "the container of a stage comes from its stage_resources") from None
    device = resources.get(stage)
    if device not in DEVICE_CLASSES:
        raise ConfigError(f"placement.{stage}={kind}: {PREFECT_FILE} gives stage '{stage}' no device class; "
                          f"add `{stage}: cpu` or `{stage}: gpu` under definitions.stage_resources")
    return f"stage-{kind}-{device}"


def check_placement(params: Params, root: str | Path, tracking_uri: str) -> None:
    """Before anything runs: a stage placed on a pool needs a shared tracking server, a remote every
    pool can reach, committed code (a pool runs the commit, not this working tree), and on docker and
    kubernetes a device class."""
    placed = placements(params)
    if not placed:
        return
    where = ", ".join(f"{s} on {k}" for s, k in placed.items())
    if not tracking_uri.startswith(("http://", "https://")):
        raise ConfigError(f"placement ({where}): stages in other working copies log to a shared MLflow server; "
                          f"set tracking.uri (or MLFLOW_TRACKING_URI) to one, not {tracking_uri}")
    name, url = default_remote(root)
    if not name or not url:
        raise ConfigError(f"placement ({where}): outputs travel through the DVC remote; configure a default one "
                          "(`dvc remote add -d NAME s3://...`)")
    changed = changed_files(root, "params.yaml", "dvc.lock")
    if changed:
        raise ConfigError(f"placement ({where}): work pools run the committed code, and these files differ from "
                          f"it: {', '.join(changed[:5])}; commit (or stash) them first")
    for stage, kind in placed.items():
        stage_deployment(stage, kind, root)


def merge_lock_entry(root: str | Path, stage: str, entry: dict[str, Any]) -> None:
    """Put a stage's dvc.lock entry (made in another working copy) into this checkout's dvc.lock."""
    import yaml

    from components.common.files import write_text

    path = Path(root) / "dvc.lock"
    lock = (yaml.safe_load(path.read_text()) if path.is_file() else None) or {"schema": "2.0", "stages": {}}
    lock.setdefault("stages", {})[stage] = entry
    write_text(path, yaml.safe_dump(lock, sort_keys=False))


def _result(run: PipelineRun, stage: str, commit: str) -> dict[str, Any]:
    """The stage's result, which pipelines/execution/stage.py logged on its MLflow run."""
    import mlflow

    from components.common.tracking import STAGE_TAG, TAG_PREFIX
    from pipelines.execution.stage import RESULT_ARTIFACT

    client = mlflow.MlflowClient()
    exp = client.get_run(run.run_id).info.experiment_id
    runs = client.search_runs(
        [exp], f"tags.mlflow.parentRunId = '{run.run_id}' and tags.`{STAGE_TAG}` = '{stage}' "
        f"and tags.`{TAG_PREFIX}runner.commit` = '{commit}'", order_by=["attributes.start_time DESC"], max_results=1,
    )
    if not runs:
        raise StageFailed(f"stage '{stage}': the stage's run finished but logged no result to {run.tracking_uri}")
    return mlflow.artifacts.load_dict(f"runs:/{runs[0].info.run_id}/{RESULT_ARTIFACT}")


def submit(stage: str, kind: str, run: PipelineRun) -> StageResult:
    """Run `stage` on the `kind` pool through its deployment; wait; merge its lock entry; pull its outputs."""
    from prefect.deployments import run_deployment

    from pipelines.execution.stage import STAGE_FLOW

    root = Path(run.root)
    commit = head_commit(root)
    # A stage that ran here (placement local) left its outputs in this checkout's cache only; the pool's
    # working copy pulls its inputs from the remote, so they go there first.
    rc, tail = dvc_ops.push(root, stage_env(run.run_id, run.tracking_uri))
    if rc != 0:
        raise StageFailed(f"stage '{stage}': the outputs it needs could not be pushed to the DVC remote:\n{tail}")
    lock = root / "dvc.lock"
    parameters = {
        "stage": stage, "commit": commit, "params_yaml": (root / "params.yaml").read_text(),
        "dvc_lock": lock.read_text() if lock.is_file() else "", "remote_url": default_remote(root)[1],
        "parent_run_id": run.run_id, "tracking_uri": run.tracking_uri,
    }
    name = f"{STAGE_FLOW}/{stage_deployment(stage, kind, root)}"
    print(f"── stage {stage}: submitted to deployment {name} (commit {commit[:12]})", flush=True)
    flow_run = run_deployment(name, parameters=parameters, timeout=None, poll_interval=2)
    state = flow_run.state
    if state is None or not state.is_completed():
        message = (state.message or "") if state else ""
        if f"StageFailed: stage '{stage}' failed" in message:  # the stage's own error line stays first
            own = message.split("StageFailed: ", 1)[1]
            raise StageFailed(own.replace(f"stage '{stage}' failed", f"stage '{stage}' failed on the {kind} pool "
                                          f"(flow run {flow_run.name})", 1))
        raise StageFailed(f"stage '{stage}' on the {kind} pool: flow run {flow_run.name} ended "
                          f"{state.type.value if state else 'without a state'}: {message}")
    result = _result(run, stage, commit)
    merge_lock_entry(root, stage, result["lock_entry"])
    rc, tail = dvc_ops.pull(root, stage_env(run.run_id, run.tracking_uri), [stage])
    if rc != 0:
        raise StageFailed(f"stage '{stage}': its outputs did not come back from the remote:\n{tail}")
    return StageResult(stage, result["status"], result["seconds"], entry_md5(result["lock_entry"]), placement=kind,
                       workdir=result["workdir"])
