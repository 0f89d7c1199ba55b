"""Model folders: load, save and find them, whoever asks (the stages, evaluation, the registry).

    resolve_dtype(name) / dtype_name(name)   `model.dtype` / `evaluate.dtype` ('auto': bf16 on a GPU
                                             that supports it, float32 otherwise)
    load_tokenizer(path) / load_model(path)  a tokenizer (pad token set, left padding) and a causal
                                             LM, safetensors only, custom code only when trusted
    save_model(model, tok, out_dir)          save_pretrained into out_dir, atomically
    is_model_dir / require_model_dir         config.json + *.safetensors, or an error naming the stage
    resolve_model(spec)                      a folder for a folder, an MLflow model URI or a hub id;
                                             an http(s) URL is an OpenAI-compatible endpoint
    registered_version(spec)                 (name, version) of models:/NAME@ALIAS or models:/NAME/VERSION

A model folder is what `save_pretrained` writes; every stage writes and reads that format, so
`AutoModelForCausalLM.from_pretrained` and vLLM load any of them as is. A LoRA run's sft and grpo
folders hold adapters instead (components/models/adapters.py); `resolve_model` gives readers their
base + adapter merged into a temporary folder.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common.errors import EvaluationError, InputError
from components.common.files import replace_dir
from components.common.params import ModelParams, Params

MODEL_URI_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")


def dtype_name(name: str) -> str:
    """'auto' -> 'bfloat16' on a GPU that supports it, else 'float32'; other names unchanged."""
    if name != "auto":
        return name
    import torch

    return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"


def resolve_dtype(name: str):
    """The torch dtype for a dtype param."""
    import torch

    return getattr(torch, dtype_name(name))


def is_model_dir(path: str | os.PathLike) -> bool:
    p = Path(path)
    return (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def is_model_or_adapter_dir(path: str | os.PathLike) -> bool:
    """A full model folder, or a LoRA adapter folder (components/models/adapters.py)."""
    from components.models.adapters import is_adapter_dir

    return is_model_dir(path) or is_adapter_dir(path)


def require_model_dir(path: str | os.PathLike, what: str, stage: str) -> None:
    """Fail early, naming the stage that writes the folder, when a model (or adapter) folder is missing."""
    if not is_model_or_adapter_dir(path):
        raise InputError(
            f"{what} folder {path} is missing or has neither config.json with *.safetensors nor a LoRA "
            f"adapter (adapter_config.json, adapter_model.safetensors); "
            f"run `dvc repro {stage}` (or `python -m components.{stage}`) first"
        )


def load_tokenizer(path: str | os.PathLike, *, trust_remote_code: bool = False, revision: str | None = None):
    """The tokenizer, with a pad token (eos if it has none) and left padding for generation."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code, revision=revision)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(
    path: str | os.PathLike,
    *,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    revision: str | None = None,
    to_gpu: bool = False,
):
    """A causal LM in `dtype`, from safetensors only; `to_gpu` moves it to CUDA when there is one."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path),
        dtype=resolve_dtype(dtype),
        trust_remote_code=trust_remote_code,
        use_safetensors=True,
        revision=revision,
    )
    if to_gpu and torch.cuda.is_available():
        model = model.to("cuda")
    return model


def load_model_and_tokenizer(path: str | os.PathLike, cfg: ModelParams):
    """Model and tokenizer of a model folder or hub id, with the `model` section's dtype and trust
    settings; `model.revision` applies to the hub id `model.name_or_path` only."""
    revision = cfg.revision if str(path) == cfg.name_or_path and not Path(str(path)).exists() else None
    kw = {"trust_remote_code": cfg.trust_remote_code, "revision": revision}
    return load_model(path, dtype=cfg.dtype, **kw), load_tokenizer(path, **kw)


def save_model(
    model,
    tokenizer,
    out_dir: str | os.PathLike,
    extra_files: dict[str, Any] | None = None,
    state_dict: dict | None = None,
) -> Path:
    """save_pretrained model + tokenizer (safetensors) into `out_dir` atomically, plus JSON side
    files; `state_dict` overrides the model's own weights (gathered ones, under ZeRO-3)."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        for name, obj in (extra_files or {}).items():
            (tmp / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")

    return replace_dir(out_dir, write)


# --------------------------------------------------------------------------- resolving a model spec


@dataclass
class ResolvedModel:
    spec: str  # what the user gave: a folder, a hub id, an MLflow URI or an endpoint URL
    model_dir: str
    tokenizer_dir: str
    endpoint: str = ""  # base URL of an OpenAI-compatible server (then there is no local folder)
    adapter_dir: str = ""  # the LoRA adapter folder when `model_dir` is its merged copy


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


def _registered_adapter(spec: str, local: Path, adapter: Path, params: Params | None) -> ResolvedModel:
    """A registered adapter version: its base (tag lineage.base_model, fetched once into the cache of
    bases by weights hash) + the adapter, merged into a temporary folder."""
    import mlflow

    from components.models import adapters

    version = registered_version(spec, params)
    if version is None:
        raise EvaluationError(f"model {spec}: a LoRA adapter; load it as models:/NAME/VERSION or models:/NAME@ALIAS")
    tags = mlflow.MlflowClient().get_model_version(*version).tags
    base_uri, sha = tags.get(adapters.BASE_URI_TAG), tags.get(adapters.BASE_SHA_TAG)
    if not base_uri or not sha:
        raise EvaluationError(f"model {spec}: a LoRA adapter whose version names no base (tags "
                              f"{adapters.BASE_URI_TAG}, {adapters.BASE_SHA_TAG})")
    base = adapters.fetch_base(base_uri, sha)
    tok_dir = _find_dir(local, lambda p: (p / "tokenizer_config.json").is_file()) or base
    merged = adapters.merged_copy(adapter, base, tok_dir)
    return ResolvedModel(spec, str(merged), str(merged), adapter_dir=str(adapter))


def resolve_model(spec: str, download_dir: str | os.PathLike | None = None, params: Params | None = None) -> ResolvedModel:
    """A model folder for `spec`: a local folder, an MLflow URI (models:/NAME@ALIAS, runs:/...) or a hub id;
    or, for an http(s) URL, the base URL of an OpenAI-compatible endpoint (nothing downloaded)."""
    if spec.startswith(("http://", "https://")):
        return ResolvedModel(spec, "", "", endpoint=spec.rstrip("/"))
    from components.models import adapters

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
                f"model {spec}: no Hugging Face model folder (config.json + *.safetensors) in its artifacts at {local}; "
                "register models with the transformers flavour (pipelines/registry.py does)"
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
            merged = adapters.merged_copy(path)
            return ResolvedModel(spec, str(merged), str(merged), adapter_dir=str(path))
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
