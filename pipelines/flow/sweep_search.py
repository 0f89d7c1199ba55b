"""What `grpoflow sweep` tries next, and what it has tried: the configurations of a grid, of seeded random
draws, or asked of Optuna's TPE sampler (ask/tell on an in-memory study rebuilt from the journal), and the
journal itself, an append-only JSON-lines file that several writers share under a file lock.

The journal (`.dvc/tmp/sweeps/<name>/journal.jsonl`) is the sweep's state: its first line holds the spec's
hash and the MLflow parent run; a `config` line each configuration as it is chosen; a `trial` line each trial
that ended, finished or failed. A rerun of the same command reads it back: a configuration chosen before is
tried again before any new one, a finished trial is never run again, a failed one is.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

from components.common.errors import ConfigError
from pipelines.params.sweep_spec import SweepSpec

JOURNAL = "journal.jsonl"


def grid(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every point of the grid, in the spec's order, up to the configurations the trials allow.

    >>> from pipelines.params.sweep_spec import Parameter
    >>> grid(SweepSpec("s", (Parameter("a", (1, 2)), Parameter("b", ("x", "y")))))
    [{'a': 1, 'b': 'x'}, {'a': 1, 'b': 'y'}, {'a': 2, 'b': 'x'}, {'a': 2, 'b': 'y'}]
    """
    keys = [p.key for p in spec.parameters]
    points = [dict(zip(keys, v, strict=True)) for v in itertools.product(*(p.values for p in spec.parameters))]
    return points[: spec.configurations]


def random_config(spec: SweepSpec, index: int) -> dict[str, Any]:
    """Configuration `index` of a random sweep, the same on every rerun (seeded by the spec's seed and index).

    >>> from pipelines.params.sweep_spec import Parameter
    >>> s = SweepSpec("s", (Parameter("lr", low=1e-6, high=1e-4, log=True), Parameter("b", (0.0, 0.1))), "random")
    >>> random_config(s, 3) == random_config(s, 3), 1e-6 <= random_config(s, 3)["lr"] <= 1e-4
    (True, True)
    """
    rng = random.Random(f"{spec.seed}:{index}")
    out: dict[str, Any] = {}
    for p in spec.parameters:
        if p.values:
            out[p.key] = rng.choice(p.values)
        elif p.integer:
            out[p.key] = rng.randint(int(p.low), int(p.high))
        elif p.log:
            out[p.key] = float(f"{math.exp(rng.uniform(math.log(p.low), math.log(p.high))):.4g}")
        else:
            out[p.key] = float(f"{rng.uniform(p.low, p.high):.4g}")
    return out


def _distributions(spec: SweepSpec) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    return {p.key: CategoricalDistribution(p.values) if p.values
            else IntDistribution(int(p.low), int(p.high), log=p.log) if p.integer
            else FloatDistribution(p.low, p.high, log=p.log) for p in spec.parameters}


def ask_tpe(spec: SweepSpec, scored: list[tuple[dict[str, Any], float | None]], count: int) -> list[dict[str, Any]]:
    """`count` new configurations from Optuna's TPE sampler, told every configuration scored so far (None:
    failed). The study lives in memory and is rebuilt from the journal each time, so the journal stays the
    one store."""
    import optuna
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=spec.seed + len(scored), n_startup_trials=min(4, spec.configurations))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    dists = _distributions(spec)
    for config, value in scored:
        study.add_trial(create_trial(params=config, distributions=dists, value=value,
                                     state=TrialState.COMPLETE if value is not None else TrialState.FAIL))
    out = []
    for _ in range(count):
        trial = study.ask(dists)
        out.append({k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in trial.params.items()})
        study.tell(trial, state=TrialState.FAIL)  # pending: the next ask does not propose it again
    return out


class Journal:
    """The sweep's append-only journal; every write appends one line under an exclusive lock."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / JOURNAL

    def lines(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        with open(self.path) as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            text = f.read()
        # a line cut by a crash mid-write is not JSON: the trial it would have recorded runs again
        return [json.loads(line) for line in text.splitlines() if line.strip() and _is_json(line)]

    def append(self, record: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()

    def start(self, spec_hash: str, make_run: Any) -> str:
        """The sweep's MLflow parent run: the journal's, or a new one (`make_run()`) for a new sweep. A journal
        of another spec under the same name is refused."""
        head = next((r for r in self.lines() if r["event"] == "sweep"), None)
        if head is None:
            run_id = make_run()
            self.append({"event": "sweep", "spec": spec_hash, "run_id": run_id})
            return run_id
        if head["spec"] != spec_hash:
            raise ConfigError(f"name: sweep '{self.folder.name}' was started with another spec ({self.path}); "
                              "give this one another name, or delete that folder to start over")
        return head["run_id"]

    def configs(self) -> list[dict[str, Any]]:
        return [r["config"] for r in self.lines() if r["event"] == "config"]

    def trials(self) -> dict[tuple[int, Any], dict[str, Any]]:
        """The last record of each (configuration, seed) that ended."""
        return {(r["index"], r["seed"]): r for r in self.lines() if r["event"] == "trial"}


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True
