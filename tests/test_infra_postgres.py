"""Integration test against a real database: MLflow's tracking server on PostgreSQL.

Starts a PostgreSQL cluster from the installed Debian packages in a temporary folder on a free
port of 127.0.0.1 (as the `postgres` user when run as root), creates a role and a database,
starts `mlflow server --backend-store-uri postgresql://...` on 127.0.0.1 with proxied artifact
serving, runs grpoflow's registry and promotion steps through HTTP against it, and checks the
result through MLflow's REST API with plain HTTP GETs. Everything it starts is stopped and
removed at the end.

    make test-postgres          # installs PostgreSQL and psycopg when missing, then runs this file

It runs only when GRPOFLOW_TEST_POSTGRES=1 (the make target sets it); without that variable it is
skipped, so that `make test` does not start a database. With the variable set, a missing
PostgreSQL installation is a failure, not a skip.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.servers import free_port

pytestmark = pytest.mark.skipif(
    os.environ.get("GRPOFLOW_TEST_POSTGRES") != "1",
    reason="Postgres integration test: run `make test-postgres` (sets GRPOFLOW_TEST_POSTGRES=1)",
)

STARTUP_TIMEOUT_S = 180  # MLflow creates its schema (alembic migrations) on first start


# --------------------------------------------------------------------------- helpers


def pg_bindir() -> Path:
    """The newest installed PostgreSQL server's bin folder (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    pytest.fail(
        "PostgreSQL is not installed (no initdb): run infra/install-postgres.sh or `make test-postgres`"
    )


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"(no log at {path})"


def http_get_json(base: str, path: str, **query: str) -> dict:
    """GET base+path?query and decode the JSON answer (urllib only: no MLflow client involved)."""
    url = f"{base}{path}?{urllib.parse.urlencode(query)}" if query else f"{base}{path}"
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"GET {url} -> HTTP {e.code}: {e.read()[:500]!r}") from e


