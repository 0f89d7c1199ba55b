"""The servers grpoflow starts and the services it talks to.

A server grpoflow starts (`grpoflow serve`, `grpoflow ui`) answers beyond this machine only with
authentication on: `require_auth_beyond_loopback` refuses any other bind address, in one line naming
how to turn it on.

A service that goes away (the MLflow tracking server, the DVC remote) ends a command within
GRPOFLOW_SERVICE_TIMEOUT_S seconds (default 30), with one line naming its address and how to start it:

- MLflow: `service_env_defaults()` (the CLI and the flows call it first) sets MLflow's own HTTP
  settings, unless they are set already: each call tries 3 times, at most T seconds each
  (MLFLOW_HTTP_REQUEST_TIMEOUT, T = (budget - 3) / 3: 9 s of the default 30), 0 then 2 s apart
  (MLFLOW_HTTP_REQUEST_MAX_RETRIES=2, MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR=1, _JITTER=1): a server that
  refuses connections fails a call in about 3 s, one that accepts but never answers in the budget.
  MLflow's defaults (7 retries, backoff factor 2, 120 s per request) took 249 s to give up on a gate
  whose server was killed. The stages inherit the settings through their environment. An artifact
  store that needs longer for one request (a large model behind a slow object store) needs a larger
  budget, or MLflow's own variables set.
- `unavailable(exc)` turns the error MLflow raises when the server does not answer (connection
  refused or reset, timed out, retries spent on 5xx answers) into TrackingUnavailable, which the CLI
  prints as one line (`one_line_service_errors`, around every command), exit 1.
- DVC: `check_remote(root)` asks the default remote's address for a TCP connection (a folder remote:
  whether its folder can be read), within the budget, before `grpoflow run` and before each pull and
  push: a remote that does not answer is one line instead of DVC's own retries.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.common.errors import ConfigError, ServiceUnavailable, TrackingUnavailable

TIMEOUT_ENV = "GRPOFLOW_SERVICE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 30.0
MLFLOW_RETRIES = 2  # three tries in all
MLFLOW_BACKOFF = 1  # urllib3 sleeps 0, then 2 * factor (+ up to JITTER) seconds between the tries
MLFLOW_JITTER = 1.0
_BACKOFF_S = 2 * MLFLOW_BACKOFF + MLFLOW_JITTER  # the most the sleeps between three tries add up to


def is_loopback(host: str) -> bool:
    """True when a server bound to `host` answers this machine only.

    >>> [is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "", "10.0.0.5", "myhost")]
    [True, True, True, False, False, False, False]
    """
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "" (every interface) or a name that may resolve to anything


def require_auth_beyond_loopback(host: str, authenticated: bool, how: str) -> None:
    """Refuse to bind a server beyond loopback without authentication; `how` says how to turn it on.
    Loopback needs none."""
    if not authenticated and not is_loopback(host):
        raise ConfigError(f"--host {host or '(every interface)'} is reachable from the network: {how}, "
                          "or bind to 127.0.0.1")


# --------------------------------------------------------------------------- the budget


def timeout_s() -> float:
    """GRPOFLOW_SERVICE_TIMEOUT_S: how long one call to a service that does not answer may take."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw.strip() else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: expected a number of seconds, e.g. 30") from None
    if value < 5:
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: at least 5 seconds")
    return value


def mlflow_http_settings(budget_s: float) -> dict[str, str]:
    """MLflow's HTTP settings that end a call to a server that does not answer within `budget_s`.

    >>> (mlflow_http_settings(30.0)["MLFLOW_HTTP_REQUEST_TIMEOUT"],
    ...  mlflow_http_settings(300.0)["MLFLOW_HTTP_REQUEST_TIMEOUT"])
    ('9', '99')
    """
    tries = MLFLOW_RETRIES + 1
    return {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(MLFLOW_RETRIES),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": str(MLFLOW_BACKOFF),
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": str(MLFLOW_JITTER),
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, int((budget_s - _BACKOFF_S) / tries))),
    }


def service_env_defaults() -> None:
    """MLflow's HTTP settings for the budget, in this process's environment (inherited by the stages);
    a value already set wins."""
    for key, value in mlflow_http_settings(timeout_s()).items():
        os.environ.setdefault(key, value)


# --------------------------------------------------------------------------- MLflow


