"""GRPO (DVC stage `grpo`): TRL's GRPOTrainer from the SFT model, with the rewards named in params.

Reads `grpo.init_dir` (default `models/sft`) and `selection.output_file` (its problems: those of
`<data.output_dir>/grpo.jsonl` the selection stage kept, components/selection.py); writes
`grpo.output_dir` (default `models/grpo`), a standard model folder (with `grpo.use_lora`, a LoRA
adapter: over SFT's base when SFT wrote an adapter too, see `start_model`), and
`grpo.metrics_file` (default `reports/train/grpo.json`) with the per-step history beside it
(`grpo.history_file`: loss, reward per function, reward std, KL, completion length,
frac_reward_zero_std, ...; the data of `dvc plots show`). For each prompt the trainer samples
`grpo.trainer.num_generations` completions at `grpo.trainer.temperature`, scores them with `rewards.funcs`
weighted by `rewards.weights` (components/training/rewards.py), normalises the rewards within each group
into advantages and takes clipped policy-gradient steps (`grpo.trainer.epsilon`) with a KL penalty to the
frozen SFT model (`grpo.trainer.beta`). `grpo.trainer` is TRL's GRPOConfig, so every loss type TRL offers
is selectable (`grpo.trainer.loss_type`); LoRA (`grpo.use_lora`) and vLLM generation
(`grpo.trainer.use_vllm`, colocate or server) are options.

MLflow (through transformers' integration, inside the stage's run): loss, each reward's mean
and std, KL, clip ratios, frac_reward_zero_std, completion lengths, learning rate at every
logging step, and the sampled completions with their rewards and advantages, a table per generation
batch (`completions/step_NNNNNN.json`, components/training/grpo_trainer.py).
A signal monitor (components/training/signal_monitor.py, `grpo.signal_*`) warns in the log and the MLflow
run when most groups carry no learning signal (task too hard or too easy) or the KL drifts, and
adds `frac_reward_zero_std_mean` and `signal_warnings` to the summary.
Crash safety as in components/sft.py: checkpoints every `grpo.trainer.save_steps`, resume
from the newest on re-run, atomic replacement of the model folder.

    python -m components.grpo
    python -m components.grpo -S grpo.trainer.loss_type=dr_grpo -S grpo.trainer.max_steps=50
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

from components.common.entry import stage_main
from components.common.errors import ConfigError, InputError
from components.common.params import Params

STAGE = "grpo"
# Columns dvc.yaml's plots read that TRL does not always log (kl only when beta > 0): present, maybe empty.
HISTORY_REQUIRED = ("loss", "reward", "reward_std", "kl", "completions/mean_length", "frac_reward_zero_std")


def history_names(trl_names: list[str], funcs: list[str]) -> dict[str, str]:
    """History columns of each reward function named as in `rewards.funcs` (the mean under its own name,
    the std with `_std`), so that dvc.yaml's per-function plot can list `${rewards.funcs}`.

    >>> history_names(["seed_combined_reward"], ["seed_combined"])
    {'rewards/seed_combined_reward/mean': 'seed_combined', 'rewards/seed_combined_reward/std': 'seed_combined_std'}
    """
    out = {}
    for trl_name, name in zip(trl_names, funcs, strict=True):
        out[f"rewards/{trl_name}/mean"] = name
        out[f"rewards/{trl_name}/std"] = f"{name}_std"
    return out


def owned_fields(params: Params) -> dict[str, Any]:
    """The GRPOConfig fields the stage sets from other params than `grpo.trainer`: the reward weights."""
    return {"reward_weights": [float(w) for w in params.rewards.weights]}


def fingerprint_settings(params: Params) -> dict[str, Any]:
    """The settings that enter the resume fingerprint (finetune.fingerprint)."""
    from components.training import finetune

    return {
        "grpo": finetune.fingerprint_fields(params.grpo),
        "rewards": dataclasses.asdict(params.rewards),
        "model.dtype": params.model.dtype,
    }


def trainer_class(params: Params) -> type:
    """The stage's trainer class for these params (components/training/grpo_trainer.py): one that trains on
    the informative groups alone with `grpo.informative_groups_only`, else GRPOFlowTrainer. Either takes
    `stage_params=params.grpo` beside TRL's arguments."""
    from components.training.grpo_trainer import GRPOFlowTrainer, InformativeGRPOTrainer

    return InformativeGRPOTrainer if params.grpo.informative_groups_only else GRPOFlowTrainer


