"""GRPO updates on informative groups only (`grpo.informative_groups_only`).

A group whose completions all got the same reward has zero advantage: its completions add nothing
to the policy gradient, only their KL term. With this option they leave the scored batch before
any log-prob pass (the KL reference's, the old policy's) and before the loss's forward and backward
passes, so they cost only their generation (verl's `filter_groups`, OpenRLHF's dynamic filtering
drop them the same way). What stays is cut to its own padding, its groups shuffled (each group's
rows together) and split over the optimizer steps of the generation batch without losing a row.

    weighted_rewards(per_func, w)     each completion's reward, as TRL sums it (NaN: unscorable)
    informative_rows(rewards, group)  the rows of the groups whose rewards are not all equal
    informative_share(rewards, group) the share of groups with a reward spread (logged every step)
    select_rows(batch, rows)          a scored batch cut to those rows, padding columns trimmed
    shuffle_groups(batch, group)      the batch's groups in a random order, each group's rows together
    split_evenly(batch, chunks)       the batch in `chunks` parts of sizes differing by at most one
"""

from __future__ import annotations

from typing import Any

# Keys of a scored batch (TRL's _generate_and_score_completions) by the columns they span.
PROMPT_KEYS = ("prompt_ids", "prompt_mask")
COMPLETION_KEYS = ("completion_ids", "completion_mask", "tool_mask", "old_per_token_logps",
                   "ref_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio")


def weighted_rewards(per_func: Any, weights: Any) -> Any:
    """Each completion's reward from its rewards per function (rows x functions): the weighted sum
    over the functions that scored it, NaN where none did (TRL's sum_then_normalize).

    >>> import torch
    >>> weighted_rewards(torch.tensor([[1.0, float("nan")], [float("nan")] * 2]), torch.tensor([1.0, 0.5])).tolist()
    [1.0, nan]
    """
    import torch

    rewards = (per_func * weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(per_func).all(dim=1)] = torch.nan
    return rewards


def informative_share(rewards: Any, group: int) -> float:
    """The share of groups of `group` consecutive rows whose rewards are not all equal.

    >>> import torch
    >>> informative_share(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2)
    0.5
    """
    groups = rewards.numel() // group
    return len(informative_rows(rewards, group)) / group / groups if groups else 0.0


def informative_rows(rewards: Any, group: int) -> Any:
    """Indices of the rows whose group of `group` consecutive rows has a reward spread (TRL's
    criterion for zero advantage: the group's std of the weighted reward is close to 0; NaN, an
    unscorable completion, is left out of the std as TRL leaves it out).

    >>> import torch
    >>> informative_rows(torch.tensor([1., 1., 0., 1., 0.5, 0.5, float("nan"), 0.5]), 2).tolist()
    [2, 3]
    """
    import torch
    from trl.trainer.utils import nanstd

    std = nanstd(rewards.view(-1, group), dim=1)
    keep = ~torch.isclose(std, torch.zeros_like(std)) & ~torch.isnan(std)
    return keep.repeat_interleave(group).nonzero().squeeze(1)


def _trim(batch: dict[str, Any]) -> dict[str, Any]:
    """Drop the prompt columns no row uses (left padding) and the completion columns no row uses
    (right padding)."""
    prompt, completion = batch["prompt_mask"], batch["completion_mask"]
    if prompt.size(0) == 0:
        return batch
    used = prompt.any(0).nonzero()
    first = int(used[0]) if len(used) else prompt.size(1)
    used = completion.any(0).nonzero()
    last = int(used[-1]) + 1 if len(used) else 1
    out = dict(batch)
    for key in PROMPT_KEYS:
        out[key] = batch[key][:, first:]
    for key in COMPLETION_KEYS:
        value = batch.get(key)
        if value is not None and getattr(value, "dim", lambda: 0)() == 2:
            out[key] = value[:, :last]
    return out


def select_rows(batch: dict[str, Any], rows: Any) -> dict[str, Any]:
    """The scored batch's rows `rows` (every tensor or list with one entry per row), then its padding
    columns trimmed. Scalars (num_items_in_batch) are left as they are.

    >>> import torch
    >>> b = {"prompt_ids": torch.tensor([[0, 5], [6, 7]]), "prompt_mask": torch.tensor([[0, 1], [1, 1]]),
    ...      "completion_ids": torch.tensor([[8, 0], [9, 9]]), "completion_mask": torch.tensor([[1, 0], [1, 1]]),
    ...      "advantages": torch.tensor([1.0, -1.0]), "num_items_in_batch": torch.tensor(3)}
    >>> out = select_rows(b, torch.tensor([0]))
    >>> out["prompt_ids"].tolist(), out["completion_ids"].tolist(), out["advantages"].tolist()
    ([[5]], [[8]], [1.0])
    """
    n = batch["completion_ids"].size(0)
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if hasattr(value, "dim") and value.dim() > 0 and value.size(0) == n:
            out[key] = value[rows]
        elif isinstance(value, list) and len(value) == n:
            out[key] = [value[i] for i in rows.tolist()]
        else:
            out[key] = value
    return _trim(out)


