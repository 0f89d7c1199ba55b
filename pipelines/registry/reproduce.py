"""`grpoflow reproduce NAME VERSION`: re-derive a registered model version's metrics from its lineage.

    grpoflow reproduce grpoflow-policy 1                          # every stage from scratch
    grpoflow reproduce grpoflow-policy 1 --from-cache             # outputs from the DVC remote, re-evaluate only
    grpoflow reproduce grpoflow-policy 1 --workdir /tmp/v1 --tolerance 0.002

1. Reads the version's tags: `lineage.git_commit`, `lineage.git_dirty`, `lineage.pipeline_run_id`
   and the recorded metrics `metric.<model>.<key>` (full precision from the pipeline run's
   metrics `<model>/<key>` when it has them).
2. Says up front what cannot be reproduced exactly, naming the cause: a tree that was dirty at
   registration, library versions that differ from the run's (`grpoflow.version.<pkg>` run
   tags against this environment), and with --from-cache a DVC remote that is missing or empty.
3. Clones this repository into a clean working copy at that commit, restores the run's
   `lineage/params.yaml` and `lineage/dvc.lock` artifacts, links the vLLM venv
   (`evaluate.vllm_python`, git-ignored) from this checkout, and runs `dvc repro --force
   --no-run-cache` (every stage, from scratch) or, with --from-cache, `dvc pull` then `dvc repro
   --force --single-item evaluate`, with MLFLOW_TRACKING_URI pointing at the copy's own
   `mlflow.db`: nothing is written to this checkout's tracking store.
4. Prints the recorded metrics beside the re-derived ones (timings are shown, not compared)
   and which stage outputs came out byte-identical (dvc.lock md5s; the stages' summaries hold
   timings, so they differ); writes `reproduce.json` in the working copy. Exit 0 only when every compared metric is
   identical (within --tolerance).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from components.common.errors import ConfigError, RegistryError
from components.common.files import json_bytes, repo_root, write_files
from components.common.params import Params
from components.common.tracking import TAG_PREFIX, configure, is_timing, package_versions
from components.evaluation.reports import read_metrics
from pipelines.execution.dvc_ops import default_remote, stage_env
from pipelines.execution.gitrepo import has_commit, working_copy
from pipelines.execution.services import check_remote
from pipelines.execution.vllm_version import vllm_engine_version
from pipelines.params.config import load_params

METRIC_TAG = "metric."
VERSION_TAG = f"{TAG_PREFIX}version."


def _fmt(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def recorded_metrics(version_tags: dict[str, str], run_metrics: dict[str, float]) -> dict[tuple[str, str], float]:
    """{(model, key): value} of a version's `metric.<model>.<key>` tags, at the run's full precision.

    >>> recorded_metrics({"metric.grpo.accuracy_strict": "0.1200", "lineage.x": "y"}, {"grpo/accuracy_strict": 0.12})
    {('grpo', 'accuracy_strict'): 0.12}
    """
    out = {}
    for tag, value in version_tags.items():
        if tag.startswith(METRIC_TAG) and tag.count(".") >= 2:
            model, key = tag[len(METRIC_TAG) :].split(".", 1)
            out[(model, key)] = run_metrics.get(f"{model}/{key}", float(value))
    return out


def compare_metrics(
    recorded: dict[tuple[str, str], float], derived: dict[str, dict[str, Any]], tolerance: float
) -> list[dict[str, Any]]:
    """One row per recorded metric: recorded, reproduced, difference and a status (same | within
    tolerance | differs | missing | timing).

    >>> rows = compare_metrics({("grpo", "n"): 20.0, ("grpo", "load_seconds"): 3.0},
    ...                        {"grpo": {"n": 20, "load_seconds": 9.0}}, 0)
    >>> [(r["key"], r["status"]) for r in rows]
    [('load_seconds', 'timing'), ('n', 'same')]
    """
    rows = []
    for (model, key), value in sorted(recorded.items()):
        new = derived.get(model, {}).get(key)
        row: dict[str, Any] = {"model": model, "key": key, "recorded": value, "reproduced": new, "diff": None}
        if is_timing(key):
            row["status"] = "timing"
        elif not isinstance(new, (int, float)) or isinstance(new, bool):
            row["status"] = "missing"
        else:
            row["diff"] = float(new) - value
            row["status"] = ("same" if new == value
                             else "within tolerance" if abs(row["diff"]) <= tolerance else "differs")
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    width = max([len(f"{r['model']}/{r['key']}") for r in rows] + [6])
    lines = [f"  {'metric':<{width}}  {'recorded':>12}  {'reproduced':>12}  {'diff':>10}  status"]
    for r in rows:
        diff = "" if r["diff"] is None else f"{r['diff']:+.3g}"
        new = "-" if r["reproduced"] is None else _fmt(r["reproduced"])
        lines.append(
            f"  {r['model'] + '/' + r['key']:<{width}}  {_fmt(r['recorded']):>12}  {new:>12}  {diff:>10}  {r['status']}"
        )
    return "\n".join(lines)


def out_md5s(lock_text: str) -> dict[str, str]:
    """{out path: md5} of every stage output in a dvc.lock text."""
    import yaml

    stages = (yaml.safe_load(lock_text) or {}).get("stages") or {}
    return {o["path"]: o.get("md5", "") for entry in stages.values() for o in entry.get("outs") or []}


def timed_files(params: Params) -> set[str]:
    """The stage summaries that record seconds, so they differ between runs of the same inputs: the
    training summaries and every evaluated model's full metrics (not the headline DVC metrics)."""
    from components.evaluate import stage_models

    ev = Path(params.evaluate.output_dir)
    return {params.sft.metrics_file, params.grpo.metrics_file, *(str(ev / f"{m}.json") for m in stage_models(params))}


