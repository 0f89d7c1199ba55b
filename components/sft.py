"""SFT warm start (DVC stage `sft`): TRL's SFTTrainer on the train split, loss on the completion only.

Reads the base model (`model.base_dir`, written by the `model` stage) and
`<data.output_dir>/train.jsonl`; writes `sft.output_dir` (default `models/sft`), a standard
model folder, `sft.metrics_file` (default `reports/train/sft.json`) and the per-step loss history
`sft.history_file` (`reports/train/sft_history.csv`, plotted by `dvc plots show`). Each demonstration is the rendered
prompt (components.problems.gsm8k.render_prompt) followed by `<reasoning>solution</reasoning><answer>gold</answer>`
and eos. Like SFT data pooled from real sources, a share of the demonstrations is noisy on
purpose (`sft.demo_untagged_rate`, `sft.demo_wrong_rate`; docs/training.md, "Noisy demonstrations,
on request"): that is what GRPO's rule-based rewards then repair.

SFT to its plateau: `sft.dev_size` demonstrations (the last rows of train.jsonl) are held out
as a dev split; every `sft.dev_every` steps the model answers them greedily and `dev_accuracy`
(flexible) joins the history and MLflow: the SFT curve. With `sft.plateau_patience` > 0, SFT
stops once dev accuracy has not risen by `sft.plateau_min_delta` for that many measurements,
so that GRPO starts from a model more SFT does not improve; the report says where it stopped.

Crash safety: a checkpoint every `sft.trainer.save_steps` in `sft.checkpoint_dir`; re-running
after a crash resumes from the newest one (a log line says which). The model folder is
replaced atomically, only after training succeeded.

    python -m components.sft
    python -m components.sft -S sft.trainer.max_steps=200 -S sft.use_lora=true
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from components.common.entry import stage_main
from components.common.errors import InputError
from components.common.params import Params, SFTParams
from components.training.dev_accuracy import Plateau, dev_callback

STAGE = "sft"
_RESULT_RE = re.compile(r"=\s*(-?\d+(?:\.\d+)?)")


def untagged_target(solution: str, answer: str) -> str:
    """A demonstration in GSM8K's own format instead of the tags.

    >>> print(untagged_target("3 + 4 = 7", "7"))
    3 + 4 = 7
    #### 7
    """
    return f"{solution.strip()}\n#### {answer}"


def wrong_answer(solution: str, gold: str, rng: random.Random) -> str:
    """A plausible mistake: the result of an earlier step, or (one step) the gold answer off by one.

    >>> wrong_answer("2 + 3 = 5. Then 5 * 4 = 20.", "20", random.Random(0))
    '5'
    >>> wrong_answer("2 + 3 = 5.", "5", random.Random(0)) in ("4", "6")
    True
    """
    earlier = [r for r in _RESULT_RE.findall(solution) if r != gold]
    if earlier:
        return rng.choice(earlier)
    try:
        value = float(gold)
    except ValueError:
        return gold + "0"
    shifted = value + rng.choice([-1, 1]) if value >= 1 else value + 1
    return str(int(shifted)) if shifted == int(shifted) else str(shifted)


def build_demos(rows: list[dict[str, str]], tokenizer: Any, cfg: SFTParams) -> tuple[Any, dict[str, int]]:
    """The prompt/completion dataset and counts of untagged and wrong demonstrations."""
    from datasets import Dataset

    from components.problems import gsm8k

    rng = random.Random(cfg.demo_seed)
    prompts, completions = [], []
    counts = {"demos": len(rows), "demos_untagged": 0, "demos_wrong": 0}
    for row in rows:
        untagged = rng.random() < cfg.demo_untagged_rate
        wrong = rng.random() < cfg.demo_wrong_rate
        answer = wrong_answer(row["solution"], row["gold"], rng) if wrong else row["gold"]
        counts["demos_untagged"] += untagged
        counts["demos_wrong"] += wrong
        prompts.append(gsm8k.render_prompt(row["question"], tokenizer))
        completions.append(
            untagged_target(row["solution"], answer)
            if untagged
            else gsm8k.format_target(row["solution"], answer)
        )
    return Dataset.from_dict({"prompt": prompts, "completion": completions}), counts


def split_dev(rows: list[dict[str, str]], dev_size: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(demonstrations SFT trains on, dev rows): the last `dev_size` rows are held out.

    >>> split_dev([{"id": str(i)} for i in range(5)], 2)
    ([{'id': '0'}, {'id': '1'}, {'id': '2'}], [{'id': '3'}, {'id': '4'}])
    """
    if dev_size and dev_size >= len(rows):
        from components.common.errors import ConfigError

        raise ConfigError(f"sft.dev_size={dev_size} holds out every one of the {len(rows)} demonstrations; lower it")
    return (rows[:-dev_size], rows[-dev_size:]) if dev_size else (rows, [])


