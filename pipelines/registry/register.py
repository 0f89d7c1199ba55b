"""The MLflow model registry: register the trained policy (the flow's `register` step).

`register()` logs the folder `<register.model_stage>.output_dir` (default `models/grpo`)
with MLflow's transformers flavour (so `mlflow.transformers.load_model` and pyfunc load it
back) and explicit pip requirements. A LoRA adapter folder is logged as the adapter alone (PEFT
through the flavour, `base_model_path` its base) and its base is registered once per weights hash
as a version of `<register.model_name>-base`; the tags `lineage.base_model` (models:/NAME-base/N)
and `lineage.base_weights_sha256` name it, `grpoflow.kind` says adapter or full, and
`resolve.resolve_model` fetches the base into a cache by hash on a machine that has none.
It logs the evaluation reports next to the model and creates a version of
`register.model_name` whose tags carry the lineage and metrics and whose description holds
the base/SFT/GRPO table. The version is created in one call with all
its tags; `lineage.dvc_lock_md5` is the idempotency key: a pipeline whose dvc.lock did not change
makes no new version. The new version gets the alias `challenger` (under the registry lease,
pipelines/registry/lease.py): it is created tagged `grpoflow.pending_alias: challenger`, the intent,
deleted once the alias is on it, so that a rerun after a failure in between sets it. The `promote` step
(pipelines/registry/promotion.py) decides whether it becomes `champion`, on the items registered with
it: `eval.items_uri` names them and `eval.items_sha256` records their hash, which `registered_items`
checks when it reads them back.

A registered model grpoflow creates carries the tag `grpoflow.managed: true`, its mark; grpoflow adds
versions to, and moves the aliases of, only a model with the mark (`check_owned`), or one whose versions
carry the `lineage.dvc_lock_md5` grpoflow's own registration writes (made before the mark was; it is then
marked). Any other model is refused in one line, unless the user adopts it (`--adopt`).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from components.common.errors import InputError, RegistryError
from components.common.files import sha256_file
from components.common.params import Params
from components.common.tracking import configure, package_versions, repo_root
from components.evaluation.reports import read_comparison, read_item_rows, read_items, read_metrics
from components.models import adapters
from pipelines.handoff import Registration
from pipelines.registry.lease import registry_lease

CHAMPION = "champion"
CHALLENGER = "challenger"
# Version tags are grouped by topic: lineage.* (where the version came from), eval.* (what it was
# evaluated on), metric.<model>.<key>, promotion.* and rollback.* (what the gate and people did).
LINEAGE = "lineage."
LOCK_TAG = f"{LINEAGE}dvc_lock_md5"  # the idempotency key: one version per dvc.lock
ITEMS_TAG = "eval.items_uri"
ITEMS_SHA_TAG = "eval.items_sha256"  # the items file's sha256 at registration: what the gate checks
# What the version was evaluated on: the gate compares two versions directly only when these match.
EVAL_KEYS = ("test_sha256", "protocol", "max_new_tokens")
MANAGED_TAG = "grpoflow.managed"  # a registered model's tag: grpoflow created it (or the user adopted it)
PENDING_TAG = "grpoflow.pending_alias"  # a new version's tag until the alias it names is on it
DECISION_TAG = "promotion.decision"
REASON_TAG = "promotion.reason"
PREVIOUS_TAG = "promotion.previous_champion"
MODEL_ARTIFACT = "model"
BASE_ARTIFACT = "base"
BASE_SUFFIX = "-base"  # the registered model that holds adapter versions' bases: <name>-base
KIND_TAG = "grpoflow.kind"  # adapter (a LoRA adapter over a registered base) | full (a whole model)
WEIGHTS_TAG = "grpoflow.weights_sha256"  # a base version's identity (components/models/adapters.py)
BASE_URI_TAG, BASE_SHA_TAG = adapters.BASE_URI_TAG, adapters.BASE_SHA_TAG  # an adapter version's base
EVAL_ARTIFACTS = "eval"
# What the transformers flavour needs to load the folder back; pinned to what trained it.
# (Left to itself MLflow infers torchvision too, which the CPU stack does not have.)
REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors", "accelerate")
TABLE_KEYS = ("accuracy_strict", "accuracy_flexible", "format_rate", "mean_completion_tokens", "n")


# --------------------------------------------------------------------------- helpers


def pip_requirements(names: tuple[str, ...] = REQUIREMENTS) -> list[str]:
    """`name==version` for the flavour's runtime (an adapter's adds peft), local version labels (+cpu) dropped."""
    reqs = []
    for name, version in package_versions(names).items():
        if version != "not-installed":
            reqs.append(f"{name}=={version.split('+', 1)[0]}")
    return reqs


def model_dir(params: Params, root: Path) -> Path:
    stage = params.register.model_stage
    section = getattr(params, stage, None)
    if section is None or not hasattr(section, "output_dir"):
        raise RegistryError(
            f"register.model_stage: {stage!r} is not a params section with an output_dir (e.g. 'grpo', 'sft')"
        )
    return root / section.output_dir


def items_path(params: Params, root: Path) -> Path:
    return root / params.evaluate.output_dir / f"{params.register.model_stage}.items.jsonl"


def registered_items(name: str, version: str, tags: dict[str, str]) -> tuple[dict[str, dict[str, Any]], bool]:
    """The evaluation items registered with a version ({item id: row}, from `eval.items_uri`) and
    whether they were checked: against `eval.items_sha256`, recorded at registration. A version
    registered before grpoflow recorded the hash is read unchecked, with a line saying so."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri, want = tags.get(ITEMS_TAG), tags.get(ITEMS_SHA_TAG)
    fix = f"restore that artifact, or delete {name} v{version} and run the pipeline again to register it anew"
    if not uri:
        raise RegistryError(f"{name} v{version} has no {ITEMS_TAG} tag: the gate compares the items a version was "
                            "registered with, and this one was not registered by `grpoflow run`")
    with tempfile.TemporaryDirectory(prefix="grpoflow-items-") as tmp:
        try:
            local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp)
        except (MlflowException, OSError) as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RegistryError(f"{name} v{version}: its evaluation items {uri} ({ITEMS_TAG}) cannot be read "
                                f"({why[:200]}); {fix}") from None
        got = sha256_file(local)
        if want and got != want:
            raise RegistryError(f"{name} v{version}: its evaluation items {uri} have sha256 {got}, not the {want} "
                                f"recorded at registration ({ITEMS_SHA_TAG}): they changed since; {fix}")
        if not want:
            print(f"promotion: {name} v{version} was registered before grpoflow recorded its items' hash "
                  f"({ITEMS_SHA_TAG}); its items {uri} are used unchecked", flush=True)
        try:
            rows = read_item_rows(local)
        except InputError as exc:
            raise InputError(str(exc).replace(str(local), uri)) from None
    return rows, bool(want)


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
    order = ([m for m in ("base", "sft", "grpo") if m in metrics]
             + [m for m in metrics if m not in ("base", "sft", "grpo")])
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


