"""Does GRPO beat its SFT warm start on the embedded defaults? Measured side by side in one run.

Runs, in a fresh temporary folder and with the default params.yaml (plus any `-S`
overrides), the stages data -> model -> sft -> selection -> grpo as `python -m components.<stage>`
(what `dvc repro` runs), timing SFT, the prompt selection and GRPO; then evaluates both models greedily on the
whole test split with the evaluate stage's own code (transformers backend, the training
prompt) and compares them on the same items (exact McNemar test). Prints one JSON object:

  sft_accuracy, grpo_accuracy, delta, ci95, p_value, n     strict accuracy (the answer tag)
  sft_format_rate, grpo_format_rate                        share of well-formed completions
  sft_accuracy_in_format, grpo_accuracy_in_format          accuracy among well-formed ones
  sft_accuracy_flexible, grpo_accuracy_flexible            last number in the text
  flexible                                                 {delta, ci95, p_value} of accuracy_flexible
  seed                                                     data.seed of the run
  sft_seconds, grpo_seconds, total_train_seconds           wall time of each stage process
  selection_seconds, selection_cpu_seconds                       the selection stage (GRPO's prompts by pass rate)
  selection_backend                                        the engine that sampled them (the stage's `auto`: vllm
                                                           where evaluate.vllm_python resolves, as for
                                                           `grpoflow run` in this checkout, else transformers)
  training_seconds                                         SFT + selection + GRPO wall seconds (the budget)
  sft_cpu_seconds, grpo_cpu_seconds                        CPU time (less sensitive to a busy machine)
  k, sampled_items                                         k samples per item at grpo.trainer.temperature (--k,
                                                           default evaluate.num_samples) on the first
                                                           --sample-items test items (default 250)
  sft_sampled_accuracy, grpo_sampled_accuracy              mean flexible correctness of those samples
  sft_pass_at_k, grpo_pass_at_k                            unbiased pass@k (flexible) of those samples
                                                           (components/evaluation/scoring.py, as `evaluate` does)
  frac_reward_zero_std                                     mean over GRPO's logs of the share of groups
                                                           whose rewards are all equal (no signal)
  sft_continued_accuracy_flexible (+ sft_continued_accuracy, the control: models/sft trained further
  sft_continued_steps, sft_continued_seconds,              with the SFT recipe for as many steps as fit
  flexible_vs_continued)                                   in selection + GRPO's wall seconds at SFT's measured
                                                           speed, greedy; paired GRPO - continued
                                                           (--no-control: off)

Per band (`evaluate.target_band`): `target`, `in_band`, `all`, `bands`, each with its `checked` numbers, as
benchmarks/gain_report.py describes them.

With `--seeds 1234,2024,7` the whole recipe runs once per data seed (each its own test split) and
the JSON is `{"seeds": [one object as above per seed], "pooled": {target, in_band, all, bands, and
delta, ci95, p_value, n, sft_accuracy_flexible, grpo_accuracy_flexible of the target band}}`: over
every seed's paired items with exact McNemar tests.

A gain in accuracy_in_format or accuracy_flexible is a gain in correctness; a gain in
format_rate alone is a gain in following the answer format. GRPO beating the continued-SFT
control says the gain is not just more training for the same compute. Sampled accuracy rising
while pass@k falls is GRPO sharpening onto its modes. The current figures: benchmarks/RESULTS.md; every
run so far: benchmarks/archive/.

    python benchmarks/grpo_gain.py                     # the claim: defaults, no network
    python benchmarks/grpo_gain.py -S grpo.trainer.max_steps=50 --keep /tmp/gain --k 0 --no-control
    python benchmarks/grpo_gain.py --seeds 1234,2024,7   # the claim across data seeds, pooled
    python benchmarks/grpo_gain.py --rescore DIR/seed-1234 DIR/seed-2024   # kept runs, today's scorer
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gain_report import CONTINUED, band_report, item_rows, pooled, reports, rescore  # noqa: E402

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def kept_workdir(parser: argparse.ArgumentParser, keep: str | None, prefix: str) -> Path:
    """The run's folder: `--keep DIR` when it is missing or empty (the run writes params.yaml, data/,
    models/ and mlflow.db there, so never into a folder holding files it did not make), else a new
    temporary folder (removed afterwards by the caller)."""
    if keep and Path(keep).exists() and (not Path(keep).is_dir() or any(Path(keep).iterdir())):
        parser.error(f"--keep {keep} is not empty; give a new folder")
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    return work


def run_stage(workdir: Path, module: str, overrides: list[str], env: dict[str, str],
              label: str = "grpo_gain", stdout: list[str] | None = None) -> tuple[float, float]:
    """Run one stage module in `workdir`; returns (wall seconds, CPU seconds). `label` prefixes its
    log lines (the benchmark that runs it); the stage's standard output is appended to `stdout` when
    given (else dropped)."""
    cmd = [sys.executable, "-m", f"components.{module}", "--params", "params.yaml"]
    for o in overrides:
        cmd += ["-S", o]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=workdir, env=env, stdout=subprocess.DEVNULL if stdout is None else subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    if stdout is not None:
        stdout.append(proc.stdout)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise SystemExit(f"{label}: stage {module} failed with exit code {proc.returncode}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"{label}: {module} took {wall:.0f} s (CPU {cpu:.0f} s)", file=sys.stderr)
    return wall, cpu


def selection_backend(stage_stdout: str) -> str:
    """The engine that sampled GRPO's prompts, from the selection stage's last line
    ("selection: kept K of N prompts (...) -> FILE (S s, BACKEND)"); "unknown" without one."""
    found = re.findall(r"^selection: kept .*\([\d.]+ s, (\w+)\)$", stage_stdout, flags=re.M)
    return found[-1] if found else "unknown"


def evaluate(workdir: Path, overrides: list[str], k: int, sample_items: int, continued: bool) -> dict:
    """Greedy evaluation of models/sft, models/grpo (and the continued-SFT control) on the test split,
    paired (the scored items in items/<model>.jsonl); then k samples per item of the first `sample_items` problems
    for SFT and GRPO."""
    from components.common.files import jsonl_bytes, write_files
    from components.evaluation import metrics as metrics_mod
    from components.evaluation import scoring
    from components.models.resolve import resolve_model
    from components.problems.sources import load_problems
    from pipelines.params.config import load_params

    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        params = load_params("params.yaml", [*overrides, "evaluate.num_samples=0"])
        data = f"jsonl:{Path(params.data.output_dir) / 'test.jsonl'}"
        problems = load_problems(data)
        models = {"sft": params.sft.output_dir, "grpo": params.grpo.output_dir}
        if continued:
            models[CONTINUED] = f"models/{CONTINUED}"
        results = {}
        for name, folder in models.items():
            metrics, items = scoring.evaluate_model(
                resolve_model(folder),
                problems,
                params,
                protocol="grpoflow",
                backend="transformers",
                data=data,
            )
            results[name] = (metrics, items)
        write_files("items", {f"{name}.jsonl": jsonl_bytes(items) for name, (_, items) in results.items()})
        paired = metrics_mod.compare(results["grpo"][1], results["sft"][1], "accuracy_strict")
        if continued:
            vs_continued = metrics_mod.compare(results["grpo"][1], results[CONTINUED][1], "accuracy_flexible")
        subset = problems[:sample_items] if sample_items else problems
        sampled = {}
        if k:  # the evaluate stage's sampled metrics (greedy is redone on the subset: cheap beside k samples)
            k_params = load_params("params.yaml", [*overrides, f"evaluate.num_samples={k}"])
            for name in ("sft", "grpo"):
                sampled[name], _ = scoring.evaluate_model(
                    resolve_model(models[name]), subset, k_params, protocol="grpoflow", backend="transformers",
                    data=data,
                )
    finally:
        os.chdir(cwd)

    out = {"n": paired["n"], "delta": paired["delta"], "ci95": paired["ci95"], "p_value": paired["p_value"]}
    # Per item (steps, GRPO, SFT, control) flexible verdicts: the band numbers and the pooled test's input.
    out["_items"] = item_rows({name: items for name, (_, items) in results.items()})
    out.update(band_report(out["_items"], params.evaluate.target_band))
    if continued:
        metrics = results.pop(CONTINUED)[0]
        out["sft_continued_accuracy_flexible"] = metrics["accuracy_flexible"]
        out["sft_continued_accuracy"] = metrics["accuracy_strict"]
        out["flexible_vs_continued"] = {key: vs_continued[key] for key in ("delta", "ci95", "p_value")}
    if k:
        out["k"] = k
        out["sampled_items"] = len(subset)
        for name, metrics in sampled.items():
            out[f"{name}_sampled_accuracy"] = metrics["sampled_accuracy_flexible"]
            out[f"{name}_pass_at_k"] = metrics["pass_at_k_flexible"]
    for name, (metrics, items) in results.items():
        formatted = [i for i in items if i["format_ok"]]
        out[f"{name}_accuracy"] = metrics["accuracy_strict"]
        out[f"{name}_format_rate"] = metrics["format_rate"]
        out[f"{name}_accuracy_in_format"] = (
            sum(i["correct"] for i in formatted) / len(formatted) if formatted else 0.0
        )
        out[f"{name}_accuracy_flexible"] = metrics["accuracy_flexible"]
        out[f"{name}_mean_completion_tokens"] = metrics["mean_completion_tokens"]
    out["flexible"] = {key: paired["by_metric"]["accuracy_flexible"][key] for key in ("delta", "ci95", "p_value")}
    return out


def continue_sft(workdir: Path, overrides: list[str], env: dict[str, str], rl_seconds: float) -> dict:
    """The same-compute control: models/sft trained further with the SFT recipe (the same
    demonstrations, train.jsonl, never the answer-only problems; the lr schedule restarted over the
    new steps) for as many steps as fit in the RL side's wall seconds (selection + grpo stage processes,
    `rl_seconds`) at the first SFT process's speed. With LoRA the SFT adapter is first merged into its
    base (models/sft_continued_base) and a new adapter of the same recipe trains over that. Writes
    models/sft_continued and its own reports beside the first run's."""
    params = reports(workdir, overrides)
    sft = json.loads((workdir / params.sft.metrics_file).read_text())
    seconds_per_step = sft["train_seconds"] / max(sft["global_step"], 1)
    steps = max(1, round(rl_seconds / seconds_per_step))
    train = Path(params.sft.metrics_file).parent
    base = params.sft.output_dir
    if params.sft.use_lora:  # an adapter trained over an adapter could not be loaded: train over SFT merged
        from components.models import adapters

        base = f"models/{CONTINUED}_base"
        adapters.merge(workdir / params.sft.output_dir, adapters.find_base(workdir / params.sft.output_dir,
                                                                           [workdir / params.model.base_dir]),
                       workdir / base)
    control = [
        f"model.base_dir={base}",
        f"sft.output_dir=models/{CONTINUED}",
        f"sft.checkpoint_dir=checkpoints/{CONTINUED}",
        f"sft.metrics_file={train / f'{CONTINUED}.json'}",
        f"sft.history_file={train / f'{CONTINUED}_history.csv'}",
        f"sft.trainer.max_steps={steps}",
    ]
    run_stage(workdir, "sft", overrides + control, env)
    summary = json.loads((workdir / train / f"{CONTINUED}.json").read_text())
    return {"sft_continued_steps": steps, "sft_continued_seconds": summary["train_seconds"]}


