"""Whether this machine computes in bfloat16 natively: the training stages' precision on a CPU.

A CPU with native bf16 instructions (x86: AVX512_BF16 or AMX-BF16; Arm: the BF16 extension)
multiplies bf16 matrices faster than float32, so training autocasts to bf16 there; a CPU without
them emulates bf16, often hundreds of times slower than float32 (benchmarks/RESULTS.md has the
measurement), so training stays in float32. Detected from the CPU's feature flags, not assumed;
benchmarks/grpo_step.py measures both rates.

    native_bf16()                 True where the training stages autocast to bf16 on a CPU
    cpu_flags(cpuinfo_text)       the feature flags of /proc/cpuinfo's text
    bf16_weights(model)           context: the model's float32 parameters held in bf16 (GRPO's
                                  rollouts), the exact float32 tensors put back on exit
    bf16_weights(model, frozen_linear_only=True)
                                  the same for the frozen weights of linear layers only (GRPO's
                                  log-prob and loss passes under bf16 autocast: what autocast
                                  computes, without casting every frozen weight at every call)
"""

from __future__ import annotations

import platform
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

X86_BF16 = ("avx512_bf16", "amx_bf16")
ARM_BF16 = ("bf16",)


def cpu_flags(cpuinfo: str) -> set[str]:
    """Feature flags named on the `flags` (x86) or `Features` (Arm) lines of /proc/cpuinfo.

    >>> sorted(cpu_flags("processor : 0\\nflags : fpu avx2 avx512_bf16\\n"))
    ['avx2', 'avx512_bf16', 'fpu']
    >>> sorted(cpu_flags("Features : fp asimd bf16 i8mm\\n"))
    ['asimd', 'bf16', 'fp', 'i8mm']
    """
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


@cache
def native_bf16() -> bool:
    """Whether this CPU has native bf16 matrix instructions (Linux: /proc/cpuinfo; macOS: sysctl)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        flags = cpu_flags(cpuinfo.read_text(errors="replace"))
        return any(f in flags for f in (*X86_BF16, *ARM_BF16))
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=5
            )
            return out.stdout.strip() == "1"
        except OSError:
            return False
    return False


class bf16_weights:  # noqa: N801 (a context manager used as `with bf16_weights(model):`)
    """Inside the block, the model's float32 parameters are bf16 copies; on exit every parameter gets
    its own float32 tensor back (the same object, so bit-identical, and the optimizer's references
    hold). What GRPO's CPU rollouts decode with where training autocasts to bf16: autocast alone
    re-casts a frozen weight at every decode step (its cast cache keeps only weights that require
    grad), which made SmolLM2's rollouts slower than float32 (benchmarks/RESULTS.md). Costs the bf16
    copy, half the float32 weights, while inside.

    With `frozen_linear_only`, only the weights of linear layers that do not require grad (a LoRA
    run's base, the KL reference's adapter) and are not shared with an embedding (a tied LM head):
    exactly the bf16 operands autocast would make of them at every call, so the log-prob and loss
    passes under bf16 autocast compute the same numbers without re-casting them (the trainable
    weights, embeddings and norms stay float32). Only inside bf16 autocast: outside it a bf16
    weight meets float32 inputs."""

    def __init__(self, model: Any, frozen_linear_only: bool = False):
        self.model = model
        self.frozen_linear_only = frozen_linear_only
        self.saved: list[tuple[Any, Any]] = []

    def _params(self) -> list[Any]:
        import torch

        if not self.frozen_linear_only:
            return list(self.model.parameters())
        embeddings = {id(m.weight) for m in self.model.modules() if isinstance(m, torch.nn.Embedding)}
        return [m.weight for m in self.model.modules() if isinstance(m, torch.nn.Linear)
                and not m.weight.requires_grad and id(m.weight) not in embeddings]

    def __enter__(self) -> Any:
        import torch

        with torch.no_grad():
            for param in self._params():
                if param.dtype == torch.float32:
                    self.saved.append((param, param.data))
                    param.data = param.data.to(torch.bfloat16)
        return self.model

    def __exit__(self, *exc: Any) -> None:
        for param, data in self.saved:
            param.data = data
        self.saved.clear()
