"""The MLflow model registry: register the trained policy, gate its promotion, move aliases.

`register()` logs the folder `<register.model_stage>.output_dir` (default `models/grpo`)
with MLflow's transformers flavour (so `mlflow.transformers.load_model` and pyfunc load it
back) and explicit pip requirements, logs the evaluation reports next to it, and creates a
version of `register.model_name` whose tags carry the lineage and metrics and whose
description holds the base/SFT/GRPO table. The version is created in one call with all
its tags; `dvc_lock_md5` is the idempotency key: a pipeline whose dvc.lock did not change
makes no new version. The new version gets the alias `challenger`.

`gate()` is the promotion step. `champion` moves to the challenger only if there is no
champion yet, or if on the evaluation items both were scored on (paired by item id) the
challenger's accuracy beats the champion's by more than zero and at least
`register.min_delta`, with an exact McNemar p-value below `register.alpha`. The numbers
and the decision are written as version tags (`promotion.*`) and printed. Tags are
written before the alias moves and `promotion.decision` last, so an interrupted gate is
completed by the next run instead of leaving a half-written state.

    grpoflow promote grpoflow-policy 3 --reason "hand-checked samples"   # force, recorded
    grpoflow rollback grpoflow-policy                                     # previous champion back
"""

from __future__ import annotations

import getpass
import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from components.tracking import configure, package_versions, repo_root

CHAMPION = "champion"
CHALLENGER = "challenger"
LOCK_TAG = "dvc_lock_md5"
ITEMS_TAG = "eval_items_uri"
DECISION_TAG = "promotion.decision"
REASON_TAG = "promotion.reason"
PREVIOUS_TAG = "promotion.previous_champion"
MODEL_ARTIFACT = "model"
EVAL_ARTIFACTS = "eval"
# What the transformers flavour needs to load the folder back; pinned to what trained it.
# (Left to itself MLflow infers torchvision too, which the CPU stack does not have.)
REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors", "accelerate")
TABLE_KEYS = ("accuracy_strict", "accuracy_flexible", "format_rate", "mean_completion_tokens", "n")


class RegistryError(RuntimeError):
    """A registry operation cannot proceed; the message says what to do."""


@dataclass
class Registration:
    name: str
    version: str
    created: bool
    run_id: str | None = None


@dataclass
class Decision:
    name: str
    version: str
    decision: str  # promoted | rejected | forced | unchanged
    reason: str
    champion_before: str | None = None
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def promoted(self) -> bool:
        return self.decision in ("promoted", "forced")


# --------------------------------------------------------------------------- helpers


def pip_requirements() -> list[str]:
    """`name==version` for the flavour's runtime, local version labels (+cpu) dropped."""
    reqs = []
    for name, version in package_versions(REQUIREMENTS).items():
        if version != "not-installed":
            reqs.append(f"{name}=={version.split('+', 1)[0]}")
    return reqs


def model_dir(params: Any, root: Path) -> Path:
    stage = params.register.model_stage
    section = getattr(params, stage, None)
    if section is None or not hasattr(section, "output_dir"):
        raise RegistryError(
            f"register.model_stage: {stage!r} is not a params section with an output_dir (e.g. 'grpo', 'sft')"
        )
    return root / section.output_dir


def items_path(params: Any, root: Path) -> Path:
    return root / params.evaluate.output_dir / f"{params.register.model_stage}.items.jsonl"


def read_items(path: str | os.PathLike) -> dict[str, bool]:
    """{item id: correct} from an evaluation items file; names the file and line on bad rows."""
    out: dict[str, bool] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RegistryError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("correct"), bool):
                raise RegistryError(f"{path}:{lineno}: expected an object with 'id' and boolean 'correct'")
            out[str(row["id"])] = row["correct"]
    return out


