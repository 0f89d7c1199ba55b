"""SFT's lean training step (`sft.lean_passes`, components/training/lean_passes.py `lean_training_step`),
checked on a tiny LoRA model: TRL's fused LM head scores only the completion positions instead of every
position, under bf16 autocast the frozen weights are bf16 during the step and float32 after it, and
the training losses are those of TRL's own step.

    pytest -q tests/test_sft_passes.py
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from components.common.params import DataParams, ModelParams  # noqa: E402
from pipelines.params import presets  # noqa: E402
from pipelines.params.config import load_params  # noqa: E402

TINY = dict(tiny_hidden_size=32, tiny_num_heads=2, tiny_num_layers=2, tiny_intermediate_size=64, tiny_vocab_size=300)


def train(tmp_path, monkeypatch, lean: bool, bf16: bool):
    """Two LoRA SFT steps of 4 demonstrations on a tiny model; (trainer, rows the head projected per
    call, (base weight dtype, LoRA weight dtype) seen in the forward passes that had a gradient)."""
    import trl.trainer.utils as trl_utils
    from peft.tuners.lora import LoraLayer

    from components import data, sft
    from components import model as model_stage
    from components.problems.sources import read_split
    from components.training import precision

    tmp_path.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(precision, "native_bf16", lambda: bf16)  # bf16 autocast on any CPU (emulated where not native)
    data.write_splits(DataParams(output_dir=str(tmp_path / "data"), synthetic_train_size=16, synthetic_test_size=4))
    model, tokenizer = model_stage.build_tiny(ModelParams(seed=0, **TINY), tmp_path / "data/train.jsonl")
    params = load_params(None, [*presets.overrides("tiny"), f"sft.lean_passes={str(lean).lower()}",
                                "sft.use_lora=true", "model.cpu_training_precision=auto",
                                "sft.trainer.max_steps=2", "sft.trainer.per_device_train_batch_size=4",
                                "sft.trainer.logging_steps=1", "sft.trainer.report_to=[]", "sft.trainer.warmup_steps=0",
                                "sft.trainer.save_strategy='no'", f"sft.checkpoint_dir={tmp_path / 'ck'}"])
    args, peft_config = sft.trainer_settings(params)
    dataset, _ = sft.build_demos(read_split(tmp_path / "data/train.jsonl"), tokenizer, params.sft)
    torch.manual_seed(0)
    trainer = sft.sft_trainer_class(params)(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                                        peft_config=peft_config)
    projected: list[int] = []
    head = trl_utils._ChunkedLogProbFunction.apply
    layer = next(m for m in trainer.model.modules() if isinstance(m, LoraLayer))
    seen: set[tuple[torch.dtype, torch.dtype]] = set()
    layer.register_forward_hook(lambda mod, inp, out: torch.is_grad_enabled() and seen.add(
        (mod.get_base_layer().weight.dtype, mod.lora_A["default"].weight.dtype)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trl_utils._ChunkedLogProbFunction, "apply",
                   lambda hidden, *a: (projected.append(hidden.size(0)), head(hidden, *a))[1])
        trainer.train()
    assert layer.get_base_layer().weight.dtype == torch.float32  # float32 again once the step is over
    return trainer, projected, seen


@pytest.mark.parametrize("bf16", [False, True])
def test_the_lean_sft_step_scores_only_the_completions_with_the_same_losses(tmp_path, monkeypatch, bf16):
    plain, every, plain_dtypes = train(tmp_path / "plain", monkeypatch, lean=False, bf16=bf16)
    lean, scored, lean_dtypes = train(tmp_path / "lean", monkeypatch, lean=True, bf16=bf16)
    assert plain.args.bf16 is bf16 and lean.args.bf16 is bf16
    assert len(every) == len(scored) == 2  # one head call a step
    # the prompts' positions are not projected
    assert all(s < e for s, e in zip(scored, every, strict=True)), (scored, every)
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (plain, lean)]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], rel=1e-2 if bf16 else 1e-4)
    base = torch.bfloat16 if bf16 else torch.float32
    assert plain_dtypes == {(torch.float32, torch.float32)}
    assert lean_dtypes == {(base, torch.float32)}  # the frozen weights in bf16 only where the step trains in bf16