def caveats(version_tags: dict[str, str], run_tags: dict[str, str], params: Params | None = None) -> list[str]:
    """What keeps this reproduction from being exact, each naming its cause.

    >>> caveats({"lineage.git_dirty": "true", "lineage.git_commit": "abc"},
    ...         {"grpoflow.version.nosuchpkg": "1.0"})[0][:40]
    'the working tree was dirty at registrati'
    """
    out = []
    commit = version_tags.get("lineage.git_commit", "unknown")
    if version_tags.get("lineage.git_dirty") != "false":
        out.append(
            f"the working tree was dirty at registration (lineage.git_dirty={version_tags.get('lineage.git_dirty')}): "
            f"commit {commit[:12]} does not hold all the code and params that ran; the run's params.yaml is "
            "restored, uncommitted code changes are lost"
        )
    recorded = {k[len(VERSION_TAG) :]: v for k, v in run_tags.items() if k.startswith(VERSION_TAG)}
    here = package_versions(tuple(recorded))
    if "vllm" in recorded and params is not None:  # the vLLM evaluation runs on, maybe in its own venv
        here["vllm"] = vllm_engine_version(params.evaluate.vllm_python)
    differ = [f"{p} {v} (run) vs {here[p]} (here)" for p, v in sorted(recorded.items()) if here[p] != v]
    if differ:
        out.append("library versions differ from the run's (grpoflow.version.* run tags): " + "; ".join(differ))
    return out


def _working_copy(root: Path, commit: str, workdir: Path) -> None:
    """A clean clone of `root` at the version's commit in `workdir` (which must be missing or empty)."""
    if not has_commit(root, commit):
        raise RegistryError(
            f"commit {commit} (lineage.git_commit) is not in the repository at {root}; fetch it first "
            "(e.g. `git fetch origin`) or run grpoflow reproduce from a clone that has it"
        )
    if workdir.exists() and any(workdir.iterdir()):
        raise RegistryError(f"--workdir {workdir} is not empty; give a new folder")
    working_copy(root, commit, workdir)


def link_vllm_venv(root: Path, workdir: Path, vllm_python: str) -> None:
    """The git-ignored vLLM venv that `evaluate.vllm_python` names, linked from this checkout."""
    if not vllm_python or Path(vllm_python).is_absolute():
        return
    top = Path(vllm_python).parts[0]
    if (root / top).exists() and not (workdir / top).exists():
        (workdir / top).symlink_to((root / top).resolve(), target_is_directory=True)


def local_remote(root: Path, workdir: Path) -> str:
    """Point the copy's default DVC remote at this checkout's folder when it is a relative local one
    (`.dvcstore/`, git-ignored); fails naming the remote when it is missing or holds nothing."""
    name, url = default_remote(workdir)
    if not name:
        raise RegistryError("--from-cache: the commit's .dvc/config names no default DVC remote to restore from")
    if url and "://" not in url:
        mine = Path(url)
        if str(mine).startswith(str(workdir)):  # a path relative to the repo: this checkout's copy
            mine = root / mine.relative_to(workdir)
        if not mine.is_dir() or not any(mine.iterdir()):
            raise RegistryError(
                f"--from-cache: the DVC remote '{name}' ({mine}) is missing or empty; push the outputs there "
                "(`dvc push`) or reproduce without --from-cache"
            )
        # .dvc/config.local is git-ignored: the working copy stays clean.
        subprocess.run([sys.executable, "-m", "dvc", "remote", "modify", "--local", name, "url", str(mine)],
                       cwd=workdir, check=True, capture_output=True)
        return f"'{name}' at {mine}"
    return f"'{name}' at {url}"


