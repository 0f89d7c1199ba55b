"""Rule-based GRPO rewards (the DeepSeek-R1 recipe), chosen by name from params.

Every reward has TRL's signature `(completions, **kwargs) -> list[float | None]`: one score
per completion; completions are strings or chat message lists
(`[{"role": "assistant", "content": ...}]`); rewards that need the gold answer read the
dataset column `gold` (TRL passes every dataset column as a keyword argument) and give
None for a row whose gold is None (TRL then leaves that reward out for the row).

    format         1.0 for the strict `<reasoning>...</reasoning><answer>...</answer>` format, else 0.0
    soft_format    1.0 when a reasoning block is followed by an answer block anywhere, else 0.0
    accuracy       1.0 when the strict format's answer equals the gold number, else 0.0
                   (exactly what `evaluate` counts as correct in strict mode)
    flexible_accuracy  1.0 when the last number in the completion equals the gold number, tags or
                   not (what `evaluate` counts in flexible mode): a reward a model that never writes
                   the tags can earn, e.g. an instruct model trained by GRPO without SFT
    seed_combined  1.0 format and answer right, 0.5 format right and answer wrong, 0.0 otherwise
    tag_count      0.25 per well-placed tag (each tag once, in order, nothing before the first
                   or after the last)

All of them are built on components/problems/gsm8k.py, the scorer evaluation uses too. None of them
raises or hangs on any text: parsing is plain linear string scanning and math-verify runs
only on short answers within a 20 ms CPU-time budget (see gsm8k.answers_match).

`get_reward_funcs(names)` resolves registry names and `package.module:function` paths;
`build_rewards(params.rewards)` returns the functions and their weights for GRPOTrainer.

    python -m doctest components/training/rewards.py
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from components.common.errors import ConfigError
from components.common.params import RewardsParams
from components.problems import answers, gsm8k

RewardFunc = Callable[..., list]


def completion_text(completion: Any) -> str:
    """The text of one completion: a string, a chat message list (the last message's
    content) or a message dict; content given as parts keeps the text parts. Anything else
    reads as the empty string.

    >>> completion_text([{"role": "assistant", "content": "<answer>7</answer>"}])
    '<answer>7</answer>'
    >>> completion_text([{"role": "assistant", "content": [{"type": "text", "text": "7"}]}])
    '7'
    >>> completion_text(None)
    ''
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)):
        if not completion:
            return ""
        completion = completion[-1]
    if isinstance(completion, dict):
        content = completion.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, (list, tuple)):
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            return "".join(p for p in parts if isinstance(p, str))
    return ""


def _golds(kwargs: dict[str, Any], n: int) -> list[Any]:
    if "gold" not in kwargs:
        raise KeyError(
            "this reward needs the gold answer: the training dataset must have a 'gold' column "
            f"(columns passed: {', '.join(sorted(kwargs)) or 'none'})"
        )
    gold = kwargs["gold"]
    if gold is None or isinstance(gold, (str, int, float)):
        return [gold] * n  # one gold for all completions (direct calls)
    gold = list(gold)
    return gold + [None] * (n - len(gold)) if len(gold) < n else gold[:n]


def _gold_text(gold: Any) -> str | None:
    if gold is None or isinstance(gold, bool):
        return None
    return gold if isinstance(gold, str) else str(gold)


def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 when the completion is exactly a reasoning block then an answer block.

    >>> format_reward(["<reasoning>\\n3 + 4 = 7\\n</reasoning>\\n<answer>\\n7\\n</answer>", "7", None])
    [1.0, 0.0, 0.0]
    """
    return [1.0 if gsm8k.has_strict_format(completion_text(c)) else 0.0 for c in completions]


def soft_format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 when a `<reasoning>...</reasoning>` block is followed by an `<answer>...</answer>`
    block anywhere in the completion (text around them allowed), else 0.0.

    >>> soft_format_reward(["Sure. <reasoning>x</reasoning> so <answer>7</answer> done", "<answer>7</answer>"])
    [1.0, 0.0]
    """
    return [1.0 if _soft_format(completion_text(c)) else 0.0 for c in completions]