def read_metrics(eval_dir: Path) -> dict[str, dict[str, Any]]:
    """{model: metrics} from `<eval_dir>/<model>.json` (comparison.json excluded)."""
    out: dict[str, dict[str, Any]] = {}
    if not eval_dir.is_dir():
        return out
    for path in sorted(eval_dir.glob("*.json")):
        if path.stem == "comparison":
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict):
            out[path.stem] = data
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def metrics_table(metrics: dict[str, dict[str, Any]], comparison: dict[str, Any] | None = None) -> str:
    """The base/SFT/GRPO table as markdown (the version description).

    >>> print(metrics_table({"sft": {"accuracy_strict": 0.25, "n": 600}, "grpo": {"accuracy_strict": 0.3, "n": 600}}))
    | model | accuracy_strict | n |
    |---|---|---|
    | sft | 0.2500 | 600 |
    | grpo | 0.3000 | 600 |
    """
    order = [m for m in ("base", "sft", "grpo") if m in metrics] + [m for m in metrics if m not in ("base", "sft", "grpo")]
    keys = [k for k in TABLE_KEYS if any(k in metrics[m] for m in order)]
    if not order or not keys:
        return "No evaluation metrics were found."
    lines = ["| model | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for m in order:
        lines.append(f"| {m} | " + " | ".join(_fmt(metrics[m].get(k, "")) for k in keys) + " |")
    for pair, res in (comparison or {}).items():
        if isinstance(res, dict) and "delta" in res:
            lines.append("")
            lines.append(
                f"{pair}: delta {_fmt(res['delta'])}"
                + (f", 95% CI [{_fmt(res['ci95'][0])}, {_fmt(res['ci95'][1])}]" if res.get("ci95") else "")
                + (f", exact McNemar p = {res['p_value']:.4g}" if "p_value" in res else "")
            )
    return "\n".join(lines)


def metric_tags(metrics: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Numeric metrics as version tags `metric.<model>.<key>`."""
    tags = {}
    for model, values in metrics.items():
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                tags[f"metric.{model}.{key}"] = _fmt(value)
    return tags


def _client(params: Any, root: str | os.PathLike | None = None):
    import mlflow

    configure(params, root)
    return mlflow.MlflowClient()


def _ensure_registered_model(client, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description="GRPO-trained policy registered by the grpoflow pipeline.")
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "ALREADY_EXISTS" not in str(exc.error_code):
            raise


def find_version(client, name: str, lock_md5: str):
    """The version registered for this dvc.lock md5, or None."""
    if not re.fullmatch(r"[0-9a-f]{32}", lock_md5):
        raise RegistryError(f"dvc.lock md5 {lock_md5!r} is not an md5 hex digest")
    found = client.search_model_versions(f"name = '{name}' and tags.{LOCK_TAG} = '{lock_md5}'")
    return min(found, key=lambda v: int(v.version)) if found else None


def alias_version(client, name: str, alias: str):
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None
    # MLflow 3 returns the version as an int here and as a str elsewhere.
    return SimpleNamespace(version=str(mv.version), tags=dict(mv.tags), run_id=mv.run_id)


# --------------------------------------------------------------------------- register


def register(params: Any, lineage: dict[str, str], run_id: str, root: str | os.PathLike | None = None) -> Registration:
    """Register the model folder as a new version (once per dvc.lock md5) and alias it challenger."""
    import mlflow

    root = Path(root or repo_root())
    name = params.register.model_name
    client = _client(params, root)
    lock_md5 = lineage[LOCK_TAG]
    _ensure_registered_model(client, name)
    existing = find_version(client, name, lock_md5)
    if existing is not None:
        return Registration(name, str(existing.version), created=False, run_id=existing.run_id)

    src = model_dir(params, root)
    if not (src / "config.json").is_file():
        raise RegistryError(
            f"{src}: no model folder to register (config.json missing); did the "
            f"'{params.register.model_stage}' stage run?"
        )
    eval_dir = root / params.evaluate.output_dir
    items = items_path(params, root)
    if not items.is_file():
        raise RegistryError(f"{items}: evaluation items missing; the promotion gate needs them (run the evaluate stage)")
    read_items(items)  # fail before registering anything if the file is malformed
    metrics = read_metrics(eval_dir)
    comparison_path = eval_dir / "comparison.json"
    comparison = json.loads(comparison_path.read_text()) if comparison_path.is_file() else None

    import transformers

    # Loaded components, not the folder path: MLflow 3.17's checkpoint-path mode breaks on
    # transformers 5 (it reads the pipeline class from a field that became a string).
    components = {
        "model": transformers.AutoModelForCausalLM.from_pretrained(src, dtype="auto"),
        "tokenizer": transformers.AutoTokenizer.from_pretrained(src),
    }
    with mlflow.start_run(run_id=run_id):
        info = mlflow.transformers.log_model(
            transformers_model=components,
            name=MODEL_ARTIFACT,
            task="text-generation",
            pip_requirements=pip_requirements(),
        )
        mlflow.log_artifacts(str(eval_dir), EVAL_ARTIFACTS)
    run = client.get_run(run_id)
    tags = {
        **{k: str(v) for k, v in lineage.items()},
        **metric_tags(metrics),
        ITEMS_TAG: f"{run.info.artifact_uri.rstrip('/')}/{EVAL_ARTIFACTS}/{items.name}",
        "model_stage": params.register.model_stage,
        "pipeline_run_id": run_id,
    }
    mv = client.create_model_version(
        name,
        source=f"models:/{info.model_id}",
        run_id=run_id,
        tags=tags,
        description=metrics_table(metrics, comparison),
        model_id=info.model_id,
    )
    client.set_registered_model_alias(name, CHALLENGER, str(mv.version))
    return Registration(name, str(mv.version), created=True, run_id=run_id)


# --------------------------------------------------------------------------- promotion


def _download_items(uri: str) -> dict[str, bool]:
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp)
        return read_items(local)


def compare_with_champion(
    challenger: dict[str, bool], champion: dict[str, bool], alpha: float, min_delta: float
) -> tuple[bool, dict[str, Any]]:
    """Paired comparison on the shared items; (promote?, numbers).

    >>> ok, n = compare_with_champion({str(i): i < 60 for i in range(100)}, {str(i): i < 40 for i in range(100)}, 0.05, 0.0)
    >>> ok, n["delta"], n["b"], n["c"], n["p_value"] < 1e-5
    (True, 0.2, 20, 0, True)
    """
    from components.stats import compare_paired

    shared = sorted(set(challenger) & set(champion))
    if not shared:
        return False, {"n": 0}
    res = compare_paired([challenger[i] for i in shared], [champion[i] for i in shared])
    numbers = {
        "n": res["n"],
        "challenger_accuracy": res["accuracy_a"],
        "champion_accuracy": res["accuracy_b"],
        "delta": res["delta"],
        "ci95": res["ci95"],
        "p_value": res["p_value"],
        "b": res["b"],
        "c": res["c"],
        "alpha": alpha,
        "min_delta": min_delta,
    }
    ok = res["delta"] > 0 and res["delta"] >= min_delta and res["p_value"] < alpha
    return ok, numbers


def _reason(version: str, champion: str, ok: bool, x: dict[str, Any]) -> str:
    if x.get("n", 0) == 0:
        return f"v{version} and champion v{champion} share no evaluation items: not comparable, champion kept"
    verdict = []
    if x["delta"] <= 0:
        verdict.append("not more accurate")
    elif x["delta"] < x["min_delta"]:
        verdict.append(f"gain below min_delta {x['min_delta']}")
    if x["p_value"] >= x["alpha"]:
        verdict.append(f"p >= alpha {x['alpha']}")
    lo, hi = x["ci95"]
    head = (
        f"v{version} accuracy {x['challenger_accuracy']:.4f} vs champion v{champion} "
        f"{x['champion_accuracy']:.4f} on {x['n']} shared items: delta {x['delta']:+.4f} "
        f"(95% CI {lo:+.4f}..{hi:+.4f}), discordant {x['b']} vs {x['c']}, exact McNemar p={x['p_value']:.4g}"
    )
    if ok:
        return f"{head} < alpha {x['alpha']} and delta >= min_delta {x['min_delta']}: promoted"
    return f"{head}: {', '.join(verdict)}; champion v{champion} kept"


def _write_decision(client, name: str, version: str, decision: Decision, move_alias: bool) -> None:
    """Numbers and reason first, then the alias, then the decision tag (the commit marker)."""
    for key, value in decision.numbers.items():
        client.set_model_version_tag(name, version, f"promotion.{key}", json.dumps(value))
    client.set_model_version_tag(name, version, REASON_TAG, decision.reason)
    if move_alias:
        if decision.champion_before and decision.champion_before != version:
            client.set_model_version_tag(name, version, PREVIOUS_TAG, decision.champion_before)
        client.set_registered_model_alias(name, CHAMPION, version)
    client.set_model_version_tag(name, version, DECISION_TAG, decision.decision)


def gate(params: Any, registration: Registration, root: str | os.PathLike | None = None) -> Decision:
    """Move `champion` to the challenger if the gate passes; the decision is tagged and returned."""
    root = Path(root or repo_root())
    name, version = registration.name, registration.version
    client = _client(params, root)
    mv = client.get_model_version(name, version)
    if DECISION_TAG in mv.tags:  # decided by an earlier run: nothing to do
        return Decision(
            name, version, mv.tags[DECISION_TAG],
            f"decided by an earlier run, nothing changed: {mv.tags.get(REASON_TAG, '')}", mv.tags.get(PREVIOUS_TAG),
        )
    client.set_registered_model_alias(name, CHALLENGER, version)
    champion = alias_version(client, name, CHAMPION)
    if champion is None:
        decision = Decision(name, version, "promoted", f"no champion yet: v{version} becomes champion")
        _write_decision(client, name, version, decision, move_alias=True)
        return decision
    if champion.version == version:  # an interrupted earlier gate had already moved the alias
        decision = Decision(name, version, "promoted", mv.tags.get(REASON_TAG, "champion alias already on it"))
        client.set_model_version_tag(name, version, DECISION_TAG, decision.decision)
        return decision
    challenger_items = read_items(items_path(params, root))
    uri = champion.tags.get(ITEMS_TAG)
    if not uri:
        decision = Decision(
            name, version, "rejected",
            f"champion v{champion.version} has no '{ITEMS_TAG}' tag, so no paired comparison is possible; "
            f"champion kept (force with: grpoflow promote {name} {version} --reason TEXT)",
            champion.version,
        )
        _write_decision(client, name, version, decision, move_alias=False)
        return decision
    ok, numbers = compare_with_champion(
        challenger_items, _download_items(uri), params.register.alpha, params.register.min_delta
    )
    decision = Decision(
        name, version, "promoted" if ok else "rejected",
        _reason(version, champion.version, ok, numbers), champion.version, numbers,
    )
    _write_decision(client, name, version, decision, move_alias=ok)
    return decision


def force_promote(params: Any, name: str, version: str, reason: str) -> Decision:
    """Put `champion` on a version by hand; the reason and who did it are tagged."""
    client = _client(params)
    from mlflow.exceptions import MlflowException

    try:
        client.get_model_version(name, version)
    except MlflowException:
        raise RegistryError(f"{name} version {version} does not exist in {configure_uri(params)}") from None
    champion = alias_version(client, name, CHAMPION)
    before = champion.version if champion else None
    if before == str(version):
        raise RegistryError(f"{name} v{version} is already the champion")
    decision = Decision(name, str(version), "forced", f"forced by {getpass.getuser()}: {reason}", before)
    _write_decision(client, name, str(version), decision, move_alias=True)
    return decision


def rollback(params: Any, name: str) -> Decision:
    """Move `champion` back to the version it replaced (its `promotion.previous_champion` tag)."""
    client = _client(params)
    champion = alias_version(client, name, CHAMPION)
    if champion is None:
        raise RegistryError(f"{name} has no champion alias to roll back")
    previous = champion.tags.get(PREVIOUS_TAG)
    if not previous:
        raise RegistryError(f"{name} v{champion.version} replaced no earlier champion; nothing to roll back to")
    user = getpass.getuser()
    client.set_model_version_tag(name, champion.version, "rollback.reason", f"rolled back by {user} to v{previous}")
    client.set_registered_model_alias(name, CHAMPION, previous)
    client.set_model_version_tag(name, previous, "rollback.restored_from", champion.version)
    return Decision(name, previous, "rollback", f"champion moved back from v{champion.version} to v{previous}",
                    champion.version)


def configure_uri(params: Any) -> str:
    from components.tracking import resolve_tracking_uri

    return resolve_tracking_uri(params)


# --------------------------------------------------------------------------- CLI


def print_decision(d: Decision, file=None) -> None:
    print(f"promotion: {d.name} v{d.version}: {d.decision} — {d.reason}", file=file or sys.stdout)


def _cli(args, action) -> int:
    from components.config import ConfigError, load_params

    try:
        params = load_params(args.params, args.overrides)
        decision = action(params)
    except (ConfigError, RegistryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_decision(decision)
    return 0


def cli_promote(args) -> int:
    """`grpoflow promote NAME VERSION --reason TEXT`."""
    return _cli(args, lambda p: force_promote(p, args.name, str(args.version), args.reason))


def cli_rollback(args) -> int:
    """`grpoflow rollback NAME`."""
    return _cli(args, lambda p: rollback(p, args.name))


def as_dict(obj: Any) -> dict[str, Any]:
    return asdict(obj) | ({"promoted": obj.promoted} if isinstance(obj, Decision) else {})
