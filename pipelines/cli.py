"""The `grpoflow` command line.

    grpoflow run [-S section.key=value ...]     run the training flow (prepare → sft → grpo → evaluate → register → promote)
    grpoflow evaluate --model PATH_OR_URI       evaluate a model folder or a registered model on GSM8K-style data
    grpoflow grade --input F --output F         grade completions from any system against gold answers
    grpoflow promote NAME VERSION --reason T    force the champion alias onto a version
    grpoflow rollback NAME                      put the previous champion back
    grpoflow deploy / serve                     schedule the flow on a Prefect server / serve it locally
    grpoflow ui                                 the MLflow UI on 127.0.0.1

Start-up stays fast: this module imports only the standard library; each subcommand
imports its heavy machinery (torch, mlflow, prefect) when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

PARAMS_HELP = "override one param, as in `dvc exp run -S` (repeatable), e.g. -S grpo.beta=0.0"


def _add_params(p: argparse.ArgumentParser) -> None:
    # Same options as components.config.add_params_args, repeated here so that
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
    p.set_defaults(handler="pipelines.commands:cli_run")

    p = sub.add_parser("evaluate", help="evaluate a model folder or registered model (models:/NAME@ALIAS)")
    p.add_argument("--model", required=True, metavar="PATH_OR_URI", help="model folder or models:/NAME@ALIAS")
    p.add_argument("--data", default=None, metavar="SOURCE",
                   help="jsonl:PATH or hf:NAME[:CONFIG] (default: the prepared test split)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="evaluate the first N problems (default: evaluate.limit; 0 = all)")
    p.add_argument("--protocol", choices=["grpoflow", "lm-eval-gsm8k"], default=None,
                   help="grpoflow: the training prompt and tag format; lm-eval-gsm8k: lm-evaluation-harness's "
                   "5-shot gsm8k task (default: evaluate.protocol from params)")
    p.add_argument("--backend", choices=["auto", "vllm", "transformers"], default=None,
                   help="generation backend (default: evaluate.backend from params)")
    p.add_argument("--output", default=None, metavar="DIR",
                   help="write <name>.json and <name>.items.jsonl here (default: <evaluate.output_dir>/cli/<name>)")
    _add_params(p)
    p.set_defaults(handler="pipelines.commands:cli_evaluate")

    p = sub.add_parser("grade", help="grade JSONL completions against gold answers")
    p.add_argument("--input", required=True, metavar="FILE",
                   help="JSONL rows with 'completion' and 'gold' (or a GSM8K-style 'answer')")
    p.add_argument("--output", required=True, metavar="FILE", help="rows written back with 'extracted' and 'correct'")
    p.add_argument("--mode", choices=["strict", "flexible", "gsm8k"], default="flexible",
                   help="answer extraction mode (default: flexible)")
    p.set_defaults(handler="pipelines.grading:cli_grade")

    p = sub.add_parser("promote", help="force the champion alias onto a model version, recording why")
    p.add_argument("name", help="registered model name, e.g. grpoflow-policy")
    p.add_argument("version", help="model version number")
    p.add_argument("--reason", required=True, help="why; stored as a version tag")
    _add_params(p)
    p.set_defaults(handler="pipelines.commands:cli_promote")

    p = sub.add_parser("rollback", help="move champion back to the previous champion")
    p.add_argument("name", help="registered model name, e.g. grpoflow-policy")
    _add_params(p)
    p.set_defaults(handler="pipelines.commands:cli_rollback")

    p = sub.add_parser("stage", help="run one dvc.yaml stage in a clean working copy of a commit (what a stage pod runs)")
    p.add_argument("name", help="dvc.yaml stage name")
    p.add_argument("--commit", required=True, help="git commit of the code to run")
    p.add_argument("--params-file", required=True, metavar="FILE", help="the pipeline's params.yaml")
    p.add_argument("--lock-file", default=None, metavar="FILE", help="the pipeline's dvc.lock (inputs to pull)")
    p.add_argument("--remote", required=True, metavar="URL", help="the shared DVC remote (s3://..., gs://..., a folder)")
    p.add_argument("--parent-run-id", required=True, help="the pipeline's MLflow parent run")
    p.add_argument("--tracking-uri", default=None, help="MLflow server (default: MLFLOW_TRACKING_URI)")
    p.add_argument("--workdir", default=None, metavar="DIR", help="working copy (default: a new temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the working copy afterwards")
    p.set_defaults(handler="pipelines.commands:cli_stage")

    p = sub.add_parser("deploy", help="apply infra/prefect.yaml deployments to the Prefect server at PREFECT_API_URL")
    p.add_argument("--name", action="append", default=None, help="deployment name (repeatable; default: all)")
    p.set_defaults(handler="pipelines.deploy:cli_deploy")

    p = sub.add_parser("serve", help="serve the training flow locally on a cron schedule")
    p.add_argument("--cron", default="0 3 * * *", help='cron schedule (default: "0 3 * * *")')
    _add_params(p)
    p.set_defaults(handler="pipelines.deploy:cli_serve")

    p = sub.add_parser("ui", help="serve the MLflow UI on 127.0.0.1")
    p.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    _add_params(p)
    p.set_defaults(handler="pipelines.ui:cli_ui")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module, func = args.handler.split(":")
    handler = getattr(importlib.import_module(module), func)
    return int(handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