def client_for(params: Params, root: str | os.PathLike | None = None):
    import mlflow

    configure(params, root)
    return mlflow.MlflowClient()


def _ensure_registered_model(
    client, name: str, description: str = "GRPO-trained policy registered by the grpoflow pipeline.",
    version_tag: str = LOCK_TAG,
) -> None:
    """Create the registered model, with grpoflow's mark; one that exists must be grpoflow's (check_owned)."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, tags={MANAGED_TAG: "true"}, description=description)
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "ALREADY_EXISTS" not in str(exc.error_code):
            raise
        check_owned(client, name, False, f"the pipeline's register step (register.model_name={name})", version_tag)


def check_owned(client, name: str, adopt: bool, command: str, version_tag: str = LOCK_TAG) -> None:
    """RegistryError (nothing written) when `name` is a registered model grpoflow did not make: neither
    its mark (MANAGED_TAG) nor a version grpoflow registered (`version_tag`, which grpoflow writes on
    every version: `lineage.dvc_lock_md5`, a base's weights hash; an older grpoflow's model, marked now).
    With `adopt`, the model is marked and becomes grpoflow's. A model that does not exist is left to the
    caller's own check."""
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(name)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc.error_code):
            return
        raise
    if model.tags.get(MANAGED_TAG) == "true":
        return
    ours = client.search_model_versions(f"name = '{name}' and tags.`{version_tag}` LIKE '%'", max_results=1)
    if not (adopt or ours):
        how = f"{command} --adopt" if command.startswith("grpoflow ") else f"choose another name for {command}"
        raise RegistryError(f"{name}: a registered model grpoflow did not make (no {MANAGED_TAG} tag, no version "
                            f"registered by grpoflow); nothing written. To let grpoflow move its aliases: {how}")
    client.set_registered_model_tag(name, MANAGED_TAG, "true")
    if adopt and not ours:
        print(f"registry: {name} adopted: tagged {MANAGED_TAG}=true", flush=True)


