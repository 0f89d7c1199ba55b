"""`grpoflow evaluate --protocol lm-eval-gsm8k` beside lm-evaluation-harness's own `gsm8k` task.

A user's GSM8K-format files in GSM8K's layout (DIR/train.jsonl beside DIR/test.jsonl, written here:
40 train and 100 test problems), one tiny model behind `grpoflow serve` (vLLM), and on it:

- `grpoflow evaluate --model http://.../v1 --protocol lm-eval-gsm8k --data jsonl:DIR/test.jsonl`, no
  few-shot setting: its examples come from DIR/train.jsonl, and it says so;
- lm-evaluation-harness 0.4.13 (`make venv-lmeval`: its own venv, `.venv-lmeval`) running its own
  gsm8k.yaml, only the dataset location overridden (a task that `include`s it, reading the same two
  files with the `json` builder), `--model local-completions` against the same server,
  `--log_samples`.

Every harness context is the prompt `lm_eval_gsm8k.build_fewshot_prompts` builds, and every completion, extracted
answer and verdict (strict-match, flexible-extract) is grpoflow's, item by item. Both sides send one
request at a time and the same generation budget (32 tokens: a random tiny model rarely stops early),
so the server's batching cannot make the numbers differ. A few minutes on two cores, most of it vLLM's
start-up and the harness's imports.

    make venv-vllm venv-lmeval && pytest -q tests/slow/test_lm_eval_harness.py
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from components.evaluation import lm_eval_gsm8k
from components.evaluation.generation import resolve_vllm_python, vllm_importable
from components.problems.sources import load_problems
from pipelines import cli
from pipelines.params.config import DataParams, ModelParams
from tests.servers import served

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
LMEVAL_PYTHON = REPO / ".venv-lmeval" / "bin" / "python"
MAX_TOKENS = 32


def gsm8k_rows(n: int, seed: int) -> list[dict[str, str]]:
    """GSM8K-format problems ({question, answer} with `<<...>>` annotations and `#### N`), one or two steps."""
    rnd = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, c = rnd.randint(2, 60), rnd.randint(2, 30), rnd.randint(2, 5)
        who, what = rnd.choice(["Tom", "Ann", "Raj", "Mia", "Leo"]), rnd.choice(["apples", "pens", "cards", "shells"])
        if rnd.random() < 0.5:
            question = f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have now?"
            answer = f"{who} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {what}.\n#### {a + b}"
        else:
            t = a * c
            question = f"{who} buys {c} boxes of {a} {what} each and gives away {b}. How many {what} are left?"
            answer = (f"The boxes hold {c} * {a} = <<{c}*{a}={t}>>{t} {what}.\n"
                      f"{who} keeps {t} - {b} = <<{t}-{b}={t - b}>>{t - b} {what}.\n#### {t - b}")
        rows.append({"question": question, "answer": answer})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def harness_task(include_dir: Path, gsm8k_dir: Path) -> str:
    """A task that is the harness's gsm8k.yaml with only the dataset read from the local files."""
    gsm8k_yaml = subprocess.run(
        [str(LMEVAL_PYTHON), "-c", "import lm_eval.tasks as t, os; "
         "print(os.path.join(os.path.dirname(t.__file__), 'gsm8k', 'gsm8k.yaml'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    include_dir.mkdir(parents=True)
    (include_dir / "gsm8k_local.yaml").write_text(
        f"include: {gsm8k_yaml}\ntask: gsm8k_local\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    train: {gsm8k_dir / 'train.jsonl'}\n"
        f"    test: {gsm8k_dir / 'test.jsonl'}\n"
    )
    return "gsm8k_local"


def test_lm_eval_protocol_answers_as_the_harness_gsm8k_task(tmp_path, monkeypatch):
    if not LMEVAL_PYTHON.exists() or not (vllm_importable() or resolve_vllm_python(".venv-vllm/bin/python", REPO)):
        if os.environ.get("CI"):
            pytest.fail("CI must provide lm-eval and vLLM for this test: run `make venv-lmeval venv-vllm` first")
        pytest.skip("needs `make venv-lmeval` (lm-eval 0.4.13) and `make venv-vllm`")
    import torch

    from components import data
    from components import model as model_stage
    from components.models.modelio import save_model

    monkeypatch.chdir(tmp_path)  # the checkout: stage paths must lie inside it
    gsm8k_dir = tmp_path / "gsm8k"
    write_jsonl(gsm8k_dir / "train.jsonl", gsm8k_rows(40, seed=1))
    write_jsonl(gsm8k_dir / "test.jsonl", gsm8k_rows(100, seed=2))
    # A tiny Qwen2 (head_dim 32, as vLLM's CPU attention needs) whose context holds a 5-shot prompt.
    data.write_splits(DataParams(output_dir=str(tmp_path / "prep"), synthetic_train_size=60, synthetic_test_size=4,
                                 synthetic_test_top_band_size=0))
    cfg = ModelParams(seed=3, tiny_hidden_size=64, tiny_num_heads=2, tiny_num_layers=2, tiny_intermediate_size=128,
                      tiny_max_positions=1024)
    model, tok = model_stage.build_tiny(cfg, tmp_path / "prep/train.jsonl")
    # At the usual init (std 0.02) it answers every prompt with the same string, which would make the
    # comparison empty; weights drawn with std 0.3 make each completion depend on its prompt.
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for weight in (p for p in model.parameters() if p.dim() == 2):
            weight.copy_(torch.randn(weight.shape, generator=gen) * 0.3)
    save_model(model, tok, tmp_path / "model")

    log = tmp_path / "serve.log"

    def cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "pipelines.cli", "serve", str(tmp_path / "model"), "--port", str(port),
                "-S", "evaluate.dtype=float32"]

    def ready(server) -> bool:
        return "is ready at" in log.read_text(errors="replace")

    with served(cmd, "", log, cwd=tmp_path, timeout=900, ready=ready) as server:
        base = server.url + "/v1"
        with urllib.request.urlopen(base + "/models", timeout=10) as resp:
            (served_name,) = [m["id"] for m in json.loads(resp.read())["data"]]

        # grpoflow: the few-shot source is the only thing it is not told.
        out = tmp_path / "grpoflow"
        rc = cli.main(["evaluate", "--model", base, "--protocol", "lm-eval-gsm8k", "--data",
                       f"jsonl:{gsm8k_dir / 'test.jsonl'}", "--output", str(out),
                       "-S", f"evaluate.max_new_tokens={MAX_TOKENS}", "-S", "evaluate.num_samples=0",
                       "-S", "evaluate.endpoint_concurrency=1"])
        assert rc == 0

        # The harness: its own gsm8k task on the same files, model and engine.
        task = harness_task(tmp_path / "tasks", gsm8k_dir)
        model_args = (f"base_url={base}/completions,model={served_name},tokenized_requests=False,"
                      "tokenizer_backend=None,num_concurrent=1,max_retries=3")
        env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)
        harness = subprocess.run(
            [str(LMEVAL_PYTHON), "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args,
             "--tasks", task, "--include_path", str(tmp_path / "tasks"), "--gen_kwargs", f"max_gen_toks={MAX_TOKENS}",
             "--log_samples", "--output_path", str(tmp_path / "harness")],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900,
        )
        assert harness.returncode == 0, harness.stderr[-3000:]

    metrics = json.loads((out / f"endpoint-127.0.0.1-{server.port}.json").read_text())
    items = [json.loads(line)
             for line in (out / f"endpoint-127.0.0.1-{server.port}.items.jsonl").read_text().splitlines()]
    assert metrics["fewshot_source"] == f"jsonl:{gsm8k_dir / 'train.jsonl'}" and metrics["n"] == len(items) == 100
    (samples_file,) = (tmp_path / "harness").rglob(f"samples_{task}_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    by_filter = {f: {s["doc_id"]: s for s in samples if s["filter"] == f} for f in ("strict-match", "flexible-extract")}
    assert all(sorted(rows) == list(range(100)) for rows in by_filter.values())
    strict, flexible = by_filter["strict-match"], by_filter["flexible-extract"]

    # The harness's contexts are build_fewshot_prompts' prompts (GSM8K train given: its sampler, its text).
    test = load_problems(f"jsonl:{gsm8k_dir / 'test.jsonl'}")
    train = load_problems(f"jsonl:{gsm8k_dir / 'train.jsonl'}", split="train")
    prompts = lm_eval_gsm8k.build_fewshot_prompts([p["question"] for p in test],
                                                  [{"question": r["question"], "answer": r["answer"]} for r in train])
    contexts = [strict[i]["arguments"]["gen_args_0"]["arg_0"] for i in range(100)]
    assert [i for i in range(100) if contexts[i] != prompts[i]] == []

    # Item by item: the completion, the extracted answers and the verdicts.
    rows = [(item, strict[i], flexible[i]) for i, item in enumerate(items)]
    differ = [(i, item["completion"][:40], s["resps"][0][0][:40]) for i, (item, s, _) in enumerate(rows)
              if item["completion"] != s["resps"][0][0]]
    assert not differ, f"{len(differ)} of 100 completions differ, e.g. {differ[:3]}"
    assert [item["extracted"] for item, _, _ in rows] == [s["filtered_resps"][0] for _, s, _ in rows]
    assert [item["extracted_flexible"] for item, _, _ in rows] == [f["filtered_resps"][0] for _, _, f in rows]
    assert [float(item["correct"]) for item, _, _ in rows] == [s["exact_match"] for _, s, _ in rows]
    assert [float(item["correct_flexible"]) for item, _, _ in rows] == [f["exact_match"] for _, _, f in rows]
    assert len({item["completion"] for item in items}) > 90  # each answer depends on its prompt
