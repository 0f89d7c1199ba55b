"""The GPU check: the SFT, GRPO and evaluate stages' own code on a CUDA machine, timed, in one command.

For each preset named (default qwen2.5-0.5b-gpu, then qwen2.5-1.5b-gpu while the time budget lasts)
it builds a model of the preset's architecture (ARCHITECTURES: the real model's config values) at
random initialisation: nothing is downloaded, and its speed and memory are the real model's. Its
tokenizer is trained here and widened to the model's vocabulary; the folder is a user's model that
`model.name_or_path` points at. Params: params.yaml, the preset's overrides (pipelines/params/presets.py),
then CHECK (synthetic data, `grpo.trainer.use_vllm=false`, evaluation on transformers). Phases:

  data       the data stage's splits (components/data.py write_splits)
  model      the model stage's build_base: the user's folder copied into models/base
  sft        the SFT stage's trainer (components/sft.py: its TRL config, LoRA and demonstrations):
             tokens per second (padding excluded), peak memory, model FLOPs utilisation (useful
             FLOPs as benchmarks/step_clock.py counts them, against --peak-tflops: 790, the bf16
             matrix rate measured on an H200)
  grpo       the GRPO stage's trainer as benchmarks/grpo_step.py builds it: each part of a step
             (generation, reference forward, policy forward/backward, optimizer, other), completions
             and tokens per second, peak memory
  evaluate   the evaluate stage's scoring (components/evaluation/scoring.py), transformers backend,
             batched greedy decoding: tokens and completions per second, peak memory

A random model does not stop early: completions run to their limit (768 tokens in both presets),
the slowest case; the synthetic problems are shorter than GSM8K's. vLLM rollouts are not checked.
Each phase is guarded: a failure is recorded with its error line (traceback in the log) and the
next phase runs; at `--budget` seconds (default 420) the running phase stops and the rest are
skipped, with a note. `--out` receives gpu_check.json (rewritten after every phase) and
gpu_check.log. `--cpu` runs the same path on TINY (two layers, a few steps, short completions) in
float32, or bf16 where the CPU has it natively (components/training/precision.py).

    python benchmarks/gpu_check.py --out /tmp/gpu-check                # a CUDA machine: within the budget
    python benchmarks/gpu_check.py --cpu --out /tmp/gpu-check          # any machine: about 30 s on 2 cores

docs/development.md shows the wheels it needs where only torch, transformers and peft are installed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

START = time.monotonic()
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.grpo_gain import OFFLINE_ENV  # noqa: E402
from benchmarks.grpo_step import build_trainer  # noqa: E402
from benchmarks.phase_report import Check, OutOfTime, Tee, error_line, rounded  # noqa: E402
from benchmarks.step_clock import PARTS, StepClock, bench_args, step_flops  # noqa: E402

log = logging.getLogger("grpoflow.gpu_check")

PRESETS = ("qwen2.5-0.5b-gpu", "qwen2.5-1.5b-gpu")
_QWEN = {"num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True, "rope_theta": 1e6,
         "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}
ARCHITECTURES = {  # Qwen2.5-0.5B-Instruct's and Qwen2.5-1.5B-Instruct's config.json
    "qwen2.5-0.5b-gpu": {**_QWEN, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                         "intermediate_size": 4864},
    "qwen2.5-1.5b-gpu": {**_QWEN, "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
                         "intermediate_size": 8960},
}
TINY = {**_QWEN, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 4096, "max_position_embeddings": 2048}
CHECK = ["data.train_source=synthetic", "data.test_source=synthetic", "data.synthetic_train_size=400",
         "data.synthetic_test_size=64", "data.synthetic_test_top_band_size=0", "data.synthetic_answer_only_size=64",
         "data.synthetic_max_steps=6",
         "data.synthetic_test_max_steps=6", "data.synthetic_answer_only_max_steps=6", "grpo.trainer.use_vllm=false",
         "evaluate.backend=transformers", "evaluate.num_samples=0", "evaluate.limit=64"]
CPU_CHECK = ["data.synthetic_train_size=60", "data.synthetic_answer_only_size=20", "data.synthetic_max_steps=2",
             "data.synthetic_test_max_steps=3", "data.synthetic_answer_only_max_steps=3", "model.dtype=float32",
             "model.cpu_training_precision=auto", "sft.trainer.per_device_train_batch_size=4",
             "sft.trainer.max_length=256", "grpo.trainer.num_generations=4",
             "grpo.trainer.per_device_train_batch_size=4",
             "grpo.trainer.gradient_accumulation_steps=1", "grpo.trainer.max_completion_length=16",
             "evaluate.dtype=float32", "evaluate.max_new_tokens=16", "evaluate.batch_size=4", "evaluate.limit=8"]
SFT_WARMUP, GRPO_WARMUP = 2, 1  # steps run before the measured ones (CUDA start-up, allocator growth)
BATCH = ("per_device_train_batch_size", "gradient_accumulation_steps")
VERSIONS = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers", "huggingface_hub",
            "pyarrow")


def widen_vocabulary(tokenizer_json: Path, size: int) -> int:
    """Fill a saved tokenizer's vocabulary up to `size` ids with words no text encodes to (no merge
    makes them), so that every id of the model's vocabulary decodes, as a real model's tokenizer
    covers its ids; returns the number added."""
    data = json.loads(tokenizer_json.read_text())
    vocab = data["model"]["vocab"]
    first = max([*vocab.values(), *(t["id"] for t in data.get("added_tokens", []))]) + 1
    fresh = (w for w in (f"\u0120zq{n}" for n in itertools.count()) if w not in vocab)  # byte-level " zq<n>"
    for next_id in range(first, size):
        vocab[next(fresh)] = next_id
    tokenizer_json.write_text(json.dumps(data, ensure_ascii=False))
    return max(size - first, 0)


def random_model(arch: dict[str, Any], params: Any, train: Path, out: Path) -> dict[str, Any]:
    """A model of `arch` at random initialisation (seed 0) in `model.dtype`, with a tokenizer trained on
    `train` and widened to the model's vocabulary, saved as a model folder `out`."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from components import model as model_stage
    from components.models.modelio import resolve_dtype, save_model

    tokenizer = model_stage.train_tokenizer(model_stage.read_texts(train), params.model.tiny_vocab_size,
                                            arch["max_position_embeddings"])
    # the tiny model's ChatML with the system turn kept, as Qwen's own template renders it
    tokenizer.chat_template = model_stage.CHAT_TEMPLATE.replace(" if message['role'] != 'system'", "")
    assert tokenizer.chat_template != model_stage.CHAT_TEMPLATE, "components/model.py's CHAT_TEMPLATE changed"
    config = Qwen2Config(**arch, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # initialised where it is fast
        model = Qwen2ForCausalLM(config).to(resolve_dtype(params.model.dtype))
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=False)
    save_model(model, tokenizer, out)
    trained = len(tokenizer)
    widen_vocabulary(out / "tokenizer.json", config.vocab_size)
    return {"parameters": sum(p.numel() for p in model.parameters()), "tokenizer_trained_tokens": trained}


