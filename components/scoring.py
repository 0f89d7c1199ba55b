"""Scoring a model on GSM8K-style problems, the same way for the evaluate stage, `grpoflow evaluate`
and the promotion gate's re-evaluation of a champion.

    build_prompts(problems, protocol, ...)   prompts (and stop strings) of a protocol: grpoflow (the
                                             training prompt) or lm-eval-gsm8k (the harness's 5-shot)
    score_item / summarize                   one items.jsonl row / accuracy metrics with Wilson intervals
    compare(items_a, items_b)                paired difference on the items both have (matched by id)
    evaluate_model(model, problems, params)  generate (components/generation.py) and score: (metrics, items)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from components import gsm8k, lm_eval_gsm8k
from components.errors import EvaluationError
from components.generation import Generation, GenerationSettings, generate
from components.modelio import ResolvedModel, load_tokenizer
from components.sources import load_problems, problems_sha256
from components.stats import compare_paired, wilson_interval

log = logging.getLogger("grpoflow.scoring")

METRICS = ("accuracy_strict", "accuracy_flexible")


def data_source(params: Any, override: str | None = None) -> str:
    src = override or params.evaluate.data
    return src or f"jsonl:{Path(params.data.output_dir) / 'test.jsonl'}"


def fewshot_source(params: Any, data: str) -> tuple[str, str]:
    """(source, split) of the lm-eval few-shot examples."""
    if params.evaluate.fewshot_source:
        src = params.evaluate.fewshot_source
    elif data.startswith("hf:"):
        src = data
    else:
        src = f"jsonl:{Path(params.data.output_dir) / 'train.jsonl'}"
    return src, "train"


def build_prompts(
    problems: list[dict[str, str]], protocol: str, tokenizer, params: Any, data: str
) -> tuple[list[str], list[str]]:
    """(prompts, stop strings) for the protocol."""
    if protocol == "grpoflow":
        return [gsm8k.render_prompt(p["question"], tokenizer) for p in problems], []
    if protocol == "lm-eval-gsm8k":
        cfg = params.evaluate
        shots: list[dict[str, str]] = []
        if cfg.num_fewshot:
            src, split = fewshot_source(params, data)
            shots = [
                {"question": r["question"], "answer": r["answer"]} for r in load_problems(src, split=split)
            ]
        try:
            prompts = lm_eval_gsm8k.build_prompts(
                [p["question"] for p in problems], shots, cfg.num_fewshot, cfg.fewshot_seed
            )
        except ValueError as exc:
            raise EvaluationError(f"lm-eval-gsm8k few-shot examples: {exc}") from None
        return prompts, list(lm_eval_gsm8k.STOP_SEQUENCES)
    raise EvaluationError(f"unknown protocol {protocol!r}; expected grpoflow or lm-eval-gsm8k")


def score_item(problem: dict[str, str], completion: str, num_tokens: int, protocol: str) -> dict[str, Any]:
    """One items.jsonl row. `correct` is the strict judgement (what the promotion gate pairs).

    >>> row = score_item({"id": "t-1", "gold": "7"}, "<reasoning>3 + 4 = 7</reasoning>\\n<answer>7</answer>", 12, "grpoflow")
    >>> row["extracted"], row["correct"], row["correct_flexible"], row["format_ok"]
    ('7', True, True, True)
    >>> row = score_item({"id": "t-2", "gold": "7"}, " 3 + 4 = 7\\n#### 7", 9, "lm-eval-gsm8k")
    >>> row["extracted"], row["correct"], row["extracted_flexible"], row["format_ok"]
    ('7', True, '7', True)
    """
    gold = problem["gold"]
    if protocol == "lm-eval-gsm8k":
        strict = lm_eval_gsm8k.extract(completion, "strict")
        flexible = lm_eval_gsm8k.extract(completion, "flexible")
        correct = lm_eval_gsm8k.exact_match(strict, gold)
        correct_flexible = lm_eval_gsm8k.exact_match(flexible, gold)
        format_ok = strict != lm_eval_gsm8k.INVALID
    else:
        strict = gsm8k.extract_answer(completion, "strict")
        flexible = gsm8k.extract_answer(completion, "flexible")
        correct = gsm8k.answers_match(strict, gold)
        correct_flexible = gsm8k.answers_match(flexible, gold)
        format_ok = gsm8k.has_strict_format(completion)
    return {
        "id": problem["id"],
        "gold": gold,
        "completion": completion,
        "extracted": strict,
        "correct": bool(correct),
        "extracted_flexible": flexible,
        "correct_flexible": bool(correct_flexible),
        "format_ok": bool(format_ok),
        "completion_tokens": int(num_tokens),
    }


def summarize(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy metrics with Wilson 95% intervals from scored items.

    >>> m = summarize([{"correct": True, "correct_flexible": True, "format_ok": True, "completion_tokens": 10},
    ...                {"correct": False, "correct_flexible": True, "format_ok": False, "completion_tokens": 30}])
    >>> m["n"], m["accuracy_strict"], m["accuracy_flexible"], m["format_rate"], m["mean_completion_tokens"]
    (2, 0.5, 1.0, 0.5, 20.0)
    """
    n = len(items)
    k_strict = sum(i["correct"] for i in items)
    k_flex = sum(i["correct_flexible"] for i in items)
    return {
        "n": n,
        "accuracy_strict": k_strict / n if n else 0.0,
        "accuracy_strict_ci95": list(wilson_interval(k_strict, n)),
        "accuracy_flexible": k_flex / n if n else 0.0,
        "accuracy_flexible_ci95": list(wilson_interval(k_flex, n)),
        "format_rate": sum(i["format_ok"] for i in items) / n if n else 0.0,
        "mean_completion_tokens": sum(i["completion_tokens"] for i in items) / n if n else 0.0,
    }


