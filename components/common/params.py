"""The params schema: one dataclass per params.yaml section, one field per key, and its rules.

Each field is `_f(default, **metadata)`; the metadata says how the key is checked and used:

    choices, ge, gt, le   value checks (components/common/params_rules.py, when params are loaded)
    path                  output_dir | input_dir | output_file: a stage path, kept inside the
                          repository and apart from other stages' (components/common/path_safety.py)
    fingerprint=False     a key that does not change what is trained: left out of the resume
                          fingerprint of the training stages (components/training/finetune.py)

A section whose keys constrain each other has a `check()` method, called once its values passed their
field's checks (the checkers live in params_rules.py). Two lists elsewhere follow the fields, each checked
by a test: params.yaml, where each key's value equals its field's default and the comment block above it
is its help (tests/test_config.py; apart from this module, so that editing a sentence re-runs no stage),
and the keys a run started through a deployment may override (pipelines/params/overrides.py). Loading and
`-S` overrides: components/common/params_load.py. Sections are `<Section>Params`, never `...Config`, so
that they do not shadow TRL's SFTConfig / GRPOConfig.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from components.common.errors import ConfigError
from components.common.params_rules import (
    STAGE_OWNED_TRAINER_KEYS,
    check_generation_batch,
    check_model_name,
    check_rewards,
    check_sources,
    check_trainer_keys,
    check_trainer_values,
    parse_band,
)


def _f(default: Any, **meta: Any) -> Any:
    """A dataclass field with its metadata: checks (choices, ge, gt, le) and roles (see the module
    docstring: path, fingerprint)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


def _dtype() -> Any:
    """The weights-dtype field the model and evaluate sections share."""
    return _f("auto", choices=["auto", "float32", "bfloat16", "float16"])


# --------------------------------------------------------------------------- sections


@dataclass
class DataParams:
    train_source: str = _f("synthetic")
    test_source: str = _f("synthetic")
    output_dir: str = _f("data/processed", path="output_dir")
    synthetic_train_size: int = _f(2000, ge=1)
    synthetic_test_size: int = _f(400, ge=1)
    seed: int = _f(1234, ge=0)
    synthetic_max_steps: int = _f(2, ge=1, le=6)
    synthetic_max_number: int = _f(9, ge=2)
    synthetic_test_max_steps: int = _f(3, ge=0, le=6)
    synthetic_test_top_band_size: int = _f(200, ge=0)
    synthetic_answer_only_size: int = _f(1000, ge=0)
    synthetic_answer_only_min_steps: int = _f(1, ge=1, le=6)
    synthetic_answer_only_max_steps: int = _f(3, ge=1, le=6)
    answer_only_share: float = _f(0.0, ge=0.0, le=0.99)
    demo_max_steps: int = _f(0, ge=0)
    answer_only_min_steps: int = _f(0, ge=0)
    on_bad_rows: str = _f("fail", choices=["fail", "skip"])
    allow_overlap: bool = _f(False)
    max_train_rows: int = _f(0, ge=0)
    max_test_rows: int = _f(0, ge=0)

    def check(self) -> None:
        """Rules across keys (each value already passed its field's checks)."""
        check_sources("data", self, ("train_source", "test_source"), synthetic=True)
        if self.synthetic_answer_only_min_steps > self.synthetic_answer_only_max_steps:
            raise ConfigError(f"data.synthetic_answer_only_min_steps ({self.synthetic_answer_only_min_steps}) is "
                              f"above data.synthetic_answer_only_max_steps ({self.synthetic_answer_only_max_steps})")
        if self.demo_max_steps and self.answer_only_min_steps and self.answer_only_min_steps <= self.demo_max_steps:
            raise ConfigError(f"data.answer_only_min_steps ({self.answer_only_min_steps}) must be above "
                              f"data.demo_max_steps ({self.demo_max_steps}): a row is a demonstration or an "
                              "answer-only problem, not both")


