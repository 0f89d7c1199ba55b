"""The `training-pipeline` Prefect flow: dvc status → dvc pull → one task per dvc.yaml stage → dvc push →
lineage → register → promote, inside one MLflow parent run.

    grpoflow run                         # the embedded defaults (what `make demo` runs)
    grpoflow run -S grpo.trainer.beta=0.0        # apply an override to params.yaml, as `dvc exp run -S` does

The stage list and order come from `dvc.yaml` (DVC's own graph); each stage task runs
`dvc repro --single-item <stage>` in a subprocess with cwd = the repo root, so `dvc.lock`
stays the only cache: a stage whose inputs did not change is skipped by DVC, and the task
reports `ran`, `restored` (from DVC's run cache) or `skipped` by comparing the stage's
`dvc.lock` entry before and after. Stage tasks retry transient failures (DVC's lock held by
another process, a failed spawn) but never a stage command that failed. No Prefect caching
anywhere: dvc.lock is the one cache of stage work.

A stage that fails ends the flow with its own error line first (handoff.failure_message), tagged
`grpoflow.error` on the parent run, whose description starts with it (summary.publish_failure).

The run is named `<short commit> <overrides>` (`rerun` added when no stage ran) in Prefect and
MLflow alike; the stages' output reaches the flow run's log in the Prefect UI line by line; at the
end the summary becomes the MLflow run's description and a Prefect markdown artifact, with link
artifacts to the MLflow run and the registered version and figures on the MLflow run.

Helpers live beside this module: DVC calls in dvc_ops.py, the parent run and lineage in
lineage.py, the per-checkout lock in runlock.py, the summary in summary.py, figures in figures.py.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from components.common.params import Params
from components.common.params_load import load_params, params_in
from components.common.tracking import repo_root
from pipelines.execution import dvc_ops
from pipelines.execution.dvc_ops import (
    StageFailed,
    TransientError,
    default_remote,
    entry_md5,
    is_transient,
    last_line,
    lock_entry,
    run_dvc,
    stage_env,
    stage_order,
    stage_status,
)
from pipelines.execution.placement import submit
from pipelines.execution.runtime import prefect_api_log
from pipelines.execution.services import service_env_defaults
from pipelines.flow import lineage
from pipelines.flow.lineage import FLOW_NAME, failure_recorded, flow_run_name, parent_run
from pipelines.flow.runlock import pipeline_lock
from pipelines.flow.summary import links, publish_failure, publish_mlflow, run_summary, summary_markdown
from pipelines.handoff import (
    Decision,
    NotRegistered,
    PipelineRun,
    Registration,
    RunSummary,
    StageResult,
    failure_message,
)
from pipelines.params.overrides import check_remote_overrides, write_overrides

__all__ = ["training_pipeline", "StageFailed", "TransientError"]


def _retry_transient(task, task_run, state) -> bool:  # Prefect's retry_condition_fn signature
    return isinstance(state.data, TransientError)


def _env(run: PipelineRun) -> dict[str, str]:
    return stage_env(run.run_id, run.tracking_uri)


@task(name="params", task_run_name="params", cache_policy=NO_CACHE)
def apply_params(root: str, overrides: list[str]) -> Params:
    """Write the `-S` overrides into params.yaml (as `dvc exp run -S` does), then load it. A run
    started through a deployment (remotely) may only set the keys of overrides.REMOTE_OVERRIDES."""
    from prefect.runtime import deployment

    if deployment.id:
        check_remote_overrides(overrides)
    write_overrides(Path(root) / "params.yaml", overrides)
    return load_params(params_in(root))


@task(name="dvc-status", task_run_name="dvc-status", cache_policy=NO_CACHE)
def dvc_status(run: PipelineRun) -> bool:
    """True when nothing changed since dvc.lock (code, params, data, outputs): every stage will skip."""
    return dvc_ops.up_to_date(run.root)


@task(name="dvc-pull", task_run_name="dvc-pull", retries=2, retry_delay_seconds=5, retry_condition_fn=_retry_transient,
      cache_policy=NO_CACHE)
def dvc_pull(run: PipelineRun, unchanged: bool = False) -> str:
    """Fetch DVC's run cache and the outputs dvc.lock records from the default remote, if it holds any."""
    name, url = default_remote(run.root)
    if not name:
        return "skipped: no default DVC remote"
    if unchanged:
        return "skipped: nothing changed since dvc.lock, every output is here"
    if url and "://" not in url and not (Path(url).is_dir() and any(Path(url).iterdir())):
        return f"skipped: remote '{name}' ({url}) holds no data yet"
    rc, tail = run_dvc(["pull", "--run-cache", "--allow-missing"], run.root, _env(run), prefect_api_log())
    if rc != 0:
        if is_transient(tail):
            raise TransientError(f"dvc pull: {last_line(tail, rc)}")
        # Not fatal: the stages regenerate what could not be fetched.
        return f"failed (stages will rebuild what is missing): {last_line(tail, rc)}"
    return f"pulled from '{name}' (outputs and run cache)"


