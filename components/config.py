"""Typed params: one dataclass per params.yaml section, loaded and validated.

`load_params()` reads params.yaml, applies `-S section.key=value` overrides (the
syntax of `dvc exp run -S`; values are parsed as YAML, so `-S grpo.beta=0.0` is a
float and `-S data.allow_overlap=true` a bool) and returns a `Params` object.
Unknown keys, wrong types and out-of-range values raise `ConfigError`, whose
message names the key and what was expected.

Every field carries `metadata={"help": ...}`; bounds and choices live in the same
metadata (`choices`, `ge`, `gt`, `le`) and are checked generically, so adding a
setting is adding one field. Cross-field rules go in `__post_init__`.

    python -m components.config            # print the effective params as YAML
    python -m components.config -S grpo.beta=0.0
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from components.errors import ConfigError, GrpoflowError
from components.files import repo_root

__all__ = ["ConfigError", "Params", "load_params", "add_params_args", "stage_main"]

DEFAULT_PARAMS = "params.yaml"
PARAMS_ENV = "GRPOFLOW_PARAMS"  # lets the flow and tests point stages at another file


def _f(default: Any, help: str, **checks: Any) -> Any:
    """A dataclass field with help text and optional checks (choices, ge, gt, le)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **checks})
    return field(default=default, metadata={"help": help, **checks})


def _dtype(purpose: str) -> Any:
    """The weights-dtype field the model and evaluate sections share."""
    return _f(
        "auto",
        f"Weights dtype for {purpose}: 'auto' (bf16 on a GPU that supports it, else float32), 'float32', 'bfloat16', "
        "'float16'.",
        choices=["auto", "float32", "bfloat16", "float16"],
    )


# --------------------------------------------------------------------------- sections


@dataclass
class DataConfig:
    train_source: str = _f(
        "synthetic",
        "Where the train split comes from: 'synthetic' (seeded GSM8K-style generator), "
        "'jsonl:PATH' (GSM8K's native {question, answer} lines) or 'hf:NAME[:CONFIG]' "
        "(a Hugging Face dataset, e.g. hf:openai/gsm8k:main).",
    )
    test_source: str = _f("synthetic", "Where the test split comes from; same forms as train_source.")
    output_dir: str = _f(
        "data/processed",
        "Folder that receives train.jsonl (demonstrations), grpo.jsonl (GRPO's problems), test.jsonl, stats.json.",
    )
    synthetic_train_size: int = _f(4000, "Number of synthetic train problems.", ge=1)
    synthetic_test_size: int = _f(600, "Number of synthetic test problems.", ge=1)
    seed: int = _f(1234, "Seed of the synthetic generator (train and test use derived seeds).", ge=0)
    synthetic_max_steps: int = _f(
        3,
        "Synthetic problems take 1 to this many arithmetic steps (drawn uniformly); both splits use the "
        "same setting. Fewer steps: easier problems (benchmarks/RESULTS.md).",
        ge=1,
        le=6,
    )
    synthetic_max_number: int = _f(
        20,
        "Largest starting amount and largest amount bought in a synthetic problem (both splits). Smaller: "
        "easier arithmetic, and a tiny model that SFT leaves at a higher accuracy (benchmarks/RESULTS.md).",
        ge=2,
    )
    synthetic_test_max_steps: int = _f(
        0,
        "Synthetic test problems take 1 to this many steps (0 = synthetic_max_steps): set it to the answer-only "
        "band's top so that the test split spans the demonstrations' band and the answer-only one.",
        ge=0,
        le=6,
    )
    synthetic_answer_only_size: int = _f(
        0,
        "Synthetic problems made for GRPO with only their final answer (grpo.jsonl), drawn from the harder band "
        "synthetic_answer_only_min_steps..synthetic_answer_only_max_steps; SFT never sees them (0 = none).",
        ge=0,
    )
    synthetic_answer_only_min_steps: int = _f(2, "Fewest steps of a synthetic answer-only problem.", ge=1, le=6)
    synthetic_answer_only_max_steps: int = _f(4, "Most steps of a synthetic answer-only problem.", ge=1, le=6)
    answer_only_share: float = _f(
        0.0,
        "Share of the train rows (any source, e.g. jsonl:) whose solution is withheld: drawn with data.seed, they "
        "leave the demonstrations (train.jsonl) and become answer-only GRPO problems (grpo.jsonl). With no "
        "answer-only problems at all, grpo.jsonl holds the demonstrations' questions with their answers.",
        ge=0.0,
        le=0.99,
    )
    on_bad_rows: str = _f(
        "fail",
        "'fail': stop and report FILE:LINE for bad rows; 'skip': drop and count them in stats.json.",
        choices=["fail", "skip"],
    )
    allow_overlap: bool = _f(
        False, "Allow a question to appear in both train and test (compared case- and space-insensitively)."
    )
    max_train_rows: int = _f(0, "Keep at most this many train rows after validation (0 = all).", ge=0)
    max_test_rows: int = _f(0, "Keep at most this many test rows after validation (0 = all).", ge=0)

    def __post_init__(self) -> None:
        for key in ("train_source", "test_source"):
            src = getattr(self, key)
            if not (src == "synthetic" or src.startswith("jsonl:") or src.startswith("hf:")):
                raise ConfigError(
                    f"data.{key}: expected 'synthetic', 'jsonl:PATH' or 'hf:NAME[:CONFIG]', got {src!r}"
                )
            if src in ("jsonl:", "hf:"):
                raise ConfigError(f"data.{key}: {src!r} needs a path or dataset name after the colon")
        if self.synthetic_answer_only_min_steps > self.synthetic_answer_only_max_steps:
            raise ConfigError(
                f"data.synthetic_answer_only_min_steps ({self.synthetic_answer_only_min_steps}) is above "
                f"data.synthetic_answer_only_max_steps ({self.synthetic_answer_only_max_steps})"
            )
        if self.synthetic_answer_only_size and self.train_source != "synthetic":
            raise ConfigError(
                "data.synthetic_answer_only_size needs data.train_source=synthetic; with another source set "
                "data.answer_only_share (the share of its train rows whose solution is withheld)"
            )


