"""GRPO's log-prob passes on a CPU (`grpo.logps_batching`, `grpo.lean_logps`): the old policy's, the
KL reference's and the loss's forward (and backward) passes over a batch of prompt + completion rows.

TRL runs them over one padded batch. Here, besides that:

- per_sequence (`unpadded_logps`): one row at a time on its own tokens, no padding;
- shared_prefix (`shared_prefix_logps`): each distinct prompt once, its KV cache shared by the rows
  (the completions of its group) that continue it. A GRPO prompt is 100 tokens and its completions
  about 50: 8 rows of a group cost 8 x 150 tokens padded or per sequence, 100 + 8 x 51 here. The
  numbers are the per-sequence ones (positions from each row's first real token, as in generation);
  the gradient reaches the prompt's tokens through the shared cache.
- the LM head only at the scored positions (the completions) and PyTorch's math attention kernel:
  components/training/lean_passes.py, shared with SFT's training step.

    unpadded_logps(compute, model, ids, mask, keep)         per sequence, through TRL's own pass
    shared_prefix_logps(model, ids, mask, keep, autocast)   one prefix pass per distinct prompt
    lean_head(head, hidden, labels, temperature)            log-probs (and entropies) at the scored positions
"""

from __future__ import annotations

from typing import Any

from components.training.lean_passes import cpu_kernels


def unpadded_logps(compute, model, input_ids, attention_mask, logits_to_keep: int, **kwargs: Any):
    """TRL's per-token log-probs (and entropies) computed one sequence at a time on its own tokens: the
    prompt's left padding and the completion's right padding cut off, results padded back to the batch's
    `logits_to_keep` columns with zeros (those positions are masked out of the loss). On a CPU a padded
    batch spends its time on padding; a sequence alone still fills the matrix units. Positions then
    count from the first real token, as in generation.

    >>> import torch
    >>> def compute(model, ids, mask, keep, **kw):  # stand-in: "log-prob" = token id, entropy = position
    ...     return ids[:, -keep:].float(), torch.arange(ids.size(1))[-keep:].float().expand(ids.size(0), -1), None
    >>> ids = torch.tensor([[0, 5, 6, 7, 8, 0], [4, 5, 6, 7, 0, 0]])
    >>> mask = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    >>> logps, ent, _ = unpadded_logps(compute, None, ids, mask, 3, compute_entropy=True)
    >>> logps.tolist(), ent.tolist()
    ([[7.0, 8.0, 0.0], [7.0, 0.0, 0.0]], [[2.0, 3.0, 0.0], [3.0, 0.0, 0.0]])
    """
    import torch

    width = input_ids.size(1)
    kwargs = {k: v for k, v in kwargs.items() if k != "batch_size"}
    logps, entropies, aux = [], [], []
    for row in range(input_ids.size(0)):
        real = attention_mask[row].nonzero().flatten()
        first, last = (int(real[0]), int(real[-1]) + 1) if len(real) else (width - 1, width)
        keep = max(logits_to_keep - (width - last), 1)  # completion columns this sequence really has
        lp, ent, ax = compute(model, input_ids[row : row + 1, first:last], attention_mask[row : row + 1, first:last],
                              keep, batch_size=1, **kwargs)
        pad = logits_to_keep - lp.size(1)
        logps.append(torch.nn.functional.pad(lp, (0, pad)))
        if ent is not None:
            entropies.append(torch.nn.functional.pad(ent, (0, pad)))
        if ax is not None:
            aux.append(ax)
    return (torch.cat(logps), torch.cat(entropies) if entropies else None,
            torch.stack(aux).mean() if aux else None)


