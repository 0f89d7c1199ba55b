"""pipelines/runtime.TemporaryServer, the temporary Prefect server `grpoflow run` starts before Prefect is
imported: it serves flows as Prefect's own would, stops with the process, and steps aside when a
Prefect profile names a server (`prefect config set PREFECT_API_URL=...`), which is then the one used.
(tests/test_pipeline_smoke.py checks it on a real run: the last logs arrive, nothing is left running.)

    pytest -q tests/test_temporary_server.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.servers import refused_port

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
from pipelines.execution.runtime import TemporaryServer, prefect_env_defaults
prefect_env_defaults()
server = TemporaryServer.launch()
launched = server.proc.pid
from prefect import flow
from prefect.settings import PREFECT_API_URL
used = server.use()

@flow(log_prints=True)
def hello() -> str:
    print("hello from the flow")
    return "done"

result = hello() if used else None
print(json.dumps({"used": used, "api": PREFECT_API_URL.value(), "ours": server.api_url, "pid": launched,
                  "result": result, "running": server.proc is not None and server.proc.poll() is None}))
"""


def _run(tmp_path: Path, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    full.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect"), **env)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=full, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_the_server_serves_a_flow_and_stops_with_the_process(tmp_path):
    out = _run(tmp_path)
    assert out["used"] is True and out["api"] == out["ours"] and out["result"] == "done" and out["running"]
    assert not _alive(out["pid"])  # stopped at exit (its watchdog and the server's group)
    import sqlite3

    db = sqlite3.connect(tmp_path / "prefect" / "prefect.db")
    assert ("hello from the flow",) in db.execute("select message from log").fetchall()


def test_a_profile_that_names_a_server_wins(tmp_path):
    with refused_port() as port:
        api = f"http://127.0.0.1:{port}/api"
        profiles = tmp_path / "profiles.toml"
        profiles.write_text(f'active = "remote"\n\n[profiles.remote]\nPREFECT_API_URL = "{api}"\n')
        out = _run(tmp_path, PREFECT_PROFILES_PATH=str(profiles))
    assert out["used"] is False and out["api"] == api and out["running"] is False
    assert not _alive(out["pid"])