def _chain(exc: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def unavailable(exc: BaseException) -> TrackingUnavailable | None:
    """The one-line error for `exc` when a tracking server that did not answer caused it, else None
    (another service's failure keeps its own error)."""
    import requests

    for e in _chain(exc):
        text = str(e).lower()
        if isinstance(e, requests.exceptions.Timeout) or (
                isinstance(e, requests.exceptions.ConnectionError) and "timed out" in text):
            tries = int(os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", MLFLOW_RETRIES)) + 1
            problem = f"no answer in {tries} tries of {os.environ.get('MLFLOW_HTTP_REQUEST_TIMEOUT', '?')} s"
        elif isinstance(e, requests.exceptions.RetryError):
            problem = "kept answering with server errors"
        elif isinstance(e, requests.exceptions.ConnectionError):
            problem = "refused the connection" if "refused" in text else "dropped the connection"
        else:
            continue
        server = _tracking_server(getattr(getattr(e, "request", None), "url", None) or "")
        return None if server is None else _tracking_error(server, f"stopped answering ({problem})")
    return None


def _tracking_server(url: str) -> str | None:
    """This process's tracking (or registry) URI when `url` (a failed request's; "" unknown) went to it."""
    import mlflow

    netloc = urllib.parse.urlsplit(url).netloc
    for uri in (mlflow.get_tracking_uri(), mlflow.get_registry_uri()):
        parts = urllib.parse.urlsplit(uri)
        if parts.scheme in ("http", "https") and (not netloc or parts.netloc == netloc):
            return uri
    return None


def _tracking_error(uri: str, problem: str) -> TrackingUnavailable:
    from components.common.tracking import tracking_unavailable

    return tracking_unavailable(uri, problem)


def one_line_service_errors(command: Callable[[], Any]) -> Any:
    """Run `command`; an error caused by a tracking server that stopped answering becomes
    TrackingUnavailable (one line, exit 1, through components.common.entry.one_line_errors)."""
    try:
        return command()
    except Exception as exc:
        if (line := unavailable(exc)) is None:
            raise
        raise line from None


SERVICE_GONE = ("Max retries exceeded", "timeout exception", "does not answer", "stopped answering")


def no_service_failure_lines(record: logging.LogRecord) -> bool:
    """A log filter for Prefect's task and flow run loggers: False for their failure records (a
    traceback, "Finished in state Failed(...)") of a service that stopped answering, which the one line
    the CLI prints says better; any other failure is still shown."""
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None:
        return not (isinstance(exc, ServiceUnavailable) or unavailable(exc) is not None)
    message = record.getMessage()
    return not ("Finished in state Failed" in message and any(m in message for m in SERVICE_GONE))


# --------------------------------------------------------------------------- the DVC remote


def remote_address(url: str, options: dict[str, Any]) -> tuple[str, int] | None:
    """Host and port a DVC remote's data travels through (its endpoint, or its cloud's), or None
    when it is a folder or its address is not known here.

    >>> remote_address("s3://bucket/dvc", {"endpointurl": "http://127.0.0.1:9000"})
    ('127.0.0.1', 9000)
    >>> remote_address("ssh://me@host.example/store", {}), remote_address("/shared/remote", {})
    (('host.example', 22), None)
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    endpoint = options.get("endpointurl") or (os.environ.get("AWS_ENDPOINT_URL") if scheme == "s3" else None)
    if endpoint:
        parts = urllib.parse.urlsplit(endpoint)
        scheme = parts.scheme.lower()
    defaults = {"http": 80, "https": 443, "ssh": 22, "s3": 443, "gs": 443, "gcs": 443}
    hosts = {"s3": "s3.amazonaws.com", "gs": "storage.googleapis.com", "gcs": "storage.googleapis.com"}
    if scheme not in defaults:
        return None
    host = hosts.get(scheme) if not endpoint and scheme in hosts else parts.hostname
    port = int(options.get("port") or parts.port or defaults[scheme])
    return (host, port) if host else None


def _answers(target: Callable[[], object], budget_s: float) -> str | None:
    """Run `target` in a thread for at most `budget_s`: None when it returned, else why not."""
    outcome: list[str | None] = []

    def run() -> None:
        try:
            target()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc.strerror or str(exc))

    thread = threading.Thread(target=run, daemon=True)  # a hung NFS read cannot be interrupted: left behind
    thread.start()
    thread.join(budget_s)
    return outcome[0] if outcome else f"no answer within {budget_s:.0f} s"


def remote_settings(root: str | os.PathLike) -> tuple[str | None, dict[str, Any]]:
    """(name, settings: url, endpointurl, ...) of the repo's default DVC remote; (None, {}) without one."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        name = repo.config["core"].get("remote")
        return name, dict(repo.config["remote"].get(name, {})) if name else {}


def check_remote(root: str | os.PathLike) -> None:
    """ServiceUnavailable, in one line, when the default DVC remote does not answer within the budget."""
    name, options = remote_settings(root)
    url = options.get("url", "")
    if not name or not url:
        return
    budget = timeout_s()
    address = remote_address(url, options)
    if address is not None:
        scheme = urllib.parse.urlsplit(options.get("endpointurl") or url).scheme.lower()
        if scheme in urllib.request.getproxies():
            return  # reached through a proxy: its own address says nothing
        why = _answers(lambda: socket.create_connection(address, timeout=budget).close(), budget)
        where = f"{address[0]}:{address[1]}"
    elif "://" not in url:
        folder = Path(url) if os.path.isabs(url) else Path(root) / ".dvc" / url
        why = _answers(folder.exists, budget)  # a missing folder is fine (push makes it); a dead mount hangs
        where = str(folder)
    else:
        return
    if why is not None:
        raise ServiceUnavailable(
            f"the DVC remote '{name}' ({url}) does not answer at {where} ({why}); start it (compose's MinIO: "
            f"`docker compose -f infra/compose.yaml up -d minio`) or make another remote the default "
            f"(`dvc remote default NAME`); {TIMEOUT_ENV} sets how long to wait"
        )
