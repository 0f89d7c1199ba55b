"""Does GRPO beat its SFT warm start on the embedded defaults? Measured side by side in one run.

Runs, in a fresh temporary folder and with the default params.yaml (plus any `-S`
overrides), the stages data -> model -> sft -> grpo as `python -m components.<stage>`
(what `dvc repro` runs), timing SFT and GRPO; then evaluates both models greedily on the
whole test split with the evaluate stage's own code (transformers backend, the training
prompt) and compares them on the same items (exact McNemar test). Prints one JSON object:

  sft_accuracy, grpo_accuracy, delta, ci95, p_value, n     strict accuracy (the answer tag)
  sft_format_rate, grpo_format_rate                        share of well-formed completions
  sft_accuracy_in_format, grpo_accuracy_in_format          accuracy among well-formed ones
  sft_accuracy_flexible, grpo_accuracy_flexible            last number in the text
  sft_seconds, grpo_seconds, total_train_seconds           wall time of each stage process
  sft_cpu_seconds, grpo_cpu_seconds                        CPU time (less sensitive to a busy machine)

A gain in accuracy_in_format or accuracy_flexible is a gain in correctness; a gain in
format_rate alone is a gain in following the answer format.

    python benchmarks/grpo_gain.py                     # the claim: defaults, no network
    python benchmarks/grpo_gain.py -S grpo.trainer.max_steps=50 --keep /tmp/gain
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def run_stage(workdir: Path, module: str, overrides: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run one stage module in `workdir`; returns (wall seconds, CPU seconds)."""
    cmd = [sys.executable, "-m", f"components.{module}", "--params", "params.yaml"]
    for o in overrides:
        cmd += ["-S", o]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise SystemExit(f"grpo_gain: stage {module} failed with exit code {proc.returncode}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"grpo_gain: {module} took {wall:.0f} s (CPU {cpu:.0f} s)", file=sys.stderr)
    return wall, cpu


def evaluate(workdir: Path, overrides: list[str]) -> dict:
    """Greedy evaluation of models/sft and models/grpo on the test split, paired."""
    from components import scoring
    from components.config import load_params
    from components.modelio import resolve_model
    from components.sources import load_problems

    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        params = load_params("params.yaml", overrides)
        data = f"jsonl:{Path(params.data.output_dir) / 'test.jsonl'}"
        problems = load_problems(data)
        results = {}
        for name, folder in (("sft", params.sft.output_dir), ("grpo", params.grpo.output_dir)):
            metrics, items = scoring.evaluate_model(
                resolve_model(folder),
                problems,
                params,
                protocol="grpoflow",
                backend="transformers",
                data=data,
            )
            results[name] = (metrics, items)
        paired = scoring.compare(results["grpo"][1], results["sft"][1], "accuracy_strict")
    finally:
        os.chdir(cwd)

    out = {"n": paired["n"], "delta": paired["delta"], "ci95": paired["ci95"], "p_value": paired["p_value"]}
    for name, (metrics, items) in results.items():
        formatted = [i for i in items if i["format_ok"]]
        out[f"{name}_accuracy"] = metrics["accuracy_strict"]
        out[f"{name}_format_rate"] = metrics["format_rate"]
        out[f"{name}_accuracy_in_format"] = (
            sum(i["correct"] for i in formatted) / len(formatted) if formatted else 0.0
        )
        out[f"{name}_accuracy_flexible"] = metrics["accuracy_flexible"]
        out[f"{name}_mean_completion_tokens"] = metrics["mean_completion_tokens"]
    out["flexible"] = {k: paired["by_metric"]["accuracy_flexible"][k] for k in ("delta", "ci95", "p_value")}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-S",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a param for every stage (repeatable)",
    )
    parser.add_argument("--keep", metavar="DIR", help="work in DIR (kept) instead of a temporary folder")
    args = parser.parse_args(argv)

    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="grpo-gain-"))
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "params.yaml", workdir / "params.yaml")
    env = {
        **os.environ,
        **OFFLINE_ENV,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}",
    }
    env.pop("GRPOFLOW_PARENT_RUN_ID", None)
    os.environ.update({k: env[k] for k in (*OFFLINE_ENV, "MLFLOW_TRACKING_URI")})
    try:
        run_stage(workdir, "data", args.overrides, env)
        run_stage(workdir, "model", args.overrides, env)
        sft_s, sft_cpu = run_stage(workdir, "sft", args.overrides, env)
        grpo_s, grpo_cpu = run_stage(workdir, "grpo", args.overrides, env)
        result = evaluate(workdir, args.overrides)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    result.update(
        {
            "sft_seconds": round(sft_s, 1),
            "grpo_seconds": round(grpo_s, 1),
            "total_train_seconds": round(sft_s + grpo_s, 1),
            "sft_cpu_seconds": round(sft_cpu, 1),
            "grpo_cpu_seconds": round(grpo_cpu, 1),
            "cpu_count": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "overrides": args.overrides,
        }
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
