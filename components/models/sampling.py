"""GRPO's transformers rollouts for large generation batches: a decoding loop that does only the work
sampling needs (`grpo.rollout_engine: batched`); greedy, the evaluation's `batched` backend
(components/evaluation/generation.py), which is why it lives with the models and not with training.

`model.generate` over a GRPO generation batch (each prompt repeated `num_generations` times) spends
its time where a CPU has none to spare: it prefills every copy of a prompt, copies the whole KV cache
at every decode step (DynamicCache concatenates), and keeps decoding rows that ended (EOS) until the
longest one is done. `sample` draws from the same distribution with less work:

- each distinct prompt is prefilled once and its KV cache copied to its completions;
- the KV cache of every layer is one buffer written in place (`BufferCache`), never concatenated;
- rows that ended leave the batch (their cache rows dropped) once enough of them have ended;
- the next token is drawn from the distribution `generate` draws from (the float32 logits through
  transformers' own warpers, in its order: temperature, top-k, top-p, min-p), by inverting its
  cumulative distribution (`draw`): one uniform number a row, where `torch.multinomial` draws one
  exponential number per vocabulary entry (126 ms of each decode step at 128 rows x 49,152 tokens
  on this 2-core CPU against 3-34 ms);
- on request (`logprobs=True`), each sampled token's log-probability under the sampling policy as
  GRPO's loss defines it (log-softmax of the logits / temperature, before top-k/top-p), so that the
  trainer can take the old policy's log-probs from the rollout instead of a second forward pass
  (`grpo.old_logps: rollout`).

Settings it does not cover (`supported` says which) go to `model.generate`. Completions end with their
first EOS token (kept, as TRL keeps it) or at `max_new_tokens`.

    supported(generation_config)   whether `sample` covers these generation settings
    draw(probs)                    one index per row, drawn with the row's probabilities
    sample(model, prompt_ids, ...) the completions' token ids, one list per prompt row (and, with
                                   logprobs=True, each token's log-probability, one list per row);
                                   greedy=True: the most likely token at each step instead (evaluation)
    BufferCache(capacity, layers)  a KV cache of preallocated buffers (rows can be dropped)
    grouped_attention()            context: grouped-query attention on a CPU without a copy of the KV
                                   cache per query head (the evaluation's batched backend)
"""

from __future__ import annotations

from typing import Any

# GenerationConfig fields `sample` reproduces; any other non-default sampling setting goes to generate.
COVERED = ("temperature", "top_k", "top_p", "min_p")
# Settings that change the distribution, and the value at which they do nothing.
NEUTRAL = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "typical_p": 1.0, "epsilon_cutoff": 0.0,
           "eta_cutoff": 0.0, "top_h": None, "bad_words_ids": None, "suppress_tokens": None,
           "begin_suppress_tokens": None, "sequence_bias": None, "min_new_tokens": None, "min_length": 0,
           "guidance_scale": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
           "num_beams": 1, "penalty_alpha": None, "watermarking_config": None}
# Drop the finished rows once this share of the batch has ended (each drop copies the KV cache).
COMPACT_SHARE = 0.125


def supported(generation_config: Any) -> bool:
    """Whether `sample` draws what `model.generate(generation_config=...)` draws: multinomial sampling
    with at most temperature, top-k, top-p and min-p.

    >>> from transformers import GenerationConfig
    >>> supported(GenerationConfig(do_sample=True, temperature=0.8, top_k=0, top_p=1.0))
    True
    >>> (supported(GenerationConfig(do_sample=True, repetition_penalty=1.1)),
    ...  supported(GenerationConfig(do_sample=False)))
    (False, False)
    """
    if not getattr(generation_config, "do_sample", False):
        return False
    for key, neutral in NEUTRAL.items():
        value = getattr(generation_config, key, neutral)
        if value not in (neutral, None) and not (isinstance(value, (list, tuple)) and not value):
            return False
    return True


