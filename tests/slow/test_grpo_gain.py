"""benchmarks/grpo_gain.py end to end on a tiny configuration: data, model, SFT, GRPO, the
continued-SFT control, greedy and sampled evaluation; the JSON has every key the README and
benchmarks/RESULTS.md quote. Few minutes on two cores.

    pytest -q tests/slow/test_grpo_gain.py
"""

from __future__ import annotations

import json

import pytest

from benchmarks import grpo_gain
from tests.project_repo import preset_overrides

pytestmark = pytest.mark.slow

TINY = [
    *preset_overrides("tiny"),
    "data.synthetic_train_size=48",
    "data.synthetic_test_size=8",
    "data.synthetic_test_top_band_size=0",
    "model.tiny_hidden_size=32",
    "model.tiny_intermediate_size=64",
    "model.tiny_num_layers=1",
    "model.tiny_num_heads=2",
    "model.tiny_vocab_size=300",
    "sft.sample_size=0",
    "sft.trainer.max_steps=4",
    "sft.trainer.per_device_train_batch_size=4",
    "sft.trainer.logging_steps=2",
    "sft.trainer.save_steps=2",
    "selection.num_samples=0",
    "selection.min_prompts=1",
    "grpo.sample_size=0",
    "grpo.trainer.num_generations=4",
    "grpo.signal_window=2",
    "grpo.trainer.max_steps=4",
    "grpo.trainer.per_device_train_batch_size=8",
    "grpo.trainer.max_completion_length=16",
    "grpo.trainer.logging_steps=2",
    "grpo.trainer.save_steps=2",
    "evaluate.max_new_tokens=16",
]


def test_grpo_gain_reports_every_key(tmp_path, capsys):
    assert grpo_gain.main([*(a for o in TINY for a in ("-S", o)), "--k", "2", "--sample-items", "4",
                           "--keep", str(tmp_path / "gain")]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in (
        "sft_accuracy", "grpo_accuracy", "delta", "p_value", "n", "sft_accuracy_flexible", "grpo_accuracy_flexible",
        "sft_sampled_accuracy", "grpo_sampled_accuracy", "sft_pass_at_k", "grpo_pass_at_k",
        "sft_continued_accuracy_flexible", "flexible_vs_continued", "sft_continued_steps",
        "sft_seconds", "grpo_seconds",
    ):
        assert key in result, key
    assert result["k"] == 2 and result["sampled_items"] == 4 and result["n"] == 8
    assert result["selection_backend"] == "none"  # read from the stage's own line: num_samples=0 samples nothing
    # the sampled figures are shares of the 4 sampled items (k=2 samples each), the control's of the 8 test items
    for key in ("sft_sampled_accuracy", "grpo_sampled_accuracy"):
        assert result[key] * 8 == round(result[key] * 8), key
    assert result["sft_continued_accuracy_flexible"] * 8 == round(result["sft_continued_accuracy_flexible"] * 8)
    # the control trained its own model and kept the first SFT run's report
    train = tmp_path / "gain" / "reports" / "train"
    assert json.loads((train / "sft.json").read_text())["global_step"] == 4
    assert json.loads((train / "sft_continued.json").read_text())["global_step"] == result["sft_continued_steps"]
    # a 4-step SFT model earns no reward: every group has zero std and the signal monitor said so
    grpo = json.loads((train / "grpo.json").read_text())
    assert grpo["frac_reward_zero_std_mean"] == result["frac_reward_zero_std"] == 1.0
    assert grpo["signal_warnings"] == 2  # zero_std, then reward_flat; each once


def test_the_control_of_a_lora_recipe_trains_over_the_merged_sft_model(tmp_path, capsys):
    """The default recipe trains LoRA adapters: the control continues SFT over models/sft merged into
    its base (an adapter over an adapter could not be loaded, and the evaluation of the control failed)."""
    lora = ["sft.use_lora=true", "grpo.use_lora=true"]
    assert grpo_gain.main([*(a for o in [*TINY, *lora] for a in ("-S", o)), "--k", "0",
                           "--keep", str(tmp_path / "gain")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sft_continued_steps"] >= 1 and 0.0 <= result["sft_continued_accuracy_flexible"] <= 1.0
    work = tmp_path / "gain" / "models"
    assert (json.loads((work / "sft_continued" / "grpoflow_adapter.json").read_text())["base_dir"]
            == "models/sft_continued_base")
