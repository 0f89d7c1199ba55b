"""Entry points: the `--params FILE -S section.key=value` options every command takes,
`one_line_errors`, the one wrapper that turns errors into one line on stderr and an exit code (used by
`grpoflow` for every subcommand and by every module's `main()`), and `stage_main`, the `main()` of
every stage module (`python -m components.<stage> [--params F] [-S k=v]`).

Exit codes: 2 for input a user can fix (components/common/errors.py GrpoflowError), 1 for a service that
does not answer (ServiceUnavailable: the tracking server, the DVC remote), a stage that failed
(CommandFailed) or an error MLflow or DVC raised; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
import typing

from components.common.errors import CommandFailed, GrpoflowError, ServiceUnavailable
from components.common.params import Params
from components.common.params_load import DEFAULT_PARAMS, PARAMS_ENV, load_params


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


def fail(message: BaseException | str, code: int) -> int:
    """Print `error: message` on stderr; return `code`."""
    print(f"error: {message}", file=sys.stderr)
    return code


def _external_error(exc: BaseException) -> str | None:
    """One line for an error MLflow or DVC raised (their own types), else None."""
    if "mlflow" in sys.modules:
        from mlflow.exceptions import MlflowException

        if isinstance(exc, MlflowException):
            return f"MLflow: {getattr(exc, 'message', exc)}"
    if "dvc" in sys.modules:
        from dvc.exceptions import DvcException

        if isinstance(exc, DvcException):
            return f"DVC: {exc}"
    return None


def one_line_errors(command: typing.Callable[[], int | None]) -> int:
    """Run a command; actionable and service errors become one line and an exit code."""
    try:
        return int(command() or 0)
    except ServiceUnavailable as exc:
        return fail(exc, 1)
    except GrpoflowError as exc:
        return fail(exc, 2)
    except CommandFailed as exc:
        return fail(exc, 1)
    except Exception as exc:
        if (line := _external_error(exc)) is None:
            raise  # a bug: the traceback is what helps
        return fail(line, 1)


def stage_main(
    stage: str, doc: str | None, run: typing.Callable[[Params], object], argv: list[str] | None = None
) -> int:
    """The entry point of every stage module (`python -m components.<stage> [--params F] [-S k=v]`):
    load the params, run the stage; errors through `one_line_errors`."""
    import logging

    parser = argparse.ArgumentParser(prog=f"python -m components.{stage}", description=(doc or "").split("\n\n")[0])
    add_params_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    def body() -> int:
        run(load_params(args.params, args.overrides))
        return 0

    return one_line_errors(body)

