"""The one prepare/train/save path of the training stages (components/sft.py, components/grpo.py).

A training stage's `run()` reads its data, loads its start model, builds its dataset, rewards and
callbacks, describes the run as a `TrainingJob` and makes one call, `train_stage(job)`, which reads
the sample problems, fingerprints the settings, code and inputs, prepares the checkpoint folder
(resume or start over: components/training/finetune.py), opens the stage's MLflow run (main process
only), builds the Trainer and trains under a StepClock (components/training/step_clock.py: the report's
seconds by part), saves and reports through finetune.train_and_save. Not a stage; only the two training
stages import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from components.common.params import Params
from components.training import finetune


@dataclass
class TrainingJob:
    """What a training stage trains, on what, and what it reports: the one hand-off to `train_stage`.

    `settings` is the stage's `trainer_settings(params)` (TRL config, LoRA config or None); `inputs`
    (the data file and the start model) and `fingerprint` (the stage's `fingerprint_settings(params)`)
    decide whether a checkpoint may be resumed; `datasets` ({name: (file, context)}) are the MLflow
    dataset inputs of the stage's run; `base` (an adapters.BaseRef) is the base a LoRA stage's adapter
    is saved over; `trainer_kwargs` go to the Trainer (GRPO's `reward_funcs`). Reporting: `metrics` are
    logged when the run opens and join the summary (SFT's demonstration counts); `history_names(trainer)`
    renames history columns (GRPO's per-reward columns); `after_training()` adds values known only once
    training is over (dev curve, signal monitor)."""

    stage: str
    params: Params
    trainer_class: type
    settings: tuple[Any, Any]
    model: Any
    tokenizer: Any
    dataset: Any
    inputs: list[str | PathLike]
    datasets: dict[str, tuple[Path, str]]
    fingerprint: dict[str, Any]
    base: Any = None
    callbacks: list[Any] = field(default_factory=list)
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, int] | None = None
    max_new_tokens: int = 256
    history_required: tuple[str, ...] = ()
    history_names: Callable[[Any], dict[str, str]] | None = None
    after_training: Callable[[], dict[str, Any]] | None = None


def train_stage(job: TrainingJob) -> Path:
    """Train `job.trainer_class` on `job.dataset` and write the stage's model folder, report and
    history; returns the model folder (`<stage>.output_dir`)."""
    from components.problems.sources import read_split
    from components.training.step_clock import StepClock

    stage, params = job.stage, job.params
    cfg = getattr(params, stage)
    args, peft_config = job.settings
    test = Path(params.data.output_dir) / "test.jsonl"
    samples = read_split(test, limit=cfg.sample_size) if cfg.sample_size else []
    fp = finetune.fingerprint(stage, job.fingerprint, job.inputs)
    checkpoint = finetune.prepare_checkpoints(args, cfg.checkpoint_dir, fp, cfg.resume, stage)

    with finetune.tracked(stage, params, args, job.datasets):
        if job.metrics and args.process_index == 0:
            import mlflow

            mlflow.log_metrics({k: float(v) for k, v in job.metrics.items()})
        clock = StepClock()  # its callback first: the others' step-end work counts as `callbacks`
        trainer = job.trainer_class(
            model=job.model, args=args, train_dataset=job.dataset, processing_class=job.tokenizer,
            peft_config=peft_config, callbacks=[clock.callback(), *job.callbacks], **job.trainer_kwargs,
        )
        clock.instrument(trainer)
        finetune.train_and_save(
            stage, trainer, checkpoint, cfg, samples=samples, max_new_tokens=job.max_new_tokens, extra=job.metrics,
            history_names=job.history_names(trainer) if job.history_names else None,
            history_required=job.history_required, after_training=job.after_training, base=job.base,
            seconds_by_part=clock.report,
        )
    return Path(cfg.output_dir)