def zero_std(workdir: Path, overrides: list[str]) -> dict:
    """GRPO's mean frac_reward_zero_std over its logs (the signal monitor's summary in its report)."""
    report = json.loads((workdir / reports(workdir, overrides).grpo.metrics_file).read_text())
    return {"frac_reward_zero_std": report.get("frac_reward_zero_std_mean")}


def run_recipe(workdir: Path, overrides: list[str], args: argparse.Namespace) -> dict:
    """The whole recipe once in `workdir` (data -> model -> sft -> selection -> grpo, the control, the evaluation);
    the single-run JSON object, with the paired flexible items under `_paired_flexible`."""
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
    run_stage(workdir, "data", overrides, env)
    run_stage(workdir, "model", overrides, env)
    sft_s, sft_cpu = run_stage(workdir, "sft", overrides, env)
    selection_out: list[str] = []
    selection_s, selection_cpu = run_stage(workdir, "selection", overrides, env, stdout=selection_out)
    grpo_s, grpo_cpu = run_stage(workdir, "grpo", overrides, env)
    control = {} if args.no_control else continue_sft(workdir, overrides, env, selection_s + grpo_s)
    k = reports(workdir, overrides).evaluate.num_samples if args.k is None else args.k
    result = evaluate(workdir, overrides, k, args.sample_items, not args.no_control)
    result.update(control)
    result.update(zero_std(workdir, overrides))
    result.update(
        {
            "seed": reports(workdir, overrides).data.seed,
            "sft_seconds": round(sft_s, 1),
            "selection_seconds": round(selection_s, 1),
            "selection_backend": selection_backend("".join(selection_out)),
            "grpo_seconds": round(grpo_s, 1),
            "total_train_seconds": round(sft_s + grpo_s, 1),
            "training_seconds": round(sft_s + selection_s + grpo_s, 1),
            "sft_cpu_seconds": round(sft_cpu, 1),
            "selection_cpu_seconds": round(selection_cpu, 1),
            "grpo_cpu_seconds": round(grpo_cpu, 1),
            "cpu_count": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "overrides": overrides,
        }
    )
    return result


