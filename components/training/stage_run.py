"""The one prepare/train/save path of the training stages (components/sft.py, components/grpo.py).

A training stage reads its data, loads its start model, builds its dataset and its callbacks, and
then makes one call:

    train_stage(STAGE, params, TrainerClass, trainer_settings(params), model=..., tokenizer=...,
                dataset=..., callbacks=[...], inputs=[data file, start model], fingerprint=...)

which reads the sample problems, fingerprints the settings, code and inputs, prepares the
checkpoint folder (resume or start over: components/training/finetune.py), opens the stage's
MLflow run (main process only), builds the Trainer and trains, saves and reports through
finetune.train_and_save. Not a stage; only the two training stages import it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from os import PathLike
from pathlib import Path
from typing import Any

from components.common.params import Params
from components.training import finetune


def train_stage(
    stage: str,
    params: Params,
    trainer_class: type,
    settings: tuple[Any, Any],
    *,
    model: Any,
    tokenizer: Any,
    dataset: Any,
    callbacks: list[Any],
    inputs: Iterable[str | PathLike],
    datasets: dict[str, tuple[Path, str]],
    fingerprint: dict[str, Any],
    metrics: dict[str, int] | None = None,
    max_new_tokens: int = 256,
    history_names: Callable[[Any], dict[str, str]] | None = None,
    history_required: tuple[str, ...] = (),
    after_training: Callable[[], dict[str, Any]] | None = None,
    base: Any = None,
    **trainer_kwargs: Any,
) -> Path:
    """Train `trainer_class` on `dataset` and write the stage's model folder, report and history;
    returns the model folder (`<stage>.output_dir`).

    `settings` is the stage's `trainer_settings(params)` (TRL config, LoRA config or None);
    `datasets` ({name: (file, context)}) are the MLflow dataset inputs of the stage's run (what it trains on);
    `inputs` (the data file and the start model) and `fingerprint` (the stage's
    `fingerprint_settings(params)`) decide whether a checkpoint may be resumed; `metrics` are
    logged when the run opens and join the summary (SFT's demonstration counts);
    `history_names(trainer)` renames history columns (GRPO's per-reward columns);
    `after_training()` adds values known only once training is over (dev curve, signal monitor);
    `base` (an adapters.BaseRef) is the base a LoRA stage's adapter is saved over;
    `trainer_kwargs` go to the Trainer (GRPO's `reward_funcs`)."""
    from components.problems.sources import read_split

    cfg = getattr(params, stage)
    args, peft_config = settings
    test = Path(params.data.output_dir) / "test.jsonl"
    samples = read_split(test, limit=cfg.sample_size) if cfg.sample_size else []
    fp = finetune.fingerprint(stage, fingerprint, inputs)
    checkpoint = finetune.prepare_checkpoints(args, cfg.checkpoint_dir, fp, cfg.resume, stage)

    with finetune.tracked(stage, params, args, datasets):
        if metrics and args.process_index == 0:
            import mlflow

            mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        trainer = trainer_class(
            model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config,
            callbacks=callbacks, **trainer_kwargs,
        )
        finetune.train_and_save(
            stage, trainer, checkpoint, cfg, samples=samples, max_new_tokens=max_new_tokens, extra=metrics,
            history_names=history_names(trainer) if history_names else None, history_required=history_required,
            after_training=after_training, base=base,
        )
    return Path(cfg.output_dir)