def find_version(client, name: str, lock_md5: str):
    """The version registered for this dvc.lock md5, or None."""
    if not re.fullmatch(r"[0-9a-f]{32}", lock_md5):
        raise RegistryError(f"dvc.lock md5 {lock_md5!r} is not an md5 hex digest")
    found = client.search_model_versions(f"name = '{name}' and tags.`{LOCK_TAG}` = '{lock_md5}'")
    return min(found, key=lambda v: int(v.version)) if found else None


def alias_version(client, name: str, alias: str):
    """The version `alias` points at, or None when the model or the alias does not exist. Any other
    error (a server error, a timeout) propagates: read as "no champion" it would let a gate set the
    alias over the real champion."""
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        code = str(exc.error_code)
        # MLflow's SQL and file stores answer INVALID_PARAMETER_VALUE "Registered model alias X not found."
        if "RESOURCE_DOES_NOT_EXIST" in code or (
                "INVALID_PARAMETER_VALUE" in code and f"alias {alias} not found" in str(exc)):
            return None
        raise
    # MLflow 3 returns the version as an int here and as a str elsewhere.
    return SimpleNamespace(version=str(mv.version), tags=dict(mv.tags), run_id=mv.run_id)


# --------------------------------------------------------------------------- the base of an adapter


def base_model_name(name: str) -> str:
    """The registered model that holds the bases of `name`'s adapter versions."""
    return f"{name}{BASE_SUFFIX}"


def register_base(client, name: str, base_dir: Path, ref: adapters.BaseRef, run_id: str) -> dict[str, str]:
    """Register the base folder under `<name>-base` unless a version with the same weights hash is
    there; returns the adapter version's tags that name it (lineage.base_model, ...). Call inside
    the open MLflow run `run_id`."""
    import mlflow
    import transformers

    sha = ref.weights_sha256 or adapters.weights_sha256(base_dir)
    base_name = base_model_name(name)
    _ensure_registered_model(client, base_name, f"Base models the LoRA adapters of {name} apply to (by weights hash).",
                             WEIGHTS_TAG)
    found = client.search_model_versions(f"name = '{base_name}' and tags.`{WEIGHTS_TAG}` = '{sha}'")
    if found:
        version = str(min(found, key=lambda v: int(v.version)).version)
    else:
        info = mlflow.transformers.log_model(
            transformers_model={
                "model": transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto"),
                "tokenizer": transformers.AutoTokenizer.from_pretrained(base_dir),
            },
            name=BASE_ARTIFACT,
            task="text-generation",
            pip_requirements=pip_requirements(),
        )
        mv = client.create_model_version(
            base_name, source=f"models:/{info.model_id}", run_id=run_id, model_id=info.model_id,
            tags={WEIGHTS_TAG: sha, f"{LINEAGE}base_source": ref.source, KIND_TAG: "full"},
            description=f"Base model built from {ref.source or base_dir}; weights sha256 {sha}.",
        )
        version = str(mv.version)
    return {
        BASE_URI_TAG: f"models:/{base_name}/{version}",
        BASE_SHA_TAG: sha,
        f"{LINEAGE}base_source": ref.source,
    }


# --------------------------------------------------------------------------- register