def compare(items_a: list[dict[str, Any]], items_b: list[dict[str, Any]], primary: str) -> dict[str, Any]:
    """Paired comparison A - B on the items both have (matched by id)."""
    b_by_id = {i["id"]: i for i in items_b}
    shared = [i for i in items_a if i["id"] in b_by_id]
    if len(shared) != len(items_a) or len(shared) != len(items_b):
        log.warning("comparing on %d shared items (%d vs %d)", len(shared), len(items_a), len(items_b))
    column = {"accuracy_strict": "correct", "accuracy_flexible": "correct_flexible"}
    by_metric = {
        m: compare_paired([i[column[m]] for i in shared], [b_by_id[i["id"]][column[m]] for i in shared])
        for m in METRICS
    }
    return {"metric": primary, **by_metric[primary], "by_metric": by_metric}


def settings_from(params: Any) -> GenerationSettings:
    cfg = params.evaluate
    return GenerationSettings(
        max_new_tokens=cfg.max_new_tokens,
        dtype=cfg.dtype,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        vllm_python=cfg.vllm_python,
        vllm_args=dict(cfg.vllm_args),
    )


def evaluate_model(
    model: ResolvedModel,
    problems: list[dict[str, str]],
    params: Any,
    *,
    protocol: str,
    backend: str,
    data: str,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(metrics, items) of one model on `problems`."""
    try:
        tokenizer = load_tokenizer(model.tokenizer_dir)
    except (OSError, ValueError) as exc:
        hint = (
            ""
            if Path(model.tokenizer_dir).exists()
            else "; it is not a local folder, and as a Hugging Face id it needs hub access"
        )
        raise EvaluationError(
            f"model {model.spec}: cannot load its tokenizer from {model.tokenizer_dir} ({str(exc)[:300]}){hint}"
        ) from None
    prompts, stop = build_prompts(problems, protocol, tokenizer, params, data)
    settings = settings_from(params)
    settings.stop = stop
    gen: Generation = generate(model.model_dir, prompts, settings, backend, model.tokenizer_dir, tokenizer)
    items = [
        score_item(p, c, t, protocol)
        for p, c, t in zip(problems, gen.completions, gen.num_tokens, strict=True)
    ]
    metrics = {
        **summarize(items),
        "completions_per_second": gen.completions_per_second,
        "generation_seconds": gen.seconds,
        "load_seconds": gen.load_seconds,
        "backend": gen.backend,
        "protocol": protocol,
        "truncated_prompts": gen.truncated_prompts,
        "max_new_tokens": settings.max_new_tokens,
        "dtype": gen.details.get("dtype"),
        "model": model.spec,
        "data": data,
        "test_sha256": problems_sha256(problems),  # which items: the promotion gate compares like with like
    }
    if gen.details.get("vllm_version"):
        metrics["vllm_version"] = gen.details["vllm_version"]
    log.info(
        "%s: accuracy_strict %.4f, accuracy_flexible %.4f, format_rate %.4f on %d items (%s, %.1f completions/s)",
        model.spec,
        metrics["accuracy_strict"],
        metrics["accuracy_flexible"],
        metrics["format_rate"],
        metrics["n"],
        gen.backend,
        metrics["completions_per_second"],
    )
    return metrics, items