@task(retries=2, retry_delay_seconds=10, retry_condition_fn=_retry_transient, cache_policy=NO_CACHE)
def run_stage(stage: str, run: PipelineRun, placement: str = "local", unchanged: bool = False) -> StageResult:
    """`dvc repro --single-item STAGE` (with `--pull` when there is a remote: a run the run cache
    knows is restored from it); ran, restored or skipped is read off DVC's output and dvc.lock.
    A stage placed on a work pool runs there instead (pipelines/execution/placement.py). When `dvc status`
    found nothing changed, the stage is skipped without starting DVC (it would skip it too)."""
    if unchanged:
        return StageResult(stage, "skipped", 0.0, entry_md5(lock_entry(run.root, stage)))
    if placement != "local":
        return submit(stage, placement, run)
    before = lock_entry(run.root, stage)
    start = time.time()
    args = ["repro", "--single-item", stage, *(["--pull"] if default_remote(run.root)[0] else [])]
    print(f"── stage {stage}: dvc {' '.join(args)}", flush=True)
    rc, tail = run_dvc(args, run.root, _env(run), prefect_api_log())
    seconds = round(time.time() - start, 2)
    if rc != 0:
        if is_transient(tail) and "failed to run" not in tail:
            raise TransientError(f"stage '{stage}': {last_line(tail, rc)}")
        raise StageFailed(failure_message(stage, rc, tail))
    after = lock_entry(run.root, stage)
    return StageResult(stage, stage_status(tail, before, after), seconds, entry_md5(after))


@task(name="dvc-push", task_run_name="dvc-push", retries=2, retry_delay_seconds=5, retry_condition_fn=_retry_transient,
      cache_policy=NO_CACHE)
def dvc_push(run: PipelineRun, unchanged: bool = False) -> str:
    """Send the outputs and the run cache to the default remote (what another clone restores from);
    not again when nothing changed since this dvc.lock was pushed there."""
    name, _ = default_remote(run.root)
    if not name:
        return "skipped: no default DVC remote"
    if unchanged and dvc_ops.already_pushed(run.root):
        return f"skipped: this dvc.lock's outputs and run cache are in '{name}' already"
    rc, tail = dvc_ops.push(run.root, _env(run), log=prefect_api_log())
    if rc != 0:
        if is_transient(tail):
            raise TransientError(f"dvc push: {last_line(tail, rc)}")
        return f"failed: {last_line(tail, rc)}"
    dvc_ops.mark_pushed(run.root)
    return f"pushed to '{name}' (outputs and run cache)"


@task(name="lineage", task_run_name="lineage", cache_policy=NO_CACHE)
def record_lineage(run: PipelineRun, stages: list[StageResult], params: Params) -> dict[str, str]:
    """dvc.lock, data hashes, per-stage status and the evaluation metrics onto the parent run."""
    return lineage.record(run, stages, params)