def warpers(generation_config: Any) -> list[Any]:
    """transformers' logits warpers for these settings, in `generate`'s order."""
    from transformers.generation import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    cfg, out = generation_config, []
    if cfg.temperature is not None and cfg.temperature != 1.0:
        out.append(TemperatureLogitsWarper(cfg.temperature))
    if cfg.top_k is not None and cfg.top_k != 0:
        out.append(TopKLogitsWarper(top_k=cfg.top_k, min_tokens_to_keep=1))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=cfg.top_p, min_tokens_to_keep=1))
    if cfg.min_p is not None:
        out.append(MinPLogitsWarper(min_p=cfg.min_p, min_tokens_to_keep=1))
    return out


def draw(probs: Any, generator: Any = None, block: int = 256) -> Any:
    """One column index per row of `probs` (rows of non-negative weights), drawn with probability
    proportional to its weight: the first index whose float64 running sum reaches a uniform number
    in (0, row sum]. A zero weight is never drawn. The running sum is taken in two levels, over
    blocks of `block` columns and then inside the block the number falls in, so that a decode step
    sums the vocabulary once instead of running a float64 cumulative sum over it (14 ms of each
    step at 128 rows x 49,152 tokens on a 2-core CPU).

    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> counts = torch.bincount(draw(torch.tensor([[0.1, 0.0, 0.6, 0.3]]).expand(20000, 4), block=2), minlength=4)
    >>> [round(c / 20000, 1) for c in counts.tolist()]
    [0.1, 0.0, 0.6, 0.3]
    >>> sorted(set(draw(torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.5]]).expand(2000, 5), block=2).tolist()))  # padded blocks
    [1, 4]
    """
    import torch

    rows, n = probs.shape
    pad = (-n) % block
    blocks = (torch.nn.functional.pad(probs, (0, pad)) if pad else probs).view(rows, -1, block)
    sums = blocks.sum(-1, dtype=torch.float64)
    cumulative = sums.cumsum(-1)
    u = (1.0 - torch.rand(rows, 1, dtype=torch.float64, device=probs.device, generator=generator)) * cumulative[:, -1:]
    chosen = torch.searchsorted(cumulative, u).clamp(max=sums.size(1) - 1)  # (rows, 1)
    inner = blocks[torch.arange(rows, device=probs.device), chosen.squeeze(1)].to(torch.float64).cumsum(-1)
    rest = u - (cumulative.gather(1, chosen) - sums.gather(1, chosen))  # the number's place inside its block
    rest = torch.minimum(rest.clamp(min=torch.finfo(torch.float64).tiny), inner[:, -1:])  # rounding: stay on a weight
    return (chosen * block + torch.searchsorted(inner, rest)).squeeze(1)


def _buffer_layer_class():
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        """One layer's keys and values in a buffer of `capacity` positions, written in place; what
        attention reads is a view of the filled part."""

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity, self.length = capacity, 0

        def lazy_initialization(self, key_states, value_states) -> None:
            self.device = key_states.device
            b, h, _, d = key_states.shape
            self._k = key_states.new_empty(b, h, self.capacity, d)
            self._v = value_states.new_empty(b, value_states.shape[1], self.capacity, value_states.shape[-1])
            self.is_initialized = True

        def update(self, key_states, value_states, *args: Any, **kwargs: Any):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = key_states.shape[-2]
            if self.length + n > self.capacity:
                raise ValueError(f"BufferCache: {self.length + n} positions exceed its capacity {self.capacity}")
            self._k[:, :, self.length : self.length + n] = key_states
            self._v[:, :, self.length : self.length + n] = value_states
            self.length += n
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def get_max_length(self) -> int:
            return self.capacity

        def batch_select_indices(self, indices) -> None:
            """Keep the rows `indices` (a new buffer holding only them)."""
            if not self.is_initialized:
                return
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = old.new_empty(len(indices), *old.shape[1:])
                new[:, :, : self.length] = old[indices, :, : self.length]
                setattr(self, name, new)
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    return BufferLayer


