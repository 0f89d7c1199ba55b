"""Models and tokenizers: load one by Hugging Face id or folder, or build the offline `tiny` model.

The `model` stage (DVC stage `model`) writes the base model every later stage starts from
into `model.base_dir` (default `models/base`), as a standard model folder:

- `model.name_or_path: tiny` (the embedded default) builds a small Qwen2-style model from a
  config, with a byte-level BPE tokenizer trained here on the train split (digits split into
  single tokens, pad and eos tokens, a ChatML chat template). Nothing is downloaded, and the
  same seed and data give byte-identical files.
- a Hugging Face id (e.g. `Qwen/Qwen2.5-0.5B-Instruct`, optionally pinned by `model.revision`)
  or a local folder is loaded (safetensors only; custom code only with
  `model.trust_remote_code`) and saved into `model.base_dir`, so that DVC versions the exact
  weights the pipeline trained from.

    python -m components.modeling                      # build models/base from params.yaml
    python -m components.modeling -S model.seed=1
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from components.atomic import replace_dir
from components.config import ConfigError, ModelConfig, add_params_args, load_params
from components.finetune import InputError

log = logging.getLogger("grpoflow.modeling")

TINY = "tiny"
# ChatML, as Qwen2 uses it, minus the system turn: a model of half a million parameters cannot
# follow instructions, it learns the answer format from SFT; and the system prompt would be a
# third of every training sequence, i.e. a third of the CPU time of SFT and GRPO.
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{%- for message in messages if message['role'] != 'system' -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


# --------------------------------------------------------------------------- loading


def resolve_dtype(name: str):
    """torch dtype for `model.dtype`; 'auto' is bf16 on a GPU that supports it, float32 otherwise."""
    import torch

    if name == "auto":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def is_model_dir(path: str | os.PathLike) -> bool:
    p = Path(path)
    return (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def load_tokenizer(name_or_path: str | os.PathLike, cfg: ModelConfig):
    """The tokenizer, with a pad token (eos if it has none) and left padding for generation."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        str(name_or_path), trust_remote_code=cfg.trust_remote_code, revision=_revision(name_or_path, cfg)
    )
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name_or_path: str | os.PathLike, cfg: ModelConfig):
    """A causal LM in `model.dtype`; safetensors only."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(name_or_path),
        dtype=resolve_dtype(cfg.dtype),
        trust_remote_code=cfg.trust_remote_code,
        use_safetensors=True,
        revision=_revision(name_or_path, cfg),
    )


def require_model_dir(path: str | os.PathLike, what: str, stage: str) -> None:
    """Fail early, naming the stage that writes the folder, when a model folder is missing."""
    if not is_model_dir(path):
        raise FileNotFoundError(
            f"{what} folder {path} is missing or has no config.json and *.safetensors; "
            f"run `dvc repro {stage}` (or `python -m components.{_MODULES.get(stage, stage)}`) first"
        )


_MODULES = {"model": "modeling"}


def load_model_and_tokenizer(path: str | os.PathLike, cfg: ModelConfig):
    """Model and tokenizer of a model folder (or hub id)."""
    return load_model(path, cfg), load_tokenizer(path, cfg)


def _revision(name_or_path: str | os.PathLike, cfg: ModelConfig) -> str | None:
    # A revision only means something for a hub id, not for a folder written by a stage.
    return (
        cfg.revision
        if str(name_or_path) == cfg.name_or_path and not Path(str(name_or_path)).exists()
        else None
    )


def generate(
    model, tokenizer, prompts: list[str], max_new_tokens: int = 256, batch_size: int = 64
) -> list[str]:
    """Greedy completions of rendered prompts, batched with left padding (tokenized as TRL's GRPO
    trainer tokenizes text prompts)."""
    import torch

    was_training = model.training
    model.eval()
    # Stop at any of the model's eos tokens and the tokenizer's, as TRL's trainers do.
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id not in eos:
        eos.insert(0, tokenizer.eos_token_id)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    out: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True).to(model.device)
            with torch.inference_mode():
                ids = model.generate(
                    **enc,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=eos,
                )
            out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out


# --------------------------------------------------------------------------- atomic outputs


def save_model(
    model,
    tokenizer,
    out_dir: str | os.PathLike,
    extra_files: dict[str, Any] | None = None,
    state_dict: dict | None = None,
) -> Path:
    """save_pretrained model + tokenizer (safetensors) into `out_dir` atomically, plus JSON side
    files; `state_dict` overrides the model's own weights (gathered ones, under ZeRO-3)."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        for name, obj in (extra_files or {}).items():
            (tmp / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")

    return replace_dir(out_dir, write)


# --------------------------------------------------------------------------- the tiny model


def read_texts(train_path: str | os.PathLike) -> list[str]:
    """The tokenizer's corpus: what the model reads and writes in training, i.e. per train row the
    question and the tagged target (the tiny chat template drops the system prompt)."""
    from components import gsm8k
    from components.finetune import read_rows

    texts = []
    for row in read_rows(train_path):
        texts += [row["question"], gsm8k.format_target(row["solution"], row["gold"])]
    return texts


def train_tokenizer(texts: Iterable[str], vocab_size: int, model_max_length: int = 512):
    """Byte-level BPE trained on `texts`, digits split into single tokens, with ChatML specials."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    # Exactly Qwen2's pipeline (NFC, Qwen2's split regex, byte-level BPE): transformers rebuilds a
    # qwen2 model's tokenizer with it on load, and vLLM reads tokenizer.json as saved; both must
    # see the tokenizer trained here. The regex puts every digit in a token of its own, which
    # arithmetic needs.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    # Rebuilt as transformers' own Qwen2 tokenizer class (same pipeline as above), so that the
    # saved folder names a class every transformers and vLLM version knows.
    state = json.loads(tok.to_str())["model"]
    return Qwen2Tokenizer(
        vocab=state["vocab"],
        merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]],
        unk_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens=[BOS_TOKEN],
        padding_side="left",  # decoder-only generation pads on the left
        model_max_length=model_max_length,
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny(cfg: ModelConfig, train_path: str | os.PathLike):
    """(model, tokenizer): a seeded Qwen2 of the `model.tiny_*` shape and its local tokenizer."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = train_tokenizer(read_texts(train_path), cfg.tiny_vocab_size, cfg.tiny_max_positions)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.tiny_hidden_size,
        intermediate_size=cfg.tiny_intermediate_size,
        num_hidden_layers=cfg.tiny_num_layers,
        num_attention_heads=cfg.tiny_num_heads,
        num_key_value_heads=cfg.tiny_num_heads,
        max_position_embeddings=cfg.tiny_max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    return model, tokenizer


# --------------------------------------------------------------------------- the stage


def run(cfg: ModelConfig, train_path: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> Path:
    """Write the base model folder: the tiny model built here, or a copy of a hub/local model."""
    out_dir = Path(out_dir or cfg.base_dir)
    if cfg.name_or_path == TINY:
        model, tokenizer = build_tiny(cfg, train_path)
        source = {"name_or_path": TINY, "seed": cfg.seed, "train_data": str(train_path)}
    else:
        model, tokenizer = load_model(cfg.name_or_path, cfg), load_tokenizer(cfg.name_or_path, cfg)
        source = {"name_or_path": cfg.name_or_path, "revision": cfg.revision}
    n_params = sum(p.numel() for p in model.parameters())
    source["parameters"] = n_params
    save_model(model, tokenizer, out_dir, {"grpoflow_source.json": source})
    log.info(
        "wrote %s (%s, %d parameters, vocabulary %d)", out_dir, cfg.name_or_path, n_params, len(tokenizer)
    )
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.modeling", description=__doc__.split("\n\n")[0]
    )
    add_params_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        params = load_params(args.params, args.overrides)
        run(params.model, Path(params.data.output_dir) / "train.jsonl")
    except (ConfigError, InputError, OSError) as exc:  # OSError: a hub id that cannot be fetched
        parser.exit(2, f"error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
