"""Model folders: load, save and find them, whoever asks (the stages, evaluation, the registry).

    resolve_dtype(name) / dtype_name(name)   `model.dtype` / `evaluate.dtype` ('auto': bf16 on a GPU
                                             that supports it, float32 otherwise)
    load_tokenizer(path) / load_model(path)  a tokenizer (pad token set, left padding) and a causal
                                             LM, safetensors only, custom code only when trusted
    save_model(model, tok, out_dir)          save_pretrained into out_dir, atomically
    is_model_dir / require_model_dir         config.json + *.safetensors, or an error naming the stage
    is_adapter_dir                           a LoRA adapter folder (components/models/adapters.py)

A model folder is what `save_pretrained` writes; every stage writes and reads that format, so
`AutoModelForCausalLM.from_pretrained` and vLLM load any of them as is. A LoRA run's sft and grpo
folders hold adapters instead (components/models/adapters.py); components/models/resolve.py gives
readers any model spec as a folder, an adapter as base + adapter merged into a temporary folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from components.common.errors import InputError
from components.common.files import replace_dir
from components.common.params import ModelParams


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


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_adapter_dir(path: str | os.PathLike) -> bool:
    """A PEFT LoRA adapter folder (components/models/adapters.py): adapter config and weights."""
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and (p / ADAPTER_WEIGHTS).is_file()


def is_model_or_adapter_dir(path: str | os.PathLike) -> bool:
    """A full model folder, or a LoRA adapter folder."""
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