@dataclass
class ModelConfig:
    name_or_path: str = _f(
        "tiny",
        "'tiny' (a small Qwen2-style model built offline), a Hugging Face model id "
        "(e.g. Qwen/Qwen2.5-0.5B-Instruct) or a local model folder.",
    )
    trust_remote_code: bool = _f(False, "Allow custom modelling code from the hub (off: only built-in architectures).")
    dtype: str = _dtype("training")
    revision: str | None = _f(
        None, "Hub revision (branch, tag or commit) of a Hugging Face model id; pin a commit to reproduce a run."
    )
    base_dir: str = _f(
        "models/base",
        "Where the `model` stage writes the base model (the tiny model built here, or a copy of name_or_path) "
        "that SFT starts from.",
    )
    tiny_hidden_size: int = _f(128, "Hidden width of the tiny model.", ge=16)
    tiny_intermediate_size: int = _f(512, "MLP width of the tiny model.", ge=16)
    tiny_num_layers: int = _f(2, "Number of decoder layers of the tiny model.", ge=1)
    tiny_num_heads: int = _f(4, "Attention heads of the tiny model (must divide tiny_hidden_size).", ge=1)
    tiny_max_positions: int = _f(512, "Longest sequence (prompt + completion, in tokens) the tiny model handles.", ge=64)
    tiny_vocab_size: int = _f(
        512, "Vocabulary size of the tiny model's locally trained BPE tokenizer (at most; a small corpus yields fewer).", ge=300
    )
    seed: int = _f(0, "Seed for the tiny model's initial weights and tokenizer.", ge=0)

    def __post_init__(self) -> None:
        if self.tiny_hidden_size % self.tiny_num_heads:
            raise ConfigError(
                f"model.tiny_num_heads: {self.tiny_num_heads} does not divide model.tiny_hidden_size "
                f"{self.tiny_hidden_size}"
            )


# The loss formulations TRL 1.16's GRPOConfig.loss_type accepts (checked against trl/trainer/grpo_trainer.py).
GRPO_LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
# Defaults of the `trainer:` mappings, tuned for the tiny model on a 2-core CPU (params.yaml
# repeats them with a comment each); any TRL SFTConfig / GRPOConfig field may be added.
SFT_TRAINER_DEFAULTS: dict[str, Any] = {
    "max_steps": 1500,
    "per_device_train_batch_size": 16,
    "learning_rate": 3.0e-3,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 30,
    "train_sampling_strategy": "group_by_length",
    "max_length": 512,
    "logging_steps": 50,
    "save_steps": 250,
    "save_total_limit": 2,
    "seed": 0,
}
GRPO_TRAINER_DEFAULTS: dict[str, Any] = {
    "max_steps": 150,
    "per_device_train_batch_size": 32,
    "learning_rate": 1.0e-4,
    "lr_scheduler_type": "constant",
    "max_completion_length": 128,
    "logging_steps": 10,
    "save_steps": 50,
    "save_total_limit": 2,
    "seed": 0,
}
# Keys the stage code sets itself; a `trainer:` mapping may not set them.
_STAGE_OWNED_TRAINER_KEYS = ("output_dir", "resume_from_checkpoint")
# The GRPO recipe lives in the grpo section's own fields (below), not in grpo.trainer.
_GRPO_RECIPE_KEYS = (
    "num_generations", "temperature", "beta", "epsilon", "loss_type", "scale_rewards", "num_iterations",
    "use_vllm", "vllm_mode", "reward_weights",
)


def _check_trainer_keys(section: str, trainer: dict[str, Any], owned: tuple[str, ...]) -> None:
    for key in trainer:
        if key == "reward_weights" and key in owned:
            raise ConfigError(f"{section}.trainer.{key}: set rewards.weights instead")
        if key in owned:
            hint = f"{section}.{key}" if key in _GRPO_RECIPE_KEYS else f"{section}.checkpoint_dir and {section}.resume"
            raise ConfigError(f"{section}.trainer.{key}: the stage sets it; use {hint} instead")


# Fields the two training stages (sft, grpo) share.
def _metrics_file(stage: str) -> Any:
    return _f(f"reports/train/{stage}.json", "The stage's summary metrics (a DVC metrics file): steps, loss, seconds, samples.")


def _history_file(stage: str) -> Any:
    return _f(
        f"reports/train/{stage}_history.csv",
        "The Trainer's per-step log history as CSV (one row per logging step: loss and, for GRPO, rewards, "
        "KL, completion length, ...); the data of the training curves of `dvc plots show`.",
    )


def _checkpoint_dir(stage: str) -> Any:
    return _f(
        f"checkpoints/{stage}",
        "Trainer checkpoints (not a DVC output). A re-run resumes from the newest one made with the same "
        "params and data; they are deleted once the model is saved.",
    )


def _resume() -> Any:
    return _f(True, "Resume from the newest matching checkpoint in checkpoint_dir (false: start over).")


