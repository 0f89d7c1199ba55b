"""Flow-only params code: the `-S` writer that puts a run's overrides into params.yaml (as
`dvc exp run -S` does, so that DVC sees them), and the allow-list of keys a run started through a
deployment (remotely) may override. Used by `grpoflow run` (pipelines/flow/pipeline.py) and tests; no
stage imports it, so neither is a stage's dvc.yaml dep.
"""

from __future__ import annotations

import fnmatch
import io
import os
import typing
from pathlib import Path

from components.common.errors import ConfigError
from components.common.files import write_text
from components.common.params import MOVED_KEYS
from components.common.params_load import apply_override, load_params, parse_override


def yaml_float(value: float) -> str:
    """A float as YAML 1.1 readers (PyYAML, DVC) read it back as a float: an exponent needs a dot
    in the mantissa (`5e-05` is a string to them).

    >>> [yaml_float(x) for x in (5e-05, 1e-4, 0.5, 3.0, 1e20, float("inf"), float("nan"))]
    ['5.0e-05', '0.0001', '0.5', '3.0', '1.0e+20', '.inf', '.nan']
    """
    if value != value:
        return ".nan"
    if value in (float("inf"), float("-inf")):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text


def write_overrides(path: str | os.PathLike, overrides: typing.Iterable[str]) -> None:
    """Write `section.key=value` overrides into the params file, as `dvc exp run -S` does, so that
    DVC sees them; comments, quoting and layout of the file are kept (ruamel round trip). All
    overrides are validated first: a rejected one leaves the file as it was."""
    overrides = list(overrides)
    if not overrides:
        return
    from ruamel.yaml import YAML

    from components.training.rewards import check_reward_names

    path = Path(path)
    params = load_params(path if path.exists() else None, overrides)  # validate all before writing any
    check_reward_names(params.rewards)  # a reward the grpo stage could not load fails now, not hours in
    yaml_rt = YAML()
    yaml_rt.preserve_quotes = True
    yaml_rt.width = 4096
    yaml_rt.representer.add_representer(
        type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    yaml_rt.representer.add_representer(
        float, lambda r, v: r.represent_scalar("tag:yaml.org,2002:float", yaml_float(v))
    )
    data = yaml_rt.load(path.read_text()) if path.exists() else None
    if data is None:
        data = {}
    for text in overrides:
        apply_override(data, text)
    buf = io.StringIO()
    yaml_rt.dump(data, buf)
    write_text(path, buf.getvalue())
    print(f"{path.name} updated: {', '.join(overrides)}", flush=True)


# The keys a run started through a deployment (remotely, e.g. from the Prefect UI) may override.
# Left out on purpose: every *_dir / *_file (paths decide what a stage writes and deletes),
# model.trust_remote_code (code from the hub), evaluate.vllm_python and evaluate.vllm_args (what
# runs), jsonl: sources (files of the worker), tracking.* (where results go), and trainer keys
# beyond training numbers (TRL's push_to_hub, hub_token, deepspeed, logging_dir, ...).
_TRAINER_NUMBERS = (
    "max_steps", "num_train_epochs", "learning_rate", "lr_scheduler_type", "warmup_steps", "warmup_ratio",
    "weight_decay", "max_grad_norm", "per_device_train_batch_size", "gradient_accumulation_steps",
    "steps_per_generation", "generation_batch_size", "max_length", "max_completion_length", "seed",
    "logging_steps", "save_steps", "save_total_limit",
)
# GRPO's recipe keys of TRL's GRPOConfig a remote run may set (use_vllm and vllm_mode pick the worker's services).
_GRPO_RECIPE_NUMBERS = ("num_generations", "temperature", "beta", "epsilon", "loss_type", "scale_rewards",
                        "num_iterations")
REMOTE_OVERRIDES = (
    "data.seed", "data.synthetic_*", "data.max_train_rows", "data.max_test_rows", "data.on_bad_rows",
    "data.answer_only_share", "data.demo_max_steps", "data.answer_only_min_steps",
    "data.train_source", "data.test_source",  # synthetic or hf:NAME only
    "model.name_or_path", "model.revision", "model.dtype", "model.seed", "model.tiny_*",
    "sft.resume", "sft.demo_*", "sft.dev_*", "sft.plateau_*", "sft.sample_size", "sft.use_lora", "sft.lora.*",
    "selection.max_candidates", "selection.num_samples", "selection.mode", "selection.keep_*",
    "selection.min_pass_rate", "selection.max_pass_rate", "selection.min_prompts", "selection.max_new_tokens",
    "selection.backend", "selection.seed",
    *(f"sft.trainer.{k}" for k in _TRAINER_NUMBERS),
    "grpo.resume", "grpo.sample_size", "grpo.dev_size", "grpo.dev_every", "grpo.use_lora", "grpo.lora.*",
    *(f"grpo.trainer.{k}" for k in (*_GRPO_RECIPE_NUMBERS, *_TRAINER_NUMBERS)),
    "rewards.funcs", "rewards.weights",  # registry names only, no package.module:function
    "evaluate.include_base", "evaluate.target_band", "evaluate.limit", "evaluate.protocol", "evaluate.backend",
    "evaluate.max_new_tokens", "evaluate.batch_size", "evaluate.dtype", "evaluate.num_samples", "evaluate.num_fewshot",
    "evaluate.fewshot_seed", "evaluate.primary_metric", "evaluate.seed", "evaluate.log_items_table",
    "register.enabled", "register.alpha", "register.min_delta", "register.min_items",
)


def check_remote_overrides(overrides: typing.Iterable[str]) -> None:
    """Reject an override a remote caller may not make (ConfigError naming the key): keys outside
    REMOTE_OVERRIDES, files as data sources, and rewards loaded from code by dotted path."""

    for text in overrides:
        section, key, value = parse_override(text)
        full = f"{section}.{key}"
        if full in MOVED_KEYS:
            raise ConfigError(f"override {text!r}: {full} is now {MOVED_KEYS[full]}; set that instead")
        if not any(fnmatch.fnmatchcase(full, pattern) for pattern in REMOTE_OVERRIDES):
            raise ConfigError(
                f"override {text!r}: {full} cannot be set by a remote run (paths, code and services are "
                "fixed by the worker's checkout); allowed keys: pipelines/params/overrides.py REMOTE_OVERRIDES"
            )
        if (full in ("data.train_source", "data.test_source")
                and not (value == "synthetic" or str(value).startswith("hf:"))):
            raise ConfigError(f"override {text!r}: a remote run reads synthetic or hf: data only, not files")
        if full == "rewards.funcs" and any(":" in str(f) for f in (value if isinstance(value, list) else [value])):
            raise ConfigError(f"override {text!r}: a remote run picks rewards by registry name, not by code path")

