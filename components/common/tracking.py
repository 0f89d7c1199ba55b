"""MLflow helpers shared by every stage and the flow: where to track, one run per stage.

Each stage wraps its work in `stage_run`:

    from components.common.tracking import stage_run
    with stage_run("sft", params) as run:      # an mlflow.ActiveRun
        ...                                     # mlflow.log_metric / log_artifact as usual

`stage_run` sets the tracking URI (the MLFLOW_TRACKING_URI environment variable wins over
`tracking.uri`; a relative sqlite path is made absolute against the repo root, so every
process of one pipeline run writes to the same file), creates the experiment on first use
(with its artifacts under `tracking.artifact_location` for local stores, and the kind
`mlflow.experimentKind` = custom_model_development, so that the MLflow UI opens it on its
training runs rather than its GenAI overview), starts a run
named after the stage, nested under the pipeline's parent run when the flow put its id in
GRPOFLOW_PARENT_RUN_ID, logs the params of the stage's sections (those its `dvc.yaml`
entry lists, else the section named like the stage) flattened as `section.key`, tags the run
with the host and pid of its process (`grpoflow.host`, `grpoflow.pid`: the next pipeline start
marks a run whose process is gone KILLED), logs the data files it is given as MLflow datasets
(`log_datasets`: the Datasets column of the runs table, digest = the file's sha256), and marks
the run FAILED when the body raises (the exception propagates), with the error in one line as its tag
`grpoflow.error` (ERROR_TAG). Log files the body wrote (`logs=`, e.g. the vLLM engine's) become
artifacts under `logs/`, whether the stage succeeds or fails.

`package_versions` (library versions) is used by the training flow to tag its parent run and by
the registry to tag model versions. Names: run tags start with `grpoflow.`
(TAG_PREFIX), metric names join their parts with `/` (`metric_key`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import socket
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from components.common.errors import TrackingUnavailable
from components.common.files import repo_root, sha256_file
from components.common.params import Params

PARENT_ENV = "GRPOFLOW_PARENT_RUN_ID"
# Names: every run tag grpoflow writes starts with TAG_PREFIX; metric names join their parts
# with METRIC_SEP (`grpo/accuracy_strict`), which MLflow's UI groups into sections.
TAG_PREFIX = "grpoflow."
METRIC_SEP = "/"
STAGE_TAG = f"{TAG_PREFIX}stage"
HOST_TAG = f"{TAG_PREFIX}host"  # on every run: the process that opened it
PID_TAG = f"{TAG_PREFIX}pid"
# On a FAILED run: its error in one line (a stage's: what its entry point prints after `error: `), so
# the runs table and the run page say why; the pipeline's parent run carries the failed stage's.
ERROR_TAG = f"{TAG_PREFIX}error"
SHA256_TAG = f"{TAG_PREFIX}sha256"  # on dataset inputs: the file's full sha256 (MLflow digests hold 36 characters)
LINEAGE_PACKAGES = ("torch", "transformers", "trl", "peft", "vllm", "prefect", "mlflow", "dvc")
_LOCAL_SCHEMES = ("sqlite", "file", "")


def _scheme(uri: str) -> str:
    return uri.split(":", 1)[0].lower() if "://" in uri else ""


def resolve_tracking_uri(params: Params | None = None, base: str | os.PathLike | None = None) -> str:
    """MLFLOW_TRACKING_URI if set, else `tracking.uri`; relative local paths made absolute against `base`."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or (params.tracking.uri if params is not None else "")
    if not uri:
        uri = "sqlite:///mlflow.db"
    root = Path(base) if base is not None else repo_root()
    scheme = _scheme(uri)
    if scheme == "sqlite":
        path = uri[len("sqlite:///") :]
        if path and path != ":memory:" and not os.path.isabs(path):
            return f"sqlite:///{(root / path).resolve()}"
        return uri
    if scheme == "":  # a bare folder is MLflow's file store
        path = Path(uri)
        return str(path if path.is_absolute() else (root / path).resolve())
    return uri


def check_reachable(uri: str, timeout: float = 10.0) -> None:
    """Fail fast, naming the URI, when `uri` is an MLflow server that does not answer (MLflow's own
    client would retry for minutes); local stores need no check."""
    if _scheme(uri) not in ("http", "https"):
        return
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as resp:
            if resp.status < 500:
                return
            problem = f"answered HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        if exc.code < 500:  # e.g. 401 from an authenticating proxy: the server is there
            return
        problem = f"answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        problem = f"is not reachable ({getattr(exc, 'reason', exc)})"
    raise tracking_unavailable(uri, problem)


def tracking_unavailable(uri: str, problem: str) -> TrackingUnavailable:
    """The one-line error for a tracking server at `uri` that `problem` (e.g. "is not reachable (…)"):
    its URI and the commands that start one."""
    return TrackingUnavailable(
        f"the MLflow tracking server at {uri} {problem}; start it (`mlflow server --port PORT`, or "
        "`docker compose -f infra/compose.yaml up -d`) or point tracking.uri / MLFLOW_TRACKING_URI at one that runs"
    )


