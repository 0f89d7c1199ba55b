"""Eight processes move one registry's champion at the same moment, as the checkouts of a team do,
against one real `mlflow server` on 127.0.0.1 (SQLite), for 20 rounds: gates, forced promotions and
rollbacks mixed, each round on a fresh registered model set up with no champion, a champion, or a
champion that replaced another. Each process is tests/slow/registry_race_worker.py calling the
project's own `gate()`, `force_promote()` and `rollback()`; the eight start each round within
milliseconds of each other. After every round:

- exactly one champion, and the moves the processes report form one chain from the champion before
  the round to the champion after it: no two versions promoted over the same champion, no move lost;
- every gate and forced promotion recorded its decision on its version (promoted, rejected or
  superseded; forced), a promoted one naming the champion it replaced; every rollback that moved
  tagged both versions, and one that did not says why in one line;
- no version is left tagged promoted that never held the alias;
- no process printed a traceback (an IntegrityError from two alias writes, say).

Before the registry lease this failed in round 0 (two gates promoted over no champion).

    pytest -q tests/slow/test_registry_race.py    # about 6 minutes on 2 busy cores, 1.5 of them to start
    GRPOFLOW_RACE_ROUNDS=4 pytest -q tests/slow/test_registry_race.py    # fewer rounds
"""

from __future__ import annotations

import json
import os
import random
import re
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.servers import mlflow_server, served

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("registry_race_worker.py")
PROCESSES, ROUNDS, ITEMS = 8, int(os.environ.get("GRPOFLOW_RACE_ROUNDS", "20")), 100
LEVELS = list(range(20, 100, 10))  # correct items per version: i < k, so a higher level wins McNemar clearly
EVALUATED_ON = {"eval.test_sha256": "e" * 64, "eval.protocol": "grpoflow", "eval.max_new_tokens": "256"}
# (versions with a champion set up before the round, then the ops of the eight processes)
SCENARIOS = [
    ([], ["gate"] * 6 + ["force", "rollback"]),                      # no champion yet
    ([30, 40], ["gate"] * 4 + ["force"] * 2 + ["rollback"] * 2),      # v2 champion, it replaced v1
    ([40], ["gate"] * 6 + ["force", "rollback"]),                    # v1 champion
    ([30, 50], ["gate"] * 5 + ["rollback"] * 3),                     # v2 champion, it replaced v1
]
ROLLBACK_REFUSALS = ("has no champion alias", "replaced no earlier champion", "the champion moved from")


def items_line(i: int, k: int) -> str:
    return json.dumps({"id": f"q{i}", "completion": "x", "extracted": "1", "correct": i < k}) + "\n"


class Workers:
    """The eight processes, each with its own checkout folder, fed one command per round."""

    def __init__(self, tmp: Path, env: dict[str, str]):
        self.roots = [tmp / f"checkout{i}" for i in range(PROCESSES)]
        self.procs = []
        for root in self.roots:
            (root / ".dvc").mkdir(parents=True)
            (root / "reports" / "eval").mkdir(parents=True)
            with open(root / "worker.log", "ab") as log:
                self.procs.append(subprocess.Popen([sys.executable, str(WORKER), str(root)], cwd=root, env=env,
                                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                                   text=True, bufsize=1))
        self.read_all("started", timeout=300)

    def read_all(self, what: str, timeout: float) -> list[str]:
        sel = selectors.DefaultSelector()
        for i, p in enumerate(self.procs):
            sel.register(p.stdout, selectors.EVENT_READ, i)
        lines: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while len(lines) < len(self.procs):
            events = sel.select(timeout=max(0.0, deadline - time.monotonic()))
            if not events:
                logs = {i: (r / "worker.log").read_text()[-2000:] for i, r in enumerate(self.roots) if i not in lines}
                raise AssertionError(f"no {what!r} within {timeout} s from processes {sorted(logs)}: {logs}")
            for key, _ in events:
                line = key.fileobj.readline()
                assert line, f"process {key.data} exited: {(self.roots[key.data] / 'worker.log').read_text()[-3000:]}"
                lines[key.data] = line.strip()
                sel.unregister(key.fileobj)
        return [lines[i] for i in range(len(self.procs))]

    def round(self, commands: list[dict]) -> list[dict]:
        for p, cmd in zip(self.procs, commands, strict=True):
            p.stdin.write(json.dumps(cmd) + "\n")
        self.read_all("ready", timeout=60)
        for p in self.procs:  # the eight start within milliseconds of each other
            p.stdin.write("go\n")
        return [json.loads(line) for line in self.read_all("result", timeout=600)]

    def close(self) -> None:
        for p in self.procs:
            p.stdin.close()
        for p in self.procs:
            p.wait(timeout=60)


def set_up_round(
    client, r: int, items_run: str, items_uri: str, workers: Workers
) -> tuple[str, str | None, list[dict]]:
    """A fresh registered model, grpoflow's (else promote and rollback refuse it as another's): the
    scenario's champion history, then one version per gate or forced promotion; the commands for the
    eight processes (shuffled), and the champion before the round."""
    from pipelines.registry.register import MANAGED_TAG

    rng = random.Random(r)
    name = f"race-{r}"
    history, ops = SCENARIOS[r % len(SCENARIOS)]
    client.create_registered_model(name, tags={MANAGED_TAG: "true"})  # grpoflow's mark, as its register step makes it

    def new_version(level: int) -> str:
        tags = {"eval.items_uri": f"{items_uri}/items_{level}.jsonl", **EVALUATED_ON,
                "eval.items_sha256": LEVEL_SHA[level]}
        return str(client.create_model_version(name, f"runs:/{items_run}/items", run_id=items_run, tags=tags,
                                               await_creation_for=0).version)

    champion = None
    for level in history:  # what grpoflow's gate wrote when these were promoted
        v = new_version(level)
        client.set_model_version_tag(name, v, "promotion.decision", "promoted")
        if champion:
            client.set_model_version_tag(name, v, "promotion.previous_champion", champion)
        client.set_registered_model_alias(name, "champion", v)
        champion = v
    rng.shuffle(ops := list(ops))
    commands = []
    for i, op in enumerate(ops):
        cmd = {"op": op, "name": name, "worker": i, "run_id": RUN_IDS[i]}
        if op != "rollback":
            level = rng.choice(LEVELS)
            cmd.update(version=new_version(level), level=level)
            (workers.roots[i] / "reports" / "eval" / "grpo.items.jsonl").write_text(
                "".join(items_line(j, level) for j in range(ITEMS)))  # the checkout's own copy, as evaluate wrote it
        commands.append(cmd)
    return name, champion, commands


