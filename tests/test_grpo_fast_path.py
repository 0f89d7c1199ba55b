"""GRPO's CPU fast path (issue 31): rollouts with the LoRA adapter folded into the weights, log-prob
passes per sequence without padding, bf16 autocast only where the CPU has native bf16, and
benchmarks/grpo_step.py's JSON on the tiny model.

- `adapters.merged_weights`: inside, a PEFT model computes what base + adapter computes; on exit the
  base weights are bit-identical to before and the adapter computes again (no drift over steps).
- `logps.unpadded_logps` (components/training/logps.py) over TRL's own log-prob function: rows with no left padding
  give the padded batch's log-probs; every row gives what it gives alone; padding columns are zero; gradients flow.
- bf16 autocast on a CPU only with `model.cpu_training_precision: auto` and native bf16 (detected).
- `benchmarks/grpo_step.py` prints the step's parts, tokens and floor; the parts add up to the step.

    pytest -q tests/test_grpo_fast_path.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]


def tiny_lora_model(seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                init_lora_weights=False, task_type="CAUSAL_LM"))
    return model.float()


def test_merged_weights_computes_base_plus_adapter_and_restores_the_exact_base():
    from components.models.adapters import merged_weights

    model = tiny_lora_model()
    model.eval()
    ids = torch.randint(0, 97, (3, 11))
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with model.disable_adapter():
            base_only = model(input_ids=ids).logits
        with merged_weights(model):
            merged = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert not torch.allclose(plain, base_only, atol=1e-3)  # the adapter matters
    assert torch.allclose(merged, plain, atol=1e-5), (merged - plain).abs().max()
    assert torch.equal(after, plain)
    for name, param in model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(param, base_before[name]), name  # bit-identical, not base + delta - delta


def test_merged_weights_leaves_a_model_without_adapters_or_already_merged_alone():
    """A plain model and a PeftModel whose adapter is merged already compute inside the block with the
    exact weights they had (an adapter folded in twice would add its delta again), and keep them after."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from components.models.adapters import merged_weights

    plain = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()
    merged = tiny_lora_model(3).eval()
    merged.merge_adapter()
    ids = torch.randint(0, 97, (2, 7))
    for model in (plain, merged):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        with torch.no_grad():
            outside = model(input_ids=ids).logits
            with merged_weights(model) as inside:
                assert inside is model
                weights = {n: p.detach().clone() for n, p in model.named_parameters()}
                logits = model(input_ids=ids).logits
            after = model(input_ids=ids).logits
        for name, param in model.named_parameters():
            assert torch.equal(weights[name], before[name]) and torch.equal(param, before[name]), name
        assert torch.equal(logits, outside) and torch.equal(after, outside)


def _trl_logps(model):
    """TRL 1.16's own GRPOTrainer._get_per_token_logps_and_entropies, bound to the little it needs, over
    `model` with the fused LM head the trainer adds at start."""
    from accelerate import Accelerator
    from trl import GRPOTrainer
    from trl.trainer import add_fused_lm_head

    add_fused_lm_head(model.get_base_model(), temperature=1.0, outputs=("log_probs", "entropy"))
    return partial(GRPOTrainer._get_per_token_logps_and_entropies, SimpleNamespace(accelerator=Accelerator(cpu=True)))


