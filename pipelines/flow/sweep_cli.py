"""`grpoflow sweep [SPEC] [-S key=a,b,c ...]`: the checks before any work (the spec, TRL's checks of swept
trainer values, the checkout's code equal to its commit), Prefect's temporary server, the sweep flow
(pipelines/flow/sweep.py), Ctrl-C as one line (exit 130), the summary. Prefect is imported only after the
temporary server is launched: Prefect reads its settings when it is imported.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from components.common.entry import fail
from components.common.errors import ConfigError
from components.common.files import repo_root
from pipelines.params.sweep_spec import SweepSpec, read_spec

CODE = ("components/", "pipelines/", "dvc.yaml")  # what a trial runs at the commit, not as the checkout has it


def check_checkout(root: Path) -> None:
    """Trials run the commit's code: code that differs from it would be measured under a name it is not."""
    from pipelines.execution.gitrepo import changed_files

    changed = [f for f in changed_files(root) if f.startswith(CODE)]
    if changed:
        raise ConfigError(f"{changed[0]}: differs from the commit, and trials run the commit's code; commit it "
                          "first (params.yaml may differ)")


def cli_sweep(args: argparse.Namespace) -> int:
    """`grpoflow sweep [SPEC] [-S k=a,b ...]`: run the sweep; prints each trial and the summary."""
    from pipelines.execution.runtime import TemporaryServer, prefect_env_defaults

    prefect_env_defaults()
    root = repo_root()
    if not (root / "dvc.yaml").is_file():
        return fail(f"{root}: no dvc.yaml here; run grpoflow from the repository", 2)
    spec = read_spec(args.spec, list(args.overrides), root / "params.yaml", args.trials, args.parallel)
    if any(key.startswith(("grpo.trainer.", "sft.trainer.")) for key in [p.key for p in spec.parameters]):
        _check_trainer_values(spec, root)
    check_checkout(root)
    server = TemporaryServer.launch()
    if server is not None:
        server.use()
    from prefect.task_runners import ThreadPoolTaskRunner

    from pipelines.flow import sweep_report
    from pipelines.flow.sweep import sweep_flow
    from pipelines.flow.sweep_search import Journal
    from pipelines.flow.sweep_trial import STOPPING

    def interrupt(signum: int, frame: object) -> None:
        STOPPING.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    from pipelines.flow.run import _no_interrupt_crash_lines

    for name in ("prefect.task_runs", "prefect.flow_runs"):  # Prefect's crash lines: the one line below says it
        logging.getLogger(name).addFilter(_no_interrupt_crash_lines)
    try:
        summary = sweep_flow.with_options(task_runner=ThreadPoolTaskRunner(max_workers=spec.parallel))(spec)
    except KeyboardInterrupt:
        done = sum(r["status"] == "finished" for r in Journal(root / ".dvc/tmp/sweeps" / spec.name).trials().values())
        print(f"\ninterrupted: {done} trials of sweep '{spec.name}' finished; the same command continues it "
              "(finished trials are not run again)", file=sys.stderr, flush=True)
        return 130
    print(sweep_report.format_summary(summary))
    return 0 if summary.chosen else 1


def _check_trainer_values(spec: SweepSpec, root: Path) -> None:
    """TRL's own checks of every swept trainer value (a key params.yaml leaves out is TRL's to know)."""
    from components import grpo, sft
    from components.common.params_load import load_params
    from pipelines.params.presets import override_list

    for p in spec.parameters:
        for value in p.values or (p.low, p.high):
            params = load_params(root / "params.yaml", [*spec.overrides, *override_list({p.key: value})])
            try:
                (sft if p.key.startswith("sft.") else grpo).trainer_settings(params)
            except ConfigError as exc:
                raise ConfigError(f"parameters.{p.key}: {exc}") from None
