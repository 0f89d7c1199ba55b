"""The sample problems a training stage answers after training: a few test problems answered
greedily by the model in memory (plain transformers `generate`), logged to MLflow as a table,
with their strict accuracy and format rate added to the stage's summary.

Not the evaluation engine (components/evaluation/generation.py, with its vLLM route): the training stages
keep their own short greedy loop so that a change to evaluation code never re-runs SFT or GRPO
(their dvc.yaml deps are their imports); the batching under both is components/models/batching.py. Used by
components/training/finetune.py `train_and_save`.
"""

from __future__ import annotations

from typing import Any

from components.models.batching import generate_batches


def model_eos_ids(model, tokenizer) -> list[int]:
    """EOS ids of a model in memory (its generation config) and of its tokenizer."""
    eos = model.generation_config.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted({int(i) for i in ids})


def greedy(model, tokenizer, prompts: list[str], max_new_tokens: int = 256, batch_size: int = 64) -> list[str]:
    """Greedy completions of rendered prompts by a model in memory: length-sorted batches, left
    padding, cut at the first EOS; a prompt longer than the context minus `max_new_tokens` keeps
    its last tokens."""
    eos_ids = model_eos_ids(model, tokenizer)
    eos = set(eos_ids)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    context = getattr(model.config, "max_position_embeddings", None)
    room = max(1, context - max_new_tokens) if context else None
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    encoded = [ids[-room:] if room and len(ids) > room else ids for ids in encoded]
    out: list[str] = [""] * len(encoded)
    was_training = model.training
    model.eval()
    try:
        batches = generate_batches(model, encoded, batch_size, do_sample=False, max_new_tokens=max_new_tokens,
                                   eos_token_id=eos_ids or None, pad_token_id=pad_id)
        for idx, rows in batches:
            for i, ids in zip(idx, rows, strict=True):
                end = next((k for k, t in enumerate(ids) if t in eos), len(ids))
                out[i] = tokenizer.decode(ids[:end], skip_special_tokens=True)
    finally:
        model.train(was_training)
    return out


def log_samples(
    model, tokenizer, rows: list[dict[str, str]], artifact_file: str, max_new_tokens: int
) -> dict[str, Any]:
    """Answer `rows` greedily, log them as an MLflow table and return {sample_accuracy, sample_format_rate}."""
    if not rows:
        return {}
    import mlflow

    from components.problems import gsm8k

    prompts = [gsm8k.render_prompt(r["question"], tokenizer) for r in rows]
    completions = greedy(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    correct = [gsm8k.is_correct(c, r["gold"], "strict") for c, r in zip(completions, rows, strict=True)]
    formatted = [gsm8k.has_strict_format(c) for c in completions]
    mlflow.log_table(
        {
            "id": [r.get("id", "") for r in rows],
            "question": [r["question"] for r in rows],
            "completion": completions,
            "gold": [r["gold"] for r in rows],
            "correct": correct,
            "strict_format": formatted,
        },
        artifact_file=artifact_file,
    )
    return {"sample_accuracy": sum(correct) / len(rows), "sample_format_rate": sum(formatted) / len(rows)}