def dev_split(problems: list[dict[str, Any]], size: int, target_band: str) -> list[dict[str, Any]]:
    """GRPO's dev split: the last `size` problems of grpo.jsonl in the target band (all of them
    without one), so that the curve is the band the user named.

    >>> rows = [{"id": str(i), "steps": 1 + i % 3} for i in range(9)]
    >>> [r["id"] for r in dev_split(rows, 2, "3")], [r["id"] for r in dev_split(rows, 2, "")], dev_split(rows, 0, "3")
    (['5', '8'], ['7', '8'], [])
    """
    from components.problems.bands import in_band, parse_band

    band = parse_band(target_band)
    pool = [r for r in problems if band is None or in_band(r.get("steps"), band)]
    return pool[-size:] if size else []


def vllm_cpu_packs_weights() -> bool:
    """Whether vLLM runs here on a CPU whose linear layers it repacks after loading (oneDNN, zentorch or
    AMX kernels: the layer's weight is replaced by an empty tensor without vLLM's weight loader), where
    TRL's colocated rollouts fail at their first weight sync ('Parameter' object has no attribute
    'weight_loader'). False without vLLM or on a GPU."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    if torch.cuda.is_available():
        return False
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    zen = current_platform.is_zen_cpu() and hasattr(getattr(torch.ops, "zentorch", None), "zentorch_linear_unary")
    return current_platform.is_cpu() and (zen or bool(getattr(ops, "_supports_onednn", False))
                                          or torch.cpu._is_amx_tile_supported())


def trainer_settings(params: Params) -> tuple[Any, Any]:
    """(trl.GRPOConfig, peft.LoraConfig or None) from the params; a wrong key or value is a ConfigError
    naming it. The stage calls it before it loads anything; `grpoflow run -S ...` before it writes
    the overrides into params.yaml (a rejected value leaves the file as it was)."""
    from trl import GRPOConfig as TRLGRPOConfig

    from components.training import finetune
    from components.training.rewards import check_reward_names

    check_reward_names(params.rewards)
    cfg = params.grpo
    if cfg.trainer["use_vllm"] and cfg.trainer["vllm_mode"] == "colocate" and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "grpo.trainer.use_vllm: vLLM is not installed here; on a GPU machine install the `vllm` extra "
            "(pip install -e '.[vllm]'), or set grpo.trainer.use_vllm=false"
        )
    if cfg.trainer["use_vllm"] and cfg.trainer["vllm_mode"] == "colocate" and vllm_cpu_packs_weights():
        raise ConfigError(
            "grpo.trainer.use_vllm: vLLM-CPU repacks its linear weights on this CPU (oneDNN, zentorch or AMX "
            "kernels), so TRL's colocated rollouts cannot load the policy's new weights into it; on a CPU set "
            "grpo.trainer.use_vllm=false (the batched rollouts, grpo.rollout_engine), or train on a GPU"
        )
    args = finetune.build_trl_args(TRLGRPOConfig, STAGE, cfg.trainer, output_dir=cfg.checkpoint_dir,
                                   cpu_bf16=finetune.cpu_bf16(params.model.cpu_training_precision),
                                   **owned_fields(params))
    if cfg.informative_groups_only and args.multi_objective_aggregation != "sum_then_normalize":
        raise ConfigError("grpo.informative_groups_only: with trainer.multi_objective_aggregation="
                          f"{args.multi_objective_aggregation} a group with equal rewards still has an advantage "
                          "(normalized over the batch); use sum_then_normalize or turn the option off")
    return args, finetune.lora_config(STAGE, cfg.lora) if cfg.use_lora else None


def start_model(params: Params, settings: tuple[Any, Any]) -> tuple[Any, Any, Any, list[Path], tuple[Any, Any]]:
    """(model, tokenizer, base, inputs, settings) GRPO starts from `grpo.init_dir`.

    A full SFT model: the model itself; with `grpo.use_lora` a new adapter over it (base: init_dir).
    A LoRA SFT adapter with `grpo.use_lora`: the adapter trains on over SFT's base (TRL keeps a frozen
    copy of it, the "ref" adapter, as the KL reference) and the GRPO adapter applies to the same base,
    so base + models/grpo is the whole policy; `grpo.lora` is not used (the adapter keeps its rank and
    targets). A LoRA SFT adapter without `grpo.use_lora`: full fine-tuning of base + adapter merged.
    `inputs` are the folders a checkpoint's fingerprint covers."""
    from components.models import adapters, modelio

    cfg = params.grpo
    init = Path(cfg.init_dir)
    if not adapters.is_adapter_dir(init):
        model, tokenizer = modelio.load_model_and_tokenizer(init, params.model)
        base = adapters.base_ref_for(init, str(init)) if cfg.use_lora else None
        return model, tokenizer, base, [init], settings
    base_dir = adapters.find_base(init)
    tokenizer = modelio.load_tokenizer(init)
    if not cfg.use_lora:
        model = modelio.load_model(adapters.merged_copy(init, base_dir), dtype=params.model.dtype)
        return model, tokenizer, None, [init, base_dir], settings
    model = adapters.load_trainable(init, base_dir, dtype=params.model.dtype)
    return model, tokenizer, adapters.base_of(init), [init, base_dir], (settings[0], None)


