"""One trial of `grpoflow sweep`: a pipeline run of one configuration and seed, up to the registered stage
(grpo), in a clean working copy of the checkout's commit, then scored on the dev split.

The working copy (pipelines/execution/gitrepo.py, as `grpoflow stage` makes it) gets the checkout's
params.yaml with the trial's overrides and uses the checkout's DVC cache, so DVC's run cache restores every
stage whose code, params and inputs an earlier trial or run already ran: a sweep over `grpo.*` runs data,
model and SFT once per data seed. A stage that several trials would run alike runs under a lock named by
its stage and the overrides it reads, so that the second trial finds it in the run cache instead of
running it beside the first. The dev split (GRPO's: the last `grpo.dev_size` problems of grpo.jsonl in the
target band, held out of training) is then evaluated by `grpoflow evaluate`; its metrics, the trial's
MLflow run (a child of the sweep's parent run, tagged with its overrides and seed) and a DVC experiment
(`dvc exp save`, fetched into the checkout's refs/exps) record the trial. Its processes use
`threads` cores: the sweep divides the machine's cores among its parallel trials.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common.errors import GrpoflowError
from components.common.files import write_text
from components.common.tracking import TAG_PREFIX
from pipelines.execution.dvc_ops import StageFailed, lock_entry, run_dvc, stage_env, stage_status
from pipelines.execution.gitrepo import git, own_workdir, working_copy
from pipelines.handoff import failure_message, stage_error
from pipelines.params.overrides import write_overrides
from pipelines.params.presets import override_list

SWEEP_TAG = f"{TAG_PREFIX}sweep"
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "grpoflow sweep", "GIT_AUTHOR_EMAIL": "sweep@grpoflow.invalid",
                "GIT_COMMITTER_NAME": "grpoflow sweep", "GIT_COMMITTER_EMAIL": "sweep@grpoflow.invalid"}
STOPPING = threading.Event()  # set on Ctrl-C: a trial that ends then is interrupted, not failed
_FETCH = threading.Lock()  # one `git fetch` into the checkout at a time


@dataclass(frozen=True)
class Trial:
    number: int  # 1.., in the order the sweep planned them
    index: int  # its configuration's
    config: dict[str, Any]
    seed_key: str
    seed: int | None  # None: params.yaml's

    @property
    def overrides(self) -> list[str]:
        return override_list({**self.config, **({self.seed_key: self.seed} if self.seed is not None else {})})


@dataclass(frozen=True)
class SweepRun:
    """What every trial of one sweep shares."""

    name: str
    root: str
    commit: str
    params_yaml: str  # the checkout's params.yaml with the sweep's fixed overrides
    tracking_uri: str
    experiment_id: str
    run_id: str  # the sweep's MLflow parent run
    cache_dir: str  # the checkout's DVC cache (its run cache inside)
    stages: tuple[str, ...]  # the stages a trial runs, in order
    stage_keys: dict[str, tuple[str, ...]]  # stage -> the params it and its upstream stages read
    metric: str
    dev_size: int
    threads: int
    state_dir: str  # .dvc/tmp/sweeps/<name>: journal, logs, locks


@dataclass
class TrialResult:
    number: int
    index: int
    seed: int | None
    config: dict[str, Any]
    status: str  # finished | failed
    value: float | None = None
    ci95: list[float] | None = None
    n: int = 0
    error: str = ""
    run_id: str = ""
    stages: dict[str, str] = field(default_factory=dict)  # stage -> ran | restored | skipped
    seconds: float = 0.0
    experiment: str = ""

    def record(self) -> dict[str, Any]:
        return {"event": "trial", **dataclasses.asdict(self)}


def run_trial(trial: Trial, sweep: SweepRun) -> TrialResult:
    """Run one trial to its dev score; a failure is a `failed` result with its first error line, an interrupt
    (Ctrl-C, STOPPING set) propagates."""
    import mlflow

    client = mlflow.MlflowClient(sweep.tracking_uri)
    result = TrialResult(trial.number, trial.index, trial.seed, trial.config, "finished")
    run = client.create_run(sweep.experiment_id, run_name=f"trial {trial.number}: {' '.join(trial.overrides)}", tags={
        "mlflow.parentRunId": sweep.run_id, SWEEP_TAG: sweep.name, f"{SWEEP_TAG}.role": "trial",
        f"{SWEEP_TAG}.trial": str(trial.number), f"{SWEEP_TAG}.overrides": " ".join(trial.overrides),
        f"{SWEEP_TAG}.seed": f"{trial.seed_key}={trial.seed}" if trial.seed is not None else "params.yaml",
    })
    result.run_id = run.info.run_id
    for key, value in {**trial.config, **({trial.seed_key: trial.seed} if trial.seed is not None else {})}.items():
        client.log_param(result.run_id, key, value)
    start = time.time()
    log_path = Path(sweep.state_dir) / f"trial-{trial.number:03d}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log_path, "w") as log, own_workdir(None, f"grpoflow-sweep-{trial.number}-", False) as work:
            env = {**stage_env(result.run_id, sweep.tracking_uri), **GIT_IDENTITY,
                   "OMP_NUM_THREADS": str(sweep.threads), "MKL_NUM_THREADS": str(sweep.threads)}
            _prepare(trial, sweep, work)
            for group in _groups(sweep, trial):  # stages that read the same overrides: one `dvc repro`
                with _stage_lock(sweep, group[-1], trial):
                    _go_on()
                    before = {s: lock_entry(work, s) for s in group}
                    start_at = log.tell()
                    rc, tail = run_dvc(["repro", *(["--single-item"] if len(group) == 1 else []), group[-1]], work,
                                       env, out=log)
                    if rc != 0:
                        raise StageFailed(failure_message(group[-1], rc, tail))
                    text = Path(log.name).read_text(errors="replace")[start_at:]
                    for s in group:
                        result.stages[s] = stage_status(_about(text, s), before[s], lock_entry(work, s))
            _go_on()
            metrics = _dev_metrics(sweep, work, env, log)
            result.value, result.ci95, result.n = _metric(metrics, sweep.metric)
            result.experiment = _save_experiment(trial, sweep, work, env, log)
    except BaseException as exc:
        # Ctrl-C reaches the trial's processes and this process's handler (STOPPING) about together
        if isinstance(exc, KeyboardInterrupt) or STOPPING.wait(timeout=3):
            client.set_terminated(result.run_id, "KILLED")
            raise KeyboardInterrupt from None  # Prefect: a crash by an interrupt, which the one line states
        if not isinstance(exc, GrpoflowError | StageFailed | OSError | subprocess.SubprocessError | KeyError):
            raise
        result.status, result.error = "failed", str(exc).strip().splitlines()[0][:300]
        client.set_tag(result.run_id, f"{TAG_PREFIX}error", result.error)
    result.seconds = round(time.time() - start, 1)
    _log_result(client, result, sweep)
    return result


def _go_on() -> None:
    """Before each process a trial starts: after Ctrl-C (a process started later would not have got it), stop."""
    if STOPPING.is_set():
        raise KeyboardInterrupt


def _prepare(trial: Trial, sweep: SweepRun, work: Path) -> None:
    """The working copy: the commit's code, the sweep's params with the trial's overrides, the shared cache."""
    working_copy(Path(sweep.root), sweep.commit, work)
    write_text(work / "params.yaml", sweep.params_yaml)
    write_overrides(work / "params.yaml", [*trial.overrides, f"grpo.dev_size={sweep.dev_size}"])
    for venv in Path(sweep.root).glob(".venv-*"):  # the evaluation engine's venv (evaluate.vllm_python)
        (work / venv.name).symlink_to(venv.resolve(), target_is_directory=True)
    with open(work / ".dvc" / "config.local", "a") as f:  # `dvc cache dir --local DIR`, without starting DVC
        f.write(f"[cache]\n    dir = {sweep.cache_dir}\n")


