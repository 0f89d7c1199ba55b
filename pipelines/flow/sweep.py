"""The `grpoflow-sweep` flow: a hyperparameter search over the pipeline (docs/sweep.md; the command: sweep_cli.py).

    grpoflow sweep sweep.yaml                                       # the spec's parameters, method, seeds, ...
    grpoflow sweep -S grpo.trainer.beta=0.0,0.1 -S grpo.trainer.learning_rate=2.0e-5,5.0e-5 --parallel 2

The Prefect flow `grpoflow-sweep` runs each trial (one configuration, one seed: pipelines/flow/sweep_trial.py)
as a task, `parallel` at a time on this machine with the cores divided between them, and records it in the
sweep's journal (pipelines/flow/sweep_search.py). Configurations are ranked by their mean dev score over the
seeds; only the chosen one then runs as a `grpoflow run` here (its stages restored from the run cache, the
evaluate stage on the test split), which registers it and gates it against the champion (McNemar). MLflow
holds one parent run per sweep, with each trial's run (and the chosen configuration's pipeline run) as a
child, the sweep table as CSV and figure (pipelines/flow/sweep_report.py).

A bad spec is one line and exit 2 before anything runs. Ctrl-C stops the sweep with one line (exit 130);
the same command continues it (finished trials are not run again). A failed trial is recorded with its
first error line and the others go on.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from components.common.files import repo_root
from pipelines.flow import sweep_report
from pipelines.flow.sweep_search import Journal, ask_tpe, grid, random_config
from pipelines.flow.sweep_trial import SWEEP_TAG, SweepRun, Trial, TrialResult, run_trial
from pipelines.params.sweep_spec import SweepSpec

SWEEP_FLOW = "grpoflow-sweep"


@task(name="trial", cache_policy=NO_CACHE)
def trial_task(trial: Trial, sweep: SweepRun) -> TrialResult:
    """One trial, recorded in the journal as soon as it ends."""
    result = run_trial(trial, sweep)
    Journal(Path(sweep.state_dir)).append(result.record())
    line = (f"dev {sweep.metric} = {result.value:.3f} (n = {result.n})" if result.status == "finished"
            else f"failed: {result.error}")
    print(f"trial {trial.number} {' '.join(trial.overrides)}: {line}; stages: {result.stages}", flush=True)
    return result


def plan(spec: SweepSpec, journal: Journal, attempted: set[tuple[int, Any]]) -> list[Trial]:
    """The next trials: those of chosen configurations not finished (nor tried by this invocation), then new
    configurations (grid points, random draws, TPE asks) while the trial cap allows; TPE asks `parallel` at
    a time, after the earlier ones are scored."""
    seeds = list(spec.seeds) or [None]
    configs, done = journal.configs(), journal.trials()

    def pending() -> list[Trial]:
        return [Trial(i * len(seeds) + j + 1, i, c, spec.seed_key, s) for i, c in enumerate(configs)
                for j, s in enumerate(seeds) if done.get((i, s), {}).get("status") != "finished"
                and (i, s) not in attempted]

    batch = spec.parallel if spec.method == "tpe" else sys.maxsize
    while len(pending()) < batch and len(configs) < spec.configurations and not any(
            (i, s) not in done for i in range(len(configs)) for s in seeds if spec.method == "tpe"):
        want = min(spec.configurations - len(configs), -(-spec.parallel // len(seeds)))
        if spec.method == "grid":
            new = grid(spec)[len(configs):]
        elif spec.method == "random":
            new = [random_config(spec, len(configs) + k) for k in range(spec.configurations - len(configs))]
        else:
            new = ask_tpe(spec, [(c, sweep_report.mean(done, i, seeds)) for i, c in enumerate(configs)], want)
        for config in new:
            journal.append({"event": "config", "index": len(configs), "config": config})
            configs.append(config)
    return pending()[:batch]


@task(name="open-sweep", cache_policy=NO_CACHE)
def open_sweep(spec: SweepSpec, root: str) -> SweepRun:
    """The sweep's journal and MLflow parent run (a rerun's: the journal's), and what its trials share."""
    import mlflow

    from components.common.params_load import load_params
    from components.common.tracking import configure
    from pipelines.execution.dvc_ops import stage_order
    from pipelines.execution.gitrepo import head_commit
    from pipelines.params.overrides import write_overrides

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "params.yaml"
        path.write_text((Path(root) / "params.yaml").read_text())
        write_overrides(path, [*spec.overrides, f"grpo.dev_size={spec.dev_size}"])
        params_yaml = path.read_text()
    params = load_params(Path(root) / "params.yaml", list(spec.overrides))
    exp_id = configure(params, root)
    state = Path(root) / ".dvc" / "tmp" / "sweeps" / spec.name
    # what decides the trials' results; `trials` and `parallel` may change between reruns
    spec_hash = hashlib.md5(repr((spec.parameters, spec.method, spec.seed_key, spec.seeds, spec.metric,
                                  spec.dev_size, spec.overrides, spec.seed)).encode()).hexdigest()

    def make_run() -> str:
        return mlflow.MlflowClient().create_run(exp_id, run_name=f"sweep {spec.name}", tags={
            SWEEP_TAG: spec.name, f"{SWEEP_TAG}.role": "parent", f"{SWEEP_TAG}.method": spec.method}).info.run_id

    run_id = Journal(state).start(spec_hash, make_run)
    order = stage_order(root)
    stages = tuple(order[: order.index(params.register.model_stage) + 1])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    from dvc.repo import Repo

    with Repo(root) as repo:
        cache_dir = repo.cache.local_cache_dir  # (its files/md5 and runs/ inside)
    return SweepRun(spec.name, root, head_commit(root), params_yaml, mlflow.get_tracking_uri(), exp_id, run_id,
                    str(cache_dir), stages, sweep_report.stage_keys(root, stages), spec.metric, spec.dev_size,
                    max(1, cores // spec.parallel), str(state))


@flow(name=SWEEP_FLOW, log_prints=True, flow_run_name="sweep {spec.name}")
def sweep_flow(spec: SweepSpec) -> sweep_report.SweepSummary:
    """Trials in parallel → the best configuration by its mean dev score → its pipeline run here (test split,
    register, gate) → the sweep table and summary on the parent run."""
    from pipelines.flow.pipeline import training_pipeline

    root = str(repo_root())
    sweep = open_sweep(spec, root)
    journal, attempted = Journal(Path(sweep.state_dir)), set()
    while trials := plan(spec, journal, attempted):
        attempted |= {(t.index, t.seed) for t in trials}
        wait_for_trials([trial_task.with_options(task_run_name=f"trial-{t.number}").submit(t, sweep) for t in trials])
    chosen = sweep_report.choose(spec, journal)
    final = None
    if chosen is not None:
        final = training_pipeline(overrides=[*spec.overrides, f"grpo.dev_size={spec.dev_size}", *chosen.overrides])
    return sweep_report.publish_sweep(spec, sweep, journal, chosen, final)


def wait_for_trials(futures: list[Any]) -> None:
    """Until every trial ends, in short sleeps: a future's own wait would hold off Ctrl-C until it ends."""
    import time

    while not all(f.state.is_final() for f in futures):
        time.sleep(0.5)