def fingerprint_settings(params: Params) -> dict[str, Any]:
    """The settings that enter the resume fingerprint (finetune.fingerprint)."""
    from components.training import finetune

    return {"sft": finetune.fingerprint_fields(params.sft), "model.dtype": params.model.dtype}


def trainer_settings(params: Params) -> tuple[Any, Any]:
    """(trl.SFTConfig, peft.LoraConfig or None) from the params; a wrong key or value is a ConfigError
    naming it. The stage calls it before it loads anything; `grpoflow run -S ...` before it writes
    the overrides into params.yaml (a rejected value leaves the file as it was)."""
    from trl import SFTConfig as TRLSFTConfig

    from components.training import finetune

    cfg = params.sft
    args = finetune.build_trl_args(TRLSFTConfig, STAGE, cfg.trainer, output_dir=cfg.checkpoint_dir,
                                   cpu_bf16=finetune.cpu_bf16(params.model.cpu_training_precision))
    return args, finetune.lora_config(STAGE, cfg.lora) if cfg.use_lora else None


def sft_trainer_class(params: Params) -> type:
    """TRL's SFTTrainer, with `sft.lean_passes` each training step under lean_passes.lean_training_step: the
    LM head at the completions only and, on a CPU, the math attention kernel and (training in bf16)
    the frozen weights held in bf16."""
    from trl import SFTTrainer

    if not params.sft.lean_passes:
        return SFTTrainer

    from components.training import lean_passes

    class LeanSFTTrainer(SFTTrainer):
        def training_step(self, *args: Any, **kwargs: Any):
            with lean_passes.lean_training_step(self.accelerator.unwrap_model(self.model), self.accelerator.device,
                                                lean_passes.trains_in_cpu_bf16(self)):
                return super().training_step(*args, **kwargs)

    return LeanSFTTrainer


def run(params: Params) -> Path:
    """Train and write the SFT model folder; returns its path. Reads top to bottom: settings → data →
    tokenizer and model → dataset and callbacks → trainer → train and save."""
    from components.models import modelio
    from components.problems.sources import read_split
    from components.training.job import TrainingJob, train_stage

    cfg, train = params.sft, Path(params.data.output_dir) / "train.jsonl"
    settings = trainer_settings(params)  # fails before any data or model is loaded
    modelio.require_model_dir(params.model.base_dir, "base model", "model")
    if cfg.use_lora and modelio.is_adapter_dir(params.model.base_dir):  # its base would name an adapter
        raise InputError(
            f"model.base_dir {params.model.base_dir} is a LoRA adapter: a new adapter trained over it could not "
            f"be loaded again; merge it into a full model first (grpoflow export {params.model.base_dir} FOLDER "
            "--merged) and point "
            f"model.base_dir there"
        )

    rows, dev = split_dev(read_split(train), cfg.dev_size)  # data

    model, tokenizer = modelio.load_model_and_tokenizer(params.model.base_dir, params.model)
    dataset, counts = build_demos(rows, tokenizer, cfg)
    callbacks = [dev_callback(dev, tokenizer, cfg.dev_every, cfg.dev_max_new_tokens,
                              Plateau(cfg.plateau_patience, cfg.plateau_min_delta))] if dev else []
    base = None
    if cfg.use_lora:  # the adapter is saved over models/base, named by its weights' hash
        from components.models.adapters import base_ref_for

        base = base_ref_for(params.model.base_dir, params.model.name_or_path)

    job = TrainingJob(
        STAGE, params, sft_trainer_class(params), settings, model, tokenizer, dataset,
        inputs=[train, params.model.base_dir], datasets={"train": (train, "training")},
        fingerprint=fingerprint_settings(params), base=base, callbacks=callbacks, metrics=counts,
        after_training=callbacks[0].summary if callbacks else None,
    )
    return train_stage(job)


def main(argv: list[str] | None = None) -> int:
    return stage_main(STAGE, __doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
