"""GRPO's throughput options on a CPU (issue 41), each checked on a tiny model:

- `grpo.rollout_engine: batched` (components/models/sampling.py): the same tokens as
  `model.generate` (greedy through top-k 1, rows ending early and leaving the batch), the first token
  sampled from the temperature and top-k distribution, inside the stage's trainer;
- `grpo.informative_groups_only` (components/training/informative.py): only the groups with a reward
  spread reach the KL reference's log-prob pass and the loss, the history logs their share;
- `grpo.old_logps: rollout`: the batched rollouts return each sampled token's log-prob (log-softmax
  of logits / T, what a forward pass gives), and the old policy's pass no longer runs;
- `grpo.logps_batching: shared_prefix` (components/training/logps.py): the per-sequence log-probs,
  entropies and LoRA gradients with one pass per distinct prompt;
- `grpo.lean_logps`: the LM head scores only the completions, the loss pass computes with the frozen
  weights in bf16 and the trainable ones in float32, the same log-probs as TRL's pass.

    pytest -q tests/test_grpo_throughput.py
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from components.common.params import DataParams, ModelParams  # noqa: E402
from pipelines.params import presets  # noqa: E402
from pipelines.params.config import load_params  # noqa: E402

TINY = dict(tiny_hidden_size=32, tiny_num_heads=2, tiny_num_layers=2, tiny_intermediate_size=64, tiny_vocab_size=300)


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
                         eos_token_id=5)
    return LlamaForCausalLM(config).eval()


PROMPTS = [[3, 4, 7, 8, 9], [3, 4, 7, 8, 9], [11, 12], [11, 12], [20, 21, 22, 23, 24, 25, 26], [30, 31, 32],
           [40, 41, 42, 43], [50, 51], [60], [70, 71, 72, 73, 74, 75, 76, 77]]


def generated(model, prompts, config):
    """model.generate's completions of left-padded `prompts`, each cut after its first EOS."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:].tolist()
    eos = config.eos_token_id
    return [row[: next((i + 1 for i, t in enumerate(row) if t in eos), len(row))] for row in out]


def test_batched_rollouts_decode_what_generate_decodes_with_rows_ending_and_leaving_the_batch():
    from transformers import GenerationConfig

    from components.models import sampling as rollouts

    model = tiny_llama()
    eos = [44, 86]  # tokens this model samples early in some rows and never in others
    config = GenerationConfig(do_sample=True, top_k=1, max_new_tokens=12, pad_token_id=0, eos_token_id=eos)
    ours = rollouts.sample(model, PROMPTS, config, 12, eos, 0)
    assert ours == generated(model, PROMPTS, config)
    lengths = sorted(len(c) for c in ours)
    assert lengths[0] < 4 and lengths[-1] == 12  # rows ended (and left the batch) while others went on
    assert all(c[-1] in eos for c in ours if len(c) < 12)


def test_batched_rollouts_sample_the_first_token_from_the_temperature_and_top_k_distribution():
    """4000 rows of one prompt, one token each: the frequencies are the softmax of logits / T over the
    top k (computed here by hand), within 5 standard deviations; nothing outside the top k."""
    from transformers import GenerationConfig

    from components.models import sampling as rollouts

    model = tiny_llama(1)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # logits spread over several units: the temperature matters
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=5, max_new_tokens=1, pad_token_id=0,
                              eos_token_id=[96])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPTS[4]])).logits[0, -1].double()
    top = logits.topk(5)
    expected = torch.zeros_like(logits)
    expected[top.indices] = torch.softmax(top.values / 0.7, dim=0)
    torch.manual_seed(0)
    n = 4000
    first = [c[0] for c in rollouts.sample(model, [PROMPTS[4]] * n, config, 1, [96], 0)]
    freq = torch.bincount(torch.tensor(first), minlength=logits.numel()).double() / n
    sigma = (expected * (1 - expected) / n).sqrt()
    assert set(first) <= set(top.indices.tolist()) and len(set(first)) >= 3
    assert ((freq - expected).abs() <= 5 * sigma + 1e-12).all(), (freq[top.indices], expected[top.indices])


