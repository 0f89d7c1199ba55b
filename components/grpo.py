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
    `grpo.rollout_merge_lora` is on; bf16 weights on a CPU where training autocasts to bf16) through
    `model.generate` or, with `grpo.rollout_engine: batched`, rollouts.sample; whose log-prob passes
    run as `grpo.logps_batching` says for text-only batches (components/training/logps.py: padded is
    TRL's own pass) and, with `grpo.lean_logps`, with the LM head at the completions only (on a CPU,
    for shared_prefix, the model's own head and a float32 log-softmax instead of TRL's fused head) and
    the frozen weights in bf16 on a CPU training in bf16; which logs `informative_groups` (the share of
    groups with a reward spread) at every generation; and, with `grpo.informative_groups_only`,
    trains on those groups alone (informative.InformativeGroupsMixin), with the old policy's
    log-probs taken from the batched rollouts when `grpo.old_logps` is `rollout`."""
    from components.training import informative, lean_passes, logps, rollouts

    base = _trainer_class()
    cfg = params.grpo
    merge = cfg.rollout_merge_lora

    class Trainer(base):
        def _cpu_bf16(self) -> bool:
            return lean_passes.trains_in_cpu_bf16(self)

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args: Any, **kwargs: Any):
            if self.use_vllm:  # vLLM holds its own copy of the weights
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)
            with rollout_context(self.accelerator.unwrap_model(self.model), merge, self._cpu_bf16()):
                if (cfg.rollout_engine == "batched" and images is None and not multimodal_fields
                        and not self.use_transformers_continuous_batching and rollouts.supported(self.generation_config)):
                    return self._batched_rollouts(prompt_ids)
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)

        def _batched_rollouts(self, prompt_ids: list[list[int]]) -> tuple[list[list[int]], Any]:
            """(completion ids, their sampled log-probs or None): the log-probs only where the
            informative-groups trainer takes the old policy's from them (`grpo.old_logps: rollout`)."""
            from trl.models.utils import unwrap_model_for_generation

            want = bool(getattr(self, "old_logps_from_rollout", False)) and self.model.training
            with unwrap_model_for_generation(self.model_wrapped, self.accelerator,  # as TRL's generate path
                                             gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                             gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs) as model:
                out = rollouts.sample(model, prompt_ids, self.generation_config, self.max_completion_length,
                                      self.eos_token_ids, self._tokenizer.pad_token_id, logprobs=want)
            return out if want else (out, None)

        def _passes_context(self) -> contextlib.ExitStack:
            stack = contextlib.ExitStack()
            if cfg.lean_logps:
                stack.enter_context(lean_passes.lean_head_and_weights(self.accelerator.unwrap_model(self.model), self._cpu_bf16()))
            return stack

        def training_step(self, *args: Any, **kwargs: Any):
            with self._passes_context():
                return super().training_step(*args, **kwargs)

        def _generate_and_score_completions(self, inputs):
            with self._passes_context():
                return super()._generate_and_score_completions(inputs)

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self._last_rewards = rewards
            if self.model.training:
                weighted = informative.weighted_rewards(rewards, self.reward_weights)
                self._metrics["train"]["informative_groups"].append(informative.informative_share(weighted, self.num_generations))
            return rewards

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            plain = args or kwargs.get("compute_aux_loss") or any(
                v is not None for k, v in kwargs.items() if k not in ("batch_size", "compute_entropy", "compute_aux_loss"))
            if plain or cfg.logps_batching == "padded":  # TRL's own pass (images, MoE aux loss: always)
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            if cfg.logps_batching == "shared_prefix" and not self.accelerator.unwrap_model(model).is_gradient_checkpointing:
                lean = cfg.lean_logps and input_ids.device.type == "cpu"  # the lean head where TRL's fused one is slow
                return logps.shared_prefix_logps(model, input_ids, attention_mask, logits_to_keep, self.accelerator.autocast,
                                                 temperature=self.temperature if lean else None,
                                                 entropy_grad=bool(getattr(self, "_entropy_bonus_enabled", False)), **kwargs)
            return logps.unpadded_logps(super()._get_per_token_logps_and_entropies, model, input_ids, attention_mask,
                                        logits_to_keep, **kwargs)

    if cfg.informative_groups_only:
        class InformativeTrainer(informative.InformativeGroupsMixin, Trainer):
            old_logps_from_rollout = cfg.old_logps == "rollout"

        return InformativeTrainer
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
