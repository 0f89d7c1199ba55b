"""`grpoflow run` with the overrides a user types first, on a copy of the session's baseline run
(tests/project_repo.py, grpoflow-policy v1 registered and champion): nested trainer keys land nested
in params.yaml, and the new version, trained on another `data.seed`, is gated like with like (the
champion re-evaluated on the new items before the paired test).

    pytest -q tests/slow/test_pipeline_overrides.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.project_repo import run_ok

pytestmark = pytest.mark.slow


def test_nested_overrides_and_a_new_data_seed_compared_like_with_like(baseline, tmp_path):
    import mlflow

    copy = baseline.copy(tmp_path / "copy")
    repo = copy.repo
    out = run_ok(repo, "run", "-S", "data.seed=99", "-S", "sft.trainer.max_steps=5", "-S", "grpo.trainer.max_steps=1",
                 env=copy.env())
    params = yaml.safe_load((repo / "params.yaml").read_text())
    assert params["sft"]["trainer"]["max_steps"] == 5 and params["grpo"]["trainer"]["max_steps"] == 1
    assert params["data"]["seed"] == 99
    assert "trainer.max_steps" not in (repo / "params.yaml").read_text()
    shown = subprocess.run([sys.executable, "-m", "pipelines.params.config"], cwd=repo, capture_output=True, text=True)
    assert shown.returncode == 0 and yaml.safe_load(shown.stdout)["sft"]["trainer"]["max_steps"] == 5

    assert "re-evaluating champion grpoflow-policy v1 on the challenger's 40 items" in out
    client = mlflow.MlflowClient(copy.tracking_uri)
    tags = client.get_model_version("grpoflow-policy", "2").tags
    test = [json.loads(line) for line in (repo / "data/processed/test.jsonl").read_text().splitlines()]
    assert tags["promotion.champion_reevaluated"] == "true"
    assert tags["promotion.test_sha256"] == tags["eval.test_sha256"]
    # the gate pairs the target band's items (evaluate.target_band: 3 steps) of the 40 re-evaluated
    assert len(test) == 40 and tags["promotion.target_band"] == "3"
    assert tags["promotion.n"] == str(sum(r["steps"] == 3 for r in test))
    assert "fewer than register.min_items 100" in tags["promotion.reason"]  # a few dozen items cannot promote
    v1 = client.get_model_version("grpoflow-policy", "1").tags
    assert v1["eval.test_sha256"] != tags["eval.test_sha256"]
    assert json.loads((repo / "reports/eval/grpo.json").read_text())["test_sha256"] == tags["eval.test_sha256"]
    assert str(client.get_model_version_by_alias("grpoflow-policy", "champion").version) == "1"