def seed_list(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds {text!r}: expected comma-separated integers, e.g. 1234,2024,7"
        ) from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: expected distinct integers, e.g. 1234,2024,7")
    return seeds


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
    parser.add_argument("--keep", metavar="DIR", help="work in DIR (new or empty; kept) instead of a temporary folder")
    parser.add_argument(
        "--seeds", type=seed_list, metavar="S1,S2,...",
        help="run the whole recipe once per data seed (data.seed=S, each in its own folder) and print "
        "{seeds: [per seed], pooled: {delta, p_value, n}}: GRPO - SFT flexible accuracy over all items",
    )
    parser.add_argument(
        "--k", type=int, default=None, help="samples per item for sampled accuracy and pass@k "
        "(default: evaluate.num_samples; 0: skip)"
    )
    parser.add_argument(
        "--sample-items", type=int, default=250, metavar="N",
        help="sample only the first N test items (0: all; 250 x k=8 takes a few minutes on a CPU)",
    )
    parser.add_argument(
        "--no-control", action="store_true", help="skip the continued-SFT control (same compute as GRPO)"
    )
    parser.add_argument(
        "--rescore", nargs="+", type=Path, metavar="DIR",
        help="run nothing: judge the kept greedy items of runs kept with --keep (DIR, or DIR/seed-S) with "
        "today's scorer and print their band report (target, in_band, all, bands, each with `checked`), pooled; "
        "-S as the runs had it (evaluate.target_band)",
    )
    parser.add_argument("--grpo-items", default="grpo", metavar="NAME",
                        help="with --rescore: the GRPO model's items file, items/NAME.jsonl (default grpo)")
    args = parser.parse_args(argv)
    if args.rescore:
        if args.seeds or args.keep:
            parser.error("--rescore reads kept runs and runs nothing: drop --seeds/--keep (give -S as the runs had it)")
        print(json.dumps(rescore(args.rescore, args.grpo_items, args.overrides), indent=2))
        return 0
    if args.seeds and any(o.split("=", 1)[0].strip() == "data.seed" for o in args.overrides):
        parser.error("--seeds sets data.seed for each run: drop -S data.seed=...")

    workdir = kept_workdir(parser, args.keep, "grpo-gain-")
    try:
        if not args.seeds:
            result = run_recipe(workdir, args.overrides, args)
            result.pop("_items")
        else:
            runs = []
            for seed in args.seeds:
                print(f"grpo_gain: data.seed={seed}", file=sys.stderr)
                runs.append(run_recipe(workdir / f"seed-{seed}", [*args.overrides, f"data.seed={seed}"], args))
            band = runs[0]["target_band"] if runs[0]["target_band"] != "all" else ""
            result = {"seeds": runs, "pooled": pooled([r.pop("_items") for r in runs], band),
                      "overrides": args.overrides}
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
