"""The MLflow tracking server killed between a run's registration and its promotion gate (a real
`mlflow server` on a copy of the session's baseline store, tests/project_repo.py; a proxy in front of it
kills it with SIGKILL the moment it has answered the new version's `challenger` alias, and stops
listening, as a dead server's port does):

- the run ends within 45 s of the kill (MLflow's own retry policy took 249 s), exit 1, with one `error:`
  line naming the server's URL and the command that starts one, and no traceback;
- with the server started again on its port, the next run registers nothing new, gates that version
  (its decision recorded) and leaves no MLflow run RUNNING.

    pytest -q tests/slow/test_pipeline_tracking_lost.py
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import signal
import threading
import time

import pytest

from tests.project_repo import REPO, grpoflow, run_ok
from tests.servers import answers, mlflow_server, served

pytestmark = pytest.mark.slow

OVERRIDE = ["-S", "evaluate.num_samples=3"]  # re-runs evaluate only: a new dvc.lock, so a new version


class KillingProxy(http.server.ThreadingHTTPServer):
    """Forwards each HTTP request to the MLflow server on `backend_port`; once it has answered the
    request `trips(method, path, body)` picks, kills the server's process group and stops listening."""

    daemon_threads = True

    def __init__(self, backend_port: int, trips, server_pid: int):
        super().__init__(("127.0.0.1", 0), _Forward)
        self.backend_port, self.trips, self.server_pid = backend_port, trips, server_pid
        self.killed_at: float | None = None
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def kill_server(self) -> None:
        os.killpg(self.server_pid, signal.SIGKILL)
        self.killed_at = time.monotonic()
        threading.Thread(target=lambda: (self.shutdown(), self.server_close()), daemon=True).start()


class _Forward(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as MLflow's client expects

    def forward(self) -> None:
        proxy: KillingProxy = self.server  # type: ignore[assignment]
        assert "chunked" not in self.headers.get("Transfer-Encoding", ""), "chunked bodies are not forwarded"
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if proxy.killed_at is not None:  # the server is gone: so is this connection
            self.close_connection = True
            return
        conn = http.client.HTTPConnection("127.0.0.1", proxy.backend_port, timeout=120)
        try:
            conn.request(self.command, self.path, body=body, headers={
                k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")})
            resp = conn.getresponse()
            data = resp.read()
        except OSError:
            self.close_connection = True
            return
        finally:
            conn.close()
        self.send_response_only(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        if proxy.trips(self.command, self.path, body):
            proxy.kill_server()

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = forward

    def log_message(self, *args) -> None:
        pass


def challenger_alias(method: str, path: str, body: bytes) -> bool:
    """Registration's last write: the new version's `challenger` alias (the gate comes next)."""
    if method != "POST" or not path.endswith("/registered-models/alias"):
        return False
    request = json.loads(body or b"{}")
    return request.get("name") == "grpoflow-policy" and request.get("alias") == "challenger"


def test_a_gate_whose_server_was_killed_fails_in_one_line_and_the_rerun_completes_it(baseline, tmp_path):
    copy = baseline.copy(tmp_path / "copy")
    repo = copy.repo
    import mlflow

    with served(lambda port: mlflow_server(port, repo), "/health", tmp_path / "mlflow.log", timeout=180) as server:
        proxy = KillingProxy(server.port, challenger_alias, server.proc.pid)
        uri = proxy.url
        # PYTHONPATH: this checkout's pipelines/ (the copy holds components/ only; the venv's editable
        # install may be another checkout's).
        env = copy.env(MLFLOW_TRACKING_URI=uri, PYTHONPATH=str(REPO))
        log = tmp_path / "lost.log"
        run = grpoflow(repo, "run", *OVERRIDE, log=log, env=env)
        try:
            rc = run.wait(timeout=1800)
        finally:
            if run.poll() is None:
                run.kill()
        out = log.read_text()
        assert proxy.killed_at is not None, f"no registration reached the server:\n{out[-3000:]}"
        seconds = time.monotonic() - proxy.killed_at  # an upper bound: wait() returned before this line
    assert rc == 1, out[-3000:]
    assert seconds <= 45, f"{seconds:.0f} s from the kill to the exit:\n{out[-3000:]}"
    assert "Traceback" not in out, out[-5000:]
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out[-3000:]
    assert f"the MLflow tracking server at {uri} stopped answering" in errors[0]
    assert "mlflow server --port PORT" in errors[0], errors[0]
    print(f"gate with its server killed: exit {rc} {seconds:.1f} s after the kill")

    port = int(uri.rsplit(":", 1)[1])
    with served(lambda _: mlflow_server(port, repo), "/health", tmp_path / "mlflow-again.log", timeout=180,
                ready=lambda s: answers(f"{uri}/health")):
        out = run_ok(repo, "run", *OVERRIDE, env=env)
        client = mlflow.MlflowClient(tracking_uri=uri)
        versions = client.search_model_versions("name = 'grpoflow-policy'")
        running = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                     "attributes.status = 'RUNNING'")
    assert sorted(int(v.version) for v in versions) == [1, 2], out[-3000:]  # nothing registered again
    v2 = next(v for v in versions if v.version == "2")
    assert v2.tags.get("promotion.decision"), (v2.tags, out[-3000:])
    assert running == [], [(r.info.run_name, r.info.run_id) for r in running]
    assert "grpoflow-policy v2" in out


def test_the_proxy_kills_only_on_the_challenger_alias():
    assert challenger_alias("POST", "/api/2.0/mlflow/registered-models/alias",
                            b'{"name": "grpoflow-policy", "alias": "challenger", "version": "2"}')
    assert not challenger_alias("POST", "/api/2.0/mlflow/registered-models/alias",
                                b'{"name": "grpoflow-policy", "alias": "champion", "version": "2"}')
    assert not challenger_alias("GET", "/api/2.0/mlflow/registered-models/alias", b"")
