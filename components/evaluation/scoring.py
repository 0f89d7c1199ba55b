"""Scoring a model on GSM8K-style problems, the same way for the evaluate stage, `grpoflow evaluate`
and the promotion gate's re-evaluation of a champion.

    build_prompts(problems, protocol, ...)   prompts (and stop strings) of a protocol: grpoflow (the
                                             training prompt) or lm-eval-gsm8k (the harness's 5-shot)
    score_item / score_samples               one items.jsonl row (greedy, and its k samples); the metrics
                                             over items and the paired comparisons: components/evaluation/metrics.py
    evaluate_model(model, problems, params)  generate (components/evaluation/generation.py, or an OpenAI-compatible
                                             endpoint, components/evaluation/endpoint.py) and score: (metrics, items)

Sampled metrics (`evaluate.num_samples` k > 0, at the training temperature `grpo.trainer.temperature`):
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
from components.evaluation.metrics import band_metrics, item_metrics
from components.evaluation.stats import majority_vote
from components.models.modelio import load_tokenizer
from components.models.resolve import ResolvedModel
from components.problems import arithmetic, gsm8k
from components.problems.sources import load_problems, problems_sha256

log = logging.getLogger("grpoflow.scoring")

METRICS = ("accuracy_strict", "accuracy_flexible")
def data_source(params: Params, override: str | None = None) -> str:
    src = override or params.evaluate.data
    return src or f"jsonl:{Path(params.data.output_dir) / 'test.jsonl'}"


def fewshot_source(params: Params, data: str) -> lm_eval_gsm8k.FewshotSource | None:
    """Where lm-eval-gsm8k's few-shot examples for test data `data` come from (None: 0-shot);
    the rules are `lm_eval_gsm8k.choose_fewshot_source`'s."""
    cfg = params.evaluate
    if not cfg.num_fewshot:
        return None
    return lm_eval_gsm8k.choose_fewshot_source(cfg.fewshot_source, data, params.data.output_dir)


def build_prompts(
    problems: list[dict[str, str]], protocol: str, tokenizer, params: Params, data: str
) -> tuple[list[str], list[str]]:
    """(prompts, stop strings) for the protocol."""
    if protocol == "grpoflow":
        return [gsm8k.render_prompt(p["question"], tokenizer) for p in problems], []
    if protocol == "lm-eval-gsm8k":
        cfg = params.evaluate
        shots: list[dict[str, str]] = []
        source = fewshot_source(params, data)
        if source is not None:
            shots = [
                {"question": r["question"], "answer": r["answer"]}
                for r in load_problems(source.source, split=source.split)
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
        # the right answer with work that holds: no equation shown is wrong (not a lucky guess)
        "correct_checked": bool(correct_flexible) and arithmetic.work_holds(completion),
        "format_ok": bool(format_ok),
    }


def score_item(problem: dict[str, str], completion: str, num_tokens: int, protocol: str) -> dict[str, Any]:
    """One items.jsonl row. `correct` is the strict judgement (what the promotion gate pairs).

    >>> row = score_item({"id": "t-1", "gold": "7"}, "<reasoning>3 + 4 = 7</reasoning>\\n<answer>7</answer>", 12,
    ...                  "grpoflow")
    >>> row["extracted"], row["correct"], row["correct_flexible"], row["correct_checked"], row["format_ok"]
    ('7', True, True, True, True)
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
        "correct_checked": verdict["correct_checked"],
        "format_ok": verdict["format_ok"],
        "completion_tokens": int(num_tokens),
        "steps": problem.get("steps"),  # the problem's reasoning steps: accuracy per step count and band
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
    for suffix, answer_key, correct_key in (
        ("", "extracted", "correct"),
        ("_flexible", "extracted_flexible", "correct_flexible"),
    ):
        keys = [_vote_key(v[answer_key]) for v in verdicts]
        winner, _ = majority_vote(keys)
        first = keys.index(winner) if winner is not None else None
        row[f"maj_answer{suffix}"] = verdicts[first][answer_key] if first is not None else None
        row[f"maj_correct{suffix}"] = bool(first is not None and verdicts[first][correct_key])
        row[f"pass_at_k{suffix}"] = any(v[correct_key] for v in verdicts)
    return row


def settings_from(params: Params) -> GenerationSettings:
    cfg = params.evaluate
    return GenerationSettings(
        max_new_tokens=cfg.max_new_tokens,
        dtype=cfg.dtype,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        num_samples=cfg.num_samples,
        temperature=params.grpo.trainer["temperature"],
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
    model: ResolvedModel, problems, protocol: str, params: Params, data: str, backend: str,
    vllm_log: str | Path | None = None,
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
    gen = generate(model.model_dir, prompts, settings, backend, model.tokenizer_dir, tokenizer, seeds, vllm_log)
    return gen, settings


def evaluate_model(
    model: ResolvedModel,
    problems: list[dict[str, str]],
    params: Params,
    *,
    protocol: str,
    backend: str,
    data: str,
    vllm_log: str | Path | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(metrics, items) of one model on `problems`; vLLM's engine log, if it runs, to `vllm_log`."""
    shots = fewshot_source(params, data) if protocol == "lm-eval-gsm8k" else None
    if shots is not None:
        log.info("lm-eval-gsm8k few-shot examples: %s", shots.describe())
    gen, settings = _generate(model, problems, protocol, params, data, backend, vllm_log)
    items = [
        score_item(p, c, t, protocol)
        for p, c, t in zip(problems, gen.completions, gen.num_tokens, strict=True)
    ]
    for item, p, texts, tokens in zip(items, problems, gen.samples, gen.sample_tokens, strict=False):
        item.update(score_samples(p["gold"], texts, tokens, protocol))
    metrics = {
        **item_metrics(items),
        **band_metrics(items, params.evaluate.target_band),
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
    if shots is not None:
        metrics.update(fewshot_source=shots.source, fewshot_split=shots.split, fewshot_rule=shots.rule)
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
