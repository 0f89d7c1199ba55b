"""Where two commits' training seconds go, part by part, in one run: each commit's SFT and GRPO stages
from the same data, on the same packages, each commit on a core of its own, side by side.

Each ref is exported (`git archive`, the user's checkout is not touched) into `--root`/<ref>, and its
stages run there in order (data, model, sft, selection, grpo: `python -m components.<stage>` with the
ref's own params.yaml and code, `-S` overrides for both). The SFT and GRPO trainers of both refs are
timed by this commit's clock (components/training/step_clock.py), put in through a `sitecustomize`
module on the stages' path: a ref older than the clock is measured the same way as this one. Both refs
run at once, each pinned to one core (`--cores`, `taskset`) with `--threads` torch threads, so that
whatever else loads the machine loads both alike.

Prints one JSON object: per ref and stage (sft, grpo) the train call's seconds, its seconds by part,
its CPU seconds, steps, completions and completion tokens (GRPO), and `ratio`: the second ref's
seconds over the first's, per part.

`--sub REF:FILE:OLD=NEW` replaces the text OLD with NEW in that ref's FILE, for a name the packages
here no longer take (f62fb56's trainer default `activation_checkpointing`, transformers >= 5.23's name
of `gradient_checkpointing`, which the locked 5.17 does not know).

    python benchmarks/grpo_parts_ab.py --refs f62fb56,HEAD --root /tmp/ab \
        --sub f62fb56:components/training/finetune.py:activation_checkpointing=gradient_checkpointing
    python benchmarks/grpo_parts_ab.py --refs f62fb56,HEAD --root /tmp/ab -S grpo.trainer.max_steps=32
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("data", "model", "sft", "selection", "grpo")
TIMED = ("sft", "grpo")

SITECUSTOMIZE = '''
import json, os, sys, time
import transformers
from step_clock import StepClock

_train = transformers.Trainer.train

def train(self, *args, **kwargs):
    clock = StepClock()
    self.add_callback(clock.callback())
    clock.instrument(self)
    start = time.monotonic()
    result = _train(self, *args, **kwargs)
    seconds = time.monotonic() - start
    tokens = {k: sum(t.get(k, 0) for t in clock.tokens) for k in ("completions", "completion", "decode_steps")}
    record = {"trainer": type(self).__name__, "train_seconds": round(seconds, 2), **clock.report(seconds),
              "cpu_seconds": round(sum(clock.cpu), 1), "steps": len(clock.steps), **tokens}
    with open(os.environ["GRPOFLOW_AB_CLOCK"], "a") as fh:
        fh.write(json.dumps(record) + "\\n")
    return result

transformers.Trainer.train = train
'''


def export(ref: str, dest: Path) -> str:
    """The ref's tree in `dest` (git archive); returns its full commit id."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", ref], check=True, capture_output=True,
                            text=True).stdout.strip()
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return commit


def start_ref(dest: Path, clock_dir: Path, core: str, threads: int, overrides: list[str]) -> subprocess.Popen:
    """One ref's stages in order, in a shell of their own, pinned to `core`."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": f"{dest}:{clock_dir}", "GRPOFLOW_AB_CLOCK": str(dest / "clock.jsonl"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{dest / 'mlflow.db'}", "HF_HUB_OFFLINE": "1",
           "GRPOFLOW_CACHE": str(dest / ".cache"), "DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true"}
    sets = " ".join(f"-S {o}" for o in overrides)
    lines = [f"taskset -c {core} {sys.executable} -m components.{stage} {sets}".strip() for stage in STAGES]
    log = open(dest / "stages.log", "w")  # noqa: SIM115 (closed by the process's end)
    return subprocess.Popen(["bash", "-c", " && ".join(lines)], cwd=dest, env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def records(dest: Path) -> dict[str, dict]:
    """The clock's records of the ref's SFT and GRPO trainers, by stage."""
    rows = [json.loads(line) for line in (dest / "clock.jsonl").read_text().splitlines()]
    return dict(zip(TIMED, rows, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--refs", default="f62fb56,HEAD", help="two commits, the baseline first")
    parser.add_argument("--root", type=Path, default=None, help="where the refs run (kept; default a temporary folder)")
    parser.add_argument("--cores", default="0,1", help="the core of each ref (taskset -c)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each ref")
    parser.add_argument("-S", dest="overrides", action="append", default=[], help="KEY=VALUE for both refs")
    parser.add_argument("--sub", action="append", default=[], metavar="REF:FILE:OLD=NEW",
                        help="replace OLD with NEW in REF's FILE")
    args = parser.parse_args(argv)
    refs, cores = args.refs.split(","), args.cores.split(",")
    root = args.root or Path(tempfile.mkdtemp(prefix="grpoflow-ab-"))
    clock_dir = root / "clock"
    clock_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "components/training/step_clock.py", clock_dir / "step_clock.py")
    (clock_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    commits, running = {}, {}
    start = time.monotonic()
    for ref, core in zip(refs, cores, strict=True):
        dest = root / ref
        commits[ref] = export(ref, dest)
        for sub in args.sub:
            target, name, change = sub.split(":", 2)
            old, _, new = change.partition("=")
            if target == ref:
                text = (dest / name).read_text()
                if old not in text:
                    parser.error(f"--sub {sub}: {old!r} is not in {ref}'s {name}")
                (dest / name).write_text(text.replace(old, new))
        running[ref] = start_ref(dest, clock_dir, core, args.threads, args.overrides)
    failed = [ref for ref, proc in running.items() if proc.wait() != 0]
    if failed:
        print(f"grpo_parts_ab: {', '.join(failed)} failed; see {root}/<ref>/stages.log", file=sys.stderr)
        return 1
    result = {"refs": commits, "root": str(root), "sub": args.sub, "wall_seconds": round(time.monotonic() - start, 1),
              "threads": args.threads, "overrides": args.overrides, "load_average_1m": os.getloadavg()[0],
              "stages": {ref: records(root / ref) for ref in refs}}
    a, b = (result["stages"][ref] for ref in refs)
    result["ratio"] = {stage: {k: round(b[stage][k] / a[stage][k], 3) for k in a[stage]
                               if k.endswith("_seconds") and a[stage][k]} for stage in TIMED}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