def prompt_dataset(rows: list[dict[str, Any]], tokenizer: Any) -> Any:
    """GRPO's training dataset: each problem's rendered prompt and its `gold` answer (the rewards read it)."""
    from datasets import Dataset

    from components.problems import gsm8k

    return Dataset.from_dict({"prompt": [gsm8k.render_prompt(r["question"], tokenizer) for r in rows],
                              "gold": [r["gold"] for r in rows]})


def run(params: Params) -> Path:
    """Train and write the GRPO model folder; returns its path. Reads top to bottom: settings →
    data → rewards → tokenizer and model → dataset and callbacks → trainer → train and save."""
    from components.models import modelio
    from components.problems.sources import read_split
    from components.training import signal_monitor
    from components.training.dev_accuracy import dev_callback
    from components.training.job import TrainingJob, train_stage
    from components.training.rewards import build_rewards

    cfg = params.grpo
    settings = trainer_settings(params)  # fails before any data or model is loaded
    max_new_tokens = settings[0].max_completion_length or 256
    modelio.require_model_dir(cfg.init_dir, "SFT model", "sft")

    # data: the selection stage's choice of grpo.jsonl's problems, less the dev split
    prompts = Path(params.selection.output_file)
    if not prompts.is_file():
        raise InputError(f"{prompts}: GRPO's selected prompts are missing; run `dvc repro selection` first")
    rows = read_split(prompts)  # the reward needs only `gold`
    dev = dev_split(read_split(Path(params.data.output_dir) / "grpo.jsonl"), cfg.dev_size,
                    params.evaluate.target_band) if cfg.dev_size else []
    if dev:  # held out: never a training prompt
        held = {r["id"] for r in dev}
        rows = [r for r in rows if r["id"] not in held]
        if not rows:
            raise ConfigError(f"grpo.dev_size={cfg.dev_size} holds out every selected prompt; lower it")

    # rewards (before the model loads: a bad name fails in a second)
    try:
        reward_funcs, weights = build_rewards(params.rewards)
    except ValueError as exc:
        raise ConfigError(f"rewards: {exc}") from None

    # tokenizer and model, then the dataset and the callbacks
    model, tokenizer, base, inputs, settings = start_model(params, settings)
    dataset = prompt_dataset(rows, tokenizer)
    monitor = signal_monitor.SignalMonitor(
        window=1,  # set from trainer.logging_steps when training starts
        zero_std=cfg.signal_zero_std, flat_reward=cfg.signal_flat_reward, max_kl=cfg.signal_max_kl,
        max_reward=signal_monitor.max_reward(weights),
    )
    callbacks = [signal_monitor.callback(monitor, cfg.signal_window)]
    if dev:
        callbacks.append(dev_callback(dev, tokenizer, cfg.dev_every, max_new_tokens, at_start=True))

    def summary() -> dict[str, Any]:
        return {**monitor.summary(), **(callbacks[1].summary() if dev else {})}

    # trainer, train, save
    job = TrainingJob(
        STAGE, params, trainer_class(params), settings, model, tokenizer, dataset,
        inputs=[prompts, *inputs], datasets={"selected_prompts": (prompts, "training")},
        fingerprint=fingerprint_settings(params), base=base, callbacks=callbacks,
        trainer_kwargs={"reward_funcs": reward_funcs, "stage_params": cfg}, max_new_tokens=max_new_tokens,
        history_required=HISTORY_REQUIRED,
        history_names=lambda trainer: history_names(trainer.reward_func_names, params.rewards.funcs),
        after_training=summary,
    )
    return train_stage(job)


def main(argv: list[str] | None = None) -> int:
    return stage_main(STAGE, __doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
