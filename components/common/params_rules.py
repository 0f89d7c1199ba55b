"""The checks params pass when they are loaded: each value against its field's type and bounds
(`coerce`, `check_bounds`: the `choices`/`ge`/`gt`/`le` metadata of components/common/params.py), and the
value checkers the sections' `check` methods (their rules across keys) are written with: data sources,
trainer keys a stage owns, the values of GRPO's recipe keys in its trainer mapping, GRPO's generation batch,
reward weights, and `parse_band` (a band of reasoning steps, `evaluate.target_band`). Every failure is a
ConfigError whose message names the key and what was expected. Nothing here imports the schema, which
imports this module.
"""

from __future__ import annotations

import os
import re
import types
import typing
from typing import Any

from components.common.errors import ConfigError

# Keys the training stages set in TRL's config themselves; a `trainer:` mapping may not set them.
STAGE_OWNED_TRAINER_KEYS = ("output_dir", "resume_from_checkpoint")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotation `tp`; ints are accepted where floats are."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(key, value, arg)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key}: unexpected value {value!r}")
    if tp is Any:
        return value
    base = origin or tp
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if base is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if base is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if base is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if base is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")  # pragma: no cover


def check_bounds(key: str, value: Any, meta: typing.Mapping[str, Any]) -> None:
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"{key}: expected one of {meta['choices']}, got {value!r}")
    if value is None:
        return
    if "ge" in meta and value < meta["ge"]:
        raise ConfigError(f"{key}: expected a value >= {meta['ge']}, got {value!r}")
    if "gt" in meta and value <= meta["gt"]:
        raise ConfigError(f"{key}: expected a value > {meta['gt']}, got {value!r}")
    if "le" in meta and value > meta["le"]:
        raise ConfigError(f"{key}: expected a value <= {meta['le']}, got {value!r}")



def check_trainer_keys(section: str, trainer: dict[str, Any], owned: tuple[str, ...]) -> None:
    """A `trainer:` mapping may not set what the stage sets itself (`owned`)."""
    for key in trainer:
        if key == "reward_weights" and key in owned:
            raise ConfigError(f"{section}.trainer.{key}: set rewards.weights instead")
        if key in owned:
            raise ConfigError(f"{section}.trainer.{key}: the stage sets it; use {section}.checkpoint_dir and "
                              f"{section}.resume instead")


def check_trainer_values(section: str, trainer: dict[str, Any], checks: dict[str, tuple[Any, dict[str, Any]]]) -> None:
    """The values of a `trainer:` mapping that `checks` names ({key: (default, {choices, ge, gt, le})}), each of
    its default's type, in place: an int becomes a float where the default is one (TRL's config checks the rest)."""
    for key, (default, meta) in checks.items():
        if key in trainer:
            trainer[key] = coerce(f"{section}.trainer.{key}", trainer[key], type(default))
            check_bounds(f"{section}.trainer.{key}", trainer[key], meta)


def check_sources(section: str, cfg: Any, keys: tuple[str, ...], synthetic: bool) -> None:
    """Data-source keys: 'synthetic' (where `synthetic`), 'jsonl:PATH' or 'hf:NAME[:CONFIG]' ('' where not)."""
    for key in keys:
        src = getattr(cfg, key)
        if synthetic:
            if not (src == "synthetic" or src.startswith("jsonl:") or src.startswith("hf:")):
                raise ConfigError(
                    f"{section}.{key}: expected 'synthetic', 'jsonl:PATH' or 'hf:NAME[:CONFIG]', got {src!r}"
                )
            if src in ("jsonl:", "hf:"):
                raise ConfigError(f"{section}.{key}: {src!r} needs a path or dataset name after the colon")
        elif src and not ((src.startswith("jsonl:") or src.startswith("hf:")) and len(src.split(":", 1)[1]) > 0):
            raise ConfigError(f"{section}.{key}: expected '', 'jsonl:PATH' or 'hf:NAME[:CONFIG]', got {src!r}")


def check_generation_batch(cfg: Any) -> None:
    """TRL checks this too, but only once torch and TRL are loaded; fail at load time instead.
    TrainingArguments defaults: per_device_train_batch_size 8, gradient_accumulation_steps 1;
    `trainer.num_generations` is there (the section's check fills in the recipe's)."""
    t = cfg.trainer
    group = t["num_generations"]
    ints = {k: t.get(k) for k in ("per_device_train_batch_size", "generation_batch_size",
                                    "steps_per_generation", "gradient_accumulation_steps")}
    if any(v is not None and (isinstance(v, bool) or not isinstance(v, int)) for v in ints.values()):
        return  # a mistyped value; building TRL's GRPOConfig at stage start reports it
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    per_step = (ints["per_device_train_batch_size"] or 8) * world
    generation = ints["generation_batch_size"] or per_step * (
        ints["steps_per_generation"] or ints["gradient_accumulation_steps"] or 1
    )
    if generation % group:
        raise ConfigError(
            f"grpo.trainer.num_generations: the generation batch of {generation} completions "
            f"(trainer.per_device_train_batch_size x processes x steps_per_generation) is not divisible by "
            f"num_generations={group}; make grpo.trainer.per_device_train_batch_size a multiple of {group}"
        )


def check_rewards(cfg: Any) -> None:
    # Names are checked where rewards are used (components/training/rewards.py check_reward_names).
    if not cfg.funcs:
        raise ConfigError("rewards.funcs: give at least one reward function")
    if len(cfg.weights) != len(cfg.funcs):
        raise ConfigError(
            f"rewards.weights: {len(cfg.weights)} weights for {len(cfg.funcs)} funcs "
            f"({', '.join(cfg.funcs)}); give one weight per func"
        )
    for i, w in enumerate(cfg.weights):
        if w != w or w in (float("inf"), float("-inf")):
            raise ConfigError(f"rewards.weights[{i}]: expected a finite number, got {w!r}")


Band = tuple[int, int | None]  # (fewest steps, most steps or None: no upper bound)
_BAND_RE = re.compile(r"^\s*(\d+)\s*(?:(-)\s*(\d+)|(\+))?\s*$")


def parse_band(text: str, key: str = "evaluate.target_band") -> Band | None:
    """`N`, `N-M` or `N+` as (low, high); "" is no band (None). A bad value is a ConfigError naming `key`.

    >>> parse_band("3"), parse_band("2-4"), parse_band("5+"), parse_band("")
    ((3, 3), (2, 4), (5, None), None)
    >>> parse_band("4-2")
    Traceback (most recent call last):
    ...
    components.common.errors.ConfigError: evaluate.target_band='4-2': expected N, N-M (N <= M) or N+ steps, e.g. 3, 3-4 or 5+
    """  # noqa: E501
    if not str(text).strip():
        return None
    m = _BAND_RE.match(str(text))
    if m:
        low = int(m.group(1))
        high = None if m.group(4) else int(m.group(3)) if m.group(2) else low
        if low >= 1 and (high is None or high >= low):
            return low, high
    raise ConfigError(f"{key}={text!r}: expected N, N-M (N <= M) or N+ steps, e.g. 3, 3-4 or 5+")


def check_model_name(name: str, what: str) -> None:
    """A registered model's name that MLflow's search filters can express (`name = '...'` has no
    escape for a single quote); ConfigError otherwise, before anything is created under it."""
    if "'" in name or not name.strip():
        raise ConfigError(f"{what}: {name!r} cannot be a registered model's name: MLflow's search filters cannot "
                          "express an empty name or one with a single quote ('); choose another")
