"""Batched `model.generate` on a model in memory: prompts sorted by length, left-padded batches.

Shared by the evaluate stage's transformers backend (components/evaluation/generation.py) and the
training stages' sample answers (components/training/train_samples.py): prompts of similar
length share a batch (less padding), each batch is padded on the left so that every row's new
tokens start at the same column, and the caller gets each batch's prompt indices with the ids
generated for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def length_sorted(prompt_ids: list[list[int]], batch_size: int) -> list[list[int]]:
    """Indices of `prompt_ids` in batches of `batch_size`, longest prompts first.

    >>> length_sorted([[1], [1, 2, 3], [1, 2]], 2)
    [[1, 2], [0]]
    """
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]), reverse=True)
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def left_padded(rows: list[list[int]], pad_id: int):
    """(input_ids, attention_mask) long tensors of `rows`, padded on the left with `pad_id`.

    >>> ids, mask = left_padded([[5, 6], [7]], 0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    import torch

    width = max(len(ids) for ids in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, ids in enumerate(rows):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask[row, width - len(ids) :] = 1
    return input_ids, mask


def generate_batches(
    model, prompt_ids: list[list[int]], batch_size: int, **generate_kwargs: Any
) -> Iterator[tuple[list[int], list[list[int]]]]:
    """For each length-sorted batch: its prompt indices and the generated ids of each output row
    (the prompt's columns removed; rows that stopped early still carry the pad tail). With
    `num_return_sequences` k there are k rows per prompt, in prompt order.
    `generate_kwargs` go to `model.generate` and must name `pad_token_id`."""
    import torch

    for idx in length_sorted(prompt_ids, batch_size):
        input_ids, mask = left_padded([prompt_ids[i] for i in idx], generate_kwargs["pad_token_id"])
        with torch.inference_mode():
            gen = model.generate(
                input_ids=input_ids.to(model.device), attention_mask=mask.to(model.device), **generate_kwargs
            )
        width = input_ids.shape[1]
        yield idx, [gen[row, width:].tolist() for row in range(gen.shape[0])]