def _sample_size() -> Any:
    return _f(16, "Test problems answered greedily after training and logged to MLflow as a table of samples.", ge=0)


def _use_lora() -> Any:
    return _f(False, "Train LoRA adapters (peft) instead of all weights; merged into the saved model.")


def _lora() -> Any:
    return _f(
        {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"},
        "Keyword arguments of peft.LoraConfig, used when use_lora is true (task_type is set by the stage).",
    )


def _trainer(defaults: dict[str, Any], trl_config: str, keys: str, note: str) -> Any:
    return _f(
        defaults,
        f"Keyword arguments passed straight to TRL's {trl_config} (max_steps, learning_rate, "
        f"per_device_train_batch_size, {keys}save_steps, ...); checked by building it when the stage starts. "
        + note,
    )


@dataclass
class SFTConfig:
    output_dir: str = _f("models/sft", "Where the SFT model is written (a standard model folder).")
    metrics_file: str = _metrics_file("sft")
    history_file: str = _history_file("sft")
    checkpoint_dir: str = _checkpoint_dir("sft")
    resume: bool = _resume()
    demo_untagged_rate: float = _f(
        0.5,
        "Fraction of SFT demonstrations written in GSM8K's own format ('reasoning' then '#### N') instead "
        "of the <reasoning>/<answer> tags, as in SFT data pooled from mixed sources. GRPO's format reward "
        "has something to fix. 0 = every demonstration tagged.",
        ge=0.0,
        le=1.0,
    )
    demo_wrong_rate: float = _f(
        0.0,
        "Fraction of SFT demonstrations whose final answer is replaced by the result of an earlier step "
        "(multi-step problems) or off by one (one-step problems): plausible mistakes that the accuracy "
        "reward can correct. Applied independently of demo_untagged_rate.",
        ge=0.0,
        le=1.0,
    )
    demo_seed: int = _f(0, "Seed that picks which demonstrations are untagged or wrong.", ge=0)
    dev_size: int = _f(
        0,
        "Demonstrations held out of SFT (the last N rows of train.jsonl) as a dev split: every dev_every steps "
        "the model answers them greedily and dev_accuracy (flexible: the answer is right) joins the history "
        "(the SFT curve). 0 = no dev split.",
        ge=0,
    )
    dev_every: int = _f(250, "Steps between two dev accuracy measurements (and at the last step).", ge=1)
    dev_max_new_tokens: int = _f(256, "Longest greedy answer to a dev problem, in tokens.", ge=1)
    plateau_patience: int = _f(
        0,
        "Stop SFT once dev_accuracy has not risen by plateau_min_delta over its best for this many "
        "measurements in a row: SFT trained to its plateau, as GRPO should start from. 0 = train max_steps.",
        ge=0,
    )
    plateau_min_delta: float = _f(0.01, "Smallest rise of dev_accuracy that counts as progress.", ge=0.0)
    sample_size: int = _sample_size()
    use_lora: bool = _use_lora()
    lora: dict[str, Any] = _lora()
    trainer: dict[str, Any] = _trainer(
        SFT_TRAINER_DEFAULTS, "SFTConfig", "", "On a CPU the stage defaults bf16 and gradient_checkpointing to false."
    )

    def __post_init__(self) -> None:
        _check_trainer_keys("sft", self.trainer, _STAGE_OWNED_TRAINER_KEYS)
        if self.plateau_patience and not self.dev_size:
            raise ConfigError("sft.plateau_patience needs a dev split to watch: set sft.dev_size (e.g. 200)")


@dataclass
class GRPOConfig:
    init_dir: str = _f("models/sft", "The model GRPO starts from (and, with beta > 0, the frozen reference).")
    output_dir: str = _f("models/grpo", "Where the GRPO model is written (a standard model folder).")
    metrics_file: str = _metrics_file("grpo")
    history_file: str = _history_file("grpo")
    checkpoint_dir: str = _checkpoint_dir("grpo")
    resume: bool = _resume()
    num_generations: int = _f(8, "Completions sampled per prompt (the group G).", ge=2)
    temperature: float = _f(0.8, "Sampling temperature of the completions.", gt=0.0)
    beta: float = _f(0.04, "KL coefficient to the frozen reference model (k3 estimator); 0 drops the reference.", ge=0.0)
    epsilon: float = _f(0.2, "PPO clip range of the probability ratio.", gt=0.0)
    loss_type: str = _f(
        "grpo",
        "Loss aggregation, any of TRL's: grpo (per-sequence mean, the paper's), dr_grpo, dapo, bnpo, cispo, "
        "sapo, luspo (needs trainer.importance_sampling_level: sequence), vespo.",
        choices=GRPO_LOSS_TYPES,
    )
    scale_rewards: str = _f(
        "group",
        "Advantage scaling: group (divide by the group's std, the paper's), batch, none (Dr. GRPO).",
        choices=["group", "batch", "none"],
    )
    num_iterations: int = _f(1, "Optimisation passes over each generated batch (mu).", ge=1)
    use_vllm: bool = _f(False, "Generate completions with vLLM (GPU machines; needs the vllm extra).")
    vllm_mode: str = _f(
        "colocate",
        "colocate: vLLM in the training process; server: a separate `trl vllm-serve` (see trainer.vllm_server_*).",
        choices=["colocate", "server"],
    )
    sample_size: int = _sample_size()
    signal_window: int = _f(
        100,
        "Signal monitor (components/signal_monitor.py): training steps its means run over "
        "(signal_window // trainer.logging_steps logs, at least 1).",
        ge=1,
    )
    signal_zero_std: float = _f(
        0.70,
        "Signal monitor: warn when the window's mean frac_reward_zero_std (groups with all rewards equal) is "
        "above this; the warning says too hard or too easy from the mean reward. 1 turns it off.",
        ge=0.0, le=1.0,
    )
    signal_flat_reward: float = _f(
        0.02,
        "Signal monitor: call the reward flat (a second warning) when, with zero-std above signal_zero_std, the "
        "window's mean reward differs from the first window's by less than this.",
        ge=0.0,
    )
    signal_max_kl: float = _f(
        0.1, "Signal monitor: warn when the window's mean KL to the reference model is above this (policy drift).", ge=0.0
    )
    use_lora: bool = _use_lora()
    lora: dict[str, Any] = _lora()
    trainer: dict[str, Any] = _trainer(
        GRPO_TRAINER_DEFAULTS, "GRPOConfig", "max_completion_length, ",
        "The recipe keys above and rewards.weights are not allowed here.",
    )

    def __post_init__(self) -> None:
        _check_trainer_keys("grpo", self.trainer, _STAGE_OWNED_TRAINER_KEYS + _GRPO_RECIPE_KEYS)
        # TRL checks this too, but only once torch and TRL are loaded; fail at load time instead.
        # TrainingArguments defaults: per_device_train_batch_size 8, gradient_accumulation_steps 1.
        t = self.trainer
        ints = {k: t.get(k) for k in ("per_device_train_batch_size", "generation_batch_size",
                                        "steps_per_generation", "gradient_accumulation_steps")}
        if any(v is not None and (isinstance(v, bool) or not isinstance(v, int)) for v in ints.values()):
            return  # a mistyped value; building TRL's GRPOConfig at stage start reports it
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        per_step = (ints["per_device_train_batch_size"] or 8) * world
        generation = ints["generation_batch_size"] or per_step * (
            ints["steps_per_generation"] or ints["gradient_accumulation_steps"] or 1
        )
        if generation % self.num_generations:
            raise ConfigError(
                f"grpo.num_generations: the generation batch of {generation} completions "
                f"(trainer.per_device_train_batch_size x processes x steps_per_generation) is not divisible by "
                f"num_generations={self.num_generations}; make grpo.trainer.per_device_train_batch_size a "
                f"multiple of {self.num_generations}"
            )


@dataclass
class SelectionConfig:
    model_dir: str = _f("models/sft", "The model whose pass rates choose GRPO's prompts: the one GRPO starts from.")
    output_file: str = _f(
        "data/selected/prompts.jsonl",
        "The selected prompts (GRPO's training problems) with their pass_rate and greedy_correct.",
    )
    metrics_file: str = _f(
        "reports/train/selection.json",
        "Counts (candidates, kept, never solved, always solved, below/above the band) and seconds (DVC metrics).",
    )
    histogram_file: str = _f(
        "reports/train/selection_pass_rates.csv",
        "Prompts per pass rate (k + 1 rows), with whether that rate is kept: the data of `dvc plots show`.",
    )
    max_candidates: int = _f(
        1200,
        "Candidates: the first N problems of <data.output_dir>/grpo.jsonl (0 = all). Each costs num_samples "
        "completions, so this bounds the stage's time.",
        ge=0,
    )
    num_samples: int = _f(
        8,
        "Completions sampled per candidate at grpo.temperature, scored by the shared checker "
        "(components/gsm8k.py, in selection.mode); 0 = no sampling, every candidate is kept.",
        ge=0,
    )
    mode: str = _f(
        "flexible",
        "What a sample must get to pass: 'flexible' (the right answer: correctness, whatever the format) or "
        "'strict' (the right answer in the <answer> tag, what the accuracy reward pays).",
        choices=["flexible", "strict"],
    )
    keep_unsolved: bool = _f(False, "Keep prompts no sample solved (pass rate 0: a GRPO group without signal).")
    keep_solved: bool = _f(False, "Keep prompts every sample solved (pass rate 1: a GRPO group without signal).")
    min_pass_rate: float = _f(0.0, "Keep only pass rates >= this (besides the two flags above).", ge=0.0, le=1.0)
    max_pass_rate: float = _f(1.0, "Keep only pass rates <= this (besides the two flags above).", ge=0.0, le=1.0)
    min_prompts: int = _f(
        100,
        "Stop with the counts when fewer prompts are kept (and never fewer than one GRPO step's prompts): "
        "GRPO must not train on (almost) nothing.",
        ge=1,
    )
    max_new_tokens: int = _f(128, "Longest sampled completion in tokens (as grpo.trainer.max_completion_length).", ge=1)
    backend: str = _f("auto", "auto (vLLM when available, like the evaluate stage) | vllm | transformers.",
                      choices=["auto", "vllm", "transformers"])
    seed: int = _f(0, "Seed of the sampled completions.", ge=0)

    def __post_init__(self) -> None:
        if self.min_pass_rate > self.max_pass_rate:
            raise ConfigError(f"selection.min_pass_rate ({self.min_pass_rate}) is above selection.max_pass_rate "
                              f"({self.max_pass_rate}): no pass rate is in the band")


@dataclass
class RewardsConfig:
    funcs: list[str] = _f(
        ["seed_combined"],
        "GRPO reward functions by registry name (format, soft_format, accuracy, seed_combined, "
        "tag_count; see components/rewards.py) or 'package.module:function' for your own.",
    )
    weights: list[float] = _f([1.0], "One weight per entry of funcs (GRPOConfig.reward_weights).")

    def __post_init__(self) -> None:
        from components.rewards import check_reward_name  # standard library only; no heavy imports

        if not self.funcs:
            raise ConfigError("rewards.funcs: give at least one reward function")
        for i, name in enumerate(self.funcs):
            try:
                check_reward_name(name)
            except ValueError as exc:
                raise ConfigError(f"rewards.funcs[{i}]: {exc}") from None
        if len(self.weights) != len(self.funcs):
            raise ConfigError(
                f"rewards.weights: {len(self.weights)} weights for {len(self.funcs)} funcs "
                f"({', '.join(self.funcs)}); give one weight per func"
            )
        for i, w in enumerate(self.weights):
            if w != w or w in (float("inf"), float("-inf")):
                raise ConfigError(f"rewards.weights[{i}]: expected a finite number, got {w!r}")


@dataclass
class EvaluateConfig:
    output_dir: str = _f(
        "reports/eval", "Where <model>.json metrics, <model>.items.jsonl per-item results and comparison.json go."
    )
    include_base: bool = _f(False, "Also evaluate the base model (model.base_dir) and compare GRPO against it.")
    data: str = _f(
        "",
        "Problems to evaluate: '' (the prepared test split, <data.output_dir>/test.jsonl), 'jsonl:PATH' "
        "(prepared rows or GSM8K's {question, answer} lines) or 'hf:NAME[:CONFIG]' (its test split).",
    )
    limit: int = _f(0, "Evaluate only the first N problems (0 = all).", ge=0)
    protocol: str = _f(
        "grpoflow",
        "'grpoflow': the training prompt, answers in <answer> tags; 'lm-eval-gsm8k': lm-evaluation-harness's "
        "5-shot gsm8k task (Question:/Answer: prompts, '#### N' strict-match and flexible-extract).",
        choices=["grpoflow", "lm-eval-gsm8k"],
    )
    backend: str = _f(
        "auto",
        "Generation backend: 'vllm', 'transformers' (batched, left padding, KV cache) or 'auto' (vLLM when it "
        "is importable or vllm_python exists, else transformers).",
        choices=["auto", "vllm", "transformers"],
    )
    vllm_python: str = _f(
        ".venv-vllm/bin/python",
        "A python with vLLM, used in a subprocess when vLLM is not importable here (relative to the repo root; "
        "`make venv-vllm` creates it with the CPU build); '' disables this route.",
    )
    vllm_args: dict = _f({}, "Extra keyword arguments for vllm.LLM (e.g. tensor_parallel_size: 2, gpu_memory_utilization: 0.8).")
    max_new_tokens: int = _f(256, "Most tokens generated per problem (greedy decoding).", ge=1)
    batch_size: int = _f(32, "Prompts per generate() call on the transformers backend.", ge=1)
    dtype: str = _dtype("evaluation")
    num_fewshot: int = _f(5, "Solved examples in each lm-eval-gsm8k prompt (the harness uses 5).", ge=0)
    fewshot_seed: int = _f(1234, "Seed of the harness's few-shot sampler (lm-eval's default is 1234).", ge=0)
    fewshot_source: str = _f(
        "",
        "Where lm-eval-gsm8k few-shot examples come from: '' (the train split of an hf: source, else the prepared "
        "train split), 'jsonl:PATH' or 'hf:NAME[:CONFIG]' (its train split).",
    )
    primary_metric: str = _f(
        "accuracy_strict",
        "Metric whose paired difference is reported at the top of each comparison.json pair, and the one the "
        "promotion gate pairs: accuracy_strict (right and tagged: what a deployment reading the tag gets) or "
        "accuracy_flexible (right anywhere: correctness alone). The gate's reason states both either way.",
        choices=["accuracy_strict", "accuracy_flexible"],
    )
    log_items_table: bool = _f(True, "Log the per-item results to MLflow as a table (browsable in the UI).")
    seed: int = _f(
        0,
        "Seed of the sampled completions (with each item's id: sample_seeds in components/scoring.py) and of "
        "the backends; greedy decoding does not use it.",
        ge=0,
    )
    num_samples: int = _f(
        8,
        "k completions sampled per problem at the training temperature (grpo.temperature), besides the greedy "
        "one: sampled accuracy, pass@k and maj@k (0 = greedy only).",
        ge=0,
        le=256,
    )
    endpoint_model: str = _f(
        "",
        "With --model http://HOST:PORT/v1: the served model name to ask ('' = the only one the server lists).",
    )
    endpoint_concurrency: int = _f(
        64, "With an endpoint: requests in flight at once (the server batches them).", ge=1, le=1024
    )
    endpoint_retries: int = _f(
        5, "With an endpoint: retries of a request answered 429/5xx or cut off (exponential backoff).", ge=0
    )
    endpoint_timeout: float = _f(300.0, "With an endpoint: seconds to wait for one answer.", gt=0.0)

    def __post_init__(self) -> None:
        for key in ("data", "fewshot_source"):
            src = getattr(self, key)
            if src and not ((src.startswith("jsonl:") or src.startswith("hf:")) and len(src.split(":", 1)[1]) > 0):
                raise ConfigError(f"evaluate.{key}: expected '', 'jsonl:PATH' or 'hf:NAME[:CONFIG]', got {src!r}")


@dataclass
class RegisterConfig:
    enabled: bool = _f(True, "Register and gate-promote the model after the stages (false: the flow stops after dvc push).")
    model_name: str = _f("grpoflow-policy", "Name of the MLflow registered model.")
    model_stage: str = _f(
        "grpo",
        "Stage whose model is registered: its <stage>.output_dir folder becomes the version, and its "
        "evaluation items <evaluate.output_dir>/<stage>.items.jsonl are what the promotion gate compares.",
    )
    alpha: float = _f(
        0.05, "Promotion gate: the exact McNemar p-value (challenger vs champion) must be below this.", gt=0.0, le=1.0
    )
    min_delta: float = _f(
        0.0,
        "Promotion gate: the challenger's accuracy must exceed the champion's by at least this much "
        "(and by more than zero) on the same items.",
        ge=0.0,
        le=1.0,
    )
    min_items: int = _f(
        100,
        "Promotion gate: fewer items shared by challenger and champion than this means no promotion "
        "(too few to tell them apart).",
        ge=1,
    )


@dataclass
class TrackingConfig:
    uri: str = _f(
        "sqlite:///mlflow.db",
        "MLflow tracking URI; the MLFLOW_TRACKING_URI environment variable wins over it.",
    )
    artifact_location: str = _f(
        "mlartifacts", "Artifact folder for a new experiment on a local (sqlite) store; ignored for servers."
    )
    experiment: str = _f("grpoflow", "MLflow experiment name.")
    run_lock_timeout: float = _f(
        600.0,
        "Seconds a second pipeline run on the same checkout waits for the running one to finish before "
        "failing with a message naming it (0: fail at once).",
        ge=0.0,
    )


PLACEMENTS = ["local", "process", "docker", "kubernetes"]


def _placement(stage: str) -> Any:
    return _f(
        "local",
        f"Where the {stage} stage runs: 'local' (a subprocess of the flow, in this checkout) or a work pool "
        f"kind ('process', 'docker', 'kubernetes'): the flow submits it to the deployment "
        f"grpoflow-stage/{stage}-<kind> of infra/prefect.yaml and waits; it runs in a clean working copy "
        "and hands its outputs back through the DVC remote.",
        choices=PLACEMENTS,
    )


@dataclass
class PlacementConfig:
    data: str = _placement("data")
    model: str = _placement("model")
    sft: str = _placement("sft")
    selection: str = _placement("selection")
    grpo: str = _placement("grpo")
    evaluate: str = _placement("evaluate")


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "sft": SFTConfig,
    "selection": SelectionConfig,
    "grpo": GRPOConfig,
    "rewards": RewardsConfig,
    "evaluate": EvaluateConfig,
    "register": RegisterConfig,
    "tracking": TrackingConfig,
    "placement": PlacementConfig,
}


