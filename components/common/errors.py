"""The errors grpoflow raises for things a user can fix; every command line prints their message
(no traceback) and exits with code 2.

    GrpoflowError           the base: `except GrpoflowError` catches every actionable error
      ConfigError           a params.yaml key or `-S` override is unknown, mistyped or out of range
      InputError            a stage input (data file, model folder, report) is missing or malformed;
        DataError           the message names the file, the line and the field
      BackendError          a generation backend was asked for but cannot run here
      EvaluationError       bad input to an evaluation (data, model, settings)
      RegistryError         a registry operation cannot proceed
      ServiceUnavailable    a service does not answer (exit code 1): the DVC remote, or
        TrackingUnavailable the MLflow tracking server; the message names it and how to start it
    CommandFailed           not the user's input: a stage, or DVC on it, failed (exit code 1); the message
                            starts with the line that says why, then the stage's last lines of output

Only the standard library is imported here: every module can import it.
"""

from __future__ import annotations


class GrpoflowError(Exception):
    """An error whose message tells the user what to fix."""


class ConfigError(GrpoflowError, ValueError):
    """A params.yaml key or override is unknown, mistyped or out of range."""


class InputError(GrpoflowError, ValueError):
    """A stage input (data file, model folder, report) is missing or malformed; the message says which and where."""


class DataError(InputError):
    """Bad input data; the message names the file, the line and the field."""


class BackendError(GrpoflowError, RuntimeError):
    """A backend was asked for but cannot run here; the message says how to make it available."""


class EvaluationError(GrpoflowError, RuntimeError):
    """Bad input to an evaluation (data, model, settings); the message says what to fix."""


class RegistryError(GrpoflowError, RuntimeError):
    """A registry operation cannot proceed; the message says what to do."""


class ServiceUnavailable(GrpoflowError, RuntimeError):
    """A service grpoflow talks to (the DVC remote, the tracking server) does not answer; the message
    names its address and how to start it."""


class TrackingUnavailable(ServiceUnavailable):
    """The MLflow tracking server does not answer; the message names its URI and how to start one."""


class CommandFailed(RuntimeError):
    """A stage, or DVC on it, failed (exit code 1): the message's first line says why, the lines after it
    are the stage's last lines of output (already streamed to the terminal)."""
