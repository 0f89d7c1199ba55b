"""Shared test fixtures: every test runs with its state (MLflow, Prefect, DVC, HF) isolated
under a temporary folder and with no network access to the Hugging Face hub."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Set before any test module imports transformers/datasets/mlflow/prefect.
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ[key] = value
# `make test VENV=DIR` hands its command-line variables to every process below it, as variables of the
# environment and again in MAKEFLAGS: a test that ran `make clean` in a copy of the Makefile removed the
# caller's DIR. Tests run make as a user does, without the outer make's command line.
if "MAKELEVEL" in os.environ:
    _line = os.environ.get("MAKEFLAGS", "").partition(" -- ")[2]
    for _word in re.split(r"(?<!\\) ", _line):
        os.environ.pop(_word.partition("=")[0], None)
    for key in ("MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKELEVEL"):
        os.environ.pop(key, None)
# Prefect reads its settings when it is first imported, so a later monkeypatch.setenv does not
# reach them: the temporary API server's start-up timeout (20 s by default, too short for a cold
# first start on 2 busy cores) must be raised here, before any test module imports prefect.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")

# Under pytest-xdist (`make test` runs a worker a core) each worker owns cores / workers threads, set
# before torch is imported and inherited by the stages' subprocesses: workers of as many threads as
# the machine has cores slow each other down.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(key, str(max(1, _cores // _WORKERS)))

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


# The slow tier's longest scenario, a third of its time: under pytest-xdist (`make test-slow`) it is
# handed out first, so that the other scenarios share the remaining workers beside it.
LONGEST_FIRST = ("tests/slow/test_real_model.py",)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def isolated_state(tmp_path_factory, monkeypatch):
    """Point MLflow, Prefect, DVC's site cache, HF caches and grpoflow's base cache at a per-test temp folder."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{state / 'mlflow.db'}")
    monkeypatch.setenv("PREFECT_HOME", str(state / "prefect"))
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(state / "dvc-site-cache"))
    monkeypatch.setenv("HF_HOME", str(state / "hf"))
    monkeypatch.setenv("GRPOFLOW_CACHE", str(state / "grpoflow-cache"))  # bases fetched from the registry
    monkeypatch.delenv("GRPOFLOW_PARENT_RUN_ID", raising=False)
    monkeypatch.delenv("GRPOFLOW_PARAMS", raising=False)
    _reset_mlflow_globals()
    yield state
    _reset_mlflow_globals()


@pytest.fixture(scope="session")
def baseline(tmp_path_factory):
    """One finished small pipeline run for the whole session (tests/project_repo.Baseline): scenarios that
    only read it share it; those that change it work on `baseline.copy(tmp_path / "copy")`."""
    from tests.project_repo import make_baseline

    return make_baseline(tmp_path_factory.mktemp("baseline"))


@pytest.fixture(scope="session", autouse=True)
def prefect_temporary_server_stopped_at_the_end():
    """In-process flows share one Prefect temporary server for the session (it starts with the first flow);
    stop it while pytest still captures its goodbye log line."""
    yield
    if "prefect.server.api.server" in sys.modules:
        from tests.toy_repo import stop_prefect_temporary_server

        stop_prefect_temporary_server()


def _reset_mlflow_globals() -> None:
    """mlflow.set_tracking_uri() sets a process-wide value that beats MLFLOW_TRACKING_URI; a test
    that called it (directly or through components.common.tracking) must not leak it into the next test."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)
