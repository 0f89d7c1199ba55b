"""A throw-away grpoflow checkout with trivial stages, for flow, deployment and UI tests.

`make_toy_repo(path, model_src)` creates a real git + DVC repository (with a local DVC
remote) whose `dvc.yaml` has the project's stage names, declared out of order so that the
flow must sort them by the graph:

    prepare  -> data/processed/items.jsonl, train.jsonl, test.jsonl   (params: toy.yaml prepare.n)
    grpo     -> models/grpo (a copy of a real tiny HF model + skill.txt)   (toy.yaml grpo.*)
    evaluate -> reports/eval/grpo.items.jsonl + grpo.json + sft.json        (item i correct iff i % 100 < skill)

The grpo and evaluate stages log to MLflow through `components.common.tracking.stage_run`;
prepare does not (the flow then makes its child run). `grpo.fail: true` makes grpo exit 1 (an
`error:` line, then 40 lines of shutdown chatter);
every grpo execution appends a line to `<repo>/../grpo-runs.log` and draws a progress bar
(`toy training N/5`, redrawn with carriage returns).

    python tests/toy_repo.py DIR MODEL_DIR      # build one by hand
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

TOY_PY = '''
"""Trivial stages for flow tests: python toy.py prepare|grpo|evaluate."""
import json, os, shutil, sys
from pathlib import Path
import yaml

cfg = yaml.safe_load(open("toy.yaml"))
stage = sys.argv[1]
if stage == "prepare":
    Path("data/processed").mkdir(parents=True, exist_ok=True)
    with open("data/processed/items.jsonl", "w") as fh:
        for i in range(cfg["prepare"]["n"]):
            fh.write(json.dumps({"id": f"q{i}"}) + "\\n")
    for split, n in (("train", 8), ("test", 4)):  # what the flow logs as MLflow datasets
        with open(f"data/processed/{split}.jsonl", "w") as fh:
            for i in range(n):
                fh.write(json.dumps({"id": f"{split}-{i}", "question": f"{i} + 1?", "solution": "",
                                     "gold": str(i + 1)}) + "\\n")
    sys.exit(0)

from pipelines.params.config import load_params
from components.common.tracking import stage_run
import mlflow

with stage_run(stage, load_params(), extra_params={"toy": cfg.get(stage, {})}):
    if stage == "grpo":
        with open(Path("..") / "grpo-runs.log", "a") as fh:
            fh.write("ran\\n")
        for step in range(1, 6):  # a progress bar, redrawn in place as tqdm does
            print(f"\\rtoy training {step}/5", end="", flush=True)
        print(flush=True)
        if cfg["grpo"].get("fail"):
            print("error: toy grpo: failing on purpose", file=sys.stderr)  # as components/common/entry.py states it
            for i in range(40):  # then an engine's shutdown chatter, as vLLM's
                print(f"(EngineCore pid=1) INFO 12-02 16:55:03 [core.py:{i}] [shutdown] step {i}", file=sys.stderr)
            sys.exit(1)
        tmp = Path("models/grpo.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(cfg["grpo"]["model_src"], tmp)
        (tmp / "skill.txt").write_text(str(cfg["grpo"]["skill"]))
        shutil.rmtree("models/grpo", ignore_errors=True)
        os.replace(tmp, "models/grpo")
        mlflow.log_metric("train_loss", 1.0 / (1 + cfg["grpo"]["skill"]))
    else:
        skill = int(Path("models/grpo/skill.txt").read_text())
        ids = [json.loads(line)["id"] for line in open("data/processed/items.jsonl")]
        Path("reports/eval").mkdir(parents=True, exist_ok=True)
        correct = [int(i[1:]) % 100 < skill for i in ids]
        with open("reports/eval/grpo.items.jsonl", "w") as fh:
            for i, c in zip(ids, correct):
                fh.write(json.dumps({"id": i, "completion": "<answer>1</answer>", "extracted": "1",
                                     "correct": c}) + "\\n")
        acc = sum(correct) / len(correct)
        # What the real evaluate stage records: which items (sha256) with which settings.
        import hashlib
        evaluated_on = {"test_sha256": hashlib.sha256(open("data/processed/items.jsonl", "rb").read()).hexdigest(),
                        "protocol": "grpoflow", "max_new_tokens": 256}
        json.dump({"accuracy_strict": acc, "format_rate": 1.0, "n": len(ids), **evaluated_on},
                  open("reports/eval/grpo.json", "w"))
        json.dump({"accuracy_strict": 0.1, "format_rate": 0.5, "n": len(ids)}, open("reports/eval/sft.json", "w"))
        mlflow.log_metric("accuracy_strict", acc)
'''

DVC_YAML = """
stages:
  evaluate:
    cmd: python toy.py evaluate
    deps: [toy.py, models/grpo, data/processed/items.jsonl]
    outs:
      - reports/eval/grpo.items.jsonl
    metrics:
      - reports/eval/grpo.json: {cache: false}
      - reports/eval/sft.json: {cache: false}
  grpo:
    cmd: python toy.py grpo
    deps: [toy.py, data/processed/items.jsonl]
    params:
      - toy.yaml:
          - grpo
    outs:
      - models/grpo:
          persist: true
  prepare:
    cmd: python toy.py prepare
    deps: [toy.py]
    params:
      - toy.yaml:
          - prepare
    outs:
      - data/processed/items.jsonl
      - data/processed/train.jsonl
      - data/processed/test.jsonl