def prompt_rows(input_ids: Any, attention_mask: Any, prompt_width: int, batch_size: int) -> list[list[int]]:
    """Rows in chunks of at most `batch_size`, the rows of one prompt (the real tokens of the first
    `prompt_width` columns) next to each other so that a chunk holds few distinct prompts.

    >>> import torch
    >>> ids = torch.tensor([[0, 5, 9], [4, 5, 8], [0, 5, 7], [4, 5, 6]])
    >>> prompt_rows(ids, (ids > 0).long(), 2, 3)
    [[1, 3, 0], [2]]
    """
    keys = [tuple(input_ids[i, :prompt_width][attention_mask[i, :prompt_width].bool()].tolist())
            for i in range(input_ids.size(0))]
    order = sorted(range(len(keys)), key=lambda i: (keys[i], i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def shared_prefix_logps(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, autocast: Any,
                        compute_entropy: bool = False, batch_size: int | None = None, temperature: float | None = None,
                        entropy_grad: bool = False, **_: Any):
    """Per-token log-probs (and entropies) of the last `logits_to_keep` columns of left-padded prompt +
    right-padded completion rows, each distinct prompt run once: a pass over the prompts but their last
    token fills a KV cache, which is copied to their rows (a differentiable copy: the gradient sums over
    the rows), and a pass over each row's last prompt token and completion reads it. Chunks of at most
    `batch_size` rows; `autocast()` is the context TRL computes in. Zeros where the mask is 0, as TRL
    gives.

    The LM head: without `temperature`, TRL's fused head (`fused_lm_head=True`, the model patched by
    TRL); with it, `lean_head`: the model's own head on the completion positions in the pass's
    precision, then log-softmax(logits / temperature) in float32 (on a CPU 1.5x faster for the whole
    pass than the fused head's chunks; RESULTS.md), the entropies without a gradient unless
    `entropy_grad`. On a CPU the attention runs in PyTorch's math kernel (its backward is faster there
    than the flash kernel's at these lengths) and, under bf16 autocast, peft's LoRA layers leave their
    inputs to autocast instead of casting them to float32 first."""
    import torch
    from transformers.cache_utils import DynamicCache

    from components.models.sampling import _cache_keyword

    rows, width = input_ids.shape
    split = width - logits_to_keep - 1  # columns [0, split): the prefix; [split, width): last prompt token + completion
    keyword = _cache_keyword(model)
    lean = temperature is not None
    body, head = (_body_and_head(model) if lean else (model, None))
    logps, entropies, order = [], [], []
    for chunk in prompt_rows(input_ids, attention_mask, width - logits_to_keep, batch_size or rows):
        idx = torch.tensor(chunk, device=input_ids.device)
        ids, mask = input_ids[idx], attention_mask[idx]
        used = mask[:, :split].any(0).nonzero()  # drop the left padding every row of the chunk has
        first = int(used[0]) if len(used) else split
        ids, mask = ids[:, first:], mask[:, first:]
        cut = split - first
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        keys = [tuple(r) for r in ids[:, :cut].masked_fill(mask[:, :cut] == 0, -1).tolist()]
        distinct: dict[tuple[int, ...], int] = {}
        of_row = torch.tensor([distinct.setdefault(k, len(distinct)) for k in keys], device=idx.device)
        first_row = torch.tensor([keys.index(k) for k in distinct], device=idx.device)
        cache = DynamicCache(config=model.config)
        with autocast(), cpu_kernels(model, input_ids.device):
            if cut:
                body(input_ids=ids[first_row, :cut], attention_mask=mask[first_row, :cut],
                     position_ids=position[first_row, :cut], use_cache=True,
                     **({} if lean else {"logits_to_keep": 1}), **{keyword: cache})
                for layer in cache.layers:
                    layer.batch_select_indices(of_row)
            tail = ids[:, cut:]
            if lean:
                hidden = body(input_ids=tail, attention_mask=mask, position_ids=position[:, cut:],
                              **{keyword: cache}).last_hidden_state[:, -logits_to_keep - 1 : -1]
                lp, ent = lean_head(head, hidden, tail[:, -logits_to_keep:], temperature, compute_entropy, entropy_grad)
                scored = mask[:, -logits_to_keep:] != 0
                lp = lp.masked_fill(~scored, 0.0)
                ent = ent.masked_fill(~scored, 0.0) if ent is not None else None
            else:
                labels = tail.masked_fill(mask[:, cut:] == 0, -100)
                out = model(input_ids=tail, attention_mask=mask, position_ids=position[:, cut:], labels=labels,
                            fused_lm_head=True, **{keyword: cache})
                lp, ent = (out.log_probs[:, -logits_to_keep:],
                           out.entropy[:, -logits_to_keep:] if compute_entropy else None)
        logps.append(lp)
        if compute_entropy:
            entropies.append(ent)
        order.extend(chunk)
    back = torch.argsort(torch.tensor(order, device=input_ids.device))
    return torch.cat(logps)[back], (torch.cat(entropies)[back] if compute_entropy else None), None


def _body_and_head(model: Any) -> tuple[Any, Any]:
    """(the decoder stack, the LM head) of a causal LM, a peft model of one, or a wrapper holding it in
    `.module`: the stack returns hidden states, the head projects them."""
    inner = getattr(model, "module", model)
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    return inner.get_decoder(), inner.get_output_embeddings()


def lean_head(head: Any, hidden: Any, labels: Any, temperature: float, compute_entropy: bool = False,
              entropy_grad: bool = False) -> tuple[Any, Any]:
    """(log-probs of `labels`, entropies or None) under the LM head `head` at `hidden` (rows x positions
    x width): the projection in the ambient precision (bf16 under bf16 autocast), the log-softmax of
    logits / temperature in float32 (TRL's definition). The entropies carry a gradient only with
    `entropy_grad` (an entropy bonus); else they are a metric and cost no backward pass.

    >>> import torch
    >>> head = torch.nn.Linear(2, 3, bias=False)
    >>> _ = head.weight.data.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    >>> lp, ent = lean_head(head, torch.tensor([[[2.0, 0.0]]]), torch.tensor([[0]]), 1.0, True)
    >>> round(lp.item(), 4), round(ent.item(), 4), ent.requires_grad
    (-0.2395, 0.6656, False)
    """
    import torch

    logp = torch.log_softmax(head(hidden).float() / temperature, dim=-1)
    chosen = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    if not compute_entropy:
        return chosen, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        source = logp if entropy_grad else logp.detach()
        entropy = -(source.exp() * source).sum(-1)
    return chosen, entropy