def BufferCache(capacity: int, layers: int) -> Any:  # noqa: N802 (builds a transformers Cache)
    """A transformers Cache of `layers` full-attention layers, each a buffer of `capacity` positions."""
    from transformers.cache_utils import Cache

    layer = _buffer_layer_class()
    return Cache(layers=[layer(capacity) for _ in range(layers)])


def _grouped_attention(original: Any) -> Any:
    """An attention function for transformers' "sdpa" slot that, on a CPU, computes grouped-query
    attention (fewer key/value heads than query heads) without copying the keys and values once per
    query head: transformers' SDPA path calls `repeat_kv` wherever a mask is given off CUDA, a copy of
    the whole KV cache in every layer at every decode step (SmolLM2: 3 key/value heads for 9 query
    heads). The query heads of a group attend to their key/value head in one batched matrix product;
    float32 scores and softmax, masked positions at float32's lowest value (as eager attention adds it).
    Anything else (no grouping, another device, dropout, extra arguments) goes to `original`."""

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        import torch

        heads, kv_heads = query.shape[1], key.shape[1]
        if (heads == kv_heads or query.device.type != "cpu" or dropout
                or any(v is not None for k, v in kwargs.items() if k in ("s_aux", "position_bias", "sinks"))):
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            is_causal=is_causal, **kwargs)
        b, _, q, d = query.shape
        groups, length = heads // kv_heads, key.shape[2]
        scores = torch.matmul(query.reshape(b, kv_heads, groups * q, d).float(), key.transpose(-1, -2).float())
        scores = (scores * (scaling if scaling is not None else d**-0.5)).view(b, kv_heads, groups, q, length)
        if attention_mask is None and q > 1:
            attention_mask = torch.ones(q, length, dtype=torch.bool, device=query.device).tril(length - q)[None, None]
        if attention_mask is not None:
            mask = attention_mask[..., :length].unsqueeze(2)  # (b or 1, 1, 1, q, length)
            low = torch.finfo(torch.float32).min
            scores = (scores.masked_fill(~mask, low) if mask.dtype == torch.bool
                      else (scores + mask.float()).clamp(min=low))
        probs = torch.softmax(scores, dim=-1).to(value.dtype).view(b, kv_heads, groups * q, length)
        out = torch.matmul(probs, value).view(b, heads, q, d)
        return out.transpose(1, 2).contiguous(), None

    return attention


class grouped_attention:  # noqa: N801 (a context manager used as `with grouped_attention():`)
    """Inside the block, transformers' "sdpa" attention is `_grouped_attention`'s (the model's own
    attention function otherwise); the mapping is restored on exit."""

    def __enter__(self) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.saved = ALL_ATTENTION_FUNCTIONS._local_mapping.get("sdpa")
        ALL_ATTENTION_FUNCTIONS["sdpa"] = _grouped_attention(ALL_ATTENTION_FUNCTIONS["sdpa"])

    def __exit__(self, *exc: Any) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        if self.saved is None:
            del ALL_ATTENTION_FUNCTIONS["sdpa"]
        else:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = self.saved


