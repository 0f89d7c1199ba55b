"""Any model spec as a local model folder, for every reader (the evaluate and selection stages,
`grpoflow evaluate`, `grpoflow serve`, `grpoflow export`, the promotion gate, the benchmarks).

    resolve_model(spec)        a folder for a folder, an MLflow model URI or a hub id; an http(s)
                               URL is an OpenAI-compatible endpoint; a LoRA adapter (a folder or a
                               registered adapter version) is base + adapter merged into a
                               temporary folder (components/models/adapters.py)
    registered_version(spec)   (name, version) of models:/NAME@ALIAS or models:/NAME/VERSION
    fetch_base(base_uri, sha)  a registered base, downloaded once into the cache of bases by hash
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from components.common.errors import EvaluationError
from components.common.params import Params
from components.models import adapters
from components.models.modelio import is_model_dir

log = logging.getLogger("grpoflow.resolve")

MODEL_URI_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")


@dataclass
class ResolvedModel:
    spec: str  # what the user gave: a folder, a hub id, an MLflow URI or an endpoint URL
    model_dir: str
    tokenizer_dir: str
    endpoint: str = ""  # base URL of an OpenAI-compatible server (then there is no local folder)
    adapter_dir: str = ""  # the LoRA adapter folder when `model_dir` is its merged copy
    base_dir: str = ""  # ... and the base folder it was merged into


def registered_version(spec: str, params: Params | None = None) -> tuple[str, str] | None:
    """(name, version) of a registered-model URI, the alias looked up in the registry; None for
    anything else. Fails naming the URI when the name, alias or version is not there."""
    m = re.fullmatch(r"models:/([^/@]+)(?:@([^/]+)|/(\d+))", spec.rstrip("/"))
    if not m:
        return None
    import mlflow

    from components.common.tracking import configure

    configure(params)
    name, alias, version = m.groups()
    try:
        client = mlflow.MlflowClient()
        mv = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
    except Exception as exc:  # unknown name/alias/version, unreachable server
        raise EvaluationError(
            f"model {spec}: not in the registry at {mlflow.get_tracking_uri()} ({type(exc).__name__}: {str(exc)[:300]})"
        ) from None
    return name, str(mv.version)


def _find_dir(root: Path, test) -> Path | None:
    for folder in sorted([root, *[p for p in root.rglob("*") if p.is_dir()]], key=lambda p: len(p.parts)):
        if test(folder):
            return folder
    return None


def fetch_base(base_uri: str, sha: str) -> Path:
    """The registered base `base_uri` (models:/NAME/VERSION) in the local cache of bases, downloaded
    once and checked against its weights hash `sha`; later calls use the cached copy."""
    import mlflow

    cached = adapters.cached_base(sha)
    if is_model_dir(cached):
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}.tmp-", dir=cached.parent))
    try:
        log.info("fetching base model %s into %s", base_uri, cached)
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=base_uri, dst_path=str(tmp)))
        found = _find_dir(local, is_model_dir)
        if found is None:
            raise EvaluationError(
                f"base model {base_uri}: no model folder (config.json + *.safetensors) in its artifacts"
            )
        got = adapters.weights_sha256(found)
        if got != sha:
            raise EvaluationError(
                f"base model {base_uri}: its weights hash {got[:12]}… is not the recorded {sha[:12]}…"
            )
        if not cached.exists():  # another process may have cached it meanwhile
            os.replace(found, cached)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cached


def _registered_adapter(spec: str, local: Path, adapter: Path, params: Params | None) -> ResolvedModel:
    """A registered adapter version: its base (tag lineage.base_model, fetched once into the cache of
    bases by weights hash) + the adapter, merged into a temporary folder."""
    import mlflow

    version = registered_version(spec, params)
    if version is None:
        raise EvaluationError(f"model {spec}: a LoRA adapter; load it as models:/NAME/VERSION or models:/NAME@ALIAS")
    tags = mlflow.MlflowClient().get_model_version(*version).tags
    base_uri, sha = tags.get(adapters.BASE_URI_TAG), tags.get(adapters.BASE_SHA_TAG)
    if not base_uri or not sha:
        raise EvaluationError(f"model {spec}: a LoRA adapter whose version names no base (tags "
                              f"{adapters.BASE_URI_TAG}, {adapters.BASE_SHA_TAG})")
    base = fetch_base(base_uri, sha)
    tok_dir = _find_dir(local, lambda p: (p / "tokenizer_config.json").is_file()) or base
    merged = adapters.merged_copy(adapter, base, tok_dir)
    return ResolvedModel(spec, str(merged), str(merged), adapter_dir=str(adapter), base_dir=str(base))


def is_endpoint(spec: str) -> bool:
    """True for an http(s) URL (an OpenAI-compatible base URL such as http://127.0.0.1:8000/v1).

    >>> is_endpoint("http://127.0.0.1:8000/v1"), is_endpoint("models/grpo")
    (True, False)
    """
    return spec.startswith(("http://", "https://"))


def resolve_model(
    spec: str, download_dir: str | os.PathLike | None = None, params: Params | None = None
) -> ResolvedModel:
    """A model folder for `spec`: a local folder, an MLflow URI (models:/NAME@ALIAS, runs:/...) or a hub id;
    or, for an http(s) URL, the base URL of an OpenAI-compatible endpoint (nothing downloaded)."""
    if is_endpoint(spec):
        return ResolvedModel(spec, "", "", endpoint=spec.rstrip("/"))
    if spec.startswith(MODEL_URI_SCHEMES):
        import mlflow

        from components.common.tracking import configure

        configure(params)  # MLFLOW_TRACKING_URI, else tracking.uri
        dst = Path(download_dir or tempfile.mkdtemp(prefix="grpoflow-model-"))
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=spec, dst_path=str(dst)))
        except Exception as exc:  # unknown name/alias/version, unreachable server
            raise EvaluationError(
                f"model {spec}: could not download it from MLflow at {mlflow.get_tracking_uri()} "
                f"({type(exc).__name__}: {str(exc)[:300]})"
            ) from None
        model_dir = _find_dir(local, is_model_dir)
        if model_dir is None and (adapter := _find_dir(local, adapters.is_adapter_dir)) is not None:
            return _registered_adapter(spec, local, adapter, params)
        if model_dir is None:
            raise EvaluationError(
                f"model {spec}: no Hugging Face model folder (config.json + *.safetensors) in its artifacts at "
                f"{local}; "
                "register models with the transformers flavour (pipelines/registry/register.py does)"
            )
        tok_dir = (
            model_dir
            if (model_dir / "tokenizer_config.json").is_file()
            else _find_dir(local, lambda p: (p / "tokenizer_config.json").is_file())
        )
        if tok_dir is None:
            raise EvaluationError(f"model {spec}: no tokenizer (tokenizer_config.json) in its artifacts at {local}")
        return ResolvedModel(spec, str(model_dir), str(tok_dir))
    path = Path(spec)
    if path.exists():
        if adapters.is_adapter_dir(path):  # base + adapter, merged for the readers (vLLM on CPU among them)
            base = adapters.find_base(path)
            merged = adapters.merged_copy(path, base)
            return ResolvedModel(spec, str(merged), str(merged), adapter_dir=str(path), base_dir=str(base))
        if not is_model_dir(path):
            raise EvaluationError(
                f"model folder {path} has neither config.json with *.safetensors weights nor a LoRA adapter "
                "(adapter_config.json); give a model folder written by a stage (models/sft, models/grpo) or "
                "models:/NAME@ALIAS"
            )
        return ResolvedModel(spec, str(path), str(path))
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec) and not spec.startswith(("models/", "./", "../")):
        return ResolvedModel(spec, spec, spec)  # a hub id; transformers/vLLM fetch it (needs hub access)
    raise EvaluationError(
        f"model {spec}: no such folder; give a model folder (e.g. models/grpo after `dvc repro grpo`), "
        "models:/NAME@ALIAS, a Hugging Face id, or an endpoint URL (http://HOST:PORT/v1)"
    )
