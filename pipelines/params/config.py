"""`python -m pipelines.params.config`: the effective params (params.yaml with `-S` overrides applied),
each key preceded by its help text as a comment. The output is YAML.

A key's help is the comment block right above it in the repository's params.yaml (as in a Helm
chart's values.yaml), read by `read_help`; a section's help is the block above the section's line, and
an entry of a mapping (`grpo.trainer.beta`) has the block above it, where it has one.
No stage imports this module and DVC hashes params by value, so editing a help sentence re-runs no stage.

    python -m pipelines.params.config                       # every key, its value and what it does
    python -m pipelines.params.config -S grpo.trainer.beta=0.0      # after an override (params.yaml unchanged)

It is also the one import for code outside the stages (the flow, the CLI, tests, benchmarks) that
needs the params API: the schema (components/common/params.py), loading
(components/common/params_load.py) and the flow-only writer and remote allow-list
(pipelines/params/overrides.py). Stages import the modules they need directly, so that neither this
module, the help text nor the writer is a stage's dvc.yaml dep.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import textwrap
from pathlib import Path

import yaml

from components.common.entry import add_params_args, stage_main
from components.common.errors import ConfigError
from components.common.params import (
    GRPO_LOSS_TYPES,
    PLACEMENTS,
    SECTIONS,
    DataParams,
    EvaluateParams,
    GRPOParams,
    ModelParams,
    Params,
    PlacementParams,
    RegisterParams,
    RewardsParams,
    SFTParams,
    TrackingParams,
)
from components.common.params_load import apply_override, load_params, params_in, parse_override
from components.common.tracking import check_reachable, repo_root, resolve_tracking_uri
from pipelines.params.overrides import REMOTE_OVERRIDES, check_remote_overrides, write_overrides

__all__ = [
    "ConfigError", "Params", "SECTIONS", "PLACEMENTS", "GRPO_LOSS_TYPES", "DataParams", "ModelParams", "SFTParams",
    "GRPOParams", "RewardsParams", "EvaluateParams", "RegisterParams", "TrackingParams", "PlacementParams",
    "load_params", "params_in", "parse_override", "apply_override", "add_params_args", "stage_main",
    "write_overrides", "check_remote_overrides", "REMOTE_OVERRIDES", "describe", "read_help",
]


def load_checked(args: argparse.Namespace, root: Path | None = None) -> Params:
    """A command's params (its --params file or the repo's, with -S overrides) and a tracking server
    that answers, or a GrpoflowError: what every command that talks to MLflow checks before any work."""
    params = load_params(params_in(root) if root else args.params, args.overrides)
    check_reachable(resolve_tracking_uri(params, root))
    return params


def read_help(text: str) -> dict[str, str]:
    r"""The help of every key of a params.yaml text: `section.key` (and `section` for a section's own
    block) to the `#` comment lines right above that key, joined into one paragraph; an entry of a
    mapping-valued key with such a block above it too, as `section.key.entry` (`grpo.trainer.beta`).

    >>> read_help("# Seeds.\nrun:\n  # How many.\n  # At most 9.\n  n: 3\n  m: 4   # inline: not help\n")
    {'run': 'Seeds.', 'run.n': 'How many. At most 9.', 'run.m': ''}
    >>> read_help("run:\n  # Args.\n  t:\n    # Rate.\n    lr: 1\n    seed: 0  # inline\n")
    {'run': '', 'run.t': 'Args.', 'run.t.lr': 'Rate.'}
    """
    out: dict[str, str] = {}
    block: list[str] = []
    section = key = ""
    for line in text.splitlines():
        comment = re.match(r"^(\s*)# ?(.*)$", line)
        found = re.match(r"^( {0,2}| {4})([A-Za-z_]\w*):", line)
        if comment:
            block.append(comment.group(2).strip())
            continue
        if found and found.group(1) == "":
            section, key = found.group(2), ""
            out[section] = " ".join(block)
        elif found and section and found.group(1) != "    ":
            key = found.group(2)
            out[f"{section}.{key}"] = " ".join(block)
        elif found and key and block:
            out[f"{section}.{key}.{found.group(2)}"] = " ".join(block)
        block = []
    return out


def repo_help() -> dict[str, str]:
    """The help of every key, from the repository's params.yaml."""
    return read_help(params_in(repo_root()).read_text())


def describe(params: Params, width: int = 100, help: dict[str, str] | None = None) -> str:
    """`params` as YAML, every section and key preceded by its help text as `#` comments.

    >>> text = describe(load_params(None, ["grpo.trainer.beta=0.0"]))
    >>> print(text[text.index("    # KL coeff"):text.index("    # PPO")], end="")
        # KL coefficient to the frozen reference model (k3 estimator); 0 drops the reference. 0.1 rather
        # than the GRPO paper's 0.04 (the tiny and GPU presets): kept from the SmolLM2 recipe this
        # default grew from, where 0.04 at a learning rate of 2e-4 lost 43 points on the 2-step band.
        beta: 0.0
    """
    help = repo_help() if help is None else help

    def comment(text: str, indent: str) -> list[str]:
        wrapped = textwrap.wrap(text, width - 2 - len(indent), break_on_hyphens=False, break_long_words=False)
        return [f"{indent}# {line}" for line in wrapped]

    lines: list[str] = []
    for name, cls in SECTIONS.items():
        lines += [*comment(help.get(name, ""), ""), f"{name}:"]
        section = getattr(params, name)
        for f in dataclasses.fields(cls):
            lines += comment(help.get(f"{name}.{f.name}", ""), "  ")
            value = yaml.safe_dump({f.name: getattr(section, f.name)}, sort_keys=False, width=width)
            for line in value.splitlines():
                entry = re.match(r"^  (\w+):", line)  # an entry of a mapping: its help, if it has one
                lines += comment(help.get(f"{name}.{f.name}.{entry.group(1)}", ""), "    ") if entry else []
                lines.append(f"  {line}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.params.config",
        description="Print the effective params (after overrides) as YAML, every key with its explanation.",
    )
    add_params_args(parser)
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params, args.overrides)
    except ConfigError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(describe(params), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
