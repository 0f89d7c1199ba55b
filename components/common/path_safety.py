"""Path safety: every stage path (a field with `path` metadata in components/common/params.py) inside the
repository, outside .git and .dvc, and no stage's output folder equal to, inside or around another's
or the data folder, so that no stage can replace or delete what it does not own.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from components.common.errors import ConfigError
from components.common.params import SECTIONS, Params

DATA_FOLDER = "data"  # where users keep source files beside the prepared splits
PROTECTED = (".git", ".dvc")


def _keys(role: str) -> tuple[str, ...]:
    """`section.key` of every field whose `path` metadata is `role`, in schema order."""
    return tuple(
        f"{name}.{f.name}"
        for name, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.metadata.get("path") == role
    )


# Folders the stages write (and may replace or delete), the ones they only read, the files they write.
OUTPUT_DIRS = _keys("output_dir")
INPUT_DIRS = _keys("input_dir")
OUTPUT_FILES = _keys("output_file")


def _value(params: Params, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(params, section), name)


def _is_default(params: Params, key: str) -> bool:
    section, name = key.split(".")
    return _value(params, key) == next(f.default for f in dataclasses.fields(SECTIONS[section]) if f.name == name)


def _overlap(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def check_paths(params: Params, root: str | os.PathLike) -> dict[str, Path]:
    """Every stage path inside the repository `root` (not the root itself, not in .git or .dvc), and
    no stage's output folder equal to, inside or around another's or the data folder, so that no
    stage can replace or delete what it does not own. Returns {key: resolved path}."""
    root = Path(root).resolve()
    resolved: dict[str, Path] = {}
    for key in OUTPUT_DIRS + INPUT_DIRS + OUTPUT_FILES:
        value = _value(params, key)
        p = (root / value).resolve()  # an absolute value stays itself
        if p == root:
            raise ConfigError(f"{key}: {value!r} is the repository root {root}; give the stage a folder of its own")
        if root not in p.parents:
            raise ConfigError(
                f"{key}: {value!r} resolves to {p}, outside the repository {root}; stage paths live inside it"
            )
        for protected in PROTECTED:
            if _overlap(p, root / protected):
                raise ConfigError(f"{key}: {value!r} is inside {protected}, which belongs to {protected.strip('.')}")
        resolved[key] = p
    data_folder = root / DATA_FOLDER
    for i, key in enumerate(OUTPUT_DIRS):
        others = {k: resolved[k] for k in OUTPUT_DIRS[i + 1 :]}
        if key != "data.output_dir":
            others["the data folder"] = data_folder
        for other, q in others.items():
            if _overlap(resolved[key], q):
                # Name the key the user changed (it differs from its default) first.
                subject, obj = (other, key) if other in resolved and _is_default(params, key) else (key, other)
                raise ConfigError(
                    f"{subject}: {_value(params, subject)!r} ({resolved[subject]}) overlaps {obj} "
                    f"({resolved.get(obj, data_folder)}); a stage output needs a folder of its own, neither "
                    "inside nor around another stage's output or the data folder"
                )
    return resolved

