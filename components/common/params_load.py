"""Loading params: params.yaml (or `--params FILE`, or $GRPOFLOW_PARAMS) read, `-S section.key=value`
overrides applied (the syntax of `dvc exp run -S`; values are parsed as YAML, so `-S grpo.trainer.beta=0.0`
is a float and `-S data.allow_overlap=true` a bool), every key checked against the schema
(components/common/params.py) and the rules (components/common/params_rules.py, each section's `check()`), and the
stage paths against the repository (components/common/path_safety.py). `load_params()` returns a `Params`; unknown
keys, wrong types and out-of-range values raise a ConfigError whose message names the key and what was expected (a
key that moved, `MOVED_KEYS`, its new name).
A key the file leaves out takes its field's default.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import typing
from pathlib import Path
from typing import Any

import yaml

from components.common.errors import ConfigError
from components.common.files import repo_root
from components.common.params import MOVED_KEYS, SECTIONS, Params
from components.common.params_rules import check_bounds, coerce
from components.common.path_safety import check_paths

DEFAULT_PARAMS = "params.yaml"
PARAMS_ENV = "GRPOFLOW_PARAMS"  # lets the flow and tests point stages at another file


def build_section(name: str, raw: Any) -> Any:
    """Validate one section's mapping and build its dataclass."""
    cls = SECTIONS[name]
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: expected a mapping of keys, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    moved = [f"{name}.{key}" for key in unknown if f"{name}.{key}" in MOVED_KEYS]
    if moved:
        new = MOVED_KEYS[moved[0]]
        raise ConfigError(f"{moved[0]}: now {new} (TRL's GRPOConfig settings are keys of grpo.trainer); "
                          f"set {new} instead")
    if unknown:
        raise ConfigError(
            f"{name}.{unknown[0]}: unknown key; known keys of '{name}': {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in raw.items():
        full = f"{name}.{key}"
        value = coerce(full, value, hints[key])
        check_bounds(full, value, fields[key].metadata)
        kwargs[key] = value
    section = cls(**kwargs)
    if hasattr(section, "check"):
        section.check()  # the section's rules across keys
    return section


def parse_override(text: str) -> tuple[str, str, Any]:
    """Split `section.key=value` into (section, key, YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    path, raw = text.split("=", 1)
    if path.count(".") < 1 or "" in path.split("."):
        raise ConfigError(f"override {text!r}: expected section.key=value")
    section, key = path.split(".", 1)
    if section not in SECTIONS:
        raise ConfigError(f"override {text!r}: unknown section '{section}'; known: {', '.join(SECTIONS)}")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc})") from None
    return section, key, value


def _default_mapping(section: str, name: str) -> dict[str, Any]:
    for f in dataclasses.fields(SECTIONS[section]):
        if f.name == name and f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            return value if isinstance(value, dict) else {}
    return {}


def params_path(path: str | os.PathLike | None = None) -> Path:
    return Path(path or os.environ.get(PARAMS_ENV) or DEFAULT_PARAMS)


def params_in(root: str | os.PathLike) -> Path | None:
    """The checkout's params.yaml, or None when it has none (the defaults then apply)."""
    path = Path(root) / DEFAULT_PARAMS
    return path if path.is_file() else None


# Parsed params files, by path and content: a process (the flow, the CLI) that loads params.yaml
# several times parses it once per content (a rewritten file is parsed again).
_PARSED: dict[tuple[str, str], Any] = {}


def _parse(p: Path) -> Any:
    text = p.read_text()
    key = (str(p.resolve()), text)
    if key not in _PARSED:
        _PARSED.clear()  # one entry: the file as it is now
        _PARSED[key] = yaml.safe_load(text)
    return copy.deepcopy(_PARSED[key])


def load_raw(path: str | os.PathLike | None = None, overrides: typing.Iterable[str] = ()) -> dict[str, Any]:
    """params.yaml as a dict with overrides applied (not yet validated)."""
    p = params_path(path)
    raw: dict[str, Any] = {}
    if p.exists():
        try:
            raw = _parse(p) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML ({exc})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: expected a mapping of sections at the top level")
    elif path is not None:
        raise ConfigError(f"{p}: params file not found")
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{p}: unknown section '{unknown[0]}'; known sections: {', '.join(SECTIONS)}")
    for text in overrides:
        apply_override(raw, text)
    return raw


def apply_override(raw: typing.MutableMapping[str, Any], text: str) -> None:
    """Set one `section.key[.sub...]=value` override in a params mapping, in place: the parser
    behind both `load_params` and the params.yaml writer. A deeper key (`sft.trainer.max_steps=10`,
    as `dvc exp run -S` takes it) sets one entry of a mapping-valued field and keeps its other
    entries; a mapping not in the file starts from the field's default."""
    section, key, value = parse_override(text)
    if raw.get(section) is None:
        raw[section] = {}
    *parents, leaf = key.split(".")
    target = raw[section]
    for depth, part in enumerate(parents):
        if target.get(part) is None:  # not in the file: start from the field's default mapping
            target[part] = _default_mapping(section, part) if depth == 0 else {}
        if not isinstance(target[part], typing.MutableMapping):
            raise ConfigError(f"override {text!r}: {section}.{'.'.join(parents[: depth + 1])} is not a mapping")
        target = target[part]
    target[leaf] = value


def load_params(
    path: str | os.PathLike | None = None, overrides: typing.Iterable[str] = (), root: str | os.PathLike | None = None
) -> Params:
    """Load, override and validate params; raises ConfigError naming the bad key. Paths are checked
    against `root` (default: the params file's folder, else the checkout of the working directory)."""
    raw = load_raw(path, overrides)
    sections = {}
    for name in SECTIONS:
        try:
            sections[name] = build_section(name, raw.get(name))
        except TypeError as exc:  # a dataclass signature problem
            raise ConfigError(f"{name}: {exc}") from None
    params = Params(**sections)
    if root is None:
        file = params_path(path)
        root = file.resolve().parent if file.is_file() else repo_root()
    check_paths(params, root)
    return params

