"""infra/compose.yaml runs MLflow with its basic-auth app: here the same app and settings file
(infra/mlflow-auth.ini) on a real `mlflow server` turn anonymous clients away, while grpoflow's
registry and promotion work for a client with the credentials compose gives the worker."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.servers import mlflow_server, served

REPO = Path(__file__).resolve().parents[1]
ADMIN, PASSWORD = "admin", "test-password-1234"


@pytest.fixture
def mlflow_with_auth(tmp_path):
    ini = (REPO / "infra" / "mlflow-auth.ini").read_text()
    assert "database_uri = sqlite:////home/mlflow/auth/basic_auth.db" in ini  # compose's volume
    (tmp_path / "auth.ini").write_text(ini.replace("/home/mlflow/auth", str(tmp_path)))
    env = {
        "PATH": str(Path(sys.executable).parent),
        "HOME": str(tmp_path),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "auth.ini"),
        "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN,
        "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-secret-key",
    }
    def cmd(port: int) -> list[str]:
        return mlflow_server(port, tmp_path, "--app-name", "basic-auth")

    with served(cmd, "/health", tmp_path / "mlflow.log", env=env, timeout=180) as server:
        yield server.url


def test_anonymous_clients_are_turned_away_and_the_pipeline_logs_in(mlflow_with_auth, tmp_path, monkeypatch):
    uri = mlflow_with_auth
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1", timeout=10)
    assert denied.value.code == 401

    from components.common.tracking import check_reachable

    check_reachable(uri)  # the health check stays open: grpoflow's preflight passes

    # The worker's credentials (compose: MLFLOW_TRACKING_USERNAME/PASSWORD from infra/.env).
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    import shutil

    import mlflow

    from components.common.tracking import configure
    from pipelines.params.config import load_params
    from pipelines.registry.promotion import gate
    from pipelines.registry.register import register
    from tests.toy_repo import make_tiny_model

    make_tiny_model(tmp_path / "repo" / "models" / "grpo")
    ev = tmp_path / "repo" / "reports" / "eval"
    ev.mkdir(parents=True)
    ev.joinpath("grpo.items.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "correct": i < 30}) + "\n"
                                                       for i in range(100)))
    ev.joinpath("grpo.json").write_text(json.dumps({"accuracy_strict": 0.3, "n": 100, "test_sha256": "d" * 64,
                                                    "protocol": "grpoflow", "max_new_tokens": 256}))
    monkeypatch.chdir(tmp_path / "repo")
    (tmp_path / "repo" / ".dvc").mkdir()
    params = load_params()
    run_id = mlflow.MlflowClient().create_run(configure(params)).info.run_id
    registration = register(params, {"lineage.dvc_lock_md5": "c" * 32}, run_id, tmp_path / "repo")
    assert gate(params, registration, tmp_path / "repo").decision == "promoted"
    shutil.rmtree(tmp_path / "repo" / "models")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    with pytest.raises(Exception, match="401|Unauthorized|credentials"):
        mlflow.MlflowClient().get_model_version_by_alias("grpoflow-policy", "champion")


def test_grpoflow_ui_on_the_network_runs_the_basic_auth_app(tmp_path):
    """`grpoflow ui --host 0.0.0.0 --app-name basic-auth`: anonymous requests get 401, the admin's get through."""
    import base64

    ini = (REPO / "infra" / "mlflow-auth.ini").read_text().replace("/home/mlflow/auth", str(tmp_path))
    (tmp_path / "auth.ini").write_text(ini)
    (tmp_path / "params.yaml").write_text("")
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path), "MLFLOW_DISABLE_TELEMETRY": "true",
           "PYTHONPATH": str(REPO), "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "auth.ini"),
           "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN, "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-secret-key"}

    def cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "pipelines.cli", "ui", "--host", "0.0.0.0", "--port", str(port), "--app-name",
                "basic-auth", "-S", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]

    with served(cmd, "/health", tmp_path / "ui.log", env=env, cwd=tmp_path, timeout=180) as server:
        search = f"{server.url}/api/2.0/mlflow/experiments/search?max_results=1"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(search, timeout=10)
        assert denied.value.code == 401
        login = base64.b64encode(f"{ADMIN}:{PASSWORD}".encode()).decode()
        request = urllib.request.Request(search, headers={"Authorization": f"Basic {login}"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200
