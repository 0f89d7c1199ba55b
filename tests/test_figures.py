"""pipelines/flow/figures.py log_figures: the run's images on its MLflow run, drawn once per content. A rerun
with the same numbers logs the cached images (the same bytes, without importing matplotlib); new
numbers draw new images, and the cache keeps only what the last run used.

    pytest -q tests/test_figures.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pipelines.flow.figures import log_figures

METRICS = {"sft": {"accuracy_strict": 0.1, "accuracy_flexible": 0.2, "n": 40},
           "grpo": {"accuracy_strict": 0.3, "accuracy_flexible": 0.3, "n": 40}}
HISTORY = "step,reward,kl,loss\n1,0.1,0.0,0.5\n2,0.3,0.01,0.4\n"

# The second run, in a process of its own: which modules were imported is part of the answer.
RERUN = """
import json, sys
from pathlib import Path
import mlflow
from pipelines.flow.figures import log_figures
run = mlflow.MlflowClient().create_run("0")
print(json.dumps({"run": run.info.run_id, "logged": log_figures(mlflow.MlflowClient(), run.info.run_id,
      json.loads(sys.argv[1]), Path(sys.argv[2]), ["accuracy"], Path(sys.argv[3])),
      "matplotlib": "matplotlib" in sys.modules}))
"""


def _image(client, run_id: str, name: str, dest: Path) -> bytes:
    return Path(client.download_artifacts(run_id, f"figures/{name}", str(dest / run_id))).read_bytes()


def test_a_rerun_logs_the_cached_images_and_new_numbers_draw_new_ones(tmp_path):
    import mlflow

    client = mlflow.MlflowClient()
    history, cache = tmp_path / "grpo_history.csv", tmp_path / "cache"
    history.write_text(HISTORY)
    first = client.create_run("0").info.run_id
    assert log_figures(client, first, METRICS, history, ["accuracy"], cache) == [
        "figures/accuracy.png", "figures/grpo_training.png"]
    assert len(list(cache.iterdir())) == 2

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", RERUN, json.dumps(METRICS), str(history), str(cache)],
                          capture_output=True, text=True, env=env, check=True)
    second = json.loads(proc.stdout.strip().splitlines()[-1])
    assert second["logged"] == ["figures/accuracy.png", "figures/grpo_training.png"]
    assert second["matplotlib"] is False  # nothing was drawn
    for name in ("accuracy.png", "grpo_training.png"):
        image = _image(client, first, name, tmp_path)
        assert image[:4] == b"\x89PNG" and _image(client, second["run"], name, tmp_path) == image

    better = {**METRICS, "grpo": {**METRICS["grpo"], "accuracy_flexible": 0.5}}
    third = client.create_run("0").info.run_id
    log_figures(client, third, better, history, ["accuracy"], cache)
    assert _image(client, third, "accuracy.png", tmp_path) != _image(client, first, "accuracy.png", tmp_path)
    assert _image(client, third, "grpo_training.png", tmp_path) == _image(client, first, "grpo_training.png", tmp_path)
    assert len(list(cache.iterdir())) == 2  # the old accuracy image is gone: only the last run's are kept


def test_a_run_without_a_grpo_history_gets_the_accuracy_figure(tmp_path):
    import mlflow

    client = mlflow.MlflowClient()
    run = client.create_run("0").info.run_id
    assert log_figures(client, run, METRICS, None, ["accuracy"], tmp_path / "cache") == ["figures/accuracy.png"]
    assert _image(client, run, "accuracy.png", tmp_path)[:4] == b"\x89PNG"