"""


def make_tiny_model(out: Path) -> Path:
    """A 1-layer Qwen2 model with a character-level tokenizer: real, loadable, ~50 KB."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {t: i for i, t in
             enumerate(["<pad>", "<eos>", "<unk>", " ", *"0123456789abcdefghijklmnopqrstuvwxyz?+=<>/"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    cfg = Qwen2Config(
        vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        eos_token_id=1, pad_token_id=0, tie_word_embeddings=True,
    )
    import torch

    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    fast.save_pretrained(out)
    return out


def stop_prefect_temporary_server() -> None:
    """Flush Prefect's log and event workers, then stop the temporary server this process started
    (else, at exit, they retry a server that is gone and print tracebacks after the test report)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.server.api.server import SubprocessASGIServer

    APILogWorker.drain_all()
    EventsWorker.drain_all()
    SubprocessASGIServer().stop()


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *args],
        cwd=root, check=True, capture_output=True,
    )


def make_toy_repo(root: Path, model_src: Path, n: int = 200, skill: int = 30) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "toy.py").write_text(TOY_PY)
    (root / "dvc.yaml").write_text(DVC_YAML)
    write_toy_params(root, n=n, skill=skill, model_src=model_src)
    (root / "params.yaml").write_text(
        textwrap.dedent(
            """\
            register:
              alpha: 0.05
            tracking:
              run_lock_timeout: 120
            """
        )
    )
    git(root, "init", "-q")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=root, check=True)
    subprocess.run(
        [sys.executable, "-m", "dvc", "remote", "add", "-d", "local", str(root.parent / "dvc-remote")],
        cwd=root, check=True,
    )
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "toy pipeline")
    return root


def write_toy_params(root: Path, **changes) -> None:
    path = root / "toy.yaml"
    cfg = yaml.safe_load(path.read_text()) if path.exists() else {"prepare": {"n": 200}, "grpo": {"skill": 30}}
    if "n" in changes:
        cfg["prepare"]["n"] = changes.pop("n")
    if "model_src" in changes:
        changes["model_src"] = str(changes["model_src"])
    cfg["grpo"].update(changes)
    path.write_text(yaml.safe_dump(cfg))


if __name__ == "__main__":
    out, model = Path(sys.argv[1]), Path(sys.argv[2])
    if out.exists():
        shutil.rmtree(out)
    print(make_toy_repo(out, model))