def ui_address(uri: str) -> str:
    """Where a user opens the MLflow UI for `uri`: the server itself, or `grpoflow ui`'s default address."""
    return uri.rstrip("/") if _scheme(uri) in ("http", "https") else "http://127.0.0.1:5000"


def resolve_artifact_location(params: Params, uri: str, base: str | os.PathLike | None = None) -> str | None:
    """A file URI for new experiments on a local store; None lets a tracking server decide."""
    if _scheme(uri) not in _LOCAL_SCHEMES or params is None or not params.tracking.artifact_location:
        return None
    loc = params.tracking.artifact_location
    if "://" in loc:
        return loc
    root = Path(base) if base is not None else repo_root()
    path = Path(loc) if os.path.isabs(loc) else root / loc
    return path.resolve().as_uri()


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
# MLflow 3's UI picks an experiment's first page from its kind: "custom_model_development" is its
# "Model training" view (the runs table); without the tag it may infer "genai_development".
EXPERIMENT_KIND = "custom_model_development"


def _kind_to_set(tags: dict[str, str]) -> bool:
    """True when the experiment's kind is missing or only inferred; a kind someone chose stays."""
    kind = tags.get(EXPERIMENT_KIND_TAG, "")
    return kind in ("", "no_inferred_type") or kind.endswith("_inferred")


def configure(params: Params, base: str | os.PathLike | None = None) -> str:
    """Point mlflow at the resolved URI and experiment (created if missing); returns the experiment id."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = resolve_tracking_uri(params, base)
    mlflow.set_tracking_uri(uri)
    name = params.tracking.experiment if params is not None else "grpoflow"
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            exp_id = client.create_experiment(
                name, artifact_location=resolve_artifact_location(params, uri, base),
                tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
            )
        except MlflowException:  # another process created it between our two calls
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            exp_id = exp.experiment_id
    else:
        exp_id = exp.experiment_id
    if exp is not None and _kind_to_set(exp.tags):  # an experiment an older grpoflow (or MLflow) created
        try:
            client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        except MlflowException:  # another process set it between our read and our write
            if _kind_to_set(client.get_experiment(exp_id).tags):
                raise
    mlflow.set_experiment(experiment_id=exp_id)
    return exp_id


def metric_key(*parts: str) -> str:
    """The one way metric names are spelled.

    >>> metric_key("grpo", "accuracy_strict")
    'grpo/accuracy_strict'
    """
    return METRIC_SEP.join(parts)


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{'grpo': {'trainer': {'lr': 1e-5}}} -> {'grpo.trainer.lr': '1e-05'} (MLflow params are strings)."""
    out: dict[str, str] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = str(value)
    return out


def stage_sections(stage: str, params: Params, dvc_yaml: str | os.PathLike | None = None) -> list[str]:
    """Param sections the stage depends on: the top-level keys its dvc.yaml `params:` names."""
    known = list(params.to_dict()) if params is not None else []
    path = Path(dvc_yaml) if dvc_yaml else repo_root() / "dvc.yaml"
    sections: list[str] = []
    if path.is_file():
        import yaml

        try:
            entry = (yaml.safe_load(path.read_text()) or {}).get("stages", {}).get(stage) or {}
        except yaml.YAMLError:
            entry = {}
        for item in entry.get("params", []) or []:
            # Items are "section", "section.key", or {params_file: [keys]}.
            keys = [item] if isinstance(item, str) else [k for v in item.values() for k in (v or [])]
            for key in keys:
                section = str(key).split(".", 1)[0]
                if section in known and section not in sections:
                    sections.append(section)
    if not sections and stage in known:
        sections = [stage]
    return sections