def _soft_format(text: str) -> bool:
    r_open = text.find(gsm8k.REASONING_OPEN)
    if r_open < 0:
        return False
    r_close = text.find(gsm8k.REASONING_CLOSE, r_open + len(gsm8k.REASONING_OPEN))
    if r_close < 0:
        return False
    a_open = text.find(gsm8k.ANSWER_OPEN, r_close + len(gsm8k.REASONING_CLOSE))
    if a_open < 0:
        return False
    return text.find(gsm8k.ANSWER_CLOSE, a_open + len(gsm8k.ANSWER_OPEN)) >= 0


def accuracy_reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when the strict format's answer equals the gold answer (`gold` column), else 0.0;
    None where the gold is None.

    >>> done = "<reasoning>\\n325 - 48 = 277\\n</reasoning>\\n<answer>\\n{}\\n</answer>"
    >>> accuracy_reward([done.format(277), done.format(305), "277"], gold=["277", "277", "277"])
    [1.0, 0.0, 0.0]
    >>> accuracy_reward([done.format(277)], gold=[None])
    [None]
    """
    return _correct(completions, kwargs, "strict")


def flexible_accuracy_reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when the last number in the completion equals the gold answer (`gold` column), tags
    or not, else 0.0; None where the gold is None.

    >>> flexible_accuracy_reward(["So he has 325 - 48 = 277 hens.", "277 hens, then 3 more", "<answer>277</answer>"],
    ...                          gold="277")
    [1.0, 0.0, 1.0]
    """
    return _correct(completions, kwargs, "flexible")


def _correct(completions: Sequence[Any], kwargs: dict[str, Any], mode: str) -> list[float | None]:
    """1.0 / 0.0 per completion: its answer in `mode` equals its row's gold; None where the gold is None."""
    golds = _golds(kwargs, len(completions))
    out: list[float | None] = []
    for c, g in zip(completions, golds, strict=True):
        gold = _gold_text(g)
        out.append(None if gold is None else float(gsm8k.is_correct(completion_text(c), gold, mode)))
    return out


def seed_combined_reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """1.0 for the strict format with the right answer, 0.5 for the strict format with a
    wrong answer, 0.0 without the format; None where the gold is None.

    >>> done = "<reasoning>\\n325 - 48 = 277\\n</reasoning>\\n<answer>\\n{}\\n</answer>"
    >>> seed_combined_reward([done.format(277), done.format(305), "The answer is 277."], gold="277")
    [1.0, 0.5, 0.0]
    """
    golds = _golds(kwargs, len(completions))
    out: list[float | None] = []
    for c, g in zip(completions, golds, strict=True):
        gold = _gold_text(g)
        if gold is None:
            out.append(None)
            continue
        answer = gsm8k.extract_answer(completion_text(c), "strict")
        if answer is None:
            out.append(0.0)
        else:
            out.append(1.0 if gsm8k.answers_match(answer, gold) else 0.5)
    return out


def tag_count_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """0.25 for each well-placed tag: present exactly once, in order with the other tags,
    nothing but whitespace before `<reasoning>`, between `</reasoning>` and `<answer>`, and
    after `</answer>`. A strict-format completion scores 1.0.

    >>> tag_count_reward([
    ...     "<reasoning>\\nx\\n</reasoning>\\n<answer>\\n7\\n</answer>",
    ...     "<reasoning>x</reasoning> so <answer>7</answer> bye",
    ...     "<reasoning>x",
    ...     "no tags"])
    [1.0, 0.5, 0.25, 0.0]
    """
    return [_tag_count(completion_text(c)) for c in completions]