def reproduce(params: Params, name: str, version: str, workdir: str | None, from_cache: bool, tolerance: float) -> int:
    import mlflow

    root = repo_root()
    configure(params, root)
    client = mlflow.MlflowClient()
    try:
        mv = client.get_model_version(name, str(version))
    except Exception as exc:
        raise RegistryError(
            f"{name} v{version}: not in the registry at {mlflow.get_tracking_uri()} ({str(exc)[:200]})"
        ) from None
    tags = dict(mv.tags)
    missing = [t for t in ("lineage.git_commit", "lineage.pipeline_run_id") if not tags.get(t)]
    if missing:
        raise RegistryError(f"{name} v{version}: no {', '.join(missing)} tag; it was not registered by grpoflow run")
    commit, run_id = tags["lineage.git_commit"], tags["lineage.pipeline_run_id"]
    run = client.get_run(run_id)
    recorded = recorded_metrics(tags, run.data.metrics)
    print(f"reproduce {name} v{version}: commit {commit[:12]}, pipeline run {run_id}")
    notes = caveats(tags, run.data.tags, params)
    print("cannot be reproduced exactly:" if notes else "nothing known that would keep it from reproducing exactly")
    for note in notes:
        print(f"  - {note}")

    dest = (Path(workdir).resolve() if workdir
            else Path(tempfile.mkdtemp(prefix=f"grpoflow-reproduce-{name}-v{version}-")))
    _working_copy(root, commit, dest)
    restored = {}
    with tempfile.TemporaryDirectory() as tmp:
        for artifact in ("lineage/params.yaml", "lineage/dvc.lock"):
            try:
                local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact, dst_path=tmp)
            except Exception as exc:
                raise RegistryError(f"pipeline run {run_id}: artifact {artifact} missing ({str(exc)[:200]})") from None
            restored[Path(artifact).name] = Path(local).read_bytes()
    write_files(dest, restored)
    recorded_lock = (dest / "dvc.lock").read_text()
    wparams = load_params(dest / "params.yaml")
    link_vllm_venv(root, dest, wparams.evaluate.vllm_python)
    print(f"working copy: {dest} (commit {commit[:12]}, the run's params.yaml and dvc.lock)")
    env = stage_env(None, f"sqlite:///{dest / 'mlflow.db'}")
    for key in ("GRPOFLOW_PARAMS", "PYTHONPATH"):
        env.pop(key, None)
    if from_cache:
        print(f"restoring the outputs from the DVC remote {local_remote(root, dest)}", flush=True)
        check_remote(dest)  # one line within the budget, not DVC's own retries, when it does not answer
        steps = [["pull"], ["repro", "--force", "--single-item", "evaluate"]]
    else:
        steps = [["repro", "--force", "--no-run-cache"]]
    for step in steps:
        print(f"── dvc {' '.join(step)}", flush=True)
        # Plain `dvc`, not the flow's guarded runner: the copy's own pipelines/ (at that commit)
        # shadows this one for `python -m`, and may predate it.
        rc = subprocess.run([sys.executable, "-m", "dvc", *step], cwd=dest, env=env).returncode
        if rc != 0:
            print(f"error: dvc {' '.join(step)} failed in {dest} (exit {rc})", file=sys.stderr)
            return 1

    rows = compare_metrics(recorded, read_metrics(dest / wparams.evaluate.output_dir), tolerance)
    before, after = out_md5s(recorded_lock), out_md5s((dest / "dvc.lock").read_text())
    timed = timed_files(wparams)
    outputs = {
        path: "identical" if after.get(path) == md5 else "differs (a summary: timings)" if path in timed else "differs"
        for path, md5 in sorted(before.items())
    }
    ok = all(r["status"] in ("same", "within tolerance", "timing") for r in rows) and bool(rows)
    write_files(dest, {"reproduce.json": json_bytes(
        {"name": name, "version": str(version), "commit": commit, "pipeline_run_id": run_id, "caveats": notes,
         "from_cache": from_cache, "tolerance": tolerance, "metrics": rows, "outputs": outputs, "ok": ok}
    )})
    print(f"\nmetrics of {name} v{version}: recorded vs re-derived "
          f"({'outputs restored, evaluate re-run' if from_cache else 'every stage re-run'})")
    print(format_table(rows))
    same = [p for p, status in outputs.items() if status == "identical"]
    print(f"stage outputs byte-identical (dvc.lock md5): {len(same)} of {len(outputs)}")
    for path, status in outputs.items():
        if status != "identical":
            print(f"  {path}: {status}")
    compared = [r for r in rows if r["status"] != "timing"]
    bad = [r for r in compared if r["status"] not in ("same", "within tolerance")]
    if ok:
        same = sum(r["status"] == "same" for r in compared)
        print(f"reproduced: {same} of {len(compared)} metrics identical"
              + (f", the rest within {tolerance}" if same < len(compared) else "")
              + f"; report {dest / 'reproduce.json'}")
        return 0
    print(f"not reproduced: {len(bad)} of {len(compared)} metrics differ or are missing"
          + (f" (tolerance {tolerance})" if tolerance else "") + f"; report {dest / 'reproduce.json'}")
    return 1


def cli_reproduce(args: argparse.Namespace) -> int:
    """`grpoflow reproduce NAME VERSION [--workdir DIR] [--from-cache] [--tolerance X]`."""
    if args.tolerance < 0:
        raise ConfigError("--tolerance must be >= 0")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    params = load_params(args.params, args.overrides)
    return reproduce(params, args.name, args.version, args.workdir, args.from_cache, args.tolerance)
