"""The grpo stage's trainer: TRL's GRPOTrainer with grpoflow's rollouts, log-prob passes and MLflow logging.

    GRPOFlowTrainer           GRPOTrainer, run as the `grpo.*` keys given as `stage_params` say (see the class)
    InformativeGRPOTrainer    the same, training on the informative groups alone (`grpo.informative_groups_only`)
    rollout_context(...)      the context its transformers rollouts run in (merged adapter, bf16 weights)

Both classes take the stage's `GRPOParams` as the keyword argument `stage_params` beside TRL's own;
components/grpo.py `trainer_class(params)` picks the class. Imported only where a GRPO trainer is
built (the stage's run, benchmarks/grpo_step.py, tests): it imports TRL.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

from trl import GRPOTrainer

from components.common.params import GRPOParams
from components.models import sampling as rollouts
from components.training import informative, lean_passes, logps

# The sampled completions in the MLflow run: one file per logging step that saw a new generation batch,
# never rewritten (mlflow.log_table appends by downloading the table and uploading it whole: at every
# logging step, a cost that grows with the run; benchmarks/completions_logging.py).
COMPLETIONS_DIR = "completions"


def completions_file(step: int) -> str:
    """The run's artifact that holds the completions logged at `step`.

    >>> completions_file(128)
    'completions/step_000128.json'
    """
    return f"{COMPLETIONS_DIR}/step_{step:06d}.json"


def completions_table(recorded: dict[str, Any], step: int) -> dict[str, list]:
    """GRPOTrainer's record of its latest generation batch (`_logs`: prompts, completions, each reward
    function's rewards, advantages) as the JSON MLflow writes a table in (`mlflow.log_table`, pandas'
    "split" layout: `pd.read_json(path, orient="split")` reads it); an unscored reward (NaN) is null.

    >>> completions_table({"prompt": ["p"], "completion": ["c"], "rewards": {"acc": [float("nan")]},
    ...                    "advantages": [0.5]}, 3)
    {'columns': ['step', 'prompt', 'completion', 'reward_acc', 'advantage'], 'data': [[3, 'p', 'c', None, 0.5]]}
    """
    columns = {
        "prompt": [str(p) for p in recorded["prompt"]],
        "completion": [str(c) for c in recorded["completion"]],
        **{f"reward_{name}": [_finite(v) for v in values] for name, values in recorded["rewards"].items()},
        "advantage": [_finite(v) for v in recorded["advantages"]],
    }
    return {"columns": ["step", *columns], "data": [[step, *row] for row in zip(*columns.values(), strict=True)]}


def _finite(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


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


class GRPOFlowTrainer(GRPOTrainer):
    """GRPOTrainer whose transformers rollouts run in rollout_context (the LoRA adapter folded into the
    base weights when `grpo.rollout_merge_lora` is on; bf16 weights on a CPU where training autocasts to
    bf16) through `model.generate` or, with `grpo.rollout_engine: batched`, rollouts.sample; whose
    log-prob passes run as `grpo.logps_batching` says for text-only batches (components/training/logps.py:
    padded is TRL's own pass) and, with `grpo.lean_logps`, with the LM head at the completions only (on a
    CPU, for shared_prefix, the model's own head and a float32 log-softmax instead of TRL's fused head) and
    the frozen weights in bf16 on a CPU training in bf16; which logs `informative_groups` (the share of
    groups with a reward spread) at every generation; and which logs the sampled completions of each
    generation batch to the MLflow run, at the first logging step after it was sampled, as a file of its
    own (`completions_file`): uploaded once, never downloaded or rewritten.

    TRL logs that table to wandb/trackio only, and writes parquet files under log_completions; here the
    rows it keeps for that purpose go to the MLflow run. Where MLflow is not installed
    (benchmarks/gpu_check.py on a GPU machine that carries only the training libraries) there is no run
    to log to."""

    def __init__(self, *args: Any, stage_params: GRPOParams, **kwargs: Any) -> None:
        self.stage_params = stage_params
        super().__init__(*args, **kwargs)

    def _cpu_bf16(self) -> bool:
        return lean_passes.trains_in_cpu_bf16(self)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args: Any, **kwargs: Any):
        if self.use_vllm:  # vLLM holds its own copy of the weights
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)
        cfg = self.stage_params
        with rollout_context(self.accelerator.unwrap_model(self.model), cfg.rollout_merge_lora, self._cpu_bf16()):
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
                                         gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs
                                         ) as model:
            out = rollouts.sample(model, prompt_ids, self.generation_config, self.max_completion_length,
                                  self.eos_token_ids, self._tokenizer.pad_token_id, logprobs=want)
        return out if want else (out, None)

    def _passes_context(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if self.stage_params.lean_logps:
            stack.enter_context(lean_passes.lean_head_and_weights(self.accelerator.unwrap_model(self.model),
                                                                  self._cpu_bf16()))
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
            self._metrics["train"]["informative_groups"].append(
                informative.informative_share(weighted, self.num_generations))
        return rewards

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        cfg = self.stage_params
        plain = args or kwargs.get("compute_aux_loss") or any(
            v is not None for k, v in kwargs.items() if k not in ("batch_size", "compute_entropy", "compute_aux_loss"))
        if plain or cfg.logps_batching == "padded":  # TRL's own pass (images, MoE aux loss: always)
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        if cfg.logps_batching == "shared_prefix" and not self.accelerator.unwrap_model(model).is_gradient_checkpointing:
            lean = cfg.lean_logps and input_ids.device.type == "cpu"  # the lean head where TRL's fused one is slow
            return logps.shared_prefix_logps(model, input_ids, attention_mask, logits_to_keep,
                                             self.accelerator.autocast,
                                             temperature=self.temperature if lean else None,
                                             entropy_grad=bool(getattr(self, "_entropy_bonus_enabled", False)),
                                             **kwargs)
        return logps.unpadded_logps(super()._get_per_token_logps_and_entropies, model, input_ids, attention_mask,
                                    logits_to_keep, **kwargs)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        super().log(logs, start_time)
        try:
            import mlflow
        except ImportError:
            return
        if not (self.accelerator.is_main_process and self.model.training and mlflow.active_run()):
            return
        table = completions_table(self._logs, self.state.global_step)  # GRPOTrainer's rows: the latest batch
        batch = json.dumps([row[1:] for row in table["data"]])  # the rows less their step
        if not table["data"] or batch == getattr(self, "_grpoflow_logged_batch", None):
            return  # nothing generated yet, or this batch is logged already (steps sharing a generation)
        self._grpoflow_logged_batch = batch
        mlflow.log_text(json.dumps(table), completions_file(self.state.global_step))


class InformativeGRPOTrainer(informative.InformativeGroupsMixin, GRPOFlowTrainer):
    """GRPOFlowTrainer that trains on the informative groups alone (informative.InformativeGroupsMixin),
    with the old policy's log-probs taken from the batched rollouts when `grpo.old_logps` is `rollout`."""

    @property
    def old_logps_from_rollout(self) -> bool:
        return self.stage_params.old_logps == "rollout"