@dataclass
class ModelParams:
    name_or_path: str = _f("smollm2-135m-instruct")
    trust_remote_code: bool = _f(False)
    dtype: str = _dtype()
    cpu_training_precision: str = _f("auto", choices=["float32", "auto"])
    revision: str | None = _f(None)
    base_dir: str = _f("models/base", path="output_dir")
    tiny_hidden_size: int = _f(128, ge=16)
    tiny_intermediate_size: int = _f(512, ge=16)
    tiny_num_layers: int = _f(2, ge=1)
    tiny_num_heads: int = _f(4, ge=1)
    tiny_max_positions: int = _f(512, ge=64)
    tiny_vocab_size: int = _f(512, ge=300)
    seed: int = _f(0, ge=0)

    def check(self) -> None:
        if self.name_or_path.strip() in ("", "gguf:"):
            raise ConfigError(f"model.name_or_path: {self.name_or_path!r} needs a model (gguf: needs a file path)")
        if self.tiny_hidden_size % self.tiny_num_heads:
            raise ConfigError(f"model.tiny_num_heads: {self.tiny_num_heads} does not divide model.tiny_hidden_size "
                              f"{self.tiny_hidden_size}")


# The loss formulations TRL 1.16's GRPOConfig.loss_type accepts (checked against trl/trainer/grpo_trainer.py).
GRPO_LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
# TRL GRPOConfig fields of GRPO's recipe, set in `grpo.trainer` (TRL's own defaults differ: beta 0, loss_type
# dapo, temperature 1): {key: (the recipe's value, the checks it passes when params are loaded)}; TRL checks
# some only once training runs (an unknown loss_type fails at the first loss). A `grpo.trainer` mapping that
# leaves one out gets the recipe's value, as a params file without the mapping gets them all.
GRPO_RECIPE: dict[str, tuple[Any, dict[str, Any]]] = {
    "num_generations": (8, {"ge": 2}),
    "temperature": (0.8, {"gt": 0.0}),
    "beta": (0.1, {"ge": 0.0}),
    "epsilon": (0.2, {"gt": 0.0}),
    "loss_type": ("grpo", {"choices": GRPO_LOSS_TYPES}),
    "scale_rewards": ("group", {"choices": ["group", "batch", "none"]}),
    "num_iterations": (1, {"ge": 1}),
    "use_vllm": (False, {}),
    "vllm_mode": ("colocate", {"choices": ["colocate", "server"]}),
}
# Keys that moved: their old name to the new one (loading names the new one instead of failing as unknown).
MOVED_KEYS = {f"grpo.{key}": f"grpo.trainer.{key}" for key in GRPO_RECIPE}
# Defaults of the `trainer:` mappings, SmolLM2-135M-Instruct's LoRA recipe on a 2-core CPU (params.yaml
# repeats them with a comment each); any TRL SFTConfig / GRPOConfig field may be added.
SFT_TRAINER_DEFAULTS: dict[str, Any] = {
    "max_steps": 100,
    "per_device_train_batch_size": 8,
    "learning_rate": 2.0e-4,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "train_sampling_strategy": "random",
    "max_length": 512,
    "logging_steps": 10,
    "save_steps": 50,
    "save_total_limit": 2,
    "seed": 0,
}
GRPO_TRAINER_DEFAULTS: dict[str, Any] = {
    **{key: value for key, (value, _) in GRPO_RECIPE.items()},
    "max_steps": 128,
    "per_device_train_batch_size": 16,
    "steps_per_generation": 8,
    "learning_rate": 5.0e-5,
    "lr_scheduler_type": "constant",
    "max_completion_length": 128,
    "logging_steps": 1,
    "save_steps": 50,
    "save_total_limit": 2,
    "seed": 0,
}
# Fields the two training stages (sft, grpo) share.
def _metrics_file(stage: str) -> Any:
    return _f(f"reports/train/{stage}.json", path="output_file", fingerprint=False)


def _history_file(stage: str) -> Any:
    return _f(f"reports/train/{stage}_history.csv", path="output_file", fingerprint=False)


def _checkpoint_dir(stage: str) -> Any:
    return _f(f"checkpoints/{stage}", path="output_dir", fingerprint=False)


def _resume() -> Any:
    return _f(True, fingerprint=False)


def _sample_size() -> Any:
    return _f(0, ge=0, fingerprint=False)


def _use_lora() -> Any:
    return _f(True)


