"""GRPO (DVC stage `grpo`): TRL's GRPOTrainer from the SFT model, with the rewards named in params.

Reads `grpo.init_dir` (default `models/sft`) and `selection.output_file` (its problems: those of
`<data.output_dir>/grpo.jsonl` the selection stage kept, components/selection.py); writes
`grpo.output_dir` (default `models/grpo`), a standard model folder (with `grpo.use_lora`, a LoRA
adapter: over SFT's base when SFT wrote an adapter too, see `start_model`), and
`grpo.metrics_file` (default `reports/train/grpo.json`) with the per-step history beside it
(`grpo.history_file`: loss, reward per function, reward std, KL, completion length,
frac_reward_zero_std, ...; the data of `dvc plots show`). For each prompt the trainer samples `grpo.num_generations`
completions at `grpo.temperature`, scores them with `rewards.funcs` weighted by
`rewards.weights` (components/training/rewards.py), normalises the rewards within each group into
advantages and takes clipped policy-gradient steps (`grpo.epsilon`) with a KL penalty to the
frozen SFT model (`grpo.beta`). Every loss type TRL offers is selectable (`grpo.loss_type`);
LoRA (`grpo.use_lora`) and vLLM generation (`grpo.use_vllm`, colocate or server) are options.

MLflow (through transformers' integration, inside the stage's run): loss, each reward's mean
and std, KL, clip ratios, frac_reward_zero_std, completion lengths, learning rate at every
logging step, and a table of sampled completions with their rewards and advantages.
A signal monitor (components/training/signal_monitor.py, `grpo.signal_*`) warns in the log and the MLflow
run when most groups carry no learning signal (task too hard or too easy) or the KL drifts, and
adds `frac_reward_zero_std_mean` and `signal_warnings` to the summary.
Crash safety as in components/sft.py: checkpoints every `grpo.trainer.save_steps`, resume
from the newest on re-run, atomic replacement of the model folder.

    python -m components.grpo
    python -m components.grpo -S grpo.loss_type=dr_grpo -S grpo.trainer.max_steps=50
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

from components.common.entry import stage_main
from components.common.errors import ConfigError, InputError
from components.common.params import Params

STAGE = "grpo"
COMPLETIONS_TABLE = "grpo_completions.json"
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


def recipe(params: Params) -> dict[str, Any]:
    """The GRPOConfig fields our params section owns (the fields marked `recipe` in
    components/common/params.py) and the reward weights."""
    cfg = params.grpo
    owned = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.metadata.get("recipe")}
    return {**owned, "reward_weights": [float(w) for w in params.rewards.weights]}


def fingerprint_settings(params: Params) -> dict[str, Any]:
    """The settings that enter the resume fingerprint (finetune.fingerprint)."""
    from components.training import finetune

    return {
        "grpo": finetune.fingerprint_fields(params.grpo),
        "rewards": dataclasses.asdict(params.rewards),
        "model.dtype": params.model.dtype,
    }


def trainer_class(params: Params):
    """The stage's GRPOTrainer class for these params: _trainer_class, whose transformers rollouts
    run in rollout_context (the LoRA adapter folded into the base weights when
    `grpo.rollout_merge_lora` is on; bf16 weights on a CPU where training autocasts to bf16), and
    whose log-prob passes run per sequence without padding when `grpo.logps_batching` is
    per_sequence (unpadded_logps; text-only batches, anything else goes to TRL's own pass)."""
    base = _trainer_class()
    merge, per_sequence = params.grpo.rollout_merge_lora, params.grpo.logps_batching == "per_sequence"

    class Trainer(base):
        def _generate_single_turn(self, *args: Any, **kwargs: Any):
            if self.use_vllm:  # vLLM holds its own copy of the weights
                return super()._generate_single_turn(*args, **kwargs)
            cpu_bf16 = bool(self.args.bf16) and self.accelerator.device.type == "cpu"
            with rollout_context(self.accelerator.unwrap_model(self.model), merge, cpu_bf16):
                return super()._generate_single_turn(*args, **kwargs)

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            if not per_sequence or args or any(v is not None for k, v in kwargs.items()
                                               if k not in ("batch_size", "compute_entropy", "compute_aux_loss")):
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            return unpadded_logps(super()._get_per_token_logps_and_entropies, model, input_ids, attention_mask,
                                  logits_to_keep, **kwargs)

    return Trainer


def rollout_context(model: Any, merge: bool, cpu_bf16: bool) -> contextlib.ExitStack:
    """The context GRPO's transformers rollouts run in: the adapter folded into the base weights
    (adapters.merged_weights, exact base weights restored on exit) when `merge`, and the weights
    held in bf16 (precision.bf16_weights, exact float32 tensors back on exit) when `cpu_bf16`, i.e.
    where training autocasts to bf16 (`model.cpu_training_precision: auto` on a CPU with native
    bf16). TRL generates outside autocast, so without it a bf16 run decodes in float32, slower and
    in another precision than the loss's forward pass (benchmarks/RESULTS.md)."""
    from components.models.adapters import merged_weights
    from components.training.precision import bf16_weights

    stack = contextlib.ExitStack()
    with stack:  # a failed enter unwinds what was entered before it
        if merge:
            stack.enter_context(merged_weights(model))
        if cpu_bf16:
            stack.enter_context(bf16_weights(model))
        return stack.pop_all()


def unpadded_logps(compute, model, input_ids, attention_mask, logits_to_keep: int, **kwargs: Any):
    """TRL's per-token log-probs (and entropies) computed one sequence at a time on its own tokens: the
    prompt's left padding and the completion's right padding cut off, results padded back to the batch's
    `logits_to_keep` columns with zeros (those positions are masked out of the loss). On a CPU a padded
    batch spends its time on padding; a sequence alone still fills the matrix units. Positions then
    count from the first real token, as in generation.

    >>> import torch
    >>> def compute(model, ids, mask, keep, **kw):  # stand-in: "log-prob" = token id, entropy = position
    ...     return ids[:, -keep:].float(), torch.arange(ids.size(1))[-keep:].float().expand(ids.size(0), -1), None
    >>> ids = torch.tensor([[0, 5, 6, 7, 8, 0], [4, 5, 6, 7, 0, 0]])
    >>> mask = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    >>> logps, ent, _ = unpadded_logps(compute, None, ids, mask, 3, compute_entropy=True)
    >>> logps.tolist(), ent.tolist()
    ([[7.0, 8.0, 0.0], [7.0, 0.0, 0.0]], [[2.0, 3.0, 0.0], [3.0, 0.0, 0.0]])
    """
    import torch

    width = input_ids.size(1)
    kwargs = {k: v for k, v in kwargs.items() if k != "batch_size"}
    logps, entropies, aux = [], [], []
    for row in range(input_ids.size(0)):
        real = attention_mask[row].nonzero().flatten()
        first, last = (int(real[0]), int(real[-1]) + 1) if len(real) else (width - 1, width)
        keep = max(logits_to_keep - (width - last), 1)  # completion columns this sequence really has
        lp, ent, ax = compute(model, input_ids[row : row + 1, first:last], attention_mask[row : row + 1, first:last],
                              keep, batch_size=1, **kwargs)
        pad = logits_to_keep - lp.size(1)
        logps.append(torch.nn.functional.pad(lp, (0, pad)))
        if ent is not None:
            entropies.append(torch.nn.functional.pad(ent, (0, pad)))
        if ax is not None:
            aux.append(ax)
    return (torch.cat(logps), torch.cat(entropies) if entropies else None,
            torch.stack(aux).mean() if aux else None)


def _trainer_class():
    """GRPOTrainer that also logs its sampled completions to MLflow as a table.

    TRL logs that table to wandb/trackio only, and writes parquet files under log_completions;
    here the rows it keeps for that purpose go to the MLflow run at every logging step. Where MLflow
    is not installed (benchmarks/gpu_check.py on a GPU machine that carries only the training
    libraries) there is no run to log to, and the trainer is TRL's.
    """
    from trl import GRPOTrainer

    try:
        import mlflow
    except ImportError:
        return GRPOTrainer

    class Trainer(GRPOTrainer):
        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            super().log(logs, start_time)
            if not (self.accelerator.is_main_process and self.model.training and mlflow.active_run()):
                return
            recorded = self._logs  # filled by GRPOTrainer at every generation (latest batch only)
            n = len(recorded["prompt"])
            if n == 0 or getattr(self, "_grpoflow_logged_step", None) == self.state.global_step:
                return
            self._grpoflow_logged_step = self.state.global_step
            table = {
                "step": [self.state.global_step] * n,
                "prompt": [str(p) for p in recorded["prompt"]],
                "completion": [str(c) for c in recorded["completion"]],
                **{f"reward_{name}": list(values) for name, values in recorded["rewards"].items()},
                "advantage": list(recorded["advantages"]),
            }
            mlflow.log_table(table, artifact_file=COMPLETIONS_TABLE)

    return Trainer


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


def trainer_settings(params: Params) -> tuple[Any, Any]:
    """(trl.GRPOConfig, peft.LoraConfig or None) from the params; a wrong key or value is a ConfigError
    naming it. The stage calls it before it loads anything; `grpoflow run -S ...` before it writes
    the overrides into params.yaml (a rejected value leaves the file as it was)."""
    from trl import GRPOConfig as TRLGRPOConfig

    from components.training import finetune
    from components.training.rewards import check_reward_names

    check_reward_names(params.rewards)
    cfg = params.grpo
    if cfg.use_vllm and cfg.vllm_mode == "colocate" and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "grpo.use_vllm: vLLM is not installed here; on a GPU machine install the `vllm` extra "
            "(pip install -e '.[vllm]'), or set grpo.use_vllm=false"
        )
    args = finetune.build_trl_args(TRLGRPOConfig, STAGE, cfg.trainer, output_dir=cfg.checkpoint_dir,
                                   cpu_bf16=finetune.cpu_bf16(params.model.cpu_training_precision), **recipe(params))
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
        trainer_kwargs={"reward_funcs": reward_funcs}, max_new_tokens=max_new_tokens,
        history_required=HISTORY_REQUIRED,
        history_names=lambda trainer: history_names(trainer.reward_func_names, params.rewards.funcs),
        after_training=summary,
    )
    return train_stage(job)


def main(argv: list[str] | None = None) -> int:
    return stage_main(STAGE, __doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
