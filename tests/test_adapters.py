"""LoRA runs write adapters, not merged copies: `sft.use_lora` and `grpo.use_lora` on the tiny model
(4 SFT steps, 2 GRPO steps), then every reader loads base + adapter.

- models/sft and models/grpo hold adapter_config.json, adapter_model.safetensors, the tokenizer and
  grpoflow_adapter.json naming models/base by its weights' hash; no model weights.
- GRPO continues SFT's adapter over the same base (base + models/grpo is the whole policy), and
  its frozen reference copy is not saved.
- Greedy answers of the merged copy equal those of base + adapter (PEFT) item by item.
- The evaluate stage scores base + each adapter (its completions are PEFT's greedy ones, not the base's); a base
  whose weights changed is refused by name.

    pytest -q tests/test_adapters.py
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from components.models import adapters
from components.models.modelio import is_model_dir
from tests.slow.test_training import make_workdir, stage

LORA = ["sft.use_lora=true", "sft.lora.r=4", "grpo.use_lora=true", "grpo.trainer.max_steps=2"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    workdir = make_workdir(tmp_path_factory.mktemp("lora"))
    stage(workdir, "sft", *LORA)
    stage(workdir, "selection", *LORA, "selection.num_samples=0", "selection.min_prompts=1")
    stage(workdir, "grpo", *LORA)
    return workdir


def test_sft_and_grpo_write_adapters_over_the_base(lora_run: Path):
    base_sha = adapters.weights_sha256(lora_run / "models/base")
    for name in ("sft", "grpo"):
        folder = lora_run / "models" / name
        assert adapters.is_adapter_dir(folder) and not is_model_dir(folder), sorted(os.listdir(folder))
        assert not (folder / "ref").exists()  # TRL's frozen reference adapter is not part of the output
        assert (folder / "tokenizer_config.json").is_file()
        ref = adapters.base_of(folder)
        assert (ref.base_dir, ref.weights_sha256, ref.source) == ("models/base", base_sha, "tiny")
        assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == "models/base"
    from safetensors.torch import load_file

    sft, grpo = (load_file(lora_run / "models" / n / adapters.ADAPTER_WEIGHTS) for n in ("sft", "grpo"))
    assert sft.keys() == grpo.keys() and all("lora_" in k for k in grpo)  # GRPO trained SFT's adapter on
    assert any(not (sft[k] == grpo[k]).all() for k in sft)
    size = sum(f.stat().st_size for f in (lora_run / "models/grpo").iterdir())
    assert size < (lora_run / "models/base/model.safetensors").stat().st_size


def test_merged_copy_answers_like_base_plus_adapter(lora_run: Path, monkeypatch):
    from components.models.modelio import load_model, load_tokenizer
    from components.problems import gsm8k
    from components.problems.sources import read_split
    from components.training.train_samples import greedy

    monkeypatch.chdir(lora_run)
    rows = read_split(Path("data/processed/test.jsonl"))
    for name in ("sft", "grpo"):
        folder = Path("models") / name
        tok = load_tokenizer(folder)
        prompts = [gsm8k.render_prompt(r["question"], tok) for r in rows]
        peft_model = adapters.load_peft(folder, Path("models/base"), None, trainable=False).eval()
        merged_dir = adapters.merged_copy(folder)
        assert is_model_dir(merged_dir)
        merged = load_model(merged_dir, dtype="float32").eval()
        assert greedy(peft_model, tok, prompts, max_new_tokens=24) == greedy(merged, tok, prompts, max_new_tokens=24)


def scramble_adapter(folder: Path, seed: int) -> None:
    """Random lora_B weights (PEFT's init_lora_weights=False draws them so too): an adapter that changes greedy
    answers. The fixture's few steps do not; base, SFT and GRPO all write the same newlines."""
    import torch
    from safetensors.torch import load_file, save_file

    path = folder / adapters.ADAPTER_WEIGHTS
    generator = torch.Generator().manual_seed(seed)
    tensors = load_file(path)
    tensors = {k: torch.randn(v.shape, generator=generator) * 0.5 if "lora_B" in k else v for k, v in tensors.items()}
    save_file(tensors, path, metadata={"format": "pt"})


def test_evaluate_stage_scores_adapter_folders(lora_run: Path, tmp_path: Path, monkeypatch):
    """The stage scores base + each adapter: its completions are the PEFT model's greedy ones, item by item,
    and not the base's."""
    from components.models.modelio import load_tokenizer
    from components.problems import gsm8k
    from components.problems.sources import read_split
    from components.training.train_samples import greedy

    work = tmp_path / "work"
    shutil.copytree(lora_run, work)
    for seed, name in enumerate(("sft", "grpo")):
        scramble_adapter(work / "models" / name, seed)
    stage(work, "evaluate", *LORA, "evaluate.backend=transformers", "evaluate.num_samples=0",
          "evaluate.max_new_tokens=24", "evaluate.include_base=true")
    completions = {m: [json.loads(line)["completion"] for line in (work / f"reports/eval/{m}.items.jsonl").open()]
                   for m in ("base", "sft", "grpo")}
    assert [len(c) for c in completions.values()] == [8, 8, 8]
    monkeypatch.chdir(work)
    rows = read_split(Path("data/processed/test.jsonl"))
    for name in ("sft", "grpo"):
        folder = Path("models") / name
        tok = load_tokenizer(folder)
        peft_model = adapters.load_peft(folder, Path("models/base"), None, trainable=False).eval()
        assert completions[name] == greedy(peft_model, tok, [gsm8k.render_prompt(r["question"], tok) for r in rows], 24)
        assert all(a != b for a, b in zip(completions[name], completions["base"], strict=True)), name


def test_a_changed_base_is_refused_by_name(lora_run: Path, tmp_path: Path):
    work = tmp_path / "work"
    shutil.copytree(lora_run, work)
    from safetensors.torch import load_file, save_file

    path = work / "models/base/model.safetensors"
    tensors = load_file(path)
    first = sorted(tensors)[0]
    tensors[first] = tensors[first] + 1
    save_file(tensors, path, metadata={"format": "pt"})
    proc = stage(work, "evaluate", *LORA, "evaluate.backend=transformers", check=False)
    assert proc.returncode != 0
    assert "adapter models/sft: its base model models/base with weights sha256" in proc.stderr


def test_export_writes_a_merged_model_or_the_adapter_with_its_base(lora_run: Path, tmp_path: Path):
    import subprocess
    import sys

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from components.models.modelio import load_model, load_tokenizer
    from components.training.train_samples import greedy
    from tests.slow.test_training import _env

    work = tmp_path / "work"
    shutil.copytree(lora_run, work)
    for args in (["models/grpo", str(tmp_path / "merged"), "--merged"], ["models/grpo", str(tmp_path / "adapter")]):
        proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "export", *args], cwd=work, env=_env(work),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"grpoflow export: wrote {args[1]}" in proc.stdout
    assert is_model_dir(tmp_path / "merged") and not adapters.is_adapter_dir(tmp_path / "merged")
    assert adapters.is_adapter_dir(tmp_path / "adapter") and is_model_dir(tmp_path / "adapter/base")
    shutil.rmtree(work)  # nothing of the checkout is needed any more

    tok = load_tokenizer(tmp_path / "adapter")
    prompts = ["1 + 2 = ?", "What is 3 + 4?"]
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "adapter/base"),
                                           tmp_path / "adapter")
    assert (greedy(peft_model.eval(), tok, prompts, 16)
            == greedy(load_model(tmp_path / "merged").eval(), tok, prompts, 16))
    again = subprocess.run([sys.executable, "-m", "pipelines.cli", "export", "models/grpo", str(lora_run / "data")],
                           cwd=lora_run, env=_env(lora_run), capture_output=True, text=True, timeout=300)
    assert again.returncode != 0 and "grpoflow did not write" in again.stderr  # never replaces foreign files
