"""benchmarks/gpu_check.py --cpu: the GPU check's path (the SFT, GRPO and evaluate stages' own code
on a model built from a config, with the qwen2.5-0.5b-gpu preset's settings) runs on a CPU in under
a minute, so that it cannot rot between the sessions that have a GPU: every phase finishes and
reports its figures, finite and positive; a failing phase is recorded and the next one runs; the
time budget stops the check with the report written.

    pytest -q tests/test_gpu_check.py
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
PRESET = "qwen2.5-0.5b-gpu"
FIGURES = {  # per phase: the figures the issue asks for, each > 0
    "sft": ("step_seconds", "tokens_per_step", "tokens_per_second", "model_tflops_per_second", "mfu",
            "peak_memory_gib"),
    "grpo": ("step_seconds", "completions_per_step", "completions_per_second", "completion_tokens_per_second",
             "generation_tokens_per_second", "peak_memory_gib"),
    "evaluate": ("completions", "completion_tokens", "tokens_per_second", "completions_per_second", "peak_memory_gib"),
}
STEP_PARTS = {"generation", "reference_forward", "policy_forward_backward", "optimizer", "other"}


def check(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--out", str(out), *args], cwd=out,
                          capture_output=True, text=True, timeout=600)


def numbers(value, path: str = ""):
    """(path, number) of every number in a JSON value, booleans aside."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from numbers(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from numbers(v, f"{path}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, value


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    proc = check(out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "gpu_check.json").read_text()), proc


def test_every_phase_runs_the_stages_code_and_reports_its_figures(run):
    out, report, proc = run
    assert json.loads(proc.stdout) == report  # printed as written
    assert report["status"] == "ok" and report["check"] == "cpu" and report["data"]["status"] == "ok"
    assert {"torch", "transformers", "trl", "peft", "accelerate", "datasets"} <= set(report["versions"])
    preset = report["presets"][PRESET]
    assert [preset[p]["status"] for p in ("model", "sft", "grpo", "evaluate")] == ["ok"] * 4
    for phase, keys in FIGURES.items():
        assert {k: preset[phase].get(k, 0) > 0 for k in keys} == dict.fromkeys(keys, True), phase
    grpo = preset["grpo"]
    assert set(grpo["parts"]) == STEP_PARTS
    assert sum(grpo["parts"].values()) == pytest.approx(grpo["step_seconds"], rel=0.01)
    assert min(grpo["parts"][p] for p in ("generation", "reference_forward", "policy_forward_backward")) > 0
    assert 0 < preset["sft"]["mfu"] < 1
    # the preset's settings, vLLM rollouts aside; the evaluation's backend and protocol
    assert preset["sft"]["settings"]["lora"] and preset["sft"]["settings"]["gradient_checkpointing"]
    assert grpo["settings"]["lora"] and grpo["settings"]["gradient_checkpointing"] and not grpo["settings"]["use_vllm"]
    assert preset["evaluate"]["settings"]["backend"] == "transformers"
    assert preset["evaluate"]["settings"]["protocol"] == "lm-eval-gsm8k"
    # a model whose vocabulary is wider than what its tokenizer was trained on (as a real model's)
    assert preset["model"]["tokenizer_trained_tokens"] < preset["architecture"]["vocab_size"]
    bad = [(path, value) for path, value in numbers(report) if not math.isfinite(value) or value < 0]
    assert bad == []
    log = (out / "gpu_check.log").read_text()
    assert all(f"phase {p}: ok" in log for p in ("data", "model", "sft", "grpo", "evaluate"))


def test_a_failing_phase_is_recorded_and_the_next_one_runs(tmp_path):
    from benchmarks.phase_report import Check

    def broken():
        raise ValueError("no such model\nsecond line")

    report: dict = {"presets": {}}
    where = report["presets"]["x"] = {}
    check = Check(tmp_path, 60, report, 0.0)
    assert not check.phase(where, "model", broken)
    assert not check.phase(where, "sft", lambda: {"tokens_per_second": 1.0}, needs="model")
    assert check.phase(where, "evaluate", lambda n: {"completions": n}, 3)
    written = json.loads((tmp_path / "gpu_check.json").read_text())["presets"]["x"]
    assert written["model"]["status"] == "failed" and written["model"]["error"] == "ValueError: no such model"
    assert written["sft"] == {"status": "skipped", "note": "needs the model phase, which did not finish"}
    assert written["evaluate"]["status"] == "ok" and written["evaluate"]["completions"] == 3


def test_a_budget_alarm_lost_inside_a_finalizer_still_stops_the_phases_after_it(tmp_path):
    """Python ignores an exception raised in a __del__ (the CI run's `regex` Group.__del__ got the
    alarm): the phase runs to its end, and the next phase is skipped all the same."""
    import gc

    from benchmarks.phase_report import Check

    report: dict = {"presets": {}}
    where = report["presets"]["x"] = {}
    check = Check(tmp_path, 1, report, 0.0)

    class Finalized:
        def __del__(self):
            check.alarm(14, None)  # SIGALRM's handler, called where its exception is lost

    def alarm_in_a_finalizer():
        Finalized()
        gc.collect()
        return {"tokens_per_second": 1.0}

    assert check.phase(where, "sft", alarm_in_a_finalizer)
    assert not check.phase(where, "grpo", lambda: {"completions": 1})
    assert where["sft"]["note"].startswith("finished after the time budget")
    assert where["grpo"]["status"] == "skipped" and check.out_of_time


def test_the_time_budget_stops_the_check_with_its_report_written(tmp_path):
    proc = check(tmp_path, "--budget", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == "stopped at the time budget"
    phases = [report["data"], *(v for v in report["presets"].get(PRESET, {}).values() if "status" in v)]
    assert {p["status"] for p in phases} <= {"ok", "stopped", "skipped"}
    assert any(p["status"] in ("stopped", "skipped") for p in phases)