def _tag_count(text: str) -> float:
    tags = gsm8k.TAGS
    pos = [text.find(t) if text.count(t) == 1 else -1 for t in tags]
    score = 0.0
    for i, p in enumerate(pos):
        if p < 0:
            continue
        in_order = all(q < 0 or (q < p if j < i else q > p) for j, q in enumerate(pos) if j != i)
        if not in_order:
            continue
        if i == 0 and text[:p].strip():
            continue
        if i == 2 and pos[1] >= 0 and text[pos[1] + len(tags[1]) : p].strip():
            continue
        if i == 3 and text[p + len(tags[3]) :].strip():
            continue
        score += 0.25
    return score


REWARD_FUNCS: dict[str, RewardFunc] = {
    "format": format_reward,
    "soft_format": soft_format_reward,
    "accuracy": accuracy_reward,
    "seed_combined": seed_combined_reward,
    "tag_count": tag_count_reward,
    "flexible_accuracy": flexible_accuracy_reward,
}


def check_reward_name(name: str) -> None:
    """Raise ValueError unless `name` is a registry name or has the form `package.module:function`
    (the path is only imported by `get_reward_funcs`)."""
    if name in REWARD_FUNCS:
        return
    module, sep, func = name.partition(":")
    if sep and module and func.isidentifier() and all(p.isidentifier() for p in module.split(".")):
        return
    raise ValueError(
        f"unknown reward {name!r}; known rewards: {', '.join(REWARD_FUNCS)}, "
        "or a dotted path 'package.module:function' to your own"
    )


def check_reward_names(cfg: RewardsParams) -> None:
    """Every name of the `rewards` params section is a registry name or a dotted path, else a
    ConfigError naming the entry (`rewards.funcs[1]: unknown reward 'nope'; ...`). The grpo stage checks
    this before it loads anything, and a `-S` override before it is written into params.yaml; the
    params schema does not (a reward is GRPO's business: the stages that do not use rewards must not
    depend on this module).

    >>> from types import SimpleNamespace
    >>> check_reward_names(SimpleNamespace(funcs=["format", "nope"]))
    Traceback (most recent call last):
    ...
    components.common.errors.ConfigError: rewards.funcs[1]: unknown reward 'nope'; known rewards: ...
    """
    for i, name in enumerate(cfg.funcs):
        try:
            check_reward_name(name)
        except ValueError as exc:
            raise ConfigError(f"rewards.funcs[{i}]: {exc}") from None


def load_reward(name: str) -> RewardFunc:
    """The reward function for a registry name or a `package.module:function` path.

    >>> load_reward("format") is format_reward
    True
    >>> load_reward("components.training.rewards:tag_count_reward") is tag_count_reward
    True
    """
    check_reward_name(name)
    if name in REWARD_FUNCS:
        return REWARD_FUNCS[name]
    module_name, _, func_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"reward {name!r}: cannot import module {module_name!r} ({exc})") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"reward {name!r}: module {module_name!r} has no function {func_name!r}")
    return func


def get_reward_funcs(names: Sequence[str]) -> list[RewardFunc]:
    """Reward functions by name, in order; an unknown name raises ValueError listing the known ones.

    >>> [f.__name__ for f in get_reward_funcs(["format", "accuracy"])]
    ['format_reward', 'accuracy_reward']
    """
    if isinstance(names, str):
        names = [names]
    funcs = [load_reward(name) for name in names]
    answers.warm_up()  # pay math-verify's import now, not inside the first timed reward call
    return funcs


def build_rewards(cfg: RewardsParams) -> tuple[list[RewardFunc], list[float]]:
    """(functions, weights) from the `rewards` params section, for GRPOTrainer's
    `reward_funcs` and GRPOConfig's `reward_weights`.

    >>> from components.common.params import RewardsParams
    >>> funcs, weights = build_rewards(RewardsParams(funcs=["format", "accuracy"], weights=[0.5, 1.0]))
    >>> [f.__name__ for f in funcs], weights
    (['format_reward', 'accuracy_reward'], [0.5, 1.0])
    """
    if len(cfg.funcs) != len(cfg.weights):
        raise ValueError(
            f"rewards: {len(cfg.funcs)} funcs but {len(cfg.weights)} weights; give one weight per func"
        )
    return get_reward_funcs(cfg.funcs), [float(w) for w in cfg.weights]