def test_batched_rollouts_return_each_sampled_tokens_log_prob_as_a_forward_pass_computes_it():
    """The rollout's log-probs are log-softmax(logits / T) at the sampled tokens, before top-k (what
    TRL's log-prob pass computes and PPO's ratio divides by), for every row, ended early or not."""
    from transformers import GenerationConfig

    from components.models import sampling as rollouts

    model = tiny_llama(1)
    with torch.no_grad():
        model.lm_head.weight.mul_(10)
    eos = [96, 22]  # tokens this model samples early in some rows
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=20, max_new_tokens=10, pad_token_id=0,
                              eos_token_id=eos)
    torch.manual_seed(0)
    ids, logps = rollouts.sample(model, PROMPTS, config, 10, eos, 0, logprobs=True)
    assert ids == (torch.manual_seed(0), rollouts.sample(model, PROMPTS, config, 10, eos, 0))[1]  # the same draws
    assert [len(lp) for lp in logps] == [len(c) for c in ids] and min(map(len, ids)) < 10
    for prompt, completion, lp in zip(PROMPTS, ids, logps, strict=True):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        expected = (torch.log_softmax(logits.float() / 0.7, dim=-1)
                    .gather(1, torch.tensor(completion)[:, None]).squeeze(1))
        assert torch.allclose(torch.tensor(lp), expected, atol=1e-4), (lp, expected.tolist())


def test_batched_rollouts_cover_only_the_sampling_settings_they_reproduce():
    from transformers import GenerationConfig

    from components.models import sampling as rollouts

    assert rollouts.supported(GenerationConfig(do_sample=True, temperature=0.8, top_k=0, top_p=1.0, min_p=0.1,
                                               repetition_penalty=1.0))
    for other in ({"repetition_penalty": 1.2}, {"no_repeat_ngram_size": 3}, {"typical_p": 0.5}, {"do_sample": False},
                  {"suppress_tokens": [3]}):
        assert not rollouts.supported(GenerationConfig(**{"do_sample": True, **other})), other


# The stage's trainer on a tiny model: groups of 2 completions; a reward that is constant for the
# problems whose gold answer is even (uninformative groups) and the completion's length parity for the
# others (informative as soon as two lengths differ in parity).
def parity_reward(completions, gold, **kwargs):
    return [1.0 if int(g) % 2 == 0 else float(len(c) % 2) for c, g in zip(completions, gold, strict=True)]


