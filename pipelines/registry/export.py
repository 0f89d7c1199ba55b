"""`grpoflow export MODEL DIR [--merged]`: a self-contained copy of a model, for shipping it elsewhere.

MODEL is a model or adapter folder (models/grpo) or a registered version (models:/NAME@ALIAS,
models:/NAME/VERSION; an adapter version's base is fetched from the registry). DIR is written
atomically and carries the file `.grpoflow-export`, export's own mark: DIR must not exist, be empty,
or hold an earlier export (that mark). Any other folder is left as it is, even one holding the same
file names (another model's), with one line and exit 2.

- A full model: its folder (config.json, *.safetensors, tokenizer), as is.
- A LoRA adapter with `--merged`: base + adapter merged into one full model folder, which vLLM,
  transformers and llama.cpp's convert_hf_to_gguf.py load like any other.
- A LoRA adapter without `--merged`: the adapter (adapter_config.json, adapter_model.safetensors,
  tokenizer) with its base in DIR/base, so that e.g. `vllm serve DIR/base --enable-lora
  --lora-modules policy=DIR` or `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(
  "DIR/base"), "DIR")` load it with nothing else at hand.

    grpoflow export models/grpo /tmp/policy --merged
    grpoflow export models:/grpoflow-policy@champion /tmp/policy
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from components.common.errors import InputError
from components.common.files import OUTPUT_MARKER, replace_dir
from components.common.params import Params

EXPORT_MARKER = ".grpoflow-export"  # in every folder export writes: the one kind of folder it replaces
MARKERS = (OUTPUT_MARKER, EXPORT_MARKER)
REFUSAL = f"It holds no {EXPORT_MARKER} (an earlier export's mark): give a new or empty folder, or remove this one."


def _replace(out_dir: str, write) -> Path:
    return replace_dir(out_dir, write, marker=EXPORT_MARKER, refusal=REFUSAL)


def export(params: Params, spec: str, out_dir: str, merged: bool) -> tuple[Path, str]:
    """Write the self-contained copy of `spec` into `out_dir`; returns (out_dir, what was written)."""
    from components.models import adapters
    from components.models.resolve import resolve_model

    if spec.startswith(("http://", "https://")):
        raise InputError(f"{spec} is an endpoint; export takes a model folder or models:/NAME@ALIAS")
    with tempfile.TemporaryDirectory(prefix="grpoflow-export-") as tmp:
        model = resolve_model(spec, download_dir=tmp, params=params)
        if not model.adapter_dir:
            out = _replace(out_dir, lambda d: _copy_files(Path(model.model_dir), d, Path(model.tokenizer_dir)))
            return out, "full model"
        if merged:  # resolve_model has merged it already
            return _replace(out_dir, lambda d: _copy_files(Path(model.model_dir), d)), "merged model (base + adapter)"

        adapter, base = Path(model.adapter_dir), Path(model.base_dir)

        def write(d: Path) -> None:
            _copy_files(adapter, d)
            for f in Path(model.tokenizer_dir).iterdir():  # the tokenizer, where the registry keeps it apart
                if f.is_file() and "token" in f.name and not (d / f.name).exists():
                    shutil.copy2(f, d / f.name)
            _copy_files(base, d / "base")
            cfg = json.loads((d / adapters.ADAPTER_CONFIG).read_text())
            cfg["base_model_name_or_path"] = "base"
            (d / adapters.ADAPTER_CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

        return _replace(out_dir, write), "adapter, with its base in base/"


def _copy_files(src: Path, dst: Path, tokenizer_dir: Path | None = None) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in MARKERS:  # the copy is marked as an export, not as a stage's output
            shutil.copy2(f, dst / f.name)
    if tokenizer_dir and tokenizer_dir != src:
        for f in tokenizer_dir.iterdir():
            if f.is_file() and f.name not in MARKERS and not (dst / f.name).exists():
                shutil.copy2(f, dst / f.name)


def cli_export(args: argparse.Namespace) -> int:
    """`grpoflow export MODEL DIR [--merged]`."""
    from pipelines.params.config import load_params

    out, what = export(load_params(args.params, args.overrides), args.model, args.dir, args.merged)
    print(f"grpoflow export: wrote {out} ({what})")
    return 0