def process_tags() -> dict[str, str]:
    """The host and pid of this process, tagged on every run it opens."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


DatasetFiles = Mapping[str, tuple[str | os.PathLike, str]]  # {name: (JSONL file, context)}


def data_splits(params: Params, **contexts: str) -> dict[str, tuple[Path, str]]:
    """{split: (file, context)} of the prepared splits, e.g. data_splits(params, train="training")."""
    return {split: (Path(params.data.output_dir) / f"{split}.jsonl", ctx) for split, ctx in contexts.items()}


def log_datasets(run_id: str, files: DatasetFiles) -> None:
    """Each existing JSONL file as an MLflow dataset input of the run (schema and row count from its
    rows, integers as doubles; digest = the first 36 hex digits of its sha256, the most MLflow
    stores; the full sha256 is the input tag `grpoflow.sha256`), with its context (`training`,
    `evaluation`, ...)."""
    import mlflow
    import pandas as pd
    from mlflow.entities import DatasetInput, InputTag

    inputs = []
    for name, (path, context) in files.items():
        path = Path(path)
        if not path.is_file():
            continue
        sha = sha256_file(path)
        rows = pd.read_json(path, lines=True, dtype=False)
        # Integer columns (`steps`) declared as doubles, as MLflow advises for columns that may miss
        # values (a source without step counts); inferred as integers, each stage printed a hint.
        rows = rows.astype({column: "float64" for column in rows.select_dtypes("integer").columns})
        with warnings.catch_warnings():  # MLflow finds two equal ways to read a local path and says so
            warnings.simplefilter("ignore", UserWarning)
            dataset = mlflow.data.from_pandas(rows, source=str(path.resolve()), name=name, digest=sha[:36])
        tags = [InputTag("mlflow.data.context", context), InputTag(SHA256_TAG, sha)]
        inputs.append(DatasetInput(dataset._to_mlflow_entity(), tags=tags))
    if inputs:
        mlflow.MlflowClient().log_inputs(run_id, inputs)


@contextlib.contextmanager
def stage_run(
    stage: str, params: Params, extra_params: Mapping[str, Any] | None = None, datasets: DatasetFiles | None = None,
    logs: list[str | os.PathLike] | tuple[str | os.PathLike, ...] = (),
) -> Iterator[Any]:
    """An MLflow run for one stage, nested under the flow's parent run when there is one. The files
    of `logs` that the body wrote (an engine's log) become artifacts under `logs/`, success or not."""
    import time

    import mlflow

    started = time.time() - 1.0  # file times tick coarser than time.time(): a margin, not a race

    configure(params)
    parent = os.environ.get(PARENT_ENV) or None
    active = mlflow.active_run()
    nested = active is not None
    if parent and active is not None and active.info.run_id != parent:
        parent = None  # a run of this process is open: nest under it instead of the env's
    run = mlflow.start_run(
        run_name=stage, parent_run_id=parent, nested=nested, tags={STAGE_TAG: stage, **process_tags()}
    )
    try:
        if datasets:
            log_datasets(run.info.run_id, datasets)
        logged: dict[str, str] = {}
        if params is not None:
            full = params.to_dict()
            for section in stage_sections(stage, params):
                logged.update(flatten(full[section], f"{section}."))
        if extra_params:
            logged.update(flatten(extra_params))
        if logged:
            mlflow.log_params(logged)
        yield run
    except BaseException as exc:
        _log_files(run.info.run_id, logs, started, failing=True)
        _tag_error(run.info.run_id, exc)
        _end_until(run.info.run_id, "FAILED")
        raise
    else:
        _log_files(run.info.run_id, logs, started)
        _end_until(run.info.run_id, "FINISHED")


def _log_files(run_id: str, paths, since: float, failing: bool = False) -> None:
    """The files of `paths` written since `since` (this run's, not an earlier run's left in place), as
    artifacts under `logs/`; best effort on a failing stage (its own error is the one to report)."""
    import mlflow

    for path in map(Path, paths):
        try:
            if path.is_file() and path.stat().st_mtime >= since:
                mlflow.MlflowClient().log_artifact(run_id, str(path), "logs")
        except Exception:  # noqa: BLE001
            if not failing:
                raise


def error_line(exc: BaseException) -> str:
    """An exception in one line, as a stage's entry point states it: a grpoflow error's own message
    (components/common/errors.py; the entry prints it after `error: `), anything else with its type.

    >>> from components.common.errors import DataError
    >>> error_line(DataError("data/x.jsonl line 3: no 'question'\\nmore")), error_line(KeyError("gold"))
    ("data/x.jsonl line 3: no 'question'", "KeyError: 'gold'")
    """
    from components.common.errors import GrpoflowError

    text = (str(exc).strip().splitlines() or [""])[0]
    return text if isinstance(exc, GrpoflowError) and text else f"{type(exc).__name__}: {text}".rstrip(": ")


def _tag_error(run_id: str, exc: BaseException) -> None:
    """ERROR_TAG on a failing stage's run. Best effort: the stage's own error is what propagates, not
    a second one from a tracking store that fails too."""
    import mlflow

    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return
    try:
        mlflow.MlflowClient().set_tag(run_id, ERROR_TAG, error_line(exc)[:MAX_TAG_CHARS])
    except Exception:  # noqa: BLE001 (the stage's error is the one to report)
        pass


MAX_TAG_CHARS = 8000  # MLflow's limit on a tag's value


def _end_until(run_id: str, status: str) -> None:
    """End runs the body left open, then ours (a stage's nested runs must not outlive it)."""
    import mlflow

    while (active := mlflow.active_run()) is not None:
        mlflow.end_run(status=status)
        if active.info.run_id == run_id:
            return
    mlflow.MlflowClient().set_terminated(run_id, status=status)  # the body already ended it


# --------------------------------------------------------------------------- lineage


def package_versions(names: tuple[str, ...] = LINEAGE_PACKAGES) -> dict[str, str]:
    """Installed version of each distribution, 'not-installed' when absent (e.g. vllm on a CPU box)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not-installed"
    return out


def is_timing(key: str) -> bool:
    """Wall-clock values, which differ run to run (train_seconds, step_time, completions_per_second, ...):
    kept out of model folders and histories, shown but not compared by `grpoflow reproduce`."""
    return key.endswith(("_seconds", "_time", "_runtime", "_per_second"))
