"""The spec of `grpoflow sweep` (docs/sweep.md): a YAML file, or `-S key=a,b,c` for a quick grid, read
into a `SweepSpec` and checked against params.yaml before anything runs. A bad field is one ConfigError
naming it (exit 2).

    parameters:                        # dotted params keys, as -S writes them
      grpo.trainer.beta: [0.0, 0.1]                                   # a list
      grpo.trainer.learning_rate: {low: 1.0e-5, high: 1.0e-4, log: true}   # a (log-uniform) range
    method: grid                       # grid | random | tpe
    seeds: {key: data.seed, values: [1234, 2024]}   # each configuration runs once per seed
    trials: 8                          # most trial runs (configurations x seeds)
    parallel: 2                        # trials at once on this machine
    metric: target.accuracy_checked    # of the dev evaluation; maximized
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from components.common.errors import ConfigError
from components.common.params_load import load_params, parse_override
from pipelines.params.presets import override_list

KEYS = ("name", "parameters", "method", "seeds", "trials", "parallel", "metric", "dev_size", "overrides", "seed",
        "pruning")
METHODS = ("grid", "random", "tpe")
METRICS = ("accuracy_checked", "accuracy_flexible", "accuracy_strict", "format_rate")
TRAINER_SECTIONS = ("sft.trainer", "grpo.trainer")  # TRL's configs: keys params.yaml leaves out are TRL's to check


@dataclass(frozen=True)
class Parameter:
    key: str
    values: tuple[Any, ...] = ()  # a list; else the range low..high
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False


@dataclass(frozen=True)
class SweepSpec:
    name: str
    parameters: tuple[Parameter, ...]
    method: str = "grid"
    seed_key: str = "data.seed"
    seeds: tuple[Any, ...] = ()  # () = one trial per configuration, at params.yaml's seed
    trials: int = 0  # 0 = every grid point
    parallel: int = 1
    metric: str = "target.accuracy_checked"
    dev_size: int = 32  # grpo.dev_size of every trial: the dev split
    overrides: tuple[str, ...] = ()  # -S of every trial
    seed: int = 0  # of the random and TPE samplers

    @property
    def per_config(self) -> int:
        return max(len(self.seeds), 1)

    @property
    def configurations(self) -> int:
        """How many configurations the sweep tries."""
        if self.method == "grid":
            size = len(list(itertools.product(*(p.values for p in self.parameters))))
            return min(size, self.trials // self.per_config) if self.trials else size
        return self.trials // self.per_config


def parse_inline(texts: list[str]) -> tuple[list[Parameter], list[str]]:
    """`-S` values: `key=a,b,c` (a comma outside brackets) is a grid parameter, any other a fixed override.

    >>> ps, fixed = parse_inline(["grpo.trainer.beta=0,0.1", "rewards.funcs=[a,b]", "grpo.trainer.max_steps=4"])
    >>> [(p.key, p.values) for p in ps], fixed
    ([('grpo.trainer.beta', (0, 0.1))], ['rewards.funcs=[a,b]', 'grpo.trainer.max_steps=4'])
    """
    parameters, fixed = [], []
    for text in texts:
        key, _, value = text.partition("=")
        if value.strip().startswith(("[", "{")) or "," not in value:
            fixed.append(text)
            continue
        parameters.append(Parameter(key.strip(), tuple(yaml.safe_load(v) for v in value.split(","))))
    return parameters, fixed


def _parameter(key: str, raw: Any) -> Parameter:
    field = f"parameters.{key}"
    if isinstance(raw, list):
        raw = {"values": raw}
    if not isinstance(raw, dict) or not set(raw) <= {"values", "low", "high", "log"}:
        raise ConfigError(f"{field}: expected a list of values or a range {{low, high[, log: true]}}, got {raw!r}")
    if "values" in raw:
        if not isinstance(raw["values"], list) or not raw["values"]:
            raise ConfigError(f"{field}: empty list of values; give at least one")
        return Parameter(key, tuple(raw["values"]))
    low, high, log = raw.get("low"), raw.get("high"), raw.get("log", False)
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in (low, high)):
        raise ConfigError(f"{field}: a range needs numbers low and high, got low={low!r} high={high!r}")
    if low >= high:
        raise ConfigError(f"{field}: empty range low={low} high={high}; low must be below high")
    if log is not False and (log is not True or low <= 0):
        raise ConfigError(f"{field}: log: true needs low > 0 (log-uniform), got low={low} log={log!r}")
    return Parameter(key, (), low, high, log, isinstance(low, int) and isinstance(high, int))


def _seeds(raw: Any, params: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    if raw is None or raw == 1:
        return "data.seed", ()
    key, values = "data.seed", raw
    if isinstance(raw, dict):
        if set(raw) - {"key", "values"}:
            raise ConfigError(f"seeds: expected {{key, values}}, got keys {sorted(raw)}")
        key, values = raw.get("key", key), raw.get("values")
    if isinstance(values, int) and not isinstance(values, bool) and values > 0:
        start = lookup(params, key)
        values = [start + i for i in range(values)] if isinstance(start, int) else values
    if not isinstance(values, list) or not values or not all(isinstance(v, int) for v in values):
        raise ConfigError(f"seeds: expected a count or a non-empty list of integer seeds, got {values!r}")
    if len(set(values)) != len(values):
        raise ConfigError(f"seeds: {values} repeats a seed")
    return key, tuple(values)


def lookup(params: dict[str, Any], key: str) -> Any:
    """The value of a dotted key in the params mapping; KeyError when a part is missing."""
    node: Any = params
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def _check_type(field: str, current: Any, value: Any) -> None:
    def kind(v: Any) -> str:
        return "bool" if isinstance(v, bool) else "number" if isinstance(v, int | float) else type(v).__name__

    if current is None or value is None:
        return
    if kind(current) != kind(value) or (isinstance(current, int) and not isinstance(current, bool)
                                        and isinstance(value, float) and not value.is_integer()):
        expected = "an integer" if isinstance(current, int) and not isinstance(current, bool) else f"a {kind(current)}"
        raise ConfigError(f"{field}: {value!r} does not match params.yaml, where the key is {expected} "
                          f"({current!r})")


def check(spec: SweepSpec, params_file: Path | None) -> None:
    """Every parameter and seed key exists in params.yaml (TRL's trainer keys: in TRL's config) with values of
    its type, and every value loads (the params' own checks); a ConfigError naming the field otherwise."""
    base = load_params(params_file, list(spec.overrides)).to_dict()
    for p in spec.parameters:
        field = f"parameters.{p.key}"
        try:
            current = lookup(base, p.key)
        except KeyError:
            if not p.key.startswith(tuple(f"{s}." for s in TRAINER_SECTIONS)):
                raise ConfigError(f"{field}: unknown key (not in params.yaml; `python -m pipelines.params.config` "
                                  "lists every key)") from None
            current = None
        if not p.values and (isinstance(current, bool) or not isinstance(current, int | float | type(None))):
            raise ConfigError(f"{field}: a range needs a number key; params.yaml has {current!r}: give a list")
        if p.integer is False and not p.values and isinstance(current, int) and not isinstance(current, bool):
            raise ConfigError(f"{field}: the key is an integer; give integer low and high")
        for value in p.values or (p.low, p.high):
            _check_type(field, current, value)
            try:
                load_params(params_file, [*spec.overrides, *override_list({p.key: value})])
            except ConfigError as exc:
                raise ConfigError(f"{field}: {exc}") from None
    if spec.seeds:
        try:
            _check_type(f"seeds.{spec.seed_key}", lookup(base, spec.seed_key), spec.seeds[0])
        except KeyError:
            raise ConfigError(f"seeds.key: {spec.seed_key}: unknown key (not in params.yaml)") from None


def read_spec(path: str | None, inline: list[str], params_file: Path | None, trials: int | None = None,
              parallel: int | None = None) -> SweepSpec:
    """The spec file (or none) with the inline `-S` grid parameters and fixed overrides merged in, checked."""
    raw: dict[str, Any] = {}
    if path:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot be read as YAML ({getattr(exc, 'strerror', None) or exc})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping with `parameters:`")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key of a sweep spec; known: {', '.join(KEYS)}")
    inline_params, fixed = parse_inline(inline)
    for text in fixed:
        parse_override(text)  # a malformed -S fails here, naming it
    parameters = [_parameter(k, v) for k, v in (raw.get("parameters") or {}).items()]
    parameters = [p for p in parameters if p.key not in {q.key for q in inline_params}] + inline_params
    if not parameters:
        raise ConfigError("parameters: nothing to sweep; give a spec's parameters or -S key=a,b,c")
    method = raw.get("method", "grid")
    if method not in METHODS:
        raise ConfigError(f"method: {method!r}; expected one of {', '.join(METHODS)}")
    if method == "grid" and any(not p.values for p in parameters):
        raise ConfigError(f"parameters.{next(p.key for p in parameters if not p.values)}: a grid needs a list of "
                          "values, not a range (or method: random / tpe)")
    base = load_params(params_file, fixed).to_dict()
    seed_key, seeds = _seeds(raw.get("seeds"), base)
    spec = SweepSpec(
        name=str(raw.get("name") or (Path(path).stem if path else "inline")), parameters=tuple(parameters),
        method=method, seed_key=seed_key, seeds=seeds, trials=_count("trials", trials or raw.get("trials", 0), 0),
        parallel=_count("parallel", parallel or raw.get("parallel", 1), 1),
        metric=_metric(raw.get("metric"), base), dev_size=_count("dev_size", raw.get("dev_size", 32), 1),
        overrides=tuple([*(raw.get("overrides") or []), *fixed]), seed=_count("seed", raw.get("seed", 0), 0),
    )
    if raw.get("pruning") not in (None, "none"):
        raise ConfigError(f"pruning: {raw['pruning']!r}: not supported yet (trials run to their end); remove it")
    if method != "grid" and not spec.trials:
        raise ConfigError(f"trials: method {method} needs a number of trials")
    if spec.trials and spec.configurations < 1:
        raise ConfigError(f"trials: {spec.trials} is fewer than one configuration's {spec.per_config} seeds")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if spec.parallel > cores:
        raise ConfigError(f"parallel: {spec.parallel} trials would share {cores} cores; give at most {cores}")
    check(spec, params_file)
    return spec


def _count(field: str, value: Any, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ConfigError(f"{field}: expected an integer >= {least}, got {value!r}")
    return value


def _metric(raw: Any, base: dict[str, Any]) -> str:
    if isinstance(raw, dict):
        if raw.get("goal", "maximize") != "maximize" or set(raw) - {"name", "goal"}:
            raise ConfigError(f"metric: expected a name (maximized), got {raw!r}")
        raw = raw.get("name")
    band = base["evaluate"]["target_band"]
    name = raw or ("target.accuracy_checked" if band else "accuracy_checked")
    slice_, _, metric = name.rpartition(".")
    if metric not in METRICS or slice_ not in ("", "target", "in_band") or (slice_ and not band):
        raise ConfigError(f"metric: {name!r}; expected [target.|in_band.]{{{','.join(METRICS)}}} "
                          "(target. and in_band. need evaluate.target_band)")
    return name
