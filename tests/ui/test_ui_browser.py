"""The MLflow UI in a real browser: two pipeline runs side by side in the compare view, and
the registered model with its `champion` alias. Screenshots go to test-artifacts/ui/.

Needs Debian's `chromium` (`apt-get install -y chromium`); run it with `make test-ui`
(which sets GRPOFLOW_UI_TEST=1); plain `pytest tests` skips it.

    GRPOFLOW_UI_TEST=1 pytest -q tests/ui/test_ui_browser.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.servers import served
from tests.toy_repo import make_tiny_model, make_toy_repo, write_toy_params

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ui"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("GRPOFLOW_UI_TEST") != "1", reason="browser test: run `make test-ui`"),
]


def browser(url: str, *args: str) -> subprocess.CompletedProcess:
    assert CHROMIUM, "chromium not found: apt-get install -y chromium"
    cmd = [
        CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--hide-scrollbars", "--window-size=1600,2000", "--virtual-time-budget=25000", *args, url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def render(url: str, png: Path) -> str:
    """Screenshot `url` into `png` and return the DOM after the page's scripts ran."""
    shot = browser(url, f"--screenshot={png}")
    assert png.is_file() and png.stat().st_size > 20_000, shot.stderr[-2000:]
    return browser(url, "--dump-dom").stdout


@pytest.fixture
def ui(tmp_path):
    """`grpoflow ui` on a free port, serving this test's MLflow store."""
    def cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "pipelines.cli", "ui", "--port", str(port)]

    with served(cmd, "/health", tmp_path / "ui.log", cwd=REPO) as server:
        yield server.url


def test_compare_view_and_champion_alias_in_a_browser(tmp_path, ui, monkeypatch):
    import mlflow

    from pipelines.flow.pipeline import training_pipeline

    toy = make_toy_repo(tmp_path / "repo", make_tiny_model(tmp_path / "model"))
    monkeypatch.chdir(toy)
    first = training_pipeline()
    write_toy_params(toy, skill=60)  # a clearly better policy: the gate promotes it
    second = training_pipeline()
    assert second.decision.decision == "promoted", second.decision
    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias("grpoflow-policy", "champion").version) == "2"

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    runs = [first.run_id, second.run_id]
    query = urllib.parse.urlencode(
        {"runs": json.dumps(runs), "experiments": json.dumps([second.experiment_id])}, quote_via=urllib.parse.quote
    )
    dom = render(f"{ui}/#/compare-runs?{query}", ARTIFACTS / "compare-runs.png")
    assert "Comparing 2 Runs" in dom
    assert all(r in dom for r in runs)
    assert "grpo/accuracy_strict" in dom and "register.alpha" in dom  # metrics and params side by side

    dom = render(f"{ui}/#/models/grpoflow-policy", ARTIFACTS / "registered-model.png")
    assert "Version 2" in dom and "Version 1" in dom
    assert "champion" in dom and "challenger" in dom

    dom = render(f"{ui}/#/models/grpoflow-policy/versions/2", ARTIFACTS / "champion-version.png")
    assert "champion" in dom and "promotion.reason" in dom