class PostgresCluster:
    """A throw-away PostgreSQL cluster: initdb into a temp folder, listen on 127.0.0.1:port only."""

    def __init__(self) -> None:
        self.bindir = pg_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="grpoflow-pg-"))
        self.data = self.root / "data"
        self.sock = self.root / "sock"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        self.superpass = secrets.token_hex(16)
        # initdb and postgres refuse to run as root: run them as Debian's `postgres` user then.
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                pytest.fail(
                    "running as root but there is no `postgres` user: install Debian's postgresql package"
                )
            self.as_user = ["runuser", "-u", "postgres", "--"]
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self.sock.mkdir()
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.superpass + "\n")
        if self.as_user:
            for p in (self.sock, pwfile):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--pwfile",
                str(pwfile),
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
                "--no-locale",
            ],
        )
        pwfile.unlink()
        self._run(
            [
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-w",
                "-t",
                "60",
                "-o",
                f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.sock}",
                "start",
            ],
        )
        self.running = True

    def _run(self, cmd: list[str]) -> None:
        proc = subprocess.run(self.as_user + cmd, capture_output=True, text=True, cwd=self.root)
        if proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{tail(self.log)}"
            )

    def create_database(self, name: str, owner: str, password: str) -> str:
        """Create a login role and a database it owns; return its SQLAlchemy URL."""
        # psycopg 3: SQLAlchemy 2.1's default driver for postgresql:// URLs, so MLflow uses it too.
        import psycopg
        from psycopg import sql

        with psycopg.connect(
            **self.dsn("postgres"), autocommit=True
        ) as conn:  # CREATE DATABASE: no transaction
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(owner), sql.Literal(password)
                )
            )
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(owner))
            )
        return f"postgresql://{owner}:{password}@127.0.0.1:{self.port}/{name}"

    def dsn(self, dbname: str) -> dict:
        """Superuser connection arguments for psycopg.connect."""
        return dict(host="127.0.0.1", port=self.port, user="postgres", password=self.superpass, dbname=dbname)

    def stop(self) -> None:
        if self.running:
            subprocess.run(
                self.as_user
                + [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
                capture_output=True,
                cwd=self.root,
            )
            self.running = False
        shutil.rmtree(self.root, ignore_errors=True)


class MlflowServer:
    """`mlflow server` on 127.0.0.1:port with the given backend store, artifacts proxied to a folder."""

    def __init__(self, backend_uri: str, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.artifacts = workdir / "artifacts"
        self.log = workdir / "mlflow-server.log"
        cmd = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            backend_uri,
            "--serve-artifacts",
            "--artifacts-destination",
            str(self.artifacts),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING")}
        with open(self.log, "wb") as log:
            # A session of its own, so that stop() reaches the server's worker processes too.
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env, start_new_session=True
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"mlflow server exited with {self.proc.returncode}:\n{tail(self.log)}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(
                    f"mlflow server not healthy after {STARTUP_TIMEOUT_S}s:\n{tail(self.log)}"
                )
            time.sleep(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def postgres():
    cluster = PostgresCluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def mlflow_server(postgres, tmp_path_factory):
    uri = postgres.create_database("mlflow", "mlflow", secrets.token_hex(12))
    server = MlflowServer(uri, tmp_path_factory.mktemp("mlflow-server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tracking(mlflow_server, monkeypatch):
    """Point MLflow clients (and grpoflow's tracking, where MLFLOW_TRACKING_URI wins) at the server."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    mlflow.set_tracking_uri(mlflow_server.url)
    yield mlflow_server
    mlflow.set_tracking_uri(None)


# --------------------------------------------------------------------------- tests


def test_server_stores_runs_and_models_in_postgres(tracking, postgres, tmp_path):
    """Smoke test of the stack itself: a run, a proxied artifact, a model version and an alias made
    through the MLflow client over HTTP are visible through the REST API and sit in PostgreSQL."""
    import mlflow
    import psycopg
    from mlflow import MlflowClient

    client = MlflowClient(tracking.url)
    exp_id = client.create_experiment("infra-smoke")
    (tmp_path / "note.txt").write_text("hello postgres\n")
    with mlflow.start_run(experiment_id=exp_id, run_name="smoke") as run:
        mlflow.log_param("backend", "postgresql")
        mlflow.log_metric("accuracy", 0.5, step=1)
        mlflow.log_artifact(str(tmp_path / "note.txt"), artifact_path="notes")
    client.create_registered_model("infra-smoke-model")
    mv = client.create_model_version("infra-smoke-model", f"runs:/{run.info.run_id}/notes", run.info.run_id)
    client.set_registered_model_alias("infra-smoke-model", "champion", mv.version)

    # The artifact went through the server's proxy (mlflow-artifacts:/) into its destination folder.
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/"), run.info.artifact_uri
    stored = list(tracking.artifacts.rglob("note.txt"))
    assert [p.read_text() for p in stored] == ["hello postgres\n"]

    got = http_get_json(tracking.url, "/api/2.0/mlflow/runs/get", run_id=run.info.run_id)["run"]
    assert got["data"]["params"] == [{"key": "backend", "value": "postgresql"}]
    assert got["data"]["metrics"][0]["key"] == "accuracy" and got["data"]["metrics"][0]["value"] == 0.5
    alias = http_get_json(
        tracking.url, "/api/2.0/mlflow/registered-models/alias", name="infra-smoke-model", alias="champion"
    )["model_version"]
    assert alias["version"] == mv.version and alias["run_id"] == run.info.run_id

    # ...and the rows are in PostgreSQL, not in some local file store.
    with psycopg.connect(**postgres.dsn("mlflow")) as conn, conn.cursor() as cur:
        cur.execute("SELECT name FROM registered_models")
        assert ("infra-smoke-model",) in cur.fetchall()
        cur.execute(
            "SELECT alias, version FROM registered_model_aliases WHERE name = %s", ("infra-smoke-model",)
        )
        assert cur.fetchall() == [("champion", int(mv.version))]
        cur.execute("SELECT value FROM params WHERE run_uuid = %s AND key = 'backend'", (run.info.run_id,))
        assert cur.fetchall() == [("postgresql",)]


# --------------------------------------------------------------------------- the pipeline's registry steps


def make_tiny_model(out: Path) -> Path:
    """A real, loadable 1-layer Qwen2 model with a character-level tokenizer (~50 KB)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {
        t: i
        for i, t in enumerate(["<pad>", "<eos>", "<unk>", " ", *"0123456789abcdefghijklmnopqrstuvwxyz?+=<>/"])
    }
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    cfg = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        eos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    fast.save_pretrained(out)
    return out


def write_outputs(root: Path, correct: list[bool], lock_text: str) -> None:
    """What the stages leave for registration: eval reports (per-item results) and dvc.lock."""
    ev = root / "reports" / "eval"
    ev.mkdir(parents=True, exist_ok=True)
    with open(ev / "grpo.items.jsonl", "w") as fh:
        for i, c in enumerate(correct):
            fh.write(json.dumps({"id": f"q{i}", "completion": "x", "extracted": "1", "correct": c}) + "\n")
    evaluated_on = {"test_sha256": "e" * 64, "protocol": "grpoflow", "max_new_tokens": 256}
    (ev / "grpo.json").write_text(
        json.dumps({"accuracy_strict": sum(correct) / len(correct), "n": len(correct), **evaluated_on})
    )
    (ev / "sft.json").write_text(json.dumps({"accuracy_strict": 0.1, "n": len(correct)}))
    (root / "dvc.lock").write_text(lock_text)


def pipeline_register_and_promote(params, root: Path) -> tuple[dict, dict]:
    """The training flow's tail, step by step: parent run → lineage → register → promote."""
    from pipelines.flow.lineage import parent_run
    from pipelines.flow.pipeline import promote_model, record_lineage, register_model

    with parent_run(params, root) as run:
        lineage = record_lineage.fn(run, [], params)
        registration = register_model.fn(params, lineage, "pushed 0 file(s)", run)
        decision = promote_model.fn(params, registration, run)
    return registration, decision


def test_pipeline_registry_and_promotion_over_http(tracking, postgres, tmp_path, monkeypatch):
    """Registration and the promotion gate of the pipeline against the Postgres-backed server, the
    outcome read back through MLflow's REST API: first version champion, a no-better challenger
    rejected with the reason tagged, a better one promoted, then a forced promotion and a rollback
    through the CLI; the champion loads back over HTTP."""
    import mlflow
    import psycopg

    from pipelines.cli import main as grpoflow
    from pipelines.params.config import load_params

    root = tmp_path / "repo"
    make_tiny_model(root / "models" / "grpo")
    (root / ".dvc").mkdir()
    monkeypatch.chdir(root)
    params = load_params()
    name = params.register.model_name
    base = [i < 40 for i in range(200)]

    write_outputs(root, base, "schema: '2.0'\nstages: {}\n# run 1\n")
    reg1, dec1 = pipeline_register_and_promote(params, root)
    assert (reg1.version, reg1.created, dec1.decision) == ("1", True, "promoted")

    write_outputs(root, [40 <= i < 80 for i in range(200)], "schema: '2.0'\nstages: {}\n# run 2\n")
    reg2, dec2 = pipeline_register_and_promote(params, root)
    assert (reg2.version, dec2.decision) == ("2", "rejected")

    write_outputs(root, [i < 80 for i in range(200)], "schema: '2.0'\nstages: {}\n# run 3\n")
    reg3, dec3 = pipeline_register_and_promote(params, root)
    assert (reg3.version, dec3.decision) == ("3", "promoted")

    # Same dvc.lock again: no new version (the idempotency key is looked up on the server).
    reg3b, _ = pipeline_register_and_promote(params, root)
    assert (reg3b.version, reg3b.created) == ("3", False)

    # The registry state, read with plain HTTP GETs.
    url = tracking.url
    model = http_get_json(url, "/api/2.0/mlflow/registered-models/get", name=name)["registered_model"]
    aliases = {a["alias"]: a["version"] for a in model.get("aliases", [])}
    assert aliases == {"champion": "3", "challenger": "3"}
    versions = {
        v["version"]: v
        for v in http_get_json(url, "/api/2.0/mlflow/model-versions/search", filter=f"name = '{name}'")[
            "model_versions"
        ]
    }
    assert sorted(versions) == ["1", "2", "3"]
    tags = {v: {t["key"]: t["value"] for t in versions[v].get("tags", [])} for v in versions}
    assert (
        tags["1"]["promotion.decision"] == "promoted" and "no champion yet" in tags["1"]["promotion.reason"]
    )
    assert (
        tags["2"]["promotion.decision"] == "rejected" and "champion v1 kept" in tags["2"]["promotion.reason"]
    )
    assert tags["3"]["promotion.decision"] == "promoted" and tags["3"]["promotion.previous_champion"] == "1"
    assert float(tags["3"]["promotion.p_value"]) < params.register.alpha
    assert len({tags[v]["lineage.dvc_lock_md5"] for v in tags}) == 3
    assert tags["3"]["metric.grpo.accuracy_strict"] == "0.4000"
    mv3 = http_get_json(url, "/api/2.0/mlflow/model-versions/get", name=name, version="3")["model_version"]
    assert "| grpo | 0.4000 | 200 |" in mv3["description"]

    # Forced promotion and rollback through the CLI, against the same server.
    assert grpoflow(["promote", name, "2", "--reason", "postgres integration test"]) == 0
    champion = http_get_json(url, "/api/2.0/mlflow/registered-models/alias", name=name, alias="champion")
    assert champion["model_version"]["version"] == "2"
    assert grpoflow(["rollback", name]) == 0
    champion = http_get_json(url, "/api/2.0/mlflow/registered-models/alias", name=name, alias="champion")
    assert champion["model_version"]["version"] == "3"

    # The model files went through the server's artifact proxy into its destination, and the
    # champion loads back over HTTP with the transformers flavour.
    assert list(tracking.artifacts.rglob("model.safetensors")), "no model weights in the artifact store"
    components = mlflow.transformers.load_model(f"models:/{name}@champion", return_type="components")
    out = components["model"].generate(
        **components["tokenizer"]("1+1=", return_tensors="pt"), max_new_tokens=3
    )
    assert out.shape[1] > 4

    # ...and the registry rows live in PostgreSQL.
    with psycopg.connect(**postgres.dsn("mlflow")) as conn:
        rows = conn.execute(
            "SELECT alias, version FROM registered_model_aliases WHERE name = %s ORDER BY alias", (name,)
        ).fetchall()
    assert rows == [("challenger", 3), ("champion", 3)]
