"""LoRA adapter folders: what a LoRA run's sft and grpo stages write instead of merged copies.

With `sft.use_lora` / `grpo.use_lora`, `models/sft` and `models/grpo` hold PEFT's adapter files
(`adapter_config.json`, `adapter_model.safetensors`), the tokenizer files and
`grpoflow_adapter.json`, which names the base the adapter applies to:

    {"base_dir": "models/base",              where the pipeline keeps it (relative to the checkout)
     "base_weights_sha256": "...",           weights_sha256 of that folder: the base's identity
     "base_source": "smollm2-135m-instruct"} what built it (model.name_or_path: hub id, wheel, tiny)

The base is identified by its weights, not by its files: `weights_sha256` hashes every tensor's
name, dtype, shape and bytes, so the same weights saved by another writer (MLflow's transformers
flavour, a copy in the registry) have the same identity.

    is_adapter_dir(path)                   adapter_config.json + adapter_model.safetensors
    weights_sha256(folder)                 the identity of a model folder's weights
    save_adapter(model, tok, out, base)    the PEFT model's "default" adapter, atomically
    base_of(adapter_dir)                   the BaseRef recorded beside the adapter
    find_base(adapter_dir, candidates)     the base folder: checked against the recorded hash
    merge(adapter_dir, base_dir, out_dir)  base + adapter merged into a full model folder
    merged_copy(adapter_dir, base_dir)     a merged copy in a temporary folder (removed at exit)
    load_trainable(adapter_dir, base_dir)  base + adapter as a trainable PeftModel (GRPO continues SFT's)
    merged_weights(peft_model)             context: the active adapters folded into the base weights (GRPO's
                                           rollouts), the exact base weights restored on exit

Readers that need plain weights (vLLM on CPU, `grpoflow serve`, the promotion gate) go through
`resolve.resolve_model` (components/models/resolve.py), which merges an adapter into a temporary folder: the merged
model is what the adapter computes, and greedy decoding of the two is compared item by item in the tests.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common.errors import InputError
from components.common.files import repo_root
from components.models.modelio import (  # noqa: F401 (ADAPTER_WEIGHTS, is_adapter_dir: the file check lives in modelio)
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    is_adapter_dir,
    is_model_dir,
)

log = logging.getLogger("grpoflow.adapters")

ADAPTER_FILE = "grpoflow_adapter.json"
# The tags of a registered adapter version that name its base (pipelines/registry/register.py writes them).
BASE_URI_TAG = "lineage.base_model"  # models:/<name>-base/<version>
BASE_SHA_TAG = "lineage.base_weights_sha256"
CACHE_ENV = "GRPOFLOW_CACHE"  # where fetched bases are kept, by weights hash (default ~/.cache/grpoflow)


def weights_sha256(folder: str | os.PathLike) -> str:
    """sha256 over every tensor (name, dtype, shape, bytes) of the folder's *.safetensors files, in
    name order: the same weights give the same hash whoever wrote the files."""
    import torch
    from safetensors import safe_open

    h = hashlib.sha256()
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise InputError(f"{folder}: no *.safetensors weights to identify")
    tensors: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensors[key] = f
    opened: dict[Path, Any] = {}
    try:
        for key in sorted(tensors):
            f = tensors[key]
            if f not in opened:
                opened[f] = safe_open(str(f), framework="pt").__enter__()
            t = opened[f].get_tensor(key).contiguous()
            h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    finally:
        for fh in opened.values():
            fh.__exit__(None, None, None)
    return h.hexdigest()


@dataclass(frozen=True)
class BaseRef:
    base_dir: str  # where the pipeline keeps the base (relative to the checkout), as recorded
    weights_sha256: str | None  # the base's identity; None for an adapter written by another tool
    source: str = ""  # what built the base: model.name_or_path


def base_of(adapter_dir: str | os.PathLike) -> BaseRef:
    """The base an adapter folder names: grpoflow_adapter.json, else PEFT's base_model_name_or_path."""
    p = Path(adapter_dir)
    side = p / ADAPTER_FILE
    if side.is_file():
        info = json.loads(side.read_text())
        return BaseRef(info["base_dir"], info.get("base_weights_sha256"), info.get("base_source", ""))
    cfg = json.loads((p / ADAPTER_CONFIG).read_text())
    base = cfg.get("base_model_name_or_path")
    if not base:
        raise InputError(f"{p / ADAPTER_CONFIG}: base_model_name_or_path is empty; the adapter names no base model")
    return BaseRef(base, None, base)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "grpoflow")


def cached_base(sha: str) -> Path:
    """Where a base with these weights is kept once fetched (`$GRPOFLOW_CACHE/bases/<sha>`, by
    resolve.fetch_base)."""
    return cache_dir() / "bases" / sha


def find_base(adapter_dir: str | os.PathLike, candidates: list[str | os.PathLike] = ()) -> Path:
    """The base folder of an adapter: the first of `candidates`, the recorded base_dir (as given,
    then under the checkout) and the cache of fetched bases that holds the recorded weights. A
    folder whose weights differ from the recorded hash is never used; InputError names what was
    looked at when none fits."""
    ref = base_of(adapter_dir)
    tried: list[str] = []
    places = [*candidates, ref.base_dir, repo_root() / ref.base_dir]
    if ref.weights_sha256:
        places.append(cached_base(ref.weights_sha256))
    for place in places:
        path = Path(place)
        if str(path) in tried:
            continue
        tried.append(str(path))
        if not is_model_dir(path):
            continue
        if ref.weights_sha256 and weights_sha256(path) != ref.weights_sha256:
            log.warning("%s: not the base of %s (its weights differ from the recorded hash)", path, adapter_dir)
            continue
        return path
    want = f" with weights sha256 {ref.weights_sha256[:12]}…" if ref.weights_sha256 else ""
    raise InputError(
        f"adapter {adapter_dir}: its base model {ref.base_dir}{want} (built from {ref.source or 'unknown'}) "
        f"is not here; looked in {', '.join(tried)}. Run `dvc pull models/base` (or `dvc repro model`), or load "
        "the adapter through the registry (models:/NAME@ALIAS fetches the registered base)"
    )