def register(
    params: Params, lineage: dict[str, str], run_id: str, root: str | os.PathLike | None = None
) -> Registration:
    """Register the model folder as a new version (once per dvc.lock md5) and alias it challenger."""
    import mlflow

    root = Path(root or repo_root())
    name = params.register.model_name
    client = client_for(params, root)
    lock_md5 = lineage[LOCK_TAG]
    _ensure_registered_model(client, name)
    existing = find_version(client, name, lock_md5)
    if existing is not None:
        if existing.tags.get(PENDING_TAG):  # registered by an earlier run that stopped before its alias
            set_pending_alias(client, name, str(existing.version), existing.tags[PENDING_TAG])
        return Registration(name, str(existing.version), created=False, run_id=existing.run_id)

    src = model_dir(params, root)
    adapter = adapters.is_adapter_dir(src)
    if not adapter and not (src / "config.json").is_file():
        raise RegistryError(
            f"{src}: no model folder to register (neither config.json nor a LoRA adapter); did the "
            f"'{params.register.model_stage}' stage run?"
        )
    eval_dir = root / params.evaluate.output_dir
    items = items_path(params, root)
    if not items.is_file():
        raise RegistryError(
            f"{items}: evaluation items missing; the promotion gate needs them (run the evaluate stage)"
        )
    read_items(items)  # fail before registering anything if the file is malformed
    items_sha256 = sha256_file(items)  # before the upload: what the gate will find, unless changed after
    metrics = read_metrics(eval_dir)
    comparison = read_comparison(eval_dir)

    import transformers

    base_tags: dict[str, str] = {}
    with mlflow.start_run(run_id=run_id):
        if adapter:  # the adapter alone, over a base registered once per weights hash
            base_dir = adapters.find_base(src, [root / adapters.base_of(src).base_dir])
            base_tags = register_base(client, name, base_dir, adapters.base_of(src), run_id)
            model = adapters.load_peft(src, base_dir, None, trainable=False)
            extra = {"base_model_path": str(base_dir)}
        else:
            # Loaded components, not the folder path: MLflow 3.17's checkpoint-path mode breaks on
            # transformers 5 (it reads the pipeline class from a field that became a string).
            model, extra = transformers.AutoModelForCausalLM.from_pretrained(src, dtype="auto"), {}
        info = mlflow.transformers.log_model(
            transformers_model={"model": model, "tokenizer": transformers.AutoTokenizer.from_pretrained(src)},
            name=MODEL_ARTIFACT,
            task="text-generation",
            pip_requirements=pip_requirements(REQUIREMENTS + ("peft",) if adapter else REQUIREMENTS),
            **extra,
        )
        mlflow.log_artifacts(str(eval_dir), EVAL_ARTIFACTS)
    run = client.get_run(run_id)
    evaluated = metrics.get(params.register.model_stage, {})
    tags = {
        **{k: str(v) for k, v in lineage.items()},
        **metric_tags(metrics),
        **{f"eval.{k}": str(evaluated[k]) for k in EVAL_KEYS if k in evaluated},
        ITEMS_TAG: f"{run.info.artifact_uri.rstrip('/')}/{EVAL_ARTIFACTS}/{items.name}",
        ITEMS_SHA_TAG: items_sha256,
        f"{LINEAGE}model_stage": params.register.model_stage,
        f"{LINEAGE}pipeline_run_id": run_id,
        KIND_TAG: "adapter" if adapter else "full",
        **base_tags,
        PENDING_TAG: CHALLENGER,  # the intent: deleted once the alias is on this version
    }
    mv = client.create_model_version(
        name,
        source=f"models:/{info.model_id}",
        run_id=run_id,
        tags=tags,
        description=metrics_table(metrics, comparison),
        model_id=info.model_id,
    )
    set_pending_alias(client, name, str(mv.version), CHALLENGER)
    return Registration(name, str(mv.version), created=True, run_id=run_id)


def set_pending_alias(client, name: str, version: str, alias: str) -> None:
    """Put `alias` on a new version, then delete the version's PENDING_TAG (under the registry lease)."""
    with registry_lease(client, name, f"register v{version}"):
        client.set_registered_model_alias(name, alias, version)
        client.delete_model_version_tag(name, version, PENDING_TAG)
