"""One of tests/slow/test_registry_race.py's racing processes: a checkout's own `gate()`,
`force_promote()` and `rollback()` against the shared MLflow server (MLFLOW_TRACKING_URI).

It imports what those three need and no more (no torch), then, per round, reads one command (JSON)
on stdin, says `ready`, waits for `go` and runs it, so that the processes of a round start within
milliseconds of each other. The result is one JSON line on stdout: the decision, a GrpoflowError's
line, or any other exception's traceback (a failure of the test). What the registry code prints
goes to stderr.

    python tests/slow/registry_race_worker.py CHECKOUT   # CHECKOUT holds .dvc/ and the items file
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from pathlib import Path

from components.common.errors import GrpoflowError
from pipelines.handoff import Registration
from pipelines.params.config import load_params
from pipelines.registry.promotion import force_promote, gate, rollback

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = ['evaluate.target_band=""', "register.min_items=100"]


def run(params, root: Path, cmd: dict) -> dict:
    with contextlib.redirect_stdout(sys.stderr):
        if cmd["op"] == "gate":
            d = gate(params, Registration(cmd["name"], cmd["version"], created=True, run_id=cmd["run_id"]), root)
        elif cmd["op"] == "force":
            d = force_promote(params, cmd["name"], cmd["version"], "race test")
        else:
            d = rollback(params, cmd["name"])
    return {"decision": d.decision, "version": str(d.version), "before": d.champion_before, "reason": d.reason}


def main() -> None:
    root = Path(sys.argv[1])
    params = load_params(REPO / "params.yaml", OVERRIDES, root=root)
    import mlflow.artifacts  # noqa: F401  what every command imports on first use: before the race, not in it

    import components.evaluation.stats  # noqa: F401
    print("started", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return
        start = time.time()
        try:
            out = run(params, root, cmd)
        except GrpoflowError as exc:
            out = {"error": str(exc)}
        except Exception:
            out = {"traceback": traceback.format_exc()}
        print(json.dumps({**cmd, **out, "start": start, "end": time.time()}), flush=True)


if __name__ == "__main__":
    main()
