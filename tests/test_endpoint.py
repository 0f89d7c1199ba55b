"""`grpoflow evaluate --model http://HOST:PORT/v1`: an OpenAI-compatible endpoint scored with the
project's protocols, reports and statistics.

A small OpenAI-compatible HTTP server (standard library, in a thread) answers from the gold
answers and fails on purpose (503, 429 with Retry-After, a dropped connection) so that the
client's retries, concurrency and request bodies can be checked; the real vLLM server is
tested end to end in tests/slow/test_serve.py.

    pytest -q tests/test_endpoint.py
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from components.common.errors import BackendError
from components.evaluation.endpoint import connect
from components.evaluation.scoring import sample_seeds
from components.problems import gsm8k
from pipelines import cli
from pipelines.params.config import DataParams
from tests.servers import refused_port


class StubOpenAI:
    """An OpenAI-compatible server on 127.0.0.1: chat answers in the tag format with the gold number
    for greedy requests (and for the first sample of each problem), a wrong one otherwise; every
    `fail_every`-th distinct request fails once with `fail_status` (0: the connection is dropped)."""

    def __init__(self, gold_by_question: dict[str, str], models=("stub",), fail_every=3, fail_status=503):
        self.gold = gold_by_question
        self.models = list(models)
        self.fail_every, self.fail_status = fail_every, fail_status
        self.bodies: list[dict] = []
        self.seen: set[str] = set()
        self.failures = 0
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, obj: dict, headers: dict | None = None) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in stub.models]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = json.dumps(body, sort_keys=True)
                with stub.lock:
                    stub.bodies.append(body)
                    # Every fail_every-th distinct request fails on its first attempt only.
                    fail = key not in stub.seen and len(stub.seen) % stub.fail_every == stub.fail_every - 1
                    stub.seen.add(key)
                    stub.failures += fail
                if fail:
                    if stub.fail_status == 0:  # drop the connection without an answer
                        self.close_connection = True
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        return
                    self._send(stub.fail_status, {"error": "busy"}, {"Retry-After": "0"})
                    return
                question = body["messages"][-1]["content"]
                gold = stub.gold[question]
                first = body.get("seed") is None or body["seed"] == stub.base_seed(question)
                answer = gold if first else str(int(gold) + 1)
                text = f"<reasoning>\nso it is {answer}\n</reasoning>\n<answer>\n{answer}\n</answer>"
                self._send(200, {
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": "stop", "stop_reason": None}],
                    "usage": {"completion_tokens": 11, "prompt_tokens": 30, "total_tokens": 41},
                })

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # the OS picks the port
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.seeds: dict[str, int] = {}

    def base_seed(self, question: str) -> int:
        return self.seeds.get(question, -1)

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def problems(tmp_path, monkeypatch) -> tuple[Path, list[dict]]:
    from components import data

    monkeypatch.chdir(tmp_path)  # the checkout params are loaded for: stage paths live inside it
    data.write_splits(DataParams(output_dir=str(tmp_path / "data"), synthetic_train_size=20, synthetic_test_size=8,
                                 synthetic_test_top_band_size=0))
    rows = [json.loads(line) for line in (tmp_path / "data/test.jsonl").read_text().splitlines()]
    return tmp_path / "data", rows


def evaluate_args(url: str, data_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["evaluate", "--model", url, "--output", str(out), "-S", f"data.output_dir={data_dir}",
            "-S", "evaluate.endpoint_concurrency=4", *extra]


@pytest.mark.parametrize("fail_status", [503, 429, 0])
def test_endpoint_is_scored_like_a_model_with_retries(problems, tmp_path, capsys, fail_status):
    data_dir, rows = problems
    with StubOpenAI({r["question"]: r["gold"] for r in rows}, fail_status=fail_status) as stub:
        stub.seeds = dict(zip([r["question"] for r in rows], sample_seeds(rows, 0), strict=True))
        rc = cli.main(evaluate_args(stub.url, data_dir, tmp_path / "out", "-S", "evaluate.num_samples=3",
                                    "-S", "evaluate.endpoint_retries=3"))
        assert rc == 0, capsys.readouterr().err
    out = tmp_path / "out"
    (report,) = out.glob("*.json")
    metrics = json.loads(report.read_text())
    items = [json.loads(line) for line in report.with_suffix(".items.jsonl").read_text().splitlines()]
    assert metrics["backend"] == "endpoint" and metrics["served_model"] == "stub" and metrics["n"] == 8
    assert metrics["accuracy_strict"] == 1.0 and metrics["format_rate"] == 1.0
    # Samples: the first of each problem is right, the other two wrong.
    assert metrics["sampled_accuracy_strict"] == pytest.approx(1 / 3)
    assert metrics["pass_at_k_strict"] == 1.0 and metrics["maj_at_k_strict"] == 0.0
    assert all(i["completion_tokens"] == 10 for i in items)  # 11 reported, EOS not counted
    assert stub.failures == 8 * (1 + 3) // 3  # every third request failed once, and was retried
    answered = list({json.dumps(b, sort_keys=True): b for b in stub.bodies}.values())
    assert len(answered) == 8 * (1 + 3) and len(stub.bodies) == len(answered) + stub.failures
    greedy = [b for b in answered if b["temperature"] == 0]
    sampled = [b for b in answered if b["temperature"] != 0]
    assert {b["messages"][-1]["content"] for b in greedy} == {r["question"] for r in rows}
    assert all(b["messages"] == gsm8k.build_messages(b["messages"][-1]["content"]) for b in answered)
    assert all(b["model"] == "stub" and b["max_tokens"] == 256 for b in answered)
    assert {b["temperature"] for b in sampled} == {0.8}  # grpo.trainer.temperature
    seeds = {(b["messages"][-1]["content"], b["seed"]) for b in sampled}
    assert seeds == {(q, s + j) for q, s in stub.seeds.items() for j in range(3)}


def test_unreachable_endpoint_fails_naming_the_url(problems, tmp_path, capsys):
    data_dir, _ = problems
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}/v1"
        assert cli.main(evaluate_args(url, data_dir, tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert url in err and "grpoflow serve" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_connect_takes_the_named_or_the_only_served_model(problems):
    _, rows = problems
    with StubOpenAI({}, models=("a", "b")) as stub:
        with pytest.raises(BackendError, match="serves 2 models .*evaluate.endpoint_model"):
            connect(stub.url)
        with pytest.raises(BackendError, match="not 'c'"):
            connect(stub.url, "c")
        assert connect(stub.url, "b").model == "b"


def test_a_request_the_server_rejects_is_not_retried(problems, tmp_path, capsys):
    data_dir, rows = problems
    with StubOpenAI({r["question"]: r["gold"] for r in rows}, fail_every=1, fail_status=400) as stub:
        assert cli.main(evaluate_args(stub.url, data_dir, tmp_path / "out", "-S", "evaluate.num_samples=0")) == 2
        asked = [b["messages"][-1]["content"] for b in stub.bodies]
        assert 1 <= len(asked) <= 8 and len(set(asked)) == len(asked)  # none retried; queued ones not sent
    assert "HTTP 400" in capsys.readouterr().err


def test_served_weights_come_from_safetensors_only(tmp_path):
    """`grpoflow serve` starts vLLM with --load-format safetensors, whatever evaluate.vllm_args say
    (a pickled *.bin beside the weights is never loaded)."""
    import sys

    from components.evaluation.vllm_backend import vllm_server_command

    cmd = vllm_server_command(str(tmp_path), served_names=["m"], host="127.0.0.1", port=8000, dtype="float32", seed=0,
                         vllm_python=sys.executable, vllm_args={"load_format": "pt", "max_num_seqs": 4})
    assert cmd[cmd.index("--load-format") + 1] == "safetensors" and cmd.count("--load-format") == 1
    assert cmd[cmd.index("--max-num-seqs") + 1] == "4"