@dataclass
class Params:
    data: DataConfig
    model: ModelConfig
    sft: SFTConfig
    selection: SelectionConfig
    grpo: GRPOConfig
    rewards: RewardsConfig
    evaluate: EvaluateConfig
    register: RegisterConfig
    tracking: TrackingConfig
    placement: PlacementConfig

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}


# --------------------------------------------------------------------------- loading


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotation `tp`; ints are accepted where floats are."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(key, value, arg)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key}: unexpected value {value!r}")
    if tp is Any:
        return value
    base = origin or tp
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if base is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if base is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if base is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if base is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")  # pragma: no cover


def _check_bounds(key: str, value: Any, meta: typing.Mapping[str, Any]) -> None:
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"{key}: expected one of {meta['choices']}, got {value!r}")
    if value is None:
        return
    if "ge" in meta and value < meta["ge"]:
        raise ConfigError(f"{key}: expected a value >= {meta['ge']}, got {value!r}")
    if "gt" in meta and value <= meta["gt"]:
        raise ConfigError(f"{key}: expected a value > {meta['gt']}, got {value!r}")
    if "le" in meta and value > meta["le"]:
        raise ConfigError(f"{key}: expected a value <= {meta['le']}, got {value!r}")


def build_section(name: str, raw: Any) -> Any:
    """Validate one section's mapping and build its dataclass."""
    cls = SECTIONS[name]
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: expected a mapping of keys, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(
            f"{name}.{unknown[0]}: unknown key; known keys of '{name}': {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in raw.items():
        full = f"{name}.{key}"
        value = _coerce(full, value, hints[key])
        _check_bounds(full, value, fields[key].metadata)
        kwargs[key] = value
    return cls(**kwargs)


def parse_override(text: str) -> tuple[str, str, Any]:
    """Split `section.key=value` into (section, key, YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    path, raw = text.split("=", 1)
    if path.count(".") < 1 or "" in path.split("."):
        raise ConfigError(f"override {text!r}: expected section.key=value")
    section, key = path.split(".", 1)
    if section not in SECTIONS:
        raise ConfigError(f"override {text!r}: unknown section '{section}'; known: {', '.join(SECTIONS)}")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc})") from None
    return section, key, value


def _default_mapping(section: str, name: str) -> dict[str, Any]:
    for f in dataclasses.fields(SECTIONS[section]):
        if f.name == name and f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            return value if isinstance(value, dict) else {}
    return {}


def params_path(path: str | os.PathLike | None = None) -> Path:
    return Path(path or os.environ.get(PARAMS_ENV) or DEFAULT_PARAMS)


def params_in(root: str | os.PathLike) -> Path | None:
    """The checkout's params.yaml, or None when it has none (the defaults then apply)."""
    path = Path(root) / DEFAULT_PARAMS
    return path if path.is_file() else None


def load_raw(path: str | os.PathLike | None = None, overrides: typing.Iterable[str] = ()) -> dict[str, Any]:
    """params.yaml as a dict with overrides applied (not yet validated)."""
    p = params_path(path)
    raw: dict[str, Any] = {}
    if p.exists():
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML ({exc})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: expected a mapping of sections at the top level")
    elif path is not None:
        raise ConfigError(f"{p}: params file not found")
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{p}: unknown section '{unknown[0]}'; known sections: {', '.join(SECTIONS)}")
    for text in overrides:
        apply_override(raw, text)
    return raw


def apply_override(raw: typing.MutableMapping[str, Any], text: str) -> None:
    """Set one `section.key[.sub...]=value` override in a params mapping, in place: the parser
    behind both `load_params` and the params.yaml writer. A deeper key (`sft.trainer.max_steps=10`,
    as `dvc exp run -S` takes it) sets one entry of a mapping-valued field and keeps its other
    entries; a mapping not in the file starts from the field's default."""
    section, key, value = parse_override(text)
    if raw.get(section) is None:
        raw[section] = {}
    *parents, leaf = key.split(".")
    target = raw[section]
    for depth, part in enumerate(parents):
        if target.get(part) is None:  # not in the file: start from the field's default mapping
            target[part] = _default_mapping(section, part) if depth == 0 else {}
        if not isinstance(target[part], typing.MutableMapping):
            raise ConfigError(f"override {text!r}: {section}.{'.'.join(parents[: depth + 1])} is not a mapping")
        target = target[part]
    target[leaf] = value


def load_params(
    path: str | os.PathLike | None = None, overrides: typing.Iterable[str] = (), root: str | os.PathLike | None = None
) -> Params:
    """Load, override and validate params; raises ConfigError naming the bad key. Paths are checked
    against `root` (default: the params file's folder, else the checkout of the working directory)."""
    raw = load_raw(path, overrides)
    sections = {}
    for name in SECTIONS:
        try:
            sections[name] = build_section(name, raw.get(name))
        except TypeError as exc:  # a __post_init__ or dataclass signature problem
            raise ConfigError(f"{name}: {exc}") from None
    params = Params(**sections)
    if root is None:
        file = params_path(path)
        root = file.resolve().parent if file.is_file() else repo_root()
    check_paths(params, root)
    return params


# --------------------------------------------------------------------------- paths

# Folders the stages write (and may replace or delete), and the ones they only read.
OUTPUT_DIRS = (
    "data.output_dir", "model.base_dir", "sft.output_dir", "sft.checkpoint_dir",
    "grpo.output_dir", "grpo.checkpoint_dir", "evaluate.output_dir",
)
INPUT_DIRS = ("grpo.init_dir",)
OUTPUT_FILES = ("sft.metrics_file", "grpo.metrics_file", "sft.history_file", "grpo.history_file")
DATA_FOLDER = "data"  # where users keep source files beside the prepared splits
PROTECTED = (".git", ".dvc")


def _value(params: Params, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(params, section), name)


def _is_default(params: Params, key: str) -> bool:
    section, name = key.split(".")
    return _value(params, key) == next(f.default for f in dataclasses.fields(SECTIONS[section]) if f.name == name)


def _overlap(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def check_paths(params: Params, root: str | os.PathLike) -> dict[str, Path]:
    """Every stage path inside the repository `root` (not the root itself, not in .git or .dvc), and
    no stage's output folder equal to, inside or around another's or the data folder, so that no
    stage can replace or delete what it does not own. Returns {key: resolved path}."""
    root = Path(root).resolve()
    resolved: dict[str, Path] = {}
    for key in OUTPUT_DIRS + INPUT_DIRS + OUTPUT_FILES:
        value = _value(params, key)
        p = (root / value).resolve()  # an absolute value stays itself
        if p == root:
            raise ConfigError(f"{key}: {value!r} is the repository root {root}; give the stage a folder of its own")
        if root not in p.parents:
            raise ConfigError(f"{key}: {value!r} resolves to {p}, outside the repository {root}; stage paths live inside it")
        for protected in PROTECTED:
            if _overlap(p, root / protected):
                raise ConfigError(f"{key}: {value!r} is inside {protected}, which belongs to {protected.strip('.')}")
        resolved[key] = p
    data_folder = root / DATA_FOLDER
    for i, key in enumerate(OUTPUT_DIRS):
        others = {k: resolved[k] for k in OUTPUT_DIRS[i + 1 :]}
        if key != "data.output_dir":
            others["the data folder"] = data_folder
        for other, q in others.items():
            if _overlap(resolved[key], q):
                # Name the key the user changed (it differs from its default) first.
                subject, obj = (other, key) if other in resolved and _is_default(params, key) else (key, other)
                raise ConfigError(
                    f"{subject}: {_value(params, subject)!r} ({resolved[subject]}) overlaps {obj} "
                    f"({resolved.get(obj, data_folder)}); a stage output needs a folder of its own, neither "
                    "inside nor around another stage's output or the data folder"
                )
    return resolved


def write_overrides(path: str | os.PathLike, overrides: typing.Iterable[str]) -> None:
    """Write `section.key=value` overrides into the params file, as `dvc exp run -S` does, so that
    DVC sees them; comments, quoting and layout of the file are kept (ruamel round trip). All
    overrides are validated first: a rejected one leaves the file as it was."""
    overrides = list(overrides)
    if not overrides:
        return
    import io

    from ruamel.yaml import YAML

    from components.files import write_text

    path = Path(path)
    load_params(path if path.exists() else None, overrides)  # validate all before writing any
    yaml_rt = YAML()
    yaml_rt.preserve_quotes = True
    yaml_rt.width = 4096
    yaml_rt.representer.add_representer(
        type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    data = yaml_rt.load(path.read_text()) if path.exists() else None
    if data is None:
        data = {}
    for text in overrides:
        apply_override(data, text)
    buf = io.StringIO()
    yaml_rt.dump(data, buf)
    write_text(path, buf.getvalue())
    print(f"{path.name} updated: {', '.join(overrides)}", flush=True)


# The keys a run started through a deployment (remotely, e.g. from the Prefect UI) may override.
# Left out on purpose: every *_dir / *_file (paths decide what a stage writes and deletes),
# model.trust_remote_code (code from the hub), evaluate.vllm_python and evaluate.vllm_args (what
# runs), jsonl: sources (files of the worker), tracking.* (where results go), and trainer keys
# beyond training numbers (TRL's push_to_hub, hub_token, deepspeed, logging_dir, ...).
_TRAINER_NUMBERS = (
    "max_steps", "num_train_epochs", "learning_rate", "lr_scheduler_type", "warmup_steps", "warmup_ratio",
    "weight_decay", "max_grad_norm", "per_device_train_batch_size", "gradient_accumulation_steps",
    "steps_per_generation", "generation_batch_size", "max_length", "max_completion_length", "seed",
    "logging_steps", "save_steps", "save_total_limit",
)
REMOTE_OVERRIDES = (
    "data.seed", "data.synthetic_*", "data.max_train_rows", "data.max_test_rows", "data.on_bad_rows",
    "data.answer_only_share",
    "data.train_source", "data.test_source",  # synthetic or hf:NAME only
    "model.name_or_path", "model.revision", "model.dtype", "model.seed", "model.tiny_*",
    "sft.resume", "sft.demo_*", "sft.dev_*", "sft.plateau_*", "sft.sample_size", "sft.use_lora", "sft.lora.*",
    "selection.max_candidates", "selection.num_samples", "selection.mode", "selection.keep_*", "selection.min_pass_rate",
    "selection.max_pass_rate", "selection.min_prompts", "selection.max_new_tokens", "selection.backend", "selection.seed",
    *(f"sft.trainer.{k}" for k in _TRAINER_NUMBERS),
    "grpo.resume", "grpo.num_generations", "grpo.temperature", "grpo.beta", "grpo.epsilon", "grpo.loss_type",
    "grpo.scale_rewards", "grpo.num_iterations", "grpo.sample_size", "grpo.use_lora", "grpo.lora.*",
    *(f"grpo.trainer.{k}" for k in _TRAINER_NUMBERS),
    "rewards.funcs", "rewards.weights",  # registry names only, no package.module:function
    "evaluate.include_base", "evaluate.limit", "evaluate.protocol", "evaluate.backend", "evaluate.max_new_tokens",
    "evaluate.batch_size", "evaluate.dtype", "evaluate.num_samples", "evaluate.num_fewshot",
    "evaluate.fewshot_seed", "evaluate.primary_metric", "evaluate.seed", "evaluate.log_items_table",
    "register.enabled", "register.alpha", "register.min_delta", "register.min_items",
)


def check_remote_overrides(overrides: typing.Iterable[str]) -> None:
    """Reject an override a remote caller may not make (ConfigError naming the key): keys outside
    REMOTE_OVERRIDES, files as data sources, and rewards loaded from code by dotted path."""
    import fnmatch

    for text in overrides:
        section, key, value = parse_override(text)
        full = f"{section}.{key}"
        if not any(fnmatch.fnmatchcase(full, pattern) for pattern in REMOTE_OVERRIDES):
            raise ConfigError(
                f"override {text!r}: {full} cannot be set by a remote run (paths, code and services are "
                "fixed by the worker's checkout); allowed keys: components/config.py REMOTE_OVERRIDES"
            )
        if full in ("data.train_source", "data.test_source") and not (value == "synthetic" or str(value).startswith("hf:")):
            raise ConfigError(f"override {text!r}: a remote run reads synthetic or hf: data only, not files")
        if full == "rewards.funcs" and any(":" in str(f) for f in (value if isinstance(value, list) else [value])):
            raise ConfigError(f"override {text!r}: a remote run picks rewards by registry name, not by code path")


def add_params_args(parser: argparse.ArgumentParser) -> None:
    """The `--params FILE -S section.key=value` options shared by every entry point."""
    parser.add_argument(
        "--params",
        default=None,
        metavar="FILE",
        help=f"params file (default: ${PARAMS_ENV} or {DEFAULT_PARAMS})",
    )
    parser.add_argument(
        "-S",
        "--set-param",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one param, as in `dvc exp run -S`; repeatable",
    )


def stage_main(stage: str, doc: str | None, run: typing.Callable[[Params], Any], argv: list[str] | None = None) -> int:
    """The entry point of every stage module (`python -m components.<stage> [--params F] [-S k=v]`):
    load the params, run the stage; an actionable error is one line on stderr and exit code 2."""
    import logging

    parser = argparse.ArgumentParser(prog=f"python -m components.{stage}", description=(doc or "").split("\n\n")[0])
    add_params_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        run(load_params(args.params, args.overrides))
    except GrpoflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def describe(section: str | None = None) -> str:
    """Help text for every key, for --help epilogs and docs."""
    lines = []
    for name, cls in SECTIONS.items():
        if section and name != section:
            continue
        for f in dataclasses.fields(cls):
            lines.append(f"{name}.{f.name}: {f.metadata.get('help', '')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.config", description="Print the effective params (after overrides) as YAML."
    )
    add_params_args(parser)
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params, args.overrides)
    except ConfigError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(yaml.safe_dump(params.to_dict(), sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