def _full_attention_layers(model: Any) -> int | None:
    """The number of decoder layers when every one is full attention (what BufferCache holds), else None."""
    config = model.config.get_text_config(decoder=True)
    types = getattr(config, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        return None
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return None
    return getattr(config, "num_hidden_layers", None)


def _cache_keyword(model: Any) -> str:
    """The forward keyword of the KV cache: `cache` (transformers >= 5.x) or `past_key_values`."""
    import inspect

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


def sample(model: Any, prompt_ids: list[list[int]], generation_config: Any, max_new_tokens: int,
           eos_token_ids: list[int], pad_token_id: int, compact_share: float = COMPACT_SHARE,
           logprobs: bool = False, greedy: bool = False) -> Any:
    """Sample one completion per row of `prompt_ids` (rows may repeat a prompt), as `model.generate`
    samples under `generation_config` (see `supported`); each completion is its token ids through the
    first EOS (kept) or `max_new_tokens`. Rows that ended leave the batch once `compact_share` of it
    has ended (above 1: never). Runs under torch.no_grad in the model's own dtype. With `logprobs`,
    returns (token ids, log-probs): each sampled token's log-softmax of the float32 logits divided by
    the temperature (what TRL's log-prob passes compute; top-k/top-p do not enter it). With `greedy`,
    each row takes its most likely next token (the float32 logits' argmax: what `generate` does with
    do_sample=False; `generation_config` and `logprobs` are not used): the evaluation's `batched` backend."""
    import torch
    from transformers.generation import TemperatureLogitsWarper

    layers = _full_attention_layers(model)
    if layers is None:
        raise ValueError("rollouts.sample holds full-attention layers only (this model has sliding windows)")
    device = next(model.parameters()).device
    distinct: dict[tuple[int, ...], int] = {}
    row_prompt = [distinct.setdefault(tuple(p), len(distinct)) for p in prompt_ids]
    prompts = list(distinct)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), width + max_new_tokens), dtype=torch.long, device=device)
    for i, p in enumerate(prompts):  # left padding, as generate's callers pad
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) : width] = 1
    position = (mask[:, :width].cumsum(-1) - 1).clamp(min=0)
    cache = BufferCache(width + max_new_tokens, layers)
    with_cache = {_cache_keyword(model): cache, "use_cache": True, "logits_to_keep": 1}
    process = [] if greedy else warpers(generation_config)
    eos = torch.tensor(eos_token_ids, dtype=torch.long, device=device)
    out: list[list[int]] = [[] for _ in prompt_ids]
    out_logps: list[list[float]] = [[] for _ in prompt_ids]
    temperature = 1.0 if greedy else generation_config.temperature or 1.0
    logprobs = logprobs and not greedy
    only_temperature = all(isinstance(w, TemperatureLogitsWarper) for w in process)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask[:, :width], position_ids=position,
                       **with_cache).logits[:, -1]
        rows = torch.tensor(row_prompt, device=device)  # each row's prompt, then each active row's index in `out`
        for layer in cache.layers:
            layer.batch_select_indices(rows)
        logits, mask, last = logits[rows], mask[rows], position[rows, -1]
        active = torch.arange(len(prompt_ids), device=device)
        ended = torch.zeros(len(prompt_ids), dtype=torch.bool, device=device)
        for step in range(max_new_tokens):
            scores = logits.float()
            for warp in process:
                scores = warp(None, scores)
            token = scores.argmax(-1) if greedy else draw(torch.softmax(scores, dim=-1))
            chosen = None
            if logprobs:  # log-softmax of logits / T at the token: the scores themselves when T is the only warper
                base = scores if only_temperature else logits.float() / temperature
                chosen = (base.gather(1, token[:, None])
                          - torch.logsumexp(base, dim=-1, keepdim=True)).squeeze(1).tolist()
            for j, (i, t) in enumerate(zip(active.tolist(), token.tolist(), strict=True)):
                if not ended[i]:
                    out[i].append(t)
                    if chosen is not None:
                        out_logps[i].append(chosen[j])
            ended[active] |= torch.isin(token, eos)
            live = ~ended[active]
            if step == max_new_tokens - 1 or not live.any():
                break
            if (~live).sum() >= max(1.0, compact_share * len(active)):  # drop the ended rows
                keep = live.nonzero().squeeze(1)
                for layer in cache.layers:
                    layer.batch_select_indices(keep)
                active, token, mask, last = active[keep], token[keep], mask[keep], last[keep]
            mask[:, width + step] = 1
            last = last + 1
            logits = model(input_ids=token[:, None], attention_mask=mask[:, : width + step + 1],
                           position_ids=last[:, None], **with_cache).logits[:, -1]
    return (out, out_logps) if logprobs else out