def save_adapter(
    model, tokenizer, out_dir: str | os.PathLike, base: BaseRef, extra_files: dict[str, Any] | None = None
) -> Path:
    """Write the PEFT model's "default" adapter (not TRL's frozen "ref" copy), the tokenizer,
    grpoflow_adapter.json and `extra_files` (JSON) into `out_dir`, atomically."""
    from components.common.files import replace_dir

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, selected_adapters=["default"])
        cfg_path = tmp / ADAPTER_CONFIG
        cfg = json.loads(cfg_path.read_text())
        cfg["base_model_name_or_path"] = base.base_dir  # a path in the checkout, not this machine's
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        tokenizer.save_pretrained(tmp)
        side = {"base_dir": base.base_dir, "base_weights_sha256": base.weights_sha256, "base_source": base.source}
        for name, obj in {ADAPTER_FILE: side, **(extra_files or {})}.items():
            (tmp / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")

    return replace_dir(out_dir, write)


def base_ref_for(base_dir: str | os.PathLike, source: str) -> BaseRef:
    """The BaseRef of a base folder the pipeline trains on (its path as given, its weights hash)."""
    return BaseRef(str(base_dir), weights_sha256(base_dir), source)


def load_peft(adapter_dir: Path, base_dir: Path, dtype: str | None, trainable: bool):
    """PeftModel of base + adapter; `dtype` a `model.dtype` name, or None for the base's own dtype."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from components.models.modelio import resolve_dtype

    base = AutoModelForCausalLM.from_pretrained(
        str(base_dir), dtype="auto" if dtype is None else resolve_dtype(dtype), use_safetensors=True
    )
    return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable)


def load_trainable(adapter_dir: str | os.PathLike, base_dir: str | os.PathLike, dtype: str = "auto"):
    """Base + adapter as a PeftModel whose adapter trains on (GRPO continuing SFT's adapter)."""
    return load_peft(Path(adapter_dir), Path(base_dir), dtype, trainable=True)


def merge(
    adapter_dir: str | os.PathLike,
    base_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike | None = None,
) -> Path:
    """Base + adapter merged (in the base's own dtype) into a full model folder `out_dir`, with the
    tokenizer of `tokenizer_dir` (default: the adapter folder's): what `grpoflow export --merged`
    writes and what vLLM on CPU loads."""
    from components.models.modelio import load_tokenizer, save_model

    model = load_peft(Path(adapter_dir), Path(base_dir), None, trainable=False).merge_and_unload()
    return save_model(model, load_tokenizer(tokenizer_dir or adapter_dir), out_dir)  # generation_config: the base's


_MERGED: dict[tuple[str, str], Path] = {}


def merged_copy(
    adapter_dir: str | os.PathLike,
    base_dir: str | os.PathLike | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
) -> Path:
    """A merged copy of the adapter in a temporary folder, made once per process and removed when
    the process exits."""
    base = Path(base_dir) if base_dir else find_base(adapter_dir)
    key = (str(Path(adapter_dir).resolve()), str(base.resolve()))
    if key not in _MERGED or not _MERGED[key].is_dir():
        root = Path(tempfile.mkdtemp(prefix="grpoflow-merged-"))
        atexit.register(shutil.rmtree, root, True)
        log.info("merging adapter %s into %s for this process", adapter_dir, base)
        _MERGED[key] = merge(adapter_dir, base, root / "model", tokenizer_dir)
    return _MERGED[key]


class merged_weights:  # noqa: N801 (a context manager used as `with merged_weights(model):`)
    """Inside the block, a PeftModel computes with its active adapters folded into the base weights
    (W + scale * B @ A, one matrix product per layer instead of three): what GRPO's rollouts use.

    The adapters are switched off meanwhile (their sum is in W), and on exit every base weight gets
    back its exact bytes from a copy (subtracting the delta again would leave rounding error in the
    frozen base, a little more at every step). A model that is not a PeftModel, or whose adapters
    are merged already, is left as it is. Costs a copy of the adapted weights while inside."""

    def __init__(self, model: Any):
        self.model = model
        self.saved: list[tuple[Any, Any]] = []
        self.disabled: Any = None

    def __enter__(self) -> Any:
        import torch
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer

        if not isinstance(self.model, PeftModel):
            return self.model
        layers = [m for m in self.model.modules() if isinstance(m, LoraLayer)]
        if not layers or any(m.merged for m in layers):
            return self.model
        with torch.no_grad():
            for layer in layers:
                active = [a for a in layer.active_adapters if a in layer.lora_A]
                if not active:
                    continue
                weight = layer.get_base_layer().weight
                self.saved.append((weight, weight.detach().clone()))
                for name in active:
                    weight.add_(layer.get_delta_weight(name).to(weight.dtype))
        self.disabled = self.model.disable_adapter()
        self.disabled.__enter__()
        return self.model

    def __exit__(self, *exc: Any) -> None:
        import torch

        try:
            if self.disabled is not None:
                self.disabled.__exit__(*exc)
        finally:
            with torch.no_grad():
                for weight, original in self.saved:
                    weight.copy_(original)
            self.saved, self.disabled = [], None