def test_unpadded_logps_match_the_padded_batch_where_positions_agree_and_each_row_alone():
    from components.training.logps import unpadded_logps

    model = tiny_lora_model(1)
    model.eval()
    trl = _trl_logps(model)
    prompt, completion = 6, 5
    width = prompt + completion
    ids = torch.randint(3, 97, (3, width))
    mask = torch.ones(3, width, dtype=torch.long)
    # row 0: full prompt, completion of 5 (no padding at all)
    mask[1, prompt + 2 :] = 0  # full prompt, completion of 2 (right padding)
    mask[2, :3] = 0  # prompt left-padded by 3, completion of 5
    with torch.no_grad():
        padded, _, _ = trl(model, ids, mask, completion)
        unpadded, entropy, _ = unpadded_logps(trl, model, ids, mask, completion, compute_entropy=True)
        alone, _, _ = trl(model, ids[2:3, 3:], mask[2:3, 3:], completion)
    assert unpadded.shape == padded.shape == entropy.shape == (3, completion)
    assert torch.allclose(unpadded[0], padded[0], atol=1e-5)
    assert torch.allclose(unpadded[1, :2], padded[1, :2], atol=1e-5) and (unpadded[1, 2:] == 0).all()
    assert torch.allclose(unpadded[2], alone[0], atol=1e-6)  # positions from the first real token
    assert (entropy[1, 2:] == 0).all() and (entropy[:, :2] > 0).all()

    model.train()
    logps, _, _ = unpadded_logps(trl, model, ids, mask, completion)
    (logps * mask[:, -completion:]).sum().backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    assert grads and all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_bf16_autocast_on_a_cpu_only_where_asked_and_native(monkeypatch):
    from trl import GRPOConfig

    from components.training import finetune, precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert finetune.device_defaults()["bf16"] is False
    assert finetune.device_defaults(cpu_bf16=True)["bf16"] is True
    for native in (False, True):
        monkeypatch.setattr(precision, "native_bf16", lambda native=native: native)
        assert finetune.cpu_bf16("float32") is False
        assert finetune.cpu_bf16("auto") is native
    args = finetune.build_trl_args(GRPOConfig, "grpo", {"max_steps": 1}, cpu_bf16=True, output_dir="x",
                                   per_device_train_batch_size=8, num_generations=8)
    assert args.bf16 and not args.fp16  # TRL accepts bf16 autocast on a CPU
    assert precision.cpu_flags("flags : fpu avx2 fma\n") == {"fpu", "avx2", "fma"}