def shuffle_groups(batch: dict[str, Any], group: int) -> dict[str, Any]:
    """The batch's groups of `group` consecutive rows in a random order, the rows of each group kept
    together (TRL shuffles rows; kept together, a minibatch's rows share their prompts, which
    `grpo.logps_batching: shared_prefix` then runs once).

    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> b = {"prompt_ids": torch.arange(6)[:, None], "prompt_mask": torch.ones(6, 1),
    ...      "completion_ids": torch.ones(6, 1), "completion_mask": torch.ones(6, 1)}
    >>> order = shuffle_groups(b, 2)["prompt_ids"].flatten().tolist()
    >>> sorted(order) == list(range(6)) and all(order[i] // 2 == order[i + 1] // 2 for i in (0, 2, 4))
    True
    """
    import torch

    groups = batch["completion_ids"].size(0) // group
    order = (torch.randperm(groups)[:, None] * group + torch.arange(group)).flatten()
    return select_rows(batch, order)


def split_evenly(batch: dict[str, Any], chunks: int) -> list[dict[str, Any]]:
    """`chunks` parts of the batch's rows in order, sizes differing by at most one (some empty when
    there are fewer rows than chunks), each trimmed to its own padding. TRL's split_tensor_dict
    drops the rows past a multiple of `chunks`, which a filtered batch rarely is.

    >>> import torch
    >>> b = {"prompt_ids": torch.ones(5, 2), "prompt_mask": torch.ones(5, 2), "completion_ids": torch.ones(5, 3),
    ...      "completion_mask": torch.ones(5, 3), "advantages": torch.arange(5.0)}
    >>> [p["advantages"].tolist() for p in split_evenly(b, 3)]
    [[0.0, 1.0], [2.0, 3.0], [4.0]]
    """
    import torch

    n = batch["completion_ids"].size(0)
    sizes = [n // chunks + (1 if i < n % chunks else 0) for i in range(chunks)]
    parts, start = [], 0
    for size in sizes:
        parts.append(select_rows(batch, torch.arange(start, start + size)))
        start += size
    return parts


class InformativeGroupsMixin:
    """GRPOTrainer methods that keep only the informative groups of each generation batch (put before
    the trainer class in the bases: `class T(InformativeGroupsMixin, Trainer)`).

    While a batch is scored, the no-grad log-prob passes (old policy, KL reference) return
    placeholders and are recorded (with vLLM rollouts they run: its importance-sampling correction
    reads the old log-probs while scoring); once TRL has the rewards and advantages, the batch is
    cut to the informative rows and those passes run on them alone, as TRL runs them (the reference
    under the "ref" adapter or with the adapters off, or on its own model). The trainer below it
    keeps the scored batch's rewards per function in `_last_rewards` (its `_calculate_rewards`) and
    may define `_passes_context()`, the context the log-prob passes run in. `trained_completions`
    joins the logged metrics. With `old_logps_from_rollout` (set by the stage from `grpo.old_logps`)
    and a batch whose rollouts returned their log-probs (TRL's `sampling_per_token_logps`), the old
    policy's pass does not run: its log-probs are the rollout's (the behaviour policy's, as PPO's
    ratio wants)."""

    old_logps_from_rollout: bool = False
    _deferred: list[tuple[Any, tuple[Any, ...]]] | None = None
    _last_rewards: Any = None

    def _passes_context(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        import torch

        if self._deferred is None or torch.is_grad_enabled():
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              *args, **kwargs)
        placeholder = torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device)
        self._deferred.append((placeholder, (args, kwargs)))
        return placeholder, None, None

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        # vLLM's importance-sampling correction needs the old log-probs while scoring: run them there
        self._deferred = None if self.use_vllm else []
        try:
            with self._passes_context():
                batch = super()._generate_and_score_completions(inputs)
                deferred, self._deferred = self._deferred or [], None
                return self._informative_part(batch, deferred)
        finally:
            self._deferred = None

    def _informative_part(self, batch: dict[str, Any], deferred: list[tuple[Any, tuple[Any, ...]]]) -> dict[str, Any]:
        keep_all = informative_rows(weighted_rewards(self._last_rewards, self.reward_weights), self.num_generations)
        n = batch["completion_ids"].size(0)
        start = self.accelerator.process_index * n
        keep = keep_all[(keep_all >= start) & (keep_all < start + n)] - start
        self._metrics["train"]["trained_completions"].append(float(len(keep_all)))
        out = select_rows(batch, keep)
        mask = out["completion_mask"] if out.get("tool_mask") is None else out["completion_mask"] * out["tool_mask"]
        out["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        for key in ("old_per_token_logps", "ref_per_token_logps"):
            found = [call for placeholder, call in deferred if placeholder is batch.get(key)]
            if not found:
                continue
            if (key == "old_per_token_logps" and self.old_logps_from_rollout
                    and out.get("sampling_per_token_logps") is not None):
                out[key] = out["sampling_per_token_logps"]
            else:
                out[key] = self._logps_of(key, out, *found[0])
        return out

    def _logps_of(self, key: str, batch: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The old policy's or the reference's per-token log-probs of the batch's rows, as TRL computes them."""
        import torch
        from trl.trainer.utils import use_adapter

        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep = batch["completion_ids"].size(1)
        if ids.size(0) == 0:
            return torch.zeros(0, keep, device=ids.device)

        def run(model):
            with torch.no_grad():
                return self._get_per_token_logps_and_entropies(model, ids, mask, keep, *args, **kwargs)[0]

        if key == "old_per_token_logps":
            return run(self.model)
        if self.ref_model is not None:
            return run(self.ref_model)
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return run(self.model)

    def _prepare_inputs(self, generation_batch):
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = shuffle_groups(self._generate_and_score_completions(generation_batch), self.num_generations)
            self._buffered_inputs = split_evenly(batch, self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _compute_loss(self, model, inputs):
        if inputs["completion_ids"].size(0) == 0:  # no informative row in this part: nothing to learn
            return sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
        return super()._compute_loss(model, inputs)