def stage_trainer(tmp_path, monkeypatch, overrides):
    from components import data, grpo
    from components import model as model_stage

    monkeypatch.chdir(tmp_path)
    data.write_splits(DataParams(output_dir=str(tmp_path / "data"), synthetic_train_size=40, synthetic_test_size=4,
                                 synthetic_answer_only_size=24))
    model, tokenizer = model_stage.build_tiny(ModelParams(seed=0, **TINY), tmp_path / "data/train.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "data/grpo.jsonl").read_text().splitlines()]
    params = load_params(None, [*presets.overrides("tiny"), "grpo.trainer.num_generations=2",
                                "grpo.trainer.per_device_train_batch_size=4",
                                "grpo.trainer.max_completion_length=12", "grpo.trainer.max_steps=4",
                                "grpo.trainer.logging_steps=1", "grpo.trainer.report_to=[]", "grpo.trainer.beta=0.1",
                                "grpo.use_lora=true", "grpo.trainer.save_strategy='no'", "grpo.trainer.temperature=1.5",
                                f"grpo.checkpoint_dir={tmp_path / 'ck'}", *overrides])
    args, peft_config = grpo.trainer_settings(params)
    trainer = grpo.trainer_class(params)(
        model=model, args=args, train_dataset=grpo.prompt_dataset(rows, tokenizer), processing_class=tokenizer,
        peft_config=peft_config, reward_funcs=[parity_reward], stage_params=params.grpo)
    return trainer, rows


@pytest.mark.parametrize("informative", [False, True])
def test_only_informative_groups_reach_the_reference_pass_and_the_loss(tmp_path, monkeypatch, informative):
    trainer, _ = stage_trainer(tmp_path, monkeypatch, [f"grpo.informative_groups_only={str(informative).lower()}",
                                                       "grpo.trainer.steps_per_generation=2"])
    losses, passes = [], []
    compute = type(trainer)._compute_loss
    monkeypatch.setattr(type(trainer), "_compute_loss",
                        lambda self, model, inputs: (losses.append(inputs["advantages"].clone()),
                                                     compute(self, model, inputs))[1])
    from trl import GRPOTrainer

    logps = GRPOTrainer._get_per_token_logps_and_entropies  # TRL's pass itself: what runs the model

    def counted(self, model, input_ids, *args, **kwargs):
        passes.append((torch.is_grad_enabled(), input_ids.size(0)))
        return logps(self, model, input_ids, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", counted)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "informative_groups" in e]
    assert len(logs) == 2  # 4 steps, a generation batch every 2
    trained = torch.cat(losses)
    shares = [e["informative_groups"] for e in logs]
    assert 0 < sum(shares) < 2, shares  # some groups informative, some not (the premise)
    if not informative:
        assert len(trained) == 16 and (trained == 0).sum() > 0  # every completion, zero advantages included
        assert sum(rows for grad, rows in passes if not grad) == 2 * 16
        return
    kept = [e["trained_completions"] for e in logs]
    assert kept == [s * 8 for s in shares] and len(trained) == sum(kept)
    assert (trained != 0).all()  # a kept row's group has a reward spread: it has an advantage
    # the old policy's and the reference's passes, each on the kept rows only
    assert sum(rows for grad, rows in passes if not grad) == 2 * sum(kept)


@pytest.mark.parametrize("old_logps", ["rollout", "forward"])
def test_the_old_policys_log_probs_come_from_the_rollouts_without_a_pass(tmp_path, monkeypatch, old_logps):
    """Batched rollouts, informative groups only, 2 optimizer steps a generation batch: with
    `grpo.old_logps: rollout` only the reference's pass runs over the kept rows, and the loss divides
    by the rollout's log-probs; with `forward`, the old policy's pass runs too."""
    trainer, _ = stage_trainer(tmp_path, monkeypatch, ["grpo.informative_groups_only=true",
                                                       "grpo.rollout_engine=batched", f"grpo.old_logps={old_logps}",
                                                       "grpo.trainer.steps_per_generation=2"])
    inputs_seen, passes = [], []
    compute = type(trainer)._compute_loss
    monkeypatch.setattr(type(trainer), "_compute_loss",
                        lambda self, model, inputs: (inputs_seen.append(dict(inputs)), compute(self, model, inputs))[1])
    from trl import GRPOTrainer

    logps = GRPOTrainer._get_per_token_logps_and_entropies

    def counted(self, model, input_ids, *args, **kwargs):
        passes.append((torch.is_grad_enabled(), input_ids.size(0)))
        return logps(self, model, input_ids, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", counted)
    trainer.train()
    kept = sum(e["trained_completions"] for e in trainer.state.log_history if "trained_completions" in e)
    assert kept > 0
    no_grad_rows = sum(rows for grad, rows in passes if not grad)
    trained = [i for i in inputs_seen if i["completion_ids"].size(0)]
    if old_logps == "forward":
        assert no_grad_rows == 2 * kept
        return
    assert no_grad_rows == kept  # the reference's pass alone
    for batch in trained:
        old, sampled = batch["old_per_token_logps"], batch["sampling_per_token_logps"]
        assert old is sampled or torch.equal(old, sampled)
        mask = batch["completion_mask"].bool()
        assert (old[mask] < 0).all() and old.shape == batch["completion_ids"].shape


def tiny_lora_llama(seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from trl.trainer import add_fused_lm_head

    model = tiny_llama(seed)
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False,
                                             task_type="CAUSAL_LM"))
    return model.float()


def grpo_rows():
    """6 rows of 2 prompts (4 and 6 tokens, left-padded) x 3 completions (2 to 5 tokens, right-padded),
    interleaved as a shuffled minibatch is."""
    prompts = {0: [11, 12, 13, 14], 1: [21, 22, 23, 24, 25, 26]}
    completions = [(0, [31, 32]), (1, [41, 42, 43, 44, 45]), (0, [33, 34, 35, 36, 37]), (1, [46]),
                   (0, [38, 39, 40]), (1, [47, 48, 49, 50])]
    ids = torch.zeros(6, 6 + 5, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (p, c) in enumerate(completions):
        ids[row, 6 - len(prompts[p]) : 6] = torch.tensor(prompts[p])
        ids[row, 6 : 6 + len(c)] = torch.tensor(c)
        mask[row, 6 - len(prompts[p]) : 6 + len(c)] = 1
    return ids, mask


@pytest.mark.parametrize("head", ["fused", "lean"])
@pytest.mark.parametrize("batch_size", [6, 2])
def test_shared_prefix_logps_are_the_per_sequence_logps_and_gradients(batch_size, head):
    """One prefix pass per distinct prompt gives each row what the row alone gives (log-probs, entropies
    and the LoRA gradient through the shared cache), in the rows' own order, chunks cutting groups or not,
    with TRL's fused LM head or the lean one (the model's head, log-softmax of logits / T)."""
    from functools import partial
    from types import SimpleNamespace

    from accelerate import Accelerator
    from trl import GRPOTrainer

    from components.training.logps import shared_prefix_logps, unpadded_logps

    model = tiny_lora_llama(2)
    model.train()
    trl = partial(GRPOTrainer._get_per_token_logps_and_entropies, SimpleNamespace(accelerator=Accelerator(cpu=True)))
    ids, mask = grpo_rows()
    completion = mask[:, 6:]
    results = []
    for compute in (lambda: unpadded_logps(trl, model, ids, mask, 5, compute_entropy=True),
                    lambda: shared_prefix_logps(model, ids, mask, 5, lambda: torch.autocast("cpu", enabled=False),
                                                compute_entropy=True, batch_size=batch_size,
                                                temperature=0.8 if head == "lean" else None)):
        model.zero_grad()
        logps, entropy, _ = compute()
        (logps * completion).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logps.detach() * completion, entropy.detach() * completion, grads))
    (lp_a, ent_a, grad_a), (lp_b, ent_b, grad_b) = results
    assert torch.allclose(lp_a, lp_b, atol=1e-5), (lp_a - lp_b).abs().max()
    assert torch.allclose(ent_a, ent_b, atol=1e-5) and (lp_b != 0).sum() == completion.sum()
    assert grad_a.keys() == grad_b.keys() and len(grad_a) > 4
    for name in grad_a:
        assert torch.allclose(grad_a[name], grad_b[name], atol=1e-5), name


@pytest.mark.parametrize("lean", [False, True])
def test_lean_logps_project_only_the_completions_and_hold_the_frozen_weights_in_bf16(tmp_path, monkeypatch, lean):
    """With grpo.lean_logps the LM head scores only the completion positions and the loss pass computes
    with the frozen weights in bf16 (trainable ones float32): the same log-probs as TRL's pass."""
    import trl.trainer.utils as trl_utils
    from peft.tuners.lora import LoraLayer

    from components.training import precision

    monkeypatch.setattr(precision, "native_bf16", lambda: True)  # bf16 autocast on any CPU (emulated where not native)
    trainer, _ = stage_trainer(tmp_path, monkeypatch, [f"grpo.lean_logps={str(lean).lower()}",
                                                       "model.cpu_training_precision=auto", "grpo.trainer.max_steps=1"])
    assert trainer.args.bf16
    layer = next(m for m in trainer.model.modules() if isinstance(m, LoraLayer))
    seen: list[tuple[bool, torch.dtype, torch.dtype]] = []
    layer.register_forward_hook(lambda mod, inp, out: seen.append(
        (torch.is_grad_enabled(), mod.get_base_layer().weight.dtype, mod.lora_A["default"].weight.dtype)))
    projected: list[int] = []
    head = trl_utils._ChunkedLogProbFunction.apply
    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply",
                        lambda hidden, *a: (projected.append(hidden.size(0)), head(hidden, *a))[1])
    ids = torch.randint(3, 100, (3, 20))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        plain = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 8)[0]
        with trainer._passes_context():
            held = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 8)[0]
    assert torch.equal(held, plain)  # the same bf16 operands, cast once instead of at every call
    assert projected == [3 * 19, 3 * 8 if lean else 3 * 19]  # every position, then only the scored ones
    seen.clear()
    trainer.train()
    in_loss = {(base, lora) for grad, base, lora in seen if grad}
    assert in_loss == {(torch.bfloat16 if lean else torch.float32, torch.float32)}
    assert layer.get_base_layer().weight.dtype == torch.float32  # and float32 again once the pass is over