def _relevant(sweep: SweepRun, stage: str, trial: Trial) -> list[str]:
    """The trial's overrides of the params `stage` and the stages upstream of it read."""
    reads = sweep.stage_keys.get(stage, ())
    return sorted(o for o in trial.overrides
                  if any(o.split("=")[0] == k or o.startswith(f"{k}.") or k.startswith(o.split("=")[0] + ".")
                         for k in reads))


def _groups(sweep: SweepRun, trial: Trial) -> list[list[str]]:
    """The trial's stages in order, the first ones that read the same overrides as one group (one `dvc repro`
    of the last runs them all), then one group per stage."""
    first = _relevant(sweep, sweep.stages[0], trial)
    k = next((i for i, s in enumerate(sweep.stages) if _relevant(sweep, s, trial) != first), len(sweep.stages))
    return [list(sweep.stages[:k]), *([s] for s in sweep.stages[k:])] if k else [[s] for s in sweep.stages]


def _about(text: str, stage: str) -> str:
    """The lines of a `dvc repro` output that speak of `stage` (what stage_status reads)."""
    return "\n".join(line for line in text.splitlines() if f"'{stage}'" in line)


@contextlib.contextmanager
def _stage_lock(sweep: SweepRun, stage: str, trial: Trial) -> Iterator[None]:
    """Held while the trial runs `stage`: trials whose overrides of what the stage reads are the same wait for
    each other (the second restores from the run cache), others run it at once."""
    digest = hashlib.md5(json.dumps(_relevant(sweep, stage, trial)).encode()).hexdigest()[:12]
    path = Path(sweep.state_dir) / "locks" / f"{stage}-{digest}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _dev_metrics(sweep: SweepRun, work: Path, env: dict[str, str], log: Any) -> dict[str, Any]:
    """`grpoflow evaluate` of the trial's GRPO model on the dev split (its MLflow run nests under the trial's)."""
    from components.common.params_load import load_params
    from components.grpo import dev_split
    from components.problems.sources import read_split

    params = load_params(work / "params.yaml")
    rows = dev_split(read_split(work / params.data.output_dir / "grpo.jsonl"), params.grpo.dev_size,
                     params.evaluate.target_band)
    dev = work / "reports" / "sweep" / "dev.jsonl"
    write_text(dev, "".join(json.dumps(r) + "\n" for r in rows))
    out = work / "reports" / "sweep" / "dev"
    cmd = [sys.executable, "-m", "pipelines.cli", "evaluate", "--model", str(work / params.grpo.output_dir),
           "--data", f"jsonl:{dev}", "--output", str(out)]
    log.write(f"── dev evaluation: {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    name = Path(params.grpo.output_dir).name
    if proc.returncode != 0 or not (out / f"{name}.json").is_file():
        tail = Path(log.name).read_text(errors="replace")[-4000:]
        raise StageFailed(f"dev evaluation failed: {stage_error(tail) or f'exit {proc.returncode}'}")
    return json.loads((out / f"{name}.json").read_text())


def _metric(metrics: dict[str, Any], name: str) -> tuple[float, list[float] | None, int]:
    """(value, 95% interval, n) of a dotted metric of an evaluation report.

    >>> _metric({"target": {"accuracy_checked": 0.25, "accuracy_checked_ci95": [0.1, 0.5], "n": 8}},
    ...         "target.accuracy_checked")
    (0.25, [0.1, 0.5], 8)
    """
    slice_, _, key = name.rpartition(".")
    part = metrics.get(slice_, {}) if slice_ else metrics
    return float(part[key]), part.get(f"{key}_ci95"), int(part.get("n", 0))


def _save_experiment(trial: Trial, sweep: SweepRun, work: Path, env: dict[str, str], log: Any) -> str:
    """`dvc exp save` in the working copy, fetched into the checkout: `dvc exp show` lists the trial there."""
    name = f"{sweep.name}-t{trial.number}"
    rc, tail = run_dvc(["exp", "save", "--force", "--name", name, "--include-untracked", "reports/sweep",
                        *sweep.stages], work, env, out=log)
    if rc != 0:
        raise StageFailed(f"dvc exp save: {tail.splitlines()[-1] if tail else rc}")
    with _FETCH:
        git(["fetch", "--quiet", str(work), "+refs/exps/*:refs/exps/*"], sweep.root)
    return name


def _log_result(client: Any, result: TrialResult, sweep: SweepRun) -> None:
    """The trial's figures on its MLflow run (what the compare view plots) and its end state."""
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    values = {"seconds": result.seconds, **({f"dev.{sweep.metric}": result.value} if result.value is not None else {})}
    if result.ci95:
        values.update({f"dev.{sweep.metric}.ci95_low": result.ci95[0], f"dev.{sweep.metric}.ci95_high": result.ci95[1]})
    client.log_batch(result.run_id, metrics=[Metric(k, float(v), stamp, 0) for k, v in values.items()])
    for key, value in {"status": result.status, **{f"stage.{s}": v for s, v in result.stages.items()}}.items():
        client.set_tag(result.run_id, f"{SWEEP_TAG}.{key}", value)
    client.set_terminated(result.run_id, "FINISHED" if result.status == "finished" else "FAILED")
