"""Entry points: the `--params FILE -S section.key=value` options every command takes, and
`stage_main`, the `main()` of every stage module (`python -m components.<stage> [--params F] [-S k=v]`).
"""

from __future__ import annotations

import argparse
import sys
import typing
from typing import Any

from components.errors import GrpoflowError
from components.params import Params
from components.params_load import DEFAULT_PARAMS, PARAMS_ENV, load_params


def add_params_args(parser: argparse.ArgumentParser) -> None:
    """The `--params FILE -S section.key=value` options shared by every entry point."""
    parser.add_argument(
        "--params",
        default=None,
        metavar="FILE",
        help=f"params file (default: ${PARAMS_ENV} or {DEFAULT_PARAMS})",
    )
    parser.add_argument(
        "-S",
        "--set-param",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one param, as in `dvc exp run -S`; repeatable",
    )


def stage_main(stage: str, doc: str | None, run: typing.Callable[[Params], Any], argv: list[str] | None = None) -> int:
    """The entry point of every stage module (`python -m components.<stage> [--params F] [-S k=v]`):
    load the params, run the stage; an actionable error is one line on stderr and exit code 2."""
    import logging

    parser = argparse.ArgumentParser(prog=f"python -m components.{stage}", description=(doc or "").split("\n\n")[0])
    add_params_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        run(load_params(args.params, args.overrides))
    except GrpoflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0

