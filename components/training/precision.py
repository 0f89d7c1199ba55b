"""Whether this machine computes in bfloat16 natively: the training stages' precision on a CPU.

A CPU with native bf16 instructions (x86: AVX512_BF16 or AMX-BF16; Arm: the BF16 extension)
multiplies bf16 matrices faster than float32, so training autocasts to bf16 there; a CPU without
them emulates bf16, often hundreds of times slower than float32 (benchmarks/RESULTS.md has the
measurement), so training stays in float32. Detected from the CPU's feature flags, not assumed;
benchmarks/grpo_step.py measures both rates.

    native_bf16()                 True where the training stages autocast to bf16 on a CPU
    cpu_flags(cpuinfo_text)       the feature flags of /proc/cpuinfo's text
"""

from __future__ import annotations

import platform
import subprocess
from functools import cache
from pathlib import Path

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
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=5)
            return out.stdout.strip() == "1"
        except OSError:
            return False
    return False
