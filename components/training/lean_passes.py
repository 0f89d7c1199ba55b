"""Work a training pass can skip without changing a number (to rounding), shared by GRPO's log-prob and
loss passes (`grpo.lean_logps`, components/training/logps.py) and SFT's training step
(`sft.lean_passes`):

- the LM head only at the scored positions (the completions). TRL's fused head scores every position
  off CUDA and XPU (there, a shape that varies would recompile a kernel), a CPU's prompt positions
  too: three in four of them for GRPO's prompts, about two in three for SFT's demonstrations;
- on a CPU, attention in PyTorch's math kernel (its backward is faster there than the flash kernel's
  at these lengths) and, under bf16 autocast, no float32 cast of LoRA inputs (autocast casts them to
  bf16 anyway);
- under bf16 autocast on a CPU, the frozen linear weights held in bf16 for the pass
  (precision.bf16_weights), instead of autocast casting each of them at every call.

    compact_lm_head()                              context: TRL's fused head at the scored positions only
    cpu_kernels(model, device, bf16=None)          context: the CPU kernels above (bf16 None: ask autocast)
    lean_head_and_weights(model, cpu_bf16)         context: the head and the bf16 frozen weights (GRPO's passes)
    lean_training_step(model, device, cpu_bf16)    context: all three around one SFT training step
    trains_in_cpu_bf16(trainer)                    whether a Trainer's steps run under bf16 autocast on a CPU
"""

from __future__ import annotations

import contextlib
from typing import Any

from components.common.errors import BackendError


@contextlib.contextmanager
def cpu_kernels(model: Any, device: Any, bf16: bool | None = None):
    """On a CPU: attention in the math kernel and, where the pass computes under bf16 autocast (`bf16`;
    None: whether bf16 autocast is on now), no float32 cast of LoRA inputs. Elsewhere nothing changes."""
    import torch

    if getattr(device, "type", str(device)) != "cpu":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if bf16 is None:
        bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with contextlib.ExitStack() as stack:
        stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        if bf16:
            try:
                from peft.helpers import disable_input_dtype_casting
            except ImportError:  # an older peft: its layers cast, autocast casts back
                pass
            else:
                stack.enter_context(disable_input_dtype_casting(model))
        yield


@contextlib.contextmanager
def compact_lm_head():
    """Inside, TRL's fused LM head projects and scores only the positions with a label (the
    completions), as it does on CUDA, on any device. The same log-probs and gradients: the other
    positions are zeros either way. TRL reads the choice from `trl.trainer.utils._use_triton` at every
    call; a TRL without that name is refused (BackendError) rather than left to score every position."""
    import trl
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None:
        raise BackendError(
            f"trl {trl.__version__} has no trl.trainer.utils._use_triton, which grpo.lean_logps and "
            "sft.lean_passes patch to score only the completions: install trl within pyproject.toml's bounds "
            "(make venv), or set grpo.lean_logps=false and sft.lean_passes=false")
    trl_utils._use_triton = lambda device: True
    try:
        yield
    finally:
        trl_utils._use_triton = original


def trains_in_cpu_bf16(trainer: Any) -> bool:
    """Whether a transformers Trainer's steps run under bf16 autocast on a CPU."""
    return bool(trainer.args.bf16) and trainer.accelerator.device.type == "cpu"


@contextlib.contextmanager
def lean_head_and_weights(model: Any, cpu_bf16: bool):
    """TRL's fused LM head at the completions only and, where the pass trains under bf16 autocast on a
    CPU (`cpu_bf16`), the frozen linear weights held in bf16 (GRPO's passes with `grpo.lean_logps`)."""
    from components.training.precision import bf16_weights

    with contextlib.ExitStack() as stack:
        stack.enter_context(compact_lm_head())
        if cpu_bf16:
            stack.enter_context(bf16_weights(model, frozen_linear_only=True))
        yield


@contextlib.contextmanager
def lean_training_step(model: Any, device: Any, cpu_bf16: bool):
    """Around one training step (forward and backward) whose loss goes through TRL's fused LM head
    (SFTTrainer's): lean_head_and_weights, and on a CPU the math attention kernel and, with `cpu_bf16`, no
    float32 cast of LoRA inputs. The same loss and gradients to rounding."""
    with lean_head_and_weights(model, cpu_bf16), cpu_kernels(model, device, bf16=cpu_bf16):
        yield