def trainer_settings(args: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The TRL arguments a phase reports beside its figures."""
    checkpointing = bool(args.gradient_checkpointing)
    return {"bf16": bool(args.bf16), "gradient_checkpointing": checkpointing, **{n: getattr(args, n) for n in names}}


def count_tokens(trainer: Any, clock: StepClock) -> None:
    """Count each training micro-batch's real tokens (attention mask) and sequences into `clock`."""
    step = trainer.training_step

    def counted(model, inputs, *args, **kwargs):
        mask = inputs.get("attention_mask")
        clock.count("tokens", int(mask.sum()) if mask is not None else inputs["input_ids"].numel())
        clock.count("sequences", len(inputs["input_ids"]))
        return step(model, inputs, *args, **kwargs)

    trainer.training_step = counted


def data_phase(overrides: list[str]) -> dict[str, Any]:
    from components import data
    from components.common.params_load import load_params

    return {"rows": data.write_splits(load_params("params.yaml", overrides).data)["counts"]}


def model_phase(arch: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """The user's model folder (random_model), then the model stage's copy of it into models/base."""
    from components import model as model_stage
    from components.common.params_load import load_params

    params = load_params("params.yaml", overrides)
    train = Path(params.data.output_dir) / "train.jsonl"
    info = random_model(arch, params, train, Path(params.model.name_or_path))
    model_stage.build_base(params.model, train)
    return info


def sft_phase(workdir: Path, overrides: list[str], steps: int, peak_tflops: float) -> dict[str, Any]:
    from trl import SFTTrainer

    from components import sft
    from components.common.params_load import load_params
    from components.models import modelio
    from components.problems.sources import read_split

    params = load_params("params.yaml", overrides)
    args, peft_config = sft.trainer_settings(params)
    bench_args(args, SFT_WARMUP + steps, workdir / "checkpoints")
    model, tokenizer = modelio.load_model_and_tokenizer(params.model.base_dir, params.model)
    rows, _dev = sft.split_dev(read_split(Path(params.data.output_dir) / "train.jsonl"), params.sft.dev_size)
    dataset, _counts = sft.build_demos(rows, tokenizer, params.sft)
    clock = StepClock()
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=[clock.callback()])
    clock.instrument(trainer)
    count_tokens(trainer, clock)
    trainer.train()
    mean, tok = clock.mean_step(SFT_WARMUP, ("tokens", "sequences"))
    lora = peft_config is not None
    flops = step_flops(trainer.model, {"prompt": tok["tokens"], "completion": 0, "sequences": tok["sequences"]},
                       lora, 0)["policy_forward_backward"]
    return {
        "steps_measured": len(clock.steps) - SFT_WARMUP, "step_seconds": mean["step"],
        "sequences_per_step": tok["sequences"], "tokens_per_step": tok["tokens"],
        "mean_sequence_tokens": tok["tokens"] / tok["sequences"], "tokens_per_second": tok["tokens"] / mean["step"],
        "model_tflops_per_second": flops / mean["step"] / 1e12, "mfu": flops / mean["step"] / (peak_tflops * 1e12),
        "parts": {k: mean[k] for k in ("policy_forward_backward", "optimizer", "other")},
        "settings": {"lora": lora, **trainer_settings(args, ("max_length", *BATCH))},
    }


def grpo_phase(workdir: Path, overrides: list[str], steps: int) -> dict[str, Any]:
    clock = StepClock()
    trainer, params = build_trainer(workdir, overrides, GRPO_WARMUP + steps, clock)
    trainer.train()
    mean, tok = clock.mean_step(GRPO_WARMUP)
    args = trainer.args
    return {
        "steps_measured": len(clock.steps) - GRPO_WARMUP, "step_seconds": mean["step"],
        "parts": {k: mean[k] for k in PARTS},
        "completions_per_step": tok["completions"], "prompt_tokens_per_step": tok["prompt"],
        "completion_tokens_per_step": tok["completion"],
        "mean_completion_tokens": tok["completion"] / tok["completions"],
        "completions_per_second": tok["completions"] / mean["step"],
        "completion_tokens_per_second": tok["completion"] / mean["step"],
        "generation_tokens_per_second": tok["completion"] / mean["generation"],
        "settings": {"lora": bool(params.grpo.use_lora), **trainer_settings(
            args, ("use_vllm", "num_generations", "max_completion_length", *BATCH))},
    }


def evaluate_phase(overrides: list[str]) -> dict[str, Any]:
    from components.common.params_load import load_params
    from components.evaluation.scoring import data_source, evaluate_model
    from components.models.resolve import resolve_model
    from components.problems.sources import load_problems

    params = load_params("params.yaml", overrides)
    cfg, data = params.evaluate, data_source(params)
    problems = load_problems(data, cfg.limit)
    metrics, items = evaluate_model(resolve_model(params.model.base_dir), problems, params, protocol=cfg.protocol,
                                    backend=cfg.backend, data=data)
    tokens, seconds = sum(i["completion_tokens"] for i in items), metrics["generation_seconds"]
    return {"completions": len(items), "completion_tokens": tokens, "mean_completion_tokens": tokens / len(items),
            "generation_seconds": seconds, "tokens_per_second": tokens / seconds,
            "completions_per_second": metrics["completions_per_second"], "load_seconds": metrics["load_seconds"],
            "settings": {"backend": metrics["backend"], "protocol": cfg.protocol, "dtype": metrics["dtype"],
                         "batch_size": cfg.batch_size, "max_new_tokens": cfg.max_new_tokens}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.log")
    parser.add_argument("--cpu", action="store_true", help="the same path on a tiny model on a CPU, in seconds")
    parser.add_argument("--presets", default="", help=f"comma-separated, in order (default {','.join(PRESETS)}; "
                        f"with --cpu {PRESETS[0]})")
    parser.add_argument("--budget", type=float, default=420, help="seconds for the whole check (default 420)")
    parser.add_argument("--sft-steps", type=int, default=0, help="measured SFT steps (default 8; --cpu 2)")
    parser.add_argument("--grpo-steps", type=int, default=0, help="measured GRPO steps (default 2; --cpu 1)")
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="the bf16 rate MFU is against (default 790)")
    args = parser.parse_args(argv)
    # before the libraries read them at import: offline, no progress bars in the log
    os.environ.update({**OFFLINE_ENV, "TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
                       "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    import torch

    if not args.cpu and not torch.cuda.is_available():
        parser.error("no CUDA device here; run with --cpu for the same path on a tiny model")
    presets = [p for p in args.presets.split(",") if p] or (list(PRESETS[:1]) if args.cpu else list(PRESETS))
    if unknown := sorted(set(presets) - set(ARCHITECTURES)):
        parser.error(f"--presets {unknown[0]}: the check knows the architectures of {', '.join(ARCHITECTURES)}")
    sft_steps, grpo_steps = args.sft_steps or (2 if args.cpu else 8), args.grpo_steps or (1 if args.cpu else 2)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    logfile, streams = (out / "gpu_check.log").open("w", buffering=1), (sys.stdout, sys.stderr)
    sys.stdout, sys.stderr = Tee(sys.stderr, logfile), Tee(sys.stderr, logfile)  # stdout: the JSON alone, at the end
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True)

    from components.common.tracking import package_versions
    from components.training.finetune import quiet_known_warnings
    from components.training.precision import native_bf16
    from pipelines.params.presets import overrides as preset_overrides

    report: dict[str, Any] = {
        "check": "cpu" if args.cpu else "cuda",
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "versions": {"python": sys.version.split()[0], "cuda": torch.version.cuda, **package_versions(VERSIONS)},
        "peak_tflops": args.peak_tflops, "budget_seconds": args.budget,
        "memory": "per phase: torch.cuda.max_memory_allocated (peak_memory_gib) and max_memory_reserved"
        if torch.cuda.is_available() else "the process's peak resident memory so far (ru_maxrss)",
        "notes": ["random weights: completions run to their length limit (no early EOS)",
                  "grpo.trainer.use_vllm=false: vLLM rollouts are not checked here"],
        "data": {}, "presets": {},
    }
    quiet_known_warnings()  # as the training stages do
    check = Check(out, args.budget, report, START)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    signal.signal(signal.SIGALRM, check.alarm)
    signal.setitimer(signal.ITIMER_REAL, max(args.budget - (time.monotonic() - START), 1.0))
    try:
        os.chdir(work)  # the stages' relative paths (data/, models/) land in the work folder
        shutil.copy(REPO / "params.yaml", work / "params.yaml")
        bf16 = str(native_bf16()).lower()
        common = [*CHECK, *(CPU_CHECK + [f"sft.trainer.bf16={bf16}", f"grpo.trainer.bf16={bf16}"] if args.cpu else [])]
        if check.phase(report, "data", data_phase, common):
            for preset in presets:
                entry = report["presets"][preset] = {"architecture": TINY if args.cpu else ARCHITECTURES[preset]}
                user_model = work / "user-models" / preset
                overrides = [*preset_overrides(preset), *common, f"model.name_or_path={user_model}"]
                check.phase(entry, "model", model_phase, entry["architecture"], overrides)
                check.phase(entry, "sft", sft_phase, work, overrides, sft_steps, args.peak_tflops, needs="model")
                check.phase(entry, "grpo", grpo_phase, work, overrides, grpo_steps, needs="model")
                check.phase(entry, "evaluate", evaluate_phase, overrides, needs="model")
                shutil.rmtree(user_model, ignore_errors=True)
    except OutOfTime:  # between two phases
        check.out_of_time = True
    except BaseException as exc:  # the report says where the check itself broke, and is written
        report["error"] = error_line(exc)
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(REPO)
        shutil.rmtree(work, ignore_errors=True)
        sys.stdout, sys.stderr = streams
        logfile.close()
        phases = [report["data"], *(v for p in report["presets"].values() for v in p.values() if "status" in v)]
        failed = "error" in report or any(p.get("status") == "failed" for p in phases)
        report["status"] = "failed" if failed else "stopped at the time budget" if check.out_of_time else "ok"
        check.write()
    print(json.dumps(rounded(report), indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