def chain(moves: list[tuple[str | None, str]], start: str | None, end: str | None) -> bool:
    """Whether the moves, each used once, lead from `start` to `end` in some order."""
    if not moves:
        return start == end
    return any(a == start and chain(moves[:i] + moves[i + 1:], b, end) for i, (a, b) in enumerate(moves))


def outcome(x: dict) -> str:
    """A process's error line, or the exception line of its traceback."""
    if "traceback" not in x:
        return x.get("error", "")
    lines = x["traceback"].strip().splitlines()
    return next((line for line in reversed(lines) if re.match(r"^[\w.]+(Error|Exception)\b", line)), lines[-1])


def check_round(client, r: int, name: str, before: str | None, results: list[dict]) -> list[str]:
    """What went wrong in round r: every broken invariant, each in one line."""
    problems = [f"a process crashed: {outcome(x)}" for x in results if "traceback" in x]
    try:
        after = str(client.get_model_version_by_alias(name, "champion").version)
    except Exception as exc:
        return [*problems, f"no champion: {exc}"]
    versions = {str(v.version): v.tags for v in client.search_model_versions(f"name = '{name}'")}
    moves = []
    for x in results:
        op, got, v = x["op"], x.get("decision"), x.get("version")
        if op == "gate" and (got not in ("promoted", "rejected", "superseded")
                             or versions[v].get("promotion.decision") != got):
            problems.append(f"the gate of v{v} recorded no decision: {outcome(x)}")
        elif op == "force" and (got != "forced" or versions[v].get("promotion.decision") != "forced"):
            problems.append(f"the forced promotion of v{v} recorded nothing: {outcome(x)}")
        elif op == "rollback" and "decision" not in x and not any(m in x["error"] for m in ROLLBACK_REFUSALS):
            problems.append(f"a rollback failed: {outcome(x)}")
        elif got == "rollback" and not versions[x["before"]].get("rollback.reason", "").endswith(f"to v{v}"):
            problems.append(f"the rollback from v{x['before']} to v{v} left no rollback.reason on v{x['before']}")
        if got in ("promoted", "forced", "rollback"):
            moves.append((x["before"], v))
            if got != "rollback" and x["before"] and versions[v].get("promotion.previous_champion") != x["before"]:
                problems.append(f"v{v} {got} over v{x['before']} but tagged as replacing "
                                f"v{versions[v].get('promotion.previous_champion')}")
    if not chain(moves, before, after):
        problems.append(f"the moves {moves} (from, to) do not lead from v{before} to the champion v{after}")
    replaced = {t.get("promotion.previous_champion") for t in versions.values()}
    strays = [v for v, t in versions.items() if t.get("promotion.decision") in ("promoted", "forced")
              and v != after and v not in replaced and "rollback.reason" not in t]
    if strays:
        problems.append(f"v{', v'.join(strays)} tagged promoted (or forced) but never champion")
    return [f"round {r} ({name}, champion before: v{before}): {p}" for p in problems]


LEVEL_SHA: dict[int, str] = {}
RUN_IDS: list[str] = []


def test_eight_processes_moving_one_champion_at_once_keep_one_champion_and_every_decision(tmp_path):
    import hashlib

    import mlflow

    store = tmp_path / "store"
    store.mkdir()
    with served(lambda port: mlflow_server(port, store), "/health", tmp_path / "mlflow.log", timeout=180) as server:
        env = {**os.environ, "MLFLOW_TRACKING_URI": server.url, "PYTHONPATH": str(REPO)}
        mlflow.set_tracking_uri(server.url)
        client = mlflow.MlflowClient()
        exp = client.create_experiment("grpoflow")
        items = tmp_path / "items"
        items.mkdir()
        for level in LEVELS:
            data = "".join(items_line(i, level) for i in range(ITEMS))
            (items / f"items_{level}.jsonl").write_text(data)
            LEVEL_SHA[level] = hashlib.sha256(data.encode()).hexdigest()
        items_run = client.create_run(exp, run_name="race items").info
        client.log_artifacts(items_run.run_id, str(items), "items")
        RUN_IDS[:] = [client.create_run(exp, run_name=f"checkout {i}").info.run_id for i in range(PROCESSES)]
        workers = Workers(tmp_path, env)
        try:
            start, problems = time.monotonic(), []
            for r in range(ROUNDS):
                name, before, commands = set_up_round(client, r, items_run.run_id, items_run.artifact_uri + "/items",
                                                      workers)
                problems += check_round(client, r, name, before, workers.round(commands))
                if len(problems) > 20:
                    break
            print(f"{r + 1} rounds of {PROCESSES} processes in {time.monotonic() - start:.0f} s")
            assert not problems, "\n".join(problems)
        finally:
            workers.close()