@task(name="register", task_run_name="register", cache_policy=NO_CACHE)
def register_model(
    params: Params, lineage_tags: dict[str, str], pushed: str, run: PipelineRun
) -> Registration | NotRegistered:
    """A new model version (once per dvc.lock), aliased challenger; not when registration is off or
    `dvc push` failed (a version whose outputs are not in the remote could not be restored)."""
    if not params.register.enabled:
        return NotRegistered("register.enabled is false")
    if pushed.startswith("failed"):
        return NotRegistered(f"dvc push failed, so the outputs are not in the remote ({pushed})")
    from pipelines.registry.register import register

    return register(params, lineage.version_tags(lineage_tags, run), run.run_id, run.root)


@task(name="promote", task_run_name="promote", cache_policy=NO_CACHE)
def promote_model(params: Params, registration: Registration | NotRegistered, run: PipelineRun) -> Decision | None:
    """The promotion gate: champion moves to the new version only if it is significantly better."""
    if isinstance(registration, NotRegistered):
        return None
    from pipelines.registry.promotion import gate, print_decision

    decision = gate(params, registration, run.root)
    print_decision(decision)
    return decision


@task(name="summary", task_run_name="summary", cache_policy=NO_CACHE)
def summarize_run(
    run: PipelineRun, params: Params, stages: list[StageResult], pulled: str, pushed: str,
    registration: Registration | NotRegistered, decision: Decision | None, overrides: list[str],
) -> RunSummary:
    return run_summary(run, params, stages, pulled, pushed, registration, decision, overrides)


@task(name="publish", task_run_name="publish", cache_policy=NO_CACHE)
def publish(run: PipelineRun, params: Params, s: RunSummary) -> RunSummary:
    """The summary where users look: the MLflow run's name, description and figures; the Prefect flow
    run's name, a markdown artifact and links to the MLflow run and the registered version."""
    from prefect.artifacts import create_link_artifact, create_markdown_artifact
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    figures = publish_mlflow(run, s, params)
    create_markdown_artifact(summary_markdown(s), key="training-summary", description=f"grpoflow run {s.name}")
    for key, url in links(s).items():
        create_link_artifact(url, link_text=f"{key.replace('-', ' ')}: {url}", key=key)
    if flow_run.id and flow_run.name != s.name:
        with get_client(sync_client=True) as client:
            client.set_flow_run_name(flow_run.id, s.name)
    return dataclasses.replace(s, figures=figures)


@flow(name=FLOW_NAME, log_prints=True, flow_run_name=flow_run_name)
def training_pipeline(overrides: list[str] | None = None) -> RunSummary:
    """dvc pull → every dvc.yaml stage in graph order → dvc push → lineage → register → promote,
    on the checkout this process runs in (a worker's is fixed: no parameter moves it)."""
    service_env_defaults()  # MLflow gives up on a server that does not answer within the budget (a worker too)
    root = str(repo_root())
    with pipeline_lock(root):
        params = apply_params(root, list(overrides or []))
        with parent_run(params, root, overrides or []) as run:
            unchanged = dvc_status(run)
            pulled = dvc_pull(run, unchanged)
            stages: list[StageResult] = []
            for stage in stage_order(root):  # read here, not in a task: its names would fan out in the graph
                with failure_recorded(stage, stages, run, publish_failure):
                    stages.append(run_stage.with_options(name=stage, task_run_name=stage)(
                        stage, run, vars(params.placement).get(stage, "local"), unchanged))
            pushed = dvc_push(run, unchanged)
            lineage_tags = record_lineage(run, stages, params)
            registration = register_model(params, lineage_tags, pushed, run)
            decision = promote_model(params, registration, run)
            result = summarize_run(run, params, stages, pulled, pushed, registration, decision, overrides or [])
            return publish(run, params, result)
