"""Scoring a model on GSM8K-style problems, the same way for the evaluate stage, `grpoflow evaluate`
and the promotion gate's re-evaluation of a champion.

    build_prompts(problems, protocol, ...)   prompts (and stop strings) of a protocol: grpoflow (the
                                             training prompt) or lm-eval-gsm8k (the harness's 5-shot)
    score_item / score_samples / item_metrics   one items.jsonl row (greedy, and its k samples) / metrics
                                             with their intervals
    compare(items_a, items_b)                paired difference on the items both have (matched by id)
    evaluate_model(model, problems, params)  generate (components/evaluation/generation.py, or an OpenAI-compatible
                                             endpoint, components/evaluation/endpoint.py) and score: (metrics, items)

Sampled metrics (`evaluate.num_samples` k > 0, at the training temperature `grpo.temperature`):
`sampled_accuracy_*` (mean correctness of the k samples, normal interval over items),
`pass_at_k_*` (unbiased pass@k, Chen et al. 2021; with n = k samples it is the share of items with
a correct sample, Wilson interval), `maj_at_k_*` (the majority answer of the k samples, Wilson
interval), each for the strict and the flexible extraction. Samples are seeded per item from
`evaluate.seed` and the item id (`sample_seeds`), so the same params give the same numbers.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from components.common.errors import EvaluationError
from components.common.params import Params
from components.evaluation import endpoint, lm_eval_gsm8k
from components.evaluation.generation import Generation, GenerationSettings, generate
from components.evaluation.stats import (
    compare_paired,
    compare_paired_means,
    majority_vote,
    mean_interval,
    pass_at_k,
    wilson_interval,
)
from components.models.modelio import ResolvedModel, load_tokenizer
from components.problems import gsm8k
from components.problems.sources import load_problems, problems_sha256

log = logging.getLogger("grpoflow.scoring")

METRICS = ("accuracy_strict", "accuracy_flexible")
# Sampled metrics and the per-item value each pairs on: a boolean column (McNemar) or a mean.
SAMPLED_BINARY = {
    "pass_at_k_strict": "pass_at_k",
    "pass_at_k_flexible": "pass_at_k_flexible",
    "maj_at_k_strict": "maj_correct",
    "maj_at_k_flexible": "maj_correct_flexible",
}
SAMPLED_MEANS = {"sampled_accuracy_strict": "samples_correct", "sampled_accuracy_flexible": "samples_correct_flexible"}


def data_source(params: Params, override: str | None = None) -> str:
    src = override or params.evaluate.data
    return src or f"jsonl:{Path(params.data.output_dir) / 'test.jsonl'}"


def fewshot_source(params: Params, data: str) -> tuple[str, str]:
    """(source, split) of the lm-eval few-shot examples."""
    if params.evaluate.fewshot_source:
        src = params.evaluate.fewshot_source
    elif data.startswith("hf:"):
        src = data
    else:
        src = f"jsonl:{Path(params.data.output_dir) / 'train.jsonl'}"
    return src, "train"


def build_prompts(
    problems: list[dict[str, str]], protocol: str, tokenizer, params: Params, data: str
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
            prompts = lm_eval_gsm8k.build_fewshot_prompts(
                [p["question"] for p in problems], shots, cfg.num_fewshot, cfg.fewshot_seed
            )
        except ValueError as exc:
            raise EvaluationError(f"lm-eval-gsm8k few-shot examples: {exc}") from None
        return prompts, list(lm_eval_gsm8k.STOP_SEQUENCES)
    raise EvaluationError(f"unknown protocol {protocol!r}; expected grpoflow or lm-eval-gsm8k")


def judge(completion: str, gold: str, protocol: str) -> dict[str, Any]:
    """Extracted answers and verdicts of one completion: strict and flexible, and the format."""
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
        "extracted": strict,
        "correct": bool(correct),
        "extracted_flexible": flexible,
        "correct_flexible": bool(correct_flexible),
        "format_ok": bool(format_ok),
    }


def score_item(problem: dict[str, str], completion: str, num_tokens: int, protocol: str) -> dict[str, Any]:
    """One items.jsonl row. `correct` is the strict judgement (what the promotion gate pairs).

    >>> row = score_item({"id": "t-1", "gold": "7"}, "<reasoning>3 + 4 = 7</reasoning>\\n<answer>7</answer>", 12, "grpoflow")
    >>> row["extracted"], row["correct"], row["correct_flexible"], row["format_ok"]
    ('7', True, True, True)
    >>> row = score_item({"id": "t-2", "gold": "7"}, " 3 + 4 = 7\\n#### 7", 9, "lm-eval-gsm8k")
    >>> row["extracted"], row["correct"], row["extracted_flexible"], row["format_ok"]
    ('7', True, '7', True)
    """
    verdict = judge(completion, problem["gold"], protocol)
    return {
        "id": problem["id"],
        "gold": problem["gold"],
        "completion": completion,
        "extracted": verdict["extracted"],
        "correct": verdict["correct"],
        "extracted_flexible": verdict["extracted_flexible"],
        "correct_flexible": verdict["correct_flexible"],
        "format_ok": verdict["format_ok"],
        "completion_tokens": int(num_tokens),
    }


def _vote_key(answer: str | None) -> str | None:
    """Answers that are the same number vote together ('$1,000' and '1000')."""
    if answer is None or answer == lm_eval_gsm8k.INVALID:
        return None
    return gsm8k.normalize_number(answer) or answer.strip()


def score_samples(gold: str, completions: list[str], num_tokens: list[int], protocol: str) -> dict[str, Any]:
    """The sample columns of an items.jsonl row: per sample the extracted answers and verdicts, and
    the item's pass@k (any sample correct) and majority vote, strict and flexible.

    >>> row = score_samples("7", ["<reasoning>r</reasoning><answer>7</answer>", "it is 8",
    ...                           "<reasoning>r</reasoning><answer>8</answer>", "so 8"], [5, 3, 5, 2], "grpoflow")
    >>> row["samples_correct"], row["pass_at_k"], row["maj_answer"], row["maj_correct"]
    ([True, False, False, False], True, '7', True)
    >>> row["samples_extracted_flexible"], row["maj_answer_flexible"], row["maj_correct_flexible"]
    (['7', '8', '8', '8'], '8', False)
    """
    verdicts = [judge(c, gold, protocol) for c in completions]
    row: dict[str, Any] = {
        "samples_extracted": [v["extracted"] for v in verdicts],
        "samples_correct": [v["correct"] for v in verdicts],
        "samples_extracted_flexible": [v["extracted_flexible"] for v in verdicts],
        "samples_correct_flexible": [v["correct_flexible"] for v in verdicts],
        "samples_format_ok": [v["format_ok"] for v in verdicts],
        "samples_tokens": [int(t) for t in num_tokens],
    }
    for suffix, answer_key, correct_key in (("", "extracted", "correct"), ("_flexible", "extracted_flexible", "correct_flexible")):
        keys = [_vote_key(v[answer_key]) for v in verdicts]
        winner, _ = majority_vote(keys)
        first = keys.index(winner) if winner is not None else None
        row[f"maj_answer{suffix}"] = verdicts[first][answer_key] if first is not None else None
        row[f"maj_correct{suffix}"] = bool(first is not None and verdicts[first][correct_key])
        row[f"pass_at_k{suffix}"] = any(v[correct_key] for v in verdicts)
    return row


def item_metrics(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy metrics with Wilson 95% intervals from scored items (and the sampled metrics when
    the items carry samples, see `sample_metrics`).

    >>> m = item_metrics([{"correct": True, "correct_flexible": True, "format_ok": True, "completion_tokens": 10},
    ...                {"correct": False, "correct_flexible": True, "format_ok": False, "completion_tokens": 30}])
    >>> m["n"], m["accuracy_strict"], m["accuracy_flexible"], m["format_rate"], m["mean_completion_tokens"]
    (2, 0.5, 1.0, 0.5, 20.0)
    """
    n = len(items)
    k_strict = sum(i["correct"] for i in items)
    k_flex = sum(i["correct_flexible"] for i in items)
    metrics = {
        "n": n,
        "accuracy_strict": k_strict / n if n else 0.0,
        "accuracy_strict_ci95": list(wilson_interval(k_strict, n)),
        "accuracy_flexible": k_flex / n if n else 0.0,
        "accuracy_flexible_ci95": list(wilson_interval(k_flex, n)),
        "format_rate": sum(i["format_ok"] for i in items) / n if n else 0.0,
        "mean_completion_tokens": sum(i["completion_tokens"] for i in items) / n if n else 0.0,
    }
    if items and "samples_correct" in items[0]:
        metrics.update(sample_metrics(items))
    return metrics


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def sample_metrics(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Sampled metrics over items with k samples each.

    >>> items = [{"samples_correct": [True, False], "samples_correct_flexible": [True, True], "pass_at_k": True,
    ...           "pass_at_k_flexible": True, "maj_correct": True, "maj_correct_flexible": True,
    ...           "samples_format_ok": [True, False], "samples_tokens": [4, 6]},
    ...          {"samples_correct": [False, False], "samples_correct_flexible": [False, True], "pass_at_k": False,
    ...           "pass_at_k_flexible": True, "maj_correct": False, "maj_correct_flexible": False,
    ...           "samples_format_ok": [True, True], "samples_tokens": [2, 4]}]
    >>> m = sample_metrics(items)
    >>> m["num_samples"], m["sampled_accuracy_strict"], m["sampled_accuracy_flexible"], m["pass_at_k_strict"]
    (2, 0.25, 0.75, 0.5)
    >>> m["maj_at_k_strict"], m["maj_at_k_flexible"], m["sampled_format_rate"], m["sampled_mean_completion_tokens"]
    (0.5, 0.5, 0.75, 4.0)
    """
    n = len(items)
    k = len(items[0]["samples_correct"]) if items else 0
    out: dict[str, Any] = {"num_samples": k}
    for suffix, col in (("strict", "samples_correct"), ("flexible", "samples_correct_flexible")):
        per_item = [_mean(i[col]) for i in items]
        out[f"sampled_accuracy_{suffix}"] = _mean(per_item)
        out[f"sampled_accuracy_{suffix}_ci95"] = list(mean_interval(per_item))
        # Unbiased pass@k from each item's n = k samples: 1.0 or 0.0 per item, so a share of items.
        passes = [pass_at_k(len(i[col]), sum(i[col]), k) for i in items] if k else []
        out[f"pass_at_k_{suffix}"] = _mean(passes)
        out[f"pass_at_k_{suffix}_ci95"] = list(wilson_interval(round(sum(passes)), n))
    for suffix, col in (("strict", "maj_correct"), ("flexible", "maj_correct_flexible")):
        hits = sum(i[col] for i in items)
        out[f"maj_at_k_{suffix}"] = hits / n if n else 0.0
        out[f"maj_at_k_{suffix}_ci95"] = list(wilson_interval(hits, n))
    out["sampled_format_rate"] = _mean([_mean(i["samples_format_ok"]) for i in items])
    out["sampled_mean_completion_tokens"] = _mean([_mean(i["samples_tokens"]) for i in items])
    return out


def compare(items_a: list[dict[str, Any]], items_b: list[dict[str, Any]], primary: str) -> dict[str, Any]:
    """Paired comparison A - B on the items both have (matched by id): greedy accuracies, and when
    both sides have samples, pass@k and maj@k (exact McNemar, Newcombe interval) and mean sampled
    accuracy (normal interval over the per-item differences)."""
    b_by_id = {i["id"]: i for i in items_b}
    shared = [i for i in items_a if i["id"] in b_by_id]
    if len(shared) != len(items_a) or len(shared) != len(items_b):
        log.warning("comparing on %d shared items (%d vs %d)", len(shared), len(items_a), len(items_b))
    pairs = [(i, b_by_id[i["id"]]) for i in shared]
    binary = {"accuracy_strict": "correct", "accuracy_flexible": "correct_flexible"}
    means: dict[str, str] = {}
    if pairs and all("samples_correct" in x and "samples_correct" in y for x, y in pairs):
        binary.update(SAMPLED_BINARY)
        means.update(SAMPLED_MEANS)
    by_metric = {m: compare_paired([x[c] for x, _ in pairs], [y[c] for _, y in pairs]) for m, c in binary.items()}
    for m, c in means.items():
        by_metric[m] = compare_paired_means([_mean(x[c]) for x, _ in pairs], [_mean(y[c]) for _, y in pairs])
    return {"metric": primary, **by_metric[primary], "by_metric": by_metric}


def settings_from(params: Params) -> GenerationSettings:
    cfg = params.evaluate
    return GenerationSettings(
        max_new_tokens=cfg.max_new_tokens,
        dtype=cfg.dtype,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        num_samples=cfg.num_samples,
        temperature=params.grpo.temperature,
        vllm_python=cfg.vllm_python,
        vllm_args=dict(cfg.vllm_args),
    )


def sample_seeds(problems: list[dict[str, str]], seed: int) -> list[int]:
    """One sampling seed per problem, from the run's seed and the problem's id: a problem draws the
    same samples whatever else is evaluated with it (sample j of problem i uses seed_i + j).

    >>> sample_seeds([{"id": "a"}, {"id": "b"}], 0) == sample_seeds([{"id": "b"}, {"id": "a"}], 0)[::-1]
    True
    """
    return [int(hashlib.sha256(f"{seed}:{p['id']}".encode()).hexdigest()[:8], 16) for p in problems]


def _generate(
    model: ResolvedModel, problems, protocol: str, params: Params, data: str, backend: str
) -> tuple[Generation, GenerationSettings]:
    """(Generation, settings) for a model folder or hub id (local backends) or an endpoint."""
    settings = settings_from(params)
    seeds = sample_seeds(problems, settings.seed)
    if model.endpoint:
        cfg = params.evaluate
        server = endpoint.connect(model.endpoint, cfg.endpoint_model, cfg.endpoint_timeout, cfg.endpoint_retries)
        if protocol == "grpoflow":  # the server renders the chat template, as render_prompt does here
            requests = [{"messages": gsm8k.build_messages(p["question"])} for p in problems]
        else:
            prompts, settings.stop = build_prompts(problems, protocol, None, params, data)
            requests = [{"prompt": prompt} for prompt in prompts]
        return endpoint.generate_on_endpoint(server, requests, settings, seeds, cfg.endpoint_concurrency), settings
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
    prompts, settings.stop = build_prompts(problems, protocol, tokenizer, params, data)
    gen = generate(model.model_dir, prompts, settings, backend, model.tokenizer_dir, tokenizer, seeds)
    return gen, settings


def evaluate_model(
    model: ResolvedModel,
    problems: list[dict[str, str]],
    params: Params,
    *,
    protocol: str,
    backend: str,
    data: str,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(metrics, items) of one model on `problems`."""
    gen, settings = _generate(model, problems, protocol, params, data, backend)
    items = [
        score_item(p, c, t, protocol)
        for p, c, t in zip(problems, gen.completions, gen.num_tokens, strict=True)
    ]
    for item, p, texts, tokens in zip(items, problems, gen.samples, gen.sample_tokens, strict=False):
        item.update(score_samples(p["gold"], texts, tokens, protocol))
    metrics = {
        **item_metrics(items),
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
    if settings.num_samples:
        metrics.update(sample_temperature=settings.temperature, sample_seconds=gen.sample_seconds)
    for key in ("vllm_version", "endpoint", "served_model"):
        if gen.details.get(key):
            metrics[key] = gen.details[key]
    log.info(
        "%s: accuracy_strict %.4f, accuracy_flexible %.4f, format_rate %.4f on %d items (%s, %.1f completions/s)%s",
        model.spec,
        metrics["accuracy_strict"],
        metrics["accuracy_flexible"],
        metrics["format_rate"],
        metrics["n"],
        gen.backend,
        metrics["completions_per_second"],
        f"; {settings.num_samples} samples at T={settings.temperature}: maj@k {metrics['maj_at_k_strict']:.4f}, "
        f"pass@k {metrics['pass_at_k_strict']:.4f}" if settings.num_samples else "",
    )
    return metrics, items