def test_grpo_step_benchmark_reports_the_parts_of_a_step(tmp_path):
    """The benchmark on the tiny preset (full fine-tuning), 1 measured step: its JSON adds up."""
    small = ["data.synthetic_train_size=60", "data.synthetic_answer_only_size=40",
             "grpo.trainer.max_completion_length=16", "grpo.trainer.per_device_train_batch_size=8",
             "grpo.trainer.num_generations=4"]
    cmd = [sys.executable, str(REPO / "benchmarks/grpo_step.py"), "--preset", "tiny", "--steps", "1", "--warmup", "1",
           "--path", "before", *[a for s in small for a in ("-S", s)]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    parts = out["parts"]
    assert set(parts) == {"generation", "reference_forward", "policy_forward_backward", "optimizer", "other"}
    assert parts["generation"] > 0 and parts["policy_forward_backward"] > 0 and parts["reference_forward"] > 0
    assert sum(parts.values()) == pytest.approx(out["step_seconds"], abs=1e-3)
    assert out["tokens"]["completion"] > 0 and out["floor_seconds"] > 0
    assert out["floor_ratio"] == pytest.approx(out["step_seconds"] / out["floor_seconds"], rel=0.005)
    assert out["matmul_gflops"]["float32"] > 0 and out["precision"] == "float32"
    # the roofline: generation at the larger of its FLOP time and its weight/KV reads at the read rate
    assert out["read_gbps"] > 0 and 0 < out["tokens"]["decode_steps"] <= 16  # max_completion_length
    assert out["generation_read_seconds"] > 0
    gen = max(out["floor_parts"]["generation"], out["generation_read_seconds"])
    assert out["roofline_seconds"] == pytest.approx(out["floor_seconds"] - out["floor_parts"]["generation"] + gen,
                                                    rel=2e-3)
    assert out["roofline_ratio"] == pytest.approx(out["step_seconds"] / out["roofline_seconds"], rel=0.005)
    # throughput (issue 41): every completion sampled in the measured step, over its seconds
    assert out["completions"] == 16 and out["generation_batch"] == 16 and out["max_completion_length"] == 16
    assert out["completions_per_second"] == pytest.approx(16 / out["step_seconds"], rel=0.01)
    assert out["completion_tokens_per_second"] == pytest.approx(out["tokens"]["completion"] / out["step_seconds"],
                                                                rel=0.01)
    assert 0.0 <= out["informative_groups"] <= 1.0 and out["cpu_completions_per_second"] > 0


def test_the_step_benchmark_compares_completions_per_second_at_the_same_completion_length():
    from benchmarks.grpo_step import compared

    before = {"completions_per_second": 0.5, "informative_completions_per_second": 0.2, "step_seconds": 32.0,
              "cpu_completions_per_second": 0.25}
    after = {"completions_per_second": 2.0, "informative_completions_per_second": 1.0, "step_seconds": 8.0,
             "cpu_completions_per_second": 0.75}
    out = compared({"before": before, "after": after})
    assert (out["throughput_speedup"], out["informative_speedup"], out["speedup"]) == (4.0, 5.0, 4.0)
    assert out["cpu_throughput_speedup"] == 3.0
    assert compared({"before": {**before, "informative_completions_per_second": None}, "after": after})[
        "informative_speedup"] is None


def test_the_step_benchmark_keeps_four_significant_figures_of_a_floor_of_milliseconds():
    """A tiny model's floor is a few milliseconds: rounded to 4 decimals it lost a digit and the
    reported ratio no longer matched the reported seconds (CI saw 7.304 against 7.267)."""
    from benchmarks.grpo_step import figure

    assert figure(0.0073456) == 0.007346 and figure(72.6666) == 72.67 and figure(2592.123) == 2592.0
    assert figure(0.0) == 0.0


@pytest.mark.parametrize("merge", [False, True])
def test_rollouts_compute_in_bf16_on_a_cpu_only_where_training_does(merge):
    """TRL generates outside autocast: without rollout_context a bf16 run decodes in float32, slower
    and in another precision than its loss. Inside it, the projections compute in bf16 (merged or
    not), and on exit the model computes in float32 again with its exact weights (the same tensors)."""
    from components.training.grpo_trainer import rollout_context

    model = tiny_lora_model(2)
    model.eval()
    ids = torch.randint(0, 97, (2, 7))
    seen: list[torch.dtype] = []
    proj = model.get_base_model().model.layers[0].self_attn.q_proj
    proj.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    storage = {n: p.data_ptr() for n, p in model.named_parameters()}
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        for cpu_bf16, expected in ((False, torch.float32), (True, torch.bfloat16)):
            seen.clear()
            with rollout_context(model, merge, cpu_bf16):
                inside = model(input_ids=ids).logits
            assert seen and set(seen) == {expected}, (cpu_bf16, seen)
            tolerance = 0.1 if cpu_bf16 else 1e-5
            assert torch.allclose(inside.float(), plain, atol=tolerance), (inside.float() - plain).abs().max()
        seen.clear()
        assert torch.equal(model(input_ids=ids).logits, plain) and set(seen) == {torch.float32}
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]) and param.dtype == torch.float32, name
        assert param.data_ptr() == storage[name], name  # the optimizer's tensors, not copies


def test_grouped_attention_equals_transformers_sdpa_with_a_padding_mask_and_restores_it():
    """rollouts.grouped_attention: grouped-query attention without the per-head KV copy gives SDPA's
    output (a decode step and a prefill, left padding masked), and puts transformers' function back."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from components.models import sampling as rollouts

    torch.manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    for q_len in (1, 5):
        query, key, value = torch.randn(4, 9, q_len, 16), torch.randn(4, 3, 12, 16), torch.randn(4, 3, 12, 16)
        mask = torch.ones(4, 1, q_len, 12, dtype=torch.bool).tril(12 - q_len)
        mask[1, :, :, :3] = False  # row 1 is left-padded by 3
        want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
        with rollouts.grouped_attention():
            grouped = ALL_ATTENTION_FUNCTIONS["sdpa"]
            got, _ = grouped(module, query, key, value, mask, scaling=0.25)
        assert got.shape == want.shape == (4, q_len, 9, 16)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward
