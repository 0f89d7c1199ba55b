"""Presets (presets/*.yaml, `grpoflow run --preset NAME`): each one loads as valid params and builds
TRL's SFTConfig and GRPOConfig, its LoRA config and the evaluation settings (nothing downloaded);
the GPU presets carry what real models need; `-S` given with a preset wins; an unknown preset is
one line naming the known ones.

    pytest -q tests/test_presets.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components import grpo, sft
from components.evaluation import scoring
from components.training import finetune, precision
from pipelines.params import presets
from pipelines.params.config import ConfigError, load_params, write_overrides

REPO = Path(__file__).resolve().parents[1]
GPU_PRESETS = ["qwen2.5-0.5b-gpu", "qwen2.5-1.5b-gpu", "llama3.2-1b-16gb"]
PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def trl_configs(params, gpu_preset: bool):
    """(SFTConfig, GRPOConfig, sft LoRA, grpo LoRA) as the stages build them. A GPU preset asks for bf16,
    which TrainingArguments refuses without a GPU unless use_cpu is set: on a machine without one the
    configs are built with use_cpu=True, every preset value unchanged."""
    import torch
    from trl import GRPOConfig, SFTConfig

    if not gpu_preset or torch.cuda.is_available():
        (sft_args, sft_lora), (grpo_args, grpo_lora) = sft.trainer_settings(params), grpo.trainer_settings(params)
        return sft_args, grpo_args, sft_lora, grpo_lora
    sft_args = finetune.build_trl_args(SFTConfig, "sft", params.sft.trainer, output_dir="c", use_cpu=True)
    grpo_args = finetune.build_trl_args(
        GRPOConfig, "grpo", params.grpo.trainer, output_dir="c", use_cpu=True, **grpo.owned_fields(params)
    )
    return (sft_args, grpo_args, finetune.lora_config("sft", params.sft.lora),
            finetune.lora_config("grpo", params.grpo.lora))


def test_every_preset_is_documented():
    assert set(presets.names()) == {"tiny", "smollm2-135m-cpu", "smollm2-135m-cpu-rl", *GPU_PRESETS}
    for name in presets.names():
        data = presets.read(name)
        assert data["description"] and data["memory"]
        assert f"grpoflow run --preset {name}" in (REPO / "presets" / f"{name}.yaml").read_text()
        assert name in (REPO / "docs" / "training.md").read_text()
    for name in GPU_PRESETS:  # nobody measured these here: the figure must say so
        assert "estimate" in presets.read(name)["memory"]


def test_cpu_preset_builds_the_real_model_settings():
    params = load_params(overrides=presets.overrides("smollm2-135m-cpu"), root=REPO)
    sft_args, grpo_args, sft_lora, grpo_lora = trl_configs(params, gpu_preset=False)
    assert params.model.name_or_path == "smollm2-135m-instruct"
    assert set(sft_lora.target_modules) == set(grpo_lora.target_modules) == PROJECTIONS
    # CPU: bf16 autocast exactly where this CPU has native bf16 (cpu_training_precision: auto), float32 elsewhere
    assert sft_args.bf16 == grpo_args.bf16 == precision.native_bf16()
    assert grpo_args.num_generations == 4 and grpo_args.generation_batch_size % 4 == 0
    settings = scoring.settings_from(params)
    assert settings.dtype == "float32" and settings.max_new_tokens >= 256


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_gpu_preset_builds_what_real_models_need(name):
    params = load_params(overrides=presets.overrides(name), root=REPO)
    sft_args, grpo_args, sft_lora, grpo_lora = trl_configs(params, gpu_preset=True)
    assert params.data.train_source == params.data.test_source == "hf:openai/gsm8k:main"
    assert params.model.dtype == "bfloat16" and sft_args.bf16 and grpo_args.bf16
    assert sft_args.gradient_checkpointing and grpo_args.gradient_checkpointing
    assert params.sft.use_lora and params.grpo.use_lora
    assert set(sft_lora.target_modules) == set(grpo_lora.target_modules) == PROJECTIONS
    # Completions long enough not to be cut: Qwen2.5-0.5B-Instruct's GSM8K answers have a median near 270 tokens.
    assert grpo_args.max_completion_length >= 512
    assert grpo_args.use_vllm and grpo_args.vllm_mode == "colocate" and 0 < grpo_args.vllm_gpu_memory_utilization <= 0.3
    assert grpo_args.generation_batch_size % grpo_args.num_generations == 0
    settings = scoring.settings_from(params)
    assert params.evaluate.protocol == "lm-eval-gsm8k" and settings.max_new_tokens >= 512
    assert settings.dtype == "bfloat16" and settings.num_samples == 8


def test_set_param_given_with_a_preset_wins(tmp_path):
    params_file = tmp_path / "params.yaml"
    params_file.write_text((REPO / "params.yaml").read_text())
    write_overrides(params_file, [*presets.overrides("smollm2-135m-cpu"), "sft.trainer.max_steps=4"])
    written = yaml.safe_load(params_file.read_text())
    assert written["sft"]["trainer"]["max_steps"] == 4
    assert written["sft"]["trainer"]["learning_rate"] == 2.0e-4  # the preset's
    assert written["sft"]["trainer"]["save_steps"] == 25
    assert written["model"]["name_or_path"] == "smollm2-135m-instruct"
    assert "  # 'tiny' (a small Qwen2-style model built offline)" in params_file.read_text()  # the help kept
    assert load_params(params_file, root=tmp_path).sft.trainer["max_steps"] == 4


def test_an_unknown_or_malformed_preset_fails_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such preset; known: llama3.2-1b-16gb, qwen2.5-0.5b-gpu"):
        presets.overrides("qwen-7b")
    (tmp_path / "bad.yaml").write_text("params: [1, 2]\n")
    with pytest.raises(ConfigError, match="bad.yaml: expected a mapping with a `params:` mapping"):
        presets.overrides("bad", tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "--preset", "qwen-7b"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: --preset 'qwen-7b': no such preset")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_default_trains_the_real_model_and_the_tiny_preset_the_tiny_one():
    """The embedded defaults run SmolLM2-135M-Instruct (offline) with GRPO's batched path; `--preset
    tiny` brings back the tiny model trained from scratch, with its own recipe."""
    default = load_params(root=REPO)
    tiny = load_params(overrides=presets.overrides("tiny"), root=REPO)
    assert default.model.name_or_path == "smollm2-135m-instruct" and tiny.model.name_or_path == "tiny"
    assert default.sft.use_lora and default.grpo.use_lora and not tiny.sft.use_lora and not tiny.grpo.use_lora
    assert default.grpo.rollout_engine == "batched" and default.grpo.informative_groups_only
    assert tiny.grpo.rollout_engine == "generate" and not tiny.grpo.informative_groups_only
    _, grpo_args, *_ = trl_configs(default, gpu_preset=False)
    assert grpo_args.generation_batch_size == 128  # 8 optimizer steps of 16 share one generation of 16 prompts x 8
    _, tiny_grpo_args, *_ = trl_configs(tiny, gpu_preset=False)
    assert tiny_grpo_args.generation_batch_size == tiny_grpo_args.per_device_train_batch_size == 32


def test_the_default_differs_from_the_rl_preset_only_in_grpo_throughput():
    """The default is smollm2-135m-cpu-rl's recipe with GRPO's throughput levers: data, model, SFT,
    selection, rewards and the evaluation are the rl preset's, so that their accuracies compare."""
    rl = load_params(overrides=presets.overrides("smollm2-135m-cpu-rl"), root=REPO).to_dict()
    default = load_params(root=REPO).to_dict()
    for section in ("model", "evaluate"):  # the rl preset spells out float32 weights: auto is float32 on a CPU
        default[section]["dtype"] = rl[section]["dtype"]
    sft_logging = {k: default["sft"]["trainer"][k] for k in ("logging_steps", "save_steps")}
    assert {k for k in rl if rl[k] != default[k]} <= {"grpo", "sft"}
    # SFT differs in logging only
    assert {**rl["sft"], "trainer": {**rl["sft"]["trainer"], **sft_logging}} == default["sft"]
    levers = {"rollout_engine", "logps_batching", "lean_logps", "informative_groups_only", "trainer"}
    assert {k for k in rl["grpo"] if rl["grpo"][k] != default["grpo"][k]} <= levers
    trainer = {k for k in rl["grpo"]["trainer"] if rl["grpo"]["trainer"][k] != default["grpo"]["trainer"][k]}
    assert trainer <= {"max_steps", "steps_per_generation", "generation_batch_size"}


GPU_PRESETS = ("qwen2.5-0.5b-gpu", "qwen2.5-1.5b-gpu", "llama3.2-1b-16gb")
# The default's GRPO recipe, which every device runs (docs/training.md#one-recipe-on-cpu-and-gpu).
RECIPE = ("informative_groups_only", "old_logps", "lean_logps", "lora", "use_lora")
RECIPE_TRAINER = ("beta", "epsilon", "loss_type", "scale_rewards", "temperature", "num_generations", "num_iterations")


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_gpu_presets_run_the_defaults_grpo_recipe_and_differ_only_where_the_docs_say_why(name):
    default = load_params(root=REPO).to_dict()["grpo"]
    preset = load_params(overrides=presets.overrides(name), root=REPO).to_dict()["grpo"]
    for key in RECIPE:
        assert preset[key] == default[key], f"{name}: grpo.{key} {preset[key]!r}, the default's {default[key]!r}"
    for key in RECIPE_TRAINER:
        assert preset["trainer"].get(key) == default["trainer"].get(key), f"{name}: grpo.trainer.{key}"
    text = (REPO / "docs" / "training.md").read_text()
    table = text[text.index("### One recipe on CPU and GPU"):text.index("## Rewards")]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `grpo.")]
    named = {name for row in rows for name in re.findall(r"`(grpo\.[\w.]+)`", row)}
    differ = {f"grpo.{k}" for k in preset if k != "trainer" and preset[k] != default[k]}
    differ |= {f"grpo.trainer.{k}" for k in set(preset["trainer"]) | set(default["trainer"])
               if preset["trainer"].get(k) != default["trainer"].get(k)}
    assert sorted(differ - named) == [], f"{name}: differences docs/training.md's table does not name"