def _lora() -> Any:
    return _f({"r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
               "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]})


def _trainer(defaults: dict[str, Any]) -> Any:
    """A `trainer:` mapping: keyword arguments passed straight to TRL's SFTConfig / GRPOConfig."""
    return _f(defaults)


@dataclass
class SFTParams:
    output_dir: str = _f("models/sft", path="output_dir", fingerprint=False)
    metrics_file: str = _metrics_file("sft")
    history_file: str = _history_file("sft")
    checkpoint_dir: str = _checkpoint_dir("sft")
    resume: bool = _resume()
    demo_untagged_rate: float = _f(0.0, ge=0.0, le=1.0)
    demo_wrong_rate: float = _f(0.0, ge=0.0, le=1.0)
    demo_seed: int = _f(0, ge=0)
    dev_size: int = _f(0, ge=0)
    dev_every: int = _f(250, ge=1)
    dev_max_new_tokens: int = _f(256, ge=1)
    plateau_patience: int = _f(0, ge=0)
    plateau_min_delta: float = _f(0.01, ge=0.0)
    sample_size: int = _sample_size()
    lean_passes: bool = _f(True)
    use_lora: bool = _use_lora()
    lora: dict[str, Any] = _lora()
    trainer: dict[str, Any] = _trainer(SFT_TRAINER_DEFAULTS)

    def check(self) -> None:
        check_trainer_keys("sft", self.trainer, STAGE_OWNED_TRAINER_KEYS)
        if self.plateau_patience and not self.dev_size:
            raise ConfigError("sft.plateau_patience needs a dev split to watch: set sft.dev_size (e.g. 200)")


@dataclass
class GRPOParams:
    # its content enters the fingerprint as an input
    init_dir: str = _f("models/sft", path="input_dir", fingerprint=False)
    output_dir: str = _f("models/grpo", path="output_dir", fingerprint=False)
    metrics_file: str = _metrics_file("grpo")
    history_file: str = _history_file("grpo")
    checkpoint_dir: str = _checkpoint_dir("grpo")
    resume: bool = _resume()
    sample_size: int = _sample_size()
    dev_size: int = _f(0, ge=0)
    dev_every: int = _f(100, ge=1)
    signal_window: int = _f(100, ge=1, fingerprint=False)  # the signal monitor only watches (so its four keys)
    signal_zero_std: float = _f(0.70, ge=0.0, le=1.0, fingerprint=False)
    signal_flat_reward: float = _f(0.02, ge=0.0, fingerprint=False)
    signal_max_kl: float = _f(0.1, ge=0.0, fingerprint=False)
    use_lora: bool = _use_lora()
    rollout_merge_lora: bool = _f(True)
    logps_batching: str = _f("shared_prefix", choices=["padded", "per_sequence", "shared_prefix"])
    lean_logps: bool = _f(True)
    rollout_engine: str = _f("batched", choices=["generate", "batched"])
    old_logps: str = _f("rollout", choices=["rollout", "forward"])
    informative_groups_only: bool = _f(True)
    lora: dict[str, Any] = _lora()
    trainer: dict[str, Any] = _trainer(GRPO_TRAINER_DEFAULTS)

    def check(self) -> None:
        check_trainer_keys("grpo", self.trainer, (*STAGE_OWNED_TRAINER_KEYS, "reward_weights"))
        for key, (value, _) in GRPO_RECIPE.items():  # the recipe's values where the mapping leaves them out
            self.trainer.setdefault(key, value)
        check_trainer_values("grpo", self.trainer, GRPO_RECIPE)
        check_generation_batch(self)


@dataclass
class SelectionParams:
    model_dir: str = _f("models/sft", path="input_dir")
    output_file: str = _f("data/selected/prompts.jsonl", path="output_file")
    metrics_file: str = _f("reports/train/selection.json", path="output_file")
    histogram_file: str = _f("reports/train/selection_pass_rates.csv", path="output_file")
    max_candidates: int = _f(0, ge=0)
    num_samples: int = _f(0, ge=0)
    mode: str = _f("flexible", choices=["flexible", "strict"])
    keep_unsolved: bool = _f(False)
    keep_solved: bool = _f(False)
    min_pass_rate: float = _f(0.0, ge=0.0, le=1.0)
    max_pass_rate: float = _f(1.0, ge=0.0, le=1.0)
    min_prompts: int = _f(50, ge=1)
    max_new_tokens: int = _f(128, ge=1)
    backend: str = _f("auto", choices=["auto", "vllm", "transformers"])
    seed: int = _f(0, ge=0)

    def check(self) -> None:
        if self.min_pass_rate > self.max_pass_rate:
            raise ConfigError(f"selection.min_pass_rate ({self.min_pass_rate}) is above selection.max_pass_rate "
                              f"({self.max_pass_rate}): no pass rate is in the band")


@dataclass
class RewardsParams:
    funcs: list[str] = _f(["flexible_accuracy"])
    weights: list[float] = _f([1.0])

    def check(self) -> None:
        check_rewards(self)  # names are checked where rewards are used (components/training/rewards.py)


@dataclass
class EvaluateParams:
    output_dir: str = _f("reports/eval", path="output_dir")
    include_base: bool = _f(False)
    data: str = _f("")
    limit: int = _f(0, ge=0)
    protocol: str = _f("grpoflow", choices=["grpoflow", "lm-eval-gsm8k"])
    backend: str = _f("auto", choices=["auto", "vllm", "transformers", "batched"])
    vllm_python: str = _f(".venv-vllm/bin/python")
    vllm_args: dict = _f({})
    max_new_tokens: int = _f(256, ge=1)
    batch_size: int = _f(32, ge=1)
    dtype: str = _dtype()
    num_fewshot: int = _f(5, ge=0)
    fewshot_seed: int = _f(1234, ge=0)
    fewshot_source: str = _f("")
    target_band: str | int = _f("3")  # `-S evaluate.target_band=3` reads as YAML's 3: check() makes it "3"
    primary_metric: str = _f("accuracy_strict", choices=["accuracy_strict", "accuracy_flexible"])
    log_items_table: bool = _f(True)
    seed: int = _f(0, ge=0)
    num_samples: int = _f(0, ge=0, le=256)
    endpoint_model: str = _f("")
    endpoint_concurrency: int = _f(64, ge=1, le=1024)
    endpoint_retries: int = _f(5, ge=0)
    endpoint_timeout: float = _f(300.0, gt=0.0)

    def check(self) -> None:
        check_sources("evaluate", self, ("data", "fewshot_source"), synthetic=False)
        self.target_band = str(self.target_band)  # `-S evaluate.target_band=3` reads as YAML's 3: one spelling
        parse_band(self.target_band)


@dataclass
class RegisterParams:
    enabled: bool = _f(True)
    model_name: str = _f("grpoflow-policy")
    model_stage: str = _f("grpo")
    alpha: float = _f(0.05, gt=0.0, le=1.0)
    min_delta: float = _f(0.0, ge=0.0, le=1.0)
    min_items: int = _f(100, ge=1)

    def check(self) -> None:
        check_model_name(self.model_name, "register.model_name")


@dataclass
class TrackingParams:
    uri: str = _f("sqlite:///mlflow.db")
    artifact_location: str = _f("mlartifacts")
    experiment: str = _f("grpoflow")
    run_lock_timeout: float = _f(600.0, ge=0.0)


PLACEMENTS = ["local", "process", "docker", "kubernetes"]


def _placement() -> Any:
    return _f("local", choices=PLACEMENTS)


@dataclass
class PlacementParams:
    data: str = _placement()
    model: str = _placement()
    sft: str = _placement()
    selection: str = _placement()
    grpo: str = _placement()
    evaluate: str = _placement()


SECTIONS: dict[str, type] = {
    "data": DataParams,
    "model": ModelParams,
    "sft": SFTParams,
    "selection": SelectionParams,
    "grpo": GRPOParams,
    "rewards": RewardsParams,
    "evaluate": EvaluateParams,
    "register": RegisterParams,
    "tracking": TrackingParams,
    "placement": PlacementParams,
}


@dataclass
class Params:
    data: DataParams
    model: ModelParams
    sft: SFTParams
    selection: SelectionParams
    grpo: GRPOParams
    rewards: RewardsParams
    evaluate: EvaluateParams
    register: RegisterParams
    tracking: TrackingParams
    placement: PlacementParams

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}


