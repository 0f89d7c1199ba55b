"""Benchmark: MLflow time of logging GRPO's sampled completions over a run, before and after.

The claim: the grpo stage logs its completions in time linear in the run's length, with no download
(no `Downloading artifacts` line on the console). This script replays, against a SQLite MLflow store
in a temporary folder, what the stage logs at every one of `--steps` logging steps (the default run:
128 steps, logging_steps 1, a generation batch of `--rows` completions every `--steps-per-generation`
steps), each way in its own run of the same store, in one process:

  before   mlflow.log_table(<the batch>, artifact_file="grpo_completions.json") at every step, the call
           the stage made until this change: MLflow appends by downloading the table and uploading it whole
  after    GRPOFlowTrainer.log, the stage's own method (TRL's metric logging, the same either way, left
           out): a new batch becomes its own file, completions/step_NNNNNN.json, a step that shares
           its generation batch logs nothing

It prints JSON: per way the wall and CPU seconds (this process's), the files and bytes in the run's
artifacts and the `Downloading artifacts: 100%` lines written to stderr (two a download); `speedup` =
before / after wall seconds; `after_every_step`, the after way with a new batch at every step
(steps_per_generation 1: one file a step); and the load average (wall seconds count the other jobs).

    python benchmarks/completions_logging.py                  # 128 steps of 128 completions
    python benchmarks/completions_logging.py --steps 32       # quicker
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/completions_logging.py` from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OLD_TABLE = "grpo_completions.json"
DOWNLOAD_LINE = "Downloading artifacts: 100%"  # the line `make demo` printed twice a step


def batch(rng: random.Random, rows: int) -> dict[str, Any]:
    """A generation batch as GRPOTrainer records it (`_logs`), at the sizes of the default run: a chat
    prompt near 600 characters, a completion of 128 tokens near 450, one reward function."""
    words = "the of and to total apples each buys she more than left".split()

    def text(chars: int) -> str:
        return " ".join(rng.choice(words) for _ in range(chars // 5))[:chars]

    return {"prompt": [text(600) for _ in range(rows)], "completion": [text(450) for _ in range(rows)],
            "rewards": {"flexible_accuracy_reward": [float(rng.random() < 0.3) for _ in range(rows)]},
            "advantages": [rng.uniform(-1.5, 1.5) for _ in range(rows)]}


def log_before(trainer: Any) -> None:
    """The stage's logging call before this change, as it was."""
    import mlflow

    recorded, n = trainer._logs, len(trainer._logs["prompt"])
    mlflow.log_table({
        "step": [trainer.state.global_step] * n,
        "prompt": [str(p) for p in recorded["prompt"]],
        "completion": [str(c) for c in recorded["completion"]],
        **{f"reward_{name}": list(values) for name, values in recorded["rewards"].items()},
        "advantage": list(recorded["advantages"]),
    }, artifact_file=OLD_TABLE)


def log_after(trainer: Any) -> None:
    """The stage's logging now: GRPOFlowTrainer.log without TRL's part (the same either way)."""
    from trl import GRPOTrainer

    from components.training.grpo_trainer import GRPOFlowTrainer

    trl_log, GRPOTrainer.log = GRPOTrainer.log, lambda self, logs, start_time=None: None
    try:
        GRPOFlowTrainer.log(trainer, {"loss": 0.0})
    finally:
        GRPOTrainer.log = trl_log


def replay(name: str, log: Any, steps: int, rows: int, per_generation: int, artifacts: Path) -> dict[str, Any]:
    """`log` at each of `steps` logging steps in a run of its own; its seconds, files and download lines."""
    import mlflow

    from components.training.grpo_trainer import GRPOFlowTrainer

    rng = random.Random(0)
    trainer = GRPOFlowTrainer.__new__(GRPOFlowTrainer)  # the methods alone: no model, no TRL setup
    trainer.accelerator, trainer.model = SimpleNamespace(is_main_process=True), SimpleNamespace(training=True)
    experiment = mlflow.create_experiment(name, artifact_location=(artifacts / name).as_uri())
    err = io.StringIO()
    seconds = cpu = 0.0
    with mlflow.start_run(experiment_id=experiment) as run, contextlib.redirect_stderr(err):
        for step in range(1, steps + 1):
            if (step - 1) % per_generation == 0:
                trainer._logs = batch(rng, rows)  # TRL refills it at each generation
            trainer.state = SimpleNamespace(global_step=step)
            start, start_cpu = time.perf_counter(), time.process_time()
            log(trainer)
            seconds, cpu = seconds + time.perf_counter() - start, cpu + time.process_time() - start_cpu
    files = [p for p in (artifacts / name / run.info.run_id).rglob("*") if p.is_file()]
    return {"seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3), "files": len(files),
            "bytes": sum(p.stat().st_size for p in files),
            "download_lines": err.getvalue().count(DOWNLOAD_LINE)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=128, help="logging steps (default: 128, the default run)")
    parser.add_argument("--rows", type=int, default=128, help="completions a generation batch (default: 128)")
    parser.add_argument("--steps-per-generation", type=int, default=8, help="steps sharing a batch (default: 8)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        import mlflow

        mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
        with contextlib.redirect_stderr(io.StringIO()):  # the store's creation log
            mlflow.search_experiments()
        artifacts = Path(tmp) / "artifacts"
        before = replay("before", log_before, args.steps, args.rows, args.steps_per_generation, artifacts)
        after = replay("after", log_after, args.steps, args.rows, args.steps_per_generation, artifacts)
        every = replay("after_every_step", log_after, args.steps, args.rows, 1, artifacts)
    print(json.dumps({
        "steps": args.steps, "rows": args.rows, "steps_per_generation": args.steps_per_generation,
        "before": before, "after": after, "after_every_step": every,
        "speedup": round(before["seconds"] / after["seconds"], 1) if after["seconds"] else None,
        "speedup_every_step": round(before["seconds"] / every["seconds"], 1) if every["seconds"] else None,
        "load_average": os.getloadavg()[0],  # what else the machine ran (wall seconds count it)
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
