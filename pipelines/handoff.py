"""What crosses the training flow's task boundaries, typed: the pipeline run every task is given, a stage
task's result and the run summary. It imports nothing of the project: every layer of pipelines/ may use it.

    PipelineRun   the checkout and the MLflow parent run (lineage.parent_run yields it) that every task needs
    StageResult   one stage: ran | restored | skipped | failed, seconds, its dvc.lock entry's md5, and
                  (added by lineage.record) its MLflow run or the earlier run that produced its outputs
    RunSummary    the run: what `grpoflow run` prints (summary.format_run_summary), the MLflow description
                  and the Prefect artifacts show; the `training-pipeline` flow's return value

    Registration  the model version the register task made or found (pipelines/registry/register.py)
    NotRegistered the register task's explicit skipped result, with the reason
    Decision      the promotion gate's decision, or a manual `grpoflow promote` / `rollback`
                  (pipelines/registry/promotion.py, moves.py)

A failed stage crosses as its error (dvc_ops.StageFailed), whose message `failure_message` writes:
the stage's own error line first (`stage_error`), then the exit code and the output's last lines.
An interrupted run (Ctrl-C, SIGTERM) crosses as `Interrupted`, the stage it was in found by
`interrupted_stage` (lineage.failure_recorded marks the exception).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class PipelineRun:
    """What every task of one pipeline run needs: where the checkout is and where it is tracked."""

    root: str
    run_id: str
    tracking_uri: str


@dataclass
class StageResult:
    stage: str
    status: str  # ran | restored (from DVC's run cache) | skipped | failed
    seconds: float = 0.0
    lock_md5: str = ""  # md5 of the stage's dvc.lock entry after it ran
    placement: str = "local"  # or the work-pool kind it was submitted to
    workdir: str | None = None  # the clean working copy it ran in, when placed on a pool
    run_id: str | None = None  # the stage's MLflow run (lineage.record)
    produced_by: str | None = None  # a skipped stage: the run that produced its outputs

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set, for JSON (lineage/stages.json)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Registration:
    name: str
    version: str
    created: bool  # false: this dvc.lock was registered before (the version is the earlier one)
    run_id: str | None = None


@dataclass(frozen=True)
class NotRegistered:
    reason: str  # why the register task made no version (registration off, `dvc push` failed)


# What a decision can be: the gate's two outcomes, `grpoflow promote` and `grpoflow rollback`. A run
# that registers nothing new reports the version's recorded decision (its `promotion.decision` tag).
DecisionKind = Literal["promoted", "rejected", "superseded", "forced", "rollback"]


@dataclass
class Decision:
    name: str
    version: str
    decision: DecisionKind
    reason: str
    champion_before: str | None = None
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def promoted(self) -> bool:
        return self.decision in ("promoted", "forced")


@dataclass
class RunSummary:
    name: str  # `<short commit> <overrides>`, `rerun` added when no stage ran
    run_id: str  # the MLflow parent run
    experiment_id: str
    tracking_uri: str
    pull: str  # what `dvc pull` did
    push: str  # what `dvc push` did
    stages: list[StageResult]
    metrics: dict[str, dict[str, Any]]  # {model: evaluation metrics}
    comparison: dict[str, Any]  # comparison.json: {pair: paired difference}
    registration: Registration | NotRegistered
    decision: Decision | None  # None when nothing was registered
    reports: dict[str, list[str]]  # {folder: [files]}
    figures: list[str] = field(default_factory=list)  # artifact paths on the parent run
    alpha: float = 0.05  # register.alpha: the significance level the summary's verdicts use


STAGE_ERROR_PREFIX = "error: "  # how a stage's entry point states its error (components/common/entry.py `fail`)
FAILURE_TAIL_LINES = 20  # of a failed stage's output, in its error message after the error line


def stage_error(tail: str) -> str | None:
    """The stage's own error line in its output: the last `error: ...` line its entry point printed
    (without the prefix), else the exception line that ends its last traceback (a bug); None when it
    printed neither (DVC failed before or around the command). Whatever the stage or its engine
    printed after it (vLLM's shutdown, DVC's `ERROR: failed to reproduce ...`) does not hide it.

    >>> stage_error("loading\\nerror: data/x.jsonl line 3: no 'question' field\\nshutting down\\n"
    ...             "ERROR: failed to reproduce 'data'")
    "data/x.jsonl line 3: no 'question' field"
    >>> stage_error("Traceback (most recent call last):\\n  File 'x.py', line 1\\n    f()\\nKeyError: 'gold'\\n"
    ...             "ERROR: failed to reproduce 'sft'")
    "KeyError: 'gold'"
    >>> stage_error("ERROR: failed to reproduce 'sft': dependency 'models/base' does not exist") is None
    True
    """
    lines = tail.splitlines()
    for line in reversed(lines):
        if line.startswith(STAGE_ERROR_PREFIX):
            return line[len(STAGE_ERROR_PREFIX):].strip()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last)"):
            return next((line for line in lines[i + 1 :] if line.strip() and not line[0].isspace()), None)
    return None


def failure_message(stage: str, rc: int, tail: str, where: str = "") -> str:
    """A failed stage's error: its own error line first (stage_error; DVC's last line when the stage
    printed none), then the exit code and the last lines of the output for context.

    >>> print(failure_message("selection", 1, "INFO x\\nerror: kept 3 of 40 prompts\\nINFO shutdown\\n"
    ...                                       "ERROR: failed to reproduce 'selection'"))
    stage 'selection' failed: kept 3 of 40 prompts
    (dvc exit 1; the last lines of its output:)
    INFO x
    error: kept 3 of 40 prompts
    INFO shutdown
    ERROR: failed to reproduce 'selection'
    """
    line = stage_error(tail) or (tail.splitlines()[-1] if tail else str(rc))  # DVC's last line
    context = "\n".join(tail.splitlines()[-FAILURE_TAIL_LINES:])
    return f"stage '{stage}' failed{where}: {line}\n(dvc exit {rc}; the last lines of its output:)\n{context}"


STAGE_ATTR = "grpoflow_stage"  # set on an exception by lineage.failure_recorded: the stage it ended


class Interrupted(KeyboardInterrupt):
    """SIGTERM during `grpoflow run` (a scheduler, `docker stop`), raised where Ctrl-C raises
    KeyboardInterrupt, so that both take one path: stop the stage, mark the runs KILLED, exit 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def interrupted_stage(exc: BaseException | None) -> str:
    """The stage an interrupt ended: the mark on the exception or on one it replaced (Prefect turns
    SIGTERM into its own TerminationSignal first); "" when it came between stages."""
    seen = 0
    while exc is not None and seen < 10:
        if getattr(exc, STAGE_ATTR, ""):
            return getattr(exc, STAGE_ATTR)
        exc, seen = exc.__context__, seen + 1
    return ""
