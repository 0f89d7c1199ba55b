"""Generation on an OpenAI-compatible server: the backend of `grpoflow evaluate --model http://HOST:PORT/v1`.

Any server that speaks the OpenAI API (`grpoflow serve`, `vllm serve`, a hosted one) is asked
the evaluation's questions with the same decoding the local backends use:

- prompts travel as the server expects them per protocol: `chat` requests carry the messages
  (`/chat/completions`; the server renders the model's chat template, exactly as
  `gsm8k.render_prompt` does locally), `text` requests carry a prompt string (`/completions`,
  the lm-eval-gsm8k protocol, which uses no chat template);
- greedy: `temperature: 0`, `max_tokens`, the protocol's stop strings; samples: one request
  per sample with `temperature` and `seed = sample_seeds[i] + j`, the seeds vLLM gives the j-th
  of `n` samples in-process, so a vLLM server draws what the evaluate stage draws;
- requests run concurrently (`concurrency` threads), 429 and 5xx answers and dropped
  connections are retried with exponential backoff (honouring `Retry-After`) up to `retries`
  times; an unreachable server fails at once with the URL and how to start one.

Token counts are the server's `usage.completion_tokens`, less the EOS token when the answer
stopped on one (vLLM counts it, the local backends do not). Only the standard library is used.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from components.common.errors import BackendError
from components.evaluation.generation import Generation, GenerationSettings

log = logging.getLogger("grpoflow.endpoint")

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


@dataclass
class Endpoint:
    base_url: str  # ends in /v1 (or whatever prefix the server serves the API under)
    model: str  # the served model name requests carry
    timeout: float = 300.0
    retries: int = 5

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if os.environ.get("OPENAI_API_KEY"):
            headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
        data = json.dumps(body).encode() if body is not None else None
        url = self.base_url.rstrip("/") + path
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:500].decode(errors="replace")
                if exc.code not in RETRY_STATUS or attempt == self.retries:
                    raise BackendError(f"endpoint {url}: HTTP {exc.code}: {detail}") from None
                wait = _retry_after(exc.headers.get("Retry-After"), attempt)
                log.warning(
                    "endpoint %s: HTTP %d, retry %d/%d in %.1f s", url, exc.code, attempt + 1, self.retries, wait
                )
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                if attempt == self.retries:
                    raise BackendError(f"endpoint {url}: {_reason(exc)} after {self.retries + 1} attempts") from None
                wait = _retry_after(None, attempt)
                log.warning(
                    "endpoint %s: %s, retry %d/%d in %.1f s", url, _reason(exc), attempt + 1, self.retries, wait
                )
            time.sleep(wait)
        raise AssertionError("unreachable")

    def complete(
        self, request: dict[str, Any], settings: GenerationSettings, temperature: float, seed: int | None
    ) -> tuple[str, int]:
        """(text, completion tokens less EOS) of one request: {"messages": [...]} or {"prompt": str}."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": settings.max_new_tokens,
            "temperature": temperature,
            "top_p": 1.0,
            "n": 1,
        }
        if settings.stop:
            body["stop"] = list(settings.stop)
        if seed is not None:
            body["seed"] = seed
        if "messages" in request:
            answer = self._request("POST", "/chat/completions", {**body, "messages": request["messages"]})
            choice = answer["choices"][0]
            text = (choice.get("message") or {}).get("content") or ""
        else:
            answer = self._request("POST", "/completions", {**body, "prompt": request["prompt"]})
            choice = answer["choices"][0]
            text = choice.get("text") or ""
        tokens = int((answer.get("usage") or {}).get("completion_tokens") or 0)
        # Stopped on an EOS token (vLLM: stop_reason None or a token id), which the server counts.
        if choice.get("finish_reason") == "stop" and not isinstance(choice.get("stop_reason"), str) and tokens:
            tokens -= 1
        return text, tokens


def _retry_after(header: str | None, attempt: int) -> float:
    if header:
        try:
            return min(60.0, float(header))
        except ValueError:
            pass
    return min(30.0, 0.5 * 2**attempt) * (1.0 + 0.25 * random.random())


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", exc)
    return f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__


def connect(base_url: str, model: str = "", timeout: float = 300.0, retries: int = 5) -> Endpoint:
    """The endpoint at `base_url` with its served model (`model`, or the only one it lists); fails
    with the URL and what to do when the server does not answer or the model is not there."""
    probe = Endpoint(base_url, model, timeout=min(timeout, 10.0), retries=0)
    try:
        listed = [m["id"] for m in probe._request("GET", "/models").get("data", [])]
    except BackendError as exc:
        raise BackendError(
            f"{exc}. Is the server running? Start one with `grpoflow serve [MODEL] --port PORT` "
            "(or `vllm serve`) and give its base URL, e.g. http://127.0.0.1:8000/v1"
        ) from None
    if model:
        if listed and model not in listed:
            raise BackendError(
                f"endpoint {base_url}: serves {', '.join(listed)}, not {model!r} (evaluate.endpoint_model)"
            )
        chosen = model
    elif len(listed) == 1:
        chosen = listed[0]
    else:
        raise BackendError(
            f"endpoint {base_url}: serves {len(listed)} models ({', '.join(listed) or 'none'}); "
            "choose one with -S evaluate.endpoint_model=NAME"
        )
    return Endpoint(base_url, chosen, timeout=timeout, retries=retries)


def generate_on_endpoint(
    endpoint: Endpoint,
    requests: list[dict[str, Any]],
    settings: Any,
    sample_seeds: list[int],
    concurrency: int = 64,
) -> Generation:
    """Greedy completions of every request, then `settings.num_samples` samples each (backend `endpoint`)."""
    k = settings.num_samples

    def run(job: tuple[int, float, int | None]) -> tuple[str, int]:
        i, temperature, seed = job
        return endpoint.complete(requests[i], settings, temperature, seed)

    pool = ThreadPoolExecutor(max_workers=concurrency)
    try:
        t0 = time.perf_counter()
        greedy = list(pool.map(run, [(i, 0.0, None) for i in range(len(requests))]))
        t1 = time.perf_counter()
        flat = list(pool.map(
            run, [(i, settings.temperature, sample_seeds[i] + j) for i in range(len(requests)) for j in range(k)]
        ))
        t2 = time.perf_counter()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # a failed request stops the queued ones
    samples = [flat[i * k : (i + 1) * k] for i in range(len(requests))] if k else []
    return Generation(
        completions=[a[0] for a in greedy],
        num_tokens=[a[1] for a in greedy],
        seconds=t1 - t0,
        load_seconds=0.0,
        backend="endpoint",
        details={"endpoint": endpoint.base_url, "served_model": endpoint.model},
        samples=[[a[0] for a in s] for s in samples],
        sample_tokens=[[a[1] for a in s] for s in samples],
        sample_seconds=t2 - t1,
    )
