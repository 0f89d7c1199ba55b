"""The `grpoflow` command line.

    grpoflow run [--preset NAME] [-S k=v ...]   run the training flow (data → model → sft → grpo → evaluate →
                                                register → promote)
    grpoflow sweep [SPEC] [-S k=a,b ...]       search hyperparameters: trials on a dev split, the best registered
    grpoflow evaluate --model PATH_OR_URI       evaluate a model folder, a registered model or an endpoint URL
    grpoflow grade --input F --output F         grade completions from any system against gold answers
    grpoflow promote NAME VERSION --reason T    force the champion alias onto a version
    grpoflow rollback NAME                      put the previous champion back
    grpoflow deploy / schedule                  schedule the flow on a Prefect server / from this process
    grpoflow serve [MODEL]                      a model behind vLLM's OpenAI-compatible server
    grpoflow reproduce NAME VERSION             re-run a registered version's pipeline, compare its metrics
    grpoflow export MODEL DIR [--merged]        a self-contained copy of a model (LoRA: merged, or with its base)
    grpoflow ui                                 the MLflow UI on 127.0.0.1

Each subcommand's handler lives with its concern (`pipelines/<concern>/<module>.py:cli_<command>`).
Errors are one line on stderr, never a traceback (components/common/entry.py one_line_errors, around every
subcommand): exit code 2 for input to fix (components/common/errors.py), 1 for a service that does not answer
or a stage/DVC/MLflow failure, 3 for a checkout held by another run. A tracking server that does not
answer is found before any work starts; one that stops answering later ends the command within
GRPOFLOW_SERVICE_TIMEOUT_S (default 30 s) with one line naming it (pipelines/execution/services.py).

Start-up stays fast: this module imports only the standard library; each subcommand
imports its heavy machinery (torch, mlflow, prefect) when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

ADOPT_HELP = ("move the aliases of a registered model grpoflow did not make (refused without it); it is tagged "
              "grpoflow.managed=true and treated as grpoflow's from then on")
PARAMS_HELP = "override one param, as in `dvc exp run -S` (repeatable), e.g. -S grpo.trainer.beta=0.0"
EXPORT_DESCRIPTION = (
    "Write MODEL as a folder that needs nothing else: a full model as is; a LoRA adapter with --merged as "
    "base + adapter merged into one model folder, without --merged as the adapter with its base in DIR/base. "
    "A registered adapter version's base is fetched from the registry (once, cached by its weights hash)."
)
SERVE_DESCRIPTION = (
    "Resolve and download MODEL, then serve it with vLLM's OpenAI-compatible server under NAME/VERSION, with its "
    "own chat template and the evaluate section's engine settings (on CPU in the evaluate.vllm_python venv). "
    "Prints a ready-to-paste curl and openai request; Ctrl-C stops it. A --host other than loopback needs an API "
    "key (--api-key or VLLM_API_KEY)."
)
SCHEDULE_DESCRIPTION = (
    "Serve the training flow from this process on a cron schedule (Prefect's flow.serve; no work pool or worker): each "
    "time the schedule fires, a subprocess of this one runs the pipeline on this checkout, as `grpoflow run` with the "
    "-S overrides given here would. The schedule lives on the Prefect server at PREFECT_API_URL; without it, on a "
    "temporary server that exists only while this process runs (start `prefect server start` and set PREFECT_API_URL "
    "to keep schedules and run history, and for faster runs). Runs until stopped: Ctrl-C or SIGTERM stops it and "
    "cancels a run in progress."
)
SWEEP_DESCRIPTION = (
    "Run trials of the pipeline over the spec's parameters (each configuration once per seed, in a clean working "
    "copy that shares the DVC cache and run cache, so unchanged stages are restored, not re-run), score each on the "
    "dev split, rank configurations by their mean dev score, then run the chosen one here: test split, registration "
    "and the McNemar gate. MLflow: one parent run per sweep, the trials as children; `dvc exp show` lists them. "
    "Ctrl-C stops it; the same command continues it."
)
REPRODUCE_DESCRIPTION = (
    "Check out the version's git commit into a clean working copy, restore the params.yaml and dvc.lock its "
    "pipeline run recorded, re-run every stage from scratch (or, with --from-cache, restore the outputs from the "
    "DVC remote and re-evaluate only) with an isolated MLflow store, and print the recorded metrics beside the "
    "re-derived ones. Exit 0 only when they agree (within --tolerance)."
)


def _add_params(p: argparse.ArgumentParser) -> None:
    # Same options as components.common.entry.add_params_args (tests/test_cli.py compares them), repeated here so that
    # `grpoflow --help` does not import yaml-loading code.
    p.add_argument("--params", default=None, metavar="FILE", help="params file (default: params.yaml)")
    p.add_argument(
        "-S", "--set-param", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help=PARAMS_HELP,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpoflow",
        description="Reproducible GRPO post-training: DVC data → SFT → GRPO → GSM8K evaluation → MLflow registry, "
        "driven by Prefect.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("run", help="run the training pipeline flow on params.yaml (+ -S overrides)")
    _add_params(p)
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="apply presets/NAME.yaml (a real model's settings: smollm2-135m-cpu, qwen2.5-0.5b-gpu, "
                   "qwen2.5-1.5b-gpu, llama3.2-1b-16gb), written into params.yaml as -S does; -S given with it wins")
    p.set_defaults(handler="pipelines.flow.run:cli_run")

    p = sub.add_parser("sweep", help="search hyperparameters: trials chosen on a dev split, the best registered",
                       description=SWEEP_DESCRIPTION)
    p.add_argument("spec", nargs="?", default=None, metavar="SPEC",
                   help="a sweep spec (YAML: parameters, method, seeds, trials, parallel, metric; docs/sweep.md)")
    p.add_argument("-S", "--set-param", dest="overrides", action="append", default=[], metavar="SECTION.KEY=V1,V2",
                   help="a grid parameter (values separated by commas, as in `dvc exp run --queue -S`), or a fixed "
                   "override of every trial (one value)")
    p.add_argument("--trials", type=int, default=None, metavar="N", help="most trial runs (overrides the spec)")
    p.add_argument("--parallel", type=int, default=None, metavar="N",
                   help="trials at once on this machine, the cores divided between them (overrides the spec)")
    p.set_defaults(handler="pipelines.flow.sweep_cli:cli_sweep")

    p = sub.add_parser("evaluate", help="evaluate a model folder, registered model (models:/NAME@ALIAS) or endpoint")
    p.add_argument("--model", required=True, metavar="PATH_OR_URI",
                   help="model folder, models:/NAME@ALIAS, hub id, or the base URL of an OpenAI-compatible "
                   "server (http://HOST:PORT/v1, e.g. from `grpoflow serve`)")
    p.add_argument("--data", default=None, metavar="SOURCE",
                   help="jsonl:PATH or hf:NAME[:CONFIG] (default: the prepared test split)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="evaluate the first N problems (default: evaluate.limit; 0 = all)")
    p.add_argument("--protocol", choices=["grpoflow", "lm-eval-gsm8k"], default=None,
                   help="grpoflow: the training prompt and tag format; lm-eval-gsm8k: lm-evaluation-harness's "
                   "5-shot gsm8k task, its examples from the data's own train split, e.g. the train.jsonl beside a "
                   "jsonl:DIR/test.jsonl (evaluate.fewshot_source overrides) (default: evaluate.protocol from params)")
    p.add_argument("--backend", choices=["auto", "vllm", "transformers", "batched"], default=None,
                   help="generation backend (default: evaluate.backend from params)")
    p.add_argument("--output", default=None, metavar="DIR",
                   help="write <name>.json and <name>.items.jsonl here (default: <evaluate.output_dir>/cli/<name>)")
    _add_params(p)
    p.set_defaults(handler="pipelines.evaluation.any_model:cli_evaluate")

    p = sub.add_parser("grade", help="grade JSONL completions against gold answers")
    p.add_argument("--input", required=True, metavar="FILE",
                   help="JSONL rows with 'completion' and 'gold' (or a GSM8K-style 'answer')")
    p.add_argument("--output", required=True, metavar="FILE", help="rows written back with 'extracted' and 'correct'")
    p.add_argument("--mode", choices=["strict", "flexible", "gsm8k"], default="flexible",
                   help="answer extraction mode (default: flexible)")
    p.set_defaults(handler="pipelines.evaluation.grading:cli_grade")

    p = sub.add_parser("promote", help="force the champion alias onto a model version, recording why")
    p.add_argument("name", help="registered model name, e.g. grpoflow-policy")
    p.add_argument("version", help="model version number")
    p.add_argument("--reason", required=True, help="why (not empty); stored as a version tag")
    p.add_argument("--adopt", action="store_true", help=ADOPT_HELP)
    _add_params(p)
    p.set_defaults(handler="pipelines.registry.promotion:cli_promote")

    p = sub.add_parser("rollback", help="move champion back to the previous champion")
    p.add_argument("name", help="registered model name, e.g. grpoflow-policy")
    p.add_argument("--adopt", action="store_true", help=ADOPT_HELP)
    _add_params(p)
    p.set_defaults(handler="pipelines.registry.promotion:cli_rollback")

    p = sub.add_parser(
        "stage", help="run one dvc.yaml stage in a clean working copy of a commit (what a stage pod runs)"
    )
    p.add_argument("name", help="dvc.yaml stage name")
    p.add_argument("--commit", required=True, help="git commit of the code to run")
    p.add_argument("--params-file", required=True, metavar="FILE", help="the pipeline's params.yaml")
    p.add_argument("--lock-file", default=None, metavar="FILE", help="the pipeline's dvc.lock (inputs to pull)")
    p.add_argument(
        "--remote", required=True, metavar="URL", help="the shared DVC remote (s3://..., gs://..., a folder)"
    )
    p.add_argument("--parent-run-id", required=True, help="the pipeline's MLflow parent run")
    p.add_argument("--tracking-uri", default=None, help="MLflow server (default: MLFLOW_TRACKING_URI)")
    p.add_argument("--workdir", default=None, metavar="DIR",
                   help="a missing or empty folder; the working copy goes in DIR/grpoflow-stage-NAME, removed "
                   "afterwards, and DIR too when it was made here and holds nothing else; nothing else in DIR is "
                   "touched (default: a new temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the working copy afterwards")
    p.set_defaults(handler="pipelines.execution.stage:cli_stage")

    p = sub.add_parser("deploy", help="apply infra/prefect.yaml deployments to the Prefect server at PREFECT_API_URL")
    p.add_argument("--name", action="append", default=None, help="deployment name (repeatable; default: all)")
    p.set_defaults(handler="pipelines.flow.deploy:cli_deploy")

    p = sub.add_parser("schedule", help="run the training flow from this process on a cron schedule (no worker)",
                       description=SCHEDULE_DESCRIPTION)
    p.add_argument("--cron", default="0 3 * * *", help='cron schedule, UTC (default: "0 3 * * *", daily at 03:00)')
    _add_params(p)
    p.set_defaults(handler="pipelines.flow.deploy:cli_schedule")

    serve_help = "serve a model with vLLM's OpenAI-compatible server on 127.0.0.1 (default: the champion)"
    p = sub.add_parser("serve", help=serve_help, description=SERVE_DESCRIPTION)
    p.add_argument("model", nargs="?", default="models:/grpoflow-policy@champion", metavar="MODEL",
                   help="models:/NAME@ALIAS, models:/NAME/VERSION, a model folder or a hub id "
                   "(default: models:/grpoflow-policy@champion)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address (default 127.0.0.1); any other than loopback needs --api-key")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every request (default: $VLLM_API_KEY; "
                   "required for a --host other than loopback)")
    _add_params(p)
    p.set_defaults(handler="pipelines.registry.serving:cli_serve")

    reproduce_help = "re-run the pipeline of a registered model version and compare its metrics"
    p = sub.add_parser("reproduce", help=reproduce_help, description=REPRODUCE_DESCRIPTION)
    p.add_argument("name", help="registered model name, e.g. grpoflow-policy")
    p.add_argument("version", help="model version number")
    p.add_argument("--workdir", default=None, metavar="DIR",
                   help="where the working copy goes (must not exist or be empty; default: a new temporary folder)")
    p.add_argument("--from-cache", action="store_true",
                   help="restore the stage outputs from the DVC remote and re-run only the evaluate stage")
    p.add_argument("--tolerance", type=float, default=0.0, metavar="X",
                   help="largest absolute difference accepted per metric (default 0: identical)")
    _add_params(p)
    p.set_defaults(handler="pipelines.registry.reproduce:cli_reproduce")

    export_help = (
        "write a self-contained copy of a model folder or registered version (LoRA: --merged, or with its base)"
    )
    p = sub.add_parser("export", help=export_help, description=EXPORT_DESCRIPTION)
    p.add_argument("model", help="model or adapter folder (models/grpo) or models:/NAME@ALIAS | models:/NAME/VERSION")
    p.add_argument("dir", help="the folder to write (must not exist, be empty, or hold an earlier export)")
    p.add_argument("--merged", action="store_true",
                   help="a LoRA adapter merged into its base: one full model folder (vLLM, transformers, llama.cpp)")
    _add_params(p)
    p.set_defaults(handler="pipelines.registry.export:cli_export")

    p = sub.add_parser("ui", help="serve the MLflow UI on 127.0.0.1")
    p.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address (default 127.0.0.1); any other than loopback needs --app-name")
    p.add_argument("--app-name", default=None, metavar="APP",
                   help="MLflow's authentication app, e.g. basic-auth (`mlflow server --app-name`; required for a "
                   "--host other than loopback)")
    _add_params(p)
    p.set_defaults(handler="pipelines.flow.ui:cli_ui")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module, func = args.handler.split(":")
    from components.common.entry import one_line_errors  # after parsing: `--help` stays stdlib-only
    from pipelines.execution import services

    def command() -> int | None:
        services.service_env_defaults()  # MLflow gives up on a server that does not answer within the budget
        return services.one_line_service_errors(lambda: getattr(importlib.import_module(module), func)(args))

    try:
        return one_line_errors(command)
    except KeyboardInterrupt as exc:  # Ctrl-C, or a stage ended by a signal from outside (`grpoflow run` says more)
        import signal

        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"\ninterrupted by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        return 128 + signum


def entry() -> None:
    """The `grpoflow` console script and `python -m pipelines.cli`: main(), then a quick exit.

    A command that imported Prefect, MLflow and DVC would otherwise spend seconds in the interpreter's
    own teardown (freeing modules, after every exit hook has run), which is all of a no-op rerun's
    wait at the end. The exit is a normal one, in its order: the other threads are joined, the exit
    hooks run (Prefect sends its last logs, MLflow ends its run, the temporary Prefect server stops);
    the hook registered here, first and so run last, flushes stdout and stderr and ends the process
    before the teardown."""
    import atexit

    code = 1  # an exception out of main(): its traceback is printed, then the exit is 1
    atexit.register(lambda: _quick_exit(code))  # before any other hook: atexit runs them last-in, first-out
    try:
        code = main()
    except SystemExit as exc:  # argparse: --help (0), a usage error (2)
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        raise
    sys.exit(code)


def _quick_exit(code: int) -> None:
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
