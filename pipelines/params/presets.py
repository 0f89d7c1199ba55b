"""Presets: named, documented sets of params overrides for real models, `presets/<NAME>.yaml`.

`grpoflow run --preset NAME` turns the file's `params:` mapping into `section.key=value` overrides
and writes them into params.yaml as `-S` does (so DVC sees them); `-S` given with it comes after
and wins. A preset file holds `description`, `memory` (measured, or marked as an estimate) and
`params` (the same layout as params.yaml; a nested mapping sets only the keys it names).

    python -m pipelines.params.presets                       # list the presets
    python -m pipelines.params.presets smollm2-135m-cpu      # the overrides a preset applies
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from components.common.errors import ConfigError

PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"
KEYS = ("description", "memory", "params")


def names(folder: Path = PRESETS_DIR) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def override_list(mapping: dict[str, Any], prefix: str = "") -> list[str]:
    """`section.key=value` overrides of a nested params mapping; the values as YAML (flow style).

    >>> override_list({"model": {"name_or_path": "gguf:x.gguf"},
    ...                "sft": {"trainer": {"max_steps": 4}, "lora": {"target_modules": ["q_proj"]}}})
    ['model.name_or_path=gguf:x.gguf', 'sft.trainer.max_steps=4', 'sft.lora.target_modules=[q_proj]']
    """
    out = []
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += override_list(value, f"{path}.")
        else:
            out.append(f"{path}=" + yaml.safe_dump(value, default_flow_style=True, width=10**6)
                       .strip().removesuffix("...").strip())
    return out


def read(name: str, folder: Path = PRESETS_DIR) -> dict[str, Any]:
    """The preset file as a mapping; an unknown name or a malformed file is a ConfigError naming it."""
    path = folder / f"{name}.yaml"
    if "/" in name or not path.is_file():
        raise ConfigError(f"--preset {name!r}: no such preset; known: {', '.join(names(folder))} (files in {folder})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
        raise ConfigError(f"{path}: expected a mapping with a `params:` mapping of params.yaml sections")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; a preset has {', '.join(KEYS)}")
    return data


def overrides(name: str, folder: Path = PRESETS_DIR) -> list[str]:
    """The preset's `section.key=value` overrides, in file order."""
    return override_list(read(name, folder)["params"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv:
            for name in names():
                print(f"{name}: {read(name)['description']}")
            return 0
        print("\n".join(f"-S {o}" for o in overrides(argv[0])))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
