"""What the SFT and GRPO stages share: TRL arguments and LoRA from
params, resuming from checkpoints, and the end of a run (train, save the model folder
atomically, log sample completions and the summary to MLflow, write the report and the per-step history CSV).

Not a stage: the training stages build their TRL arguments here and train through
components/training/job.py, which calls the rest. Under `accelerate launch`
every process runs the stage: the main process alone logs to MLflow and writes files.

Resuming: a stage writes its Trainer checkpoints into `<section>.checkpoint_dir` (not a DVC
output) next to a fingerprint of everything that shapes training (the stage's params, the
input model and data). A re-run with the same fingerprint resumes from the newest complete
checkpoint and logs which; a different fingerprint starts over. After the model is saved the
checkpoints are deleted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from components.common.errors import ConfigError, InputError
from components.common.files import csv_bytes, md5_file, tree_digest, write_bytes, write_json
from components.common.params import GRPOParams, Params, SFTParams
from components.common.tracking import is_timing, package_versions

log = logging.getLogger("grpoflow.finetune")

FINGERPRINT_FILE = "grpoflow_fingerprint.json"


_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


# --------------------------------------------------------------------------- TRL arguments


def device_defaults(cpu_bf16: bool = False) -> dict[str, Any]:
    """bf16 and gradient checkpointing only where they help: TRL turns both on by default, and on a
    CPU both make a small model slower. bf16 on a CPU only when asked (`cpu_bf16`: the
    `model.cpu_training_precision: auto` of a CPU with native bf16, components/training/precision.py),
    as autocast over float32 weights. Pinned memory only with an accelerator to pin it for (on a
    CPU, torch's DataLoader warns once per epoch that it has none)."""
    import torch

    gpu = torch.cuda.is_available()
    cpu_autocast = not gpu and cpu_bf16
    return {
        "bf16": bool(gpu and torch.cuda.is_bf16_supported()) or cpu_autocast,
        "gradient_checkpointing": gpu,
        "dataloader_pin_memory": gpu,
        "report_to": ["mlflow"],
        **({"use_cpu": True} if cpu_autocast else {}),  # transformers accepts bf16 without a GPU only with use_cpu
    }


def cpu_bf16(precision_param: str) -> bool:
    """Whether a CPU run trains under bf16 autocast: `model.cpu_training_precision` is auto and the CPU
    has native bf16 instructions (detected)."""
    from components.training.precision import native_bf16

    return precision_param == "auto" and native_bf16()


# Warnings known to be harmless that no setting of ours avoids, each silenced by its exact message
# and the module that issues it (never wholesale): (category, message, module). None with the locked
# versions; transformers 5.23+ deprecates `model.is_gradient_checkpointing`, which TRL 1.16 reads before
# every GRPO generation: (FutureWarning, "`is_gradient_checkpointing` is deprecated", r"transformers\.modeling_utils").
KNOWN_HARMLESS_WARNINGS: list[tuple[type[Warning], str, str]] = []


def quiet_known_warnings() -> None:
    """Silence KNOWN_HARMLESS_WARNINGS in this process (the training stages call it)."""
    for category, message, module in KNOWN_HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category, module=module)


_PLAIN_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,)}


def _coerce_trainer_values(config_cls: type, section: str, trainer: dict[str, Any]) -> dict[str, Any]:
    """Check values against the field's plain type (int, float, bool; optional or not), which TRL
    does not; YAML 1.1 reads `1e-5` as a string, so such strings become numbers where TRL wants a float.

    >>> from trl import SFTConfig
    >>> _coerce_trainer_values(SFTConfig, "sft", {"learning_rate": "1e-5", "max_steps": 3})
    {'learning_rate': 1e-05, 'max_steps': 3}
    >>> _coerce_trainer_values(SFTConfig, "sft", {"max_steps": "x"})
    Traceback (most recent call last):
    ...
    components.common.errors.ConfigError: sft.trainer.max_steps: expected int, got 'x'
    """
    hints = {
        f.name: f.type.__name__ if isinstance(f.type, type) else str(f.type).replace("typing.", "")
        for f in dataclasses.fields(config_cls)
    }
    out = {}
    for key, value in trainer.items():
        hint = hints.get(key, "")
        optional = hint.startswith("Optional[") or hint.endswith("| None")
        plain = hint.removeprefix("Optional[").removesuffix("]").removesuffix(" | None")
        if isinstance(value, str) and plain == "float":
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{section}.trainer.{key}: expected a number, got {value!r}") from None
        wanted = _PLAIN_TYPES.get(plain)
        if wanted and not (value is None and optional):
            if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
                raise ConfigError(f"{section}.trainer.{key}: expected {plain}, got {value!r}")
        out[key] = value
    return out


def build_trl_args(config_cls: type, section: str, trainer: dict[str, Any], cpu_bf16: bool = False, **stage_set: Any):
    """`config_cls(**defaults, **trainer, **stage_set)`; an unknown or bad key becomes a ConfigError
    naming `<section>.trainer.<key>`. `cpu_bf16`: see device_defaults."""
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(trainer) - known)
    if unknown:
        raise ConfigError(
            f"{section}.trainer.{unknown[0]}: not a field of trl.{config_cls.__name__} "
            f"(see `python -c 'import trl; help(trl.{config_cls.__name__})'`)"
        )
    defaults = device_defaults(cpu_bf16)
    kwargs = {**defaults, **_coerce_trainer_values(config_cls, section, trainer), **stage_set}
    try:
        return config_cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{section}.trainer: trl.{config_cls.__name__} rejected the settings: {exc}"
        ) from None


def lora_config(section: str, lora: dict[str, Any]):
    """peft.LoraConfig from the section's `lora` mapping (task_type fixed to causal LM)."""
    from peft import LoraConfig

    try:
        return LoraConfig(**{**lora, "task_type": "CAUSAL_LM"})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{section}.lora: peft.LoraConfig rejected the settings: {exc}") from None


# --------------------------------------------------------------------------- checkpoints


TRAINING_LIBRARIES = ("torch", "transformers", "trl")


def code_md5s(stage: str) -> dict[str, str]:
    """md5 of each Python file among the stage's dvc.yaml deps (the stage's code: the stage runs
    from the repo root); without a dvc.yaml, of every module of this package."""
    import yaml

    deps: list[str] = []
    if Path("dvc.yaml").is_file():
        entry = ((yaml.safe_load(Path("dvc.yaml").read_text()) or {}).get("stages") or {}).get(stage) or {}
        deps = [d for d in entry.get("deps") or [] if isinstance(d, str) and d.endswith(".py") and Path(d).is_file()]
    if not deps:
        deps = sorted(str(p) for p in Path(__file__).parents[1].rglob("*.py"))
    return {d: md5_file(d) for d in deps}


def fingerprint_fields(section: SFTParams | GRPOParams) -> dict[str, Any]:
    """A params section's values that shape training: every field but those marked
    `fingerprint=False` in components/common/params.py (paths, resume, sample_size, the GRPO monitor)."""
    return {
        f.name: getattr(section, f.name) for f in dataclasses.fields(section) if f.metadata.get("fingerprint", True)
    }


def fingerprint(stage: str, settings: dict[str, Any], inputs: Iterable[str | os.PathLike]) -> str:
    """What makes a checkpoint resumable: the training settings, the input files (model, data), the
    stage's code and the versions of the training libraries."""
    blob = json.dumps(
        {"settings": settings, "code": code_md5s(stage), "libraries": package_versions(TRAINING_LIBRARIES)},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256((blob + tree_digest(inputs)).encode()).hexdigest()


def complete_checkpoints(ckpt_dir: Path) -> list[Path]:
    """checkpoint-N folders whose trainer_state.json (written last by the Trainer) exists, by step."""
    found = []
    for p in ckpt_dir.iterdir() if ckpt_dir.is_dir() else []:
        m = _CHECKPOINT_RE.match(p.name)
        if m and p.is_dir() and (p / "trainer_state.json").is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def _owned(d: Path) -> bool:
    """A checkpoint folder grpoflow may delete: empty, or holding the stage's fingerprint marker."""
    return d.is_dir() and (not any(d.iterdir()) or (d / FINGERPRINT_FILE).is_file())


def _refuse(d: Path, stage: str) -> InputError:
    return InputError(
        f"{stage}.checkpoint_dir {d} exists and was not made by grpoflow (no {FINGERPRINT_FILE} in it); "
        f"refusing to delete it. Point {stage}.checkpoint_dir at a folder of its own."
    )


def resume_point(ckpt_dir: str | os.PathLike, fp: str, resume: bool, stage: str) -> str | None:
    """The checkpoint to resume from, or None after preparing an empty checkpoint folder."""
    d = Path(ckpt_dir)
    marker = d / FINGERPRINT_FILE
    if d.exists():
        if not _owned(d):
            raise _refuse(d, stage)
        try:
            same = json.loads(marker.read_text()).get("fingerprint") == fp
        except (OSError, ValueError, AttributeError):  # no marker, or a corrupt one: a mismatch
            same = False
        ckpts = complete_checkpoints(d)
        if resume and same and ckpts:
            step = int(_CHECKPOINT_RE.match(ckpts[-1].name).group(1))
            log.warning("%s: resuming from checkpoint %s (step %d)", stage, ckpts[-1], step)
            return str(ckpts[-1])
        if ckpts:
            why = "resume is off" if not resume else "they were made with other params, code, libraries or data"
            log.warning("%s: starting over; not resuming from the checkpoints in %s (%s)", stage, d, why)
        shutil.rmtree(d)
    d.mkdir(parents=True)
    marker.write_text(json.dumps({"stage": stage, "fingerprint": fp}) + "\n")
    return None


def clear_checkpoints(ckpt_dir: str | os.PathLike) -> None:
    """Delete the checkpoint folder once the model is saved, if it is the stage's own."""
    d = Path(ckpt_dir)
    if d.exists() and not _owned(d):
        log.warning("not deleting %s: it holds no %s, so grpoflow did not make it", d, FINGERPRINT_FILE)
        return
    shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- train, save, report


@contextlib.contextmanager
def tracked(stage: str, params: Params, args: Any, datasets: dict[str, tuple[Path, str]]) -> Iterator[None]:
    """The stage's MLflow run (tracking.stage_run) on the main process; nothing on the others
    (under `accelerate launch` every process runs the stage, one of them logs)."""
    if args.process_index == 0:
        from components.common.tracking import stage_run

        with stage_run(stage, params, datasets=datasets):
            yield
    else:
        yield


def prepare_checkpoints(
    args: Any, ckpt_dir: str | os.PathLike, fp: str, resume: bool, stage: str
) -> str | None:
    """resume_point, run by the main process first so that every process resumes from the same one."""
    with args.main_process_first(local=False, desc=f"{stage} checkpoints"):
        if args.process_index == 0:
            return resume_point(ckpt_dir, fp, resume, stage)
        ckpts = complete_checkpoints(Path(ckpt_dir))
        return str(ckpts[-1]) if resume and ckpts else None


def train_and_save(
    stage: str,
    trainer: Any,
    checkpoint: str | None,
    cfg: SFTParams | GRPOParams,
    *,
    samples: list[dict[str, str]],
    max_new_tokens: int,
    extra: dict[str, Any] | None = None,
    history_names: dict[str, str] | None = None,
    history_required: tuple[str, ...] = (),
    after_training: Callable[[], dict[str, Any]] | None = None,
    base: Any = None,
    seconds_by_part: Callable[[float], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Train (resuming from `checkpoint`), save the model folder `cfg.output_dir` atomically (with
    `cfg.use_lora`, the LoRA adapter over `base`, an adapters.BaseRef: components/models/adapters.py),
    answer the sample problems, log the summary to MLflow and
    write `cfg.metrics_file` and the per-step history `cfg.history_file` (see `history_rows`);
    returns the summary. `cfg` is the stage's params section; `after_training()`, if given, adds
    values known only once training is over (the GRPO signal monitor's); `seconds_by_part(seconds)`, if
    given, where the train call's seconds went (StepClock.report: `generation_seconds`, ...)."""
    import mlflow

    from components.models.modelio import save_model
    from components.training.train_samples import log_samples

    output_dir, ckpt_dir, lora, report = cfg.output_dir, cfg.checkpoint_dir, cfg.use_lora, Path(cfg.metrics_file)

    quiet_known_warnings()
    start = time.monotonic()
    result = trainer.train(resume_from_checkpoint=checkpoint)
    seconds = time.monotonic() - start
    accelerator = trainer.accelerator
    # Collective: gathers sharded weights (DeepSpeed ZeRO-3) onto the main process.
    state_dict = None if lora else accelerator.get_state_dict(trainer.model)
    summary: dict[str, Any] = {
        "stage": stage,
        "global_step": trainer.state.global_step,
        "train_loss": result.training_loss,
        "train_seconds": round(seconds, 1),
        **(seconds_by_part(seconds) if seconds_by_part else {}),
        "resumed_from": checkpoint,
        **(extra or {}),
        **(after_training() if after_training else {}),
    }
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        tokenizer = trainer.processing_class
        # The model folder holds no timings: the same params give a byte-identical folder (DVC's
        # hash, `grpoflow reproduce`); the report and MLflow keep them.
        provenance = {k: v for k, v in summary.items() if not is_timing(k)}
        if lora:  # the adapter, not a merged copy of the base
            from components.models.adapters import save_adapter

            save_adapter(model, tokenizer, output_dir, base, {"grpoflow_stage.json": provenance})
        else:
            save_model(model, tokenizer, output_dir, {"grpoflow_stage.json": provenance}, state_dict=state_dict)
        summary.update(log_samples(model, tokenizer, samples, f"{stage}_samples.json", max_new_tokens))
        mlflow.log_metrics({k: float(v) for k, v in summary.items() if isinstance(v, (int, float))})
        write_json(report, summary)
        rows, columns = history_rows(trainer.state.log_history, history_names, history_required)
        write_bytes(cfg.history_file, csv_bytes(rows, columns))
        clear_checkpoints(ckpt_dir)
        log.info(
            "%s: wrote %s after %d steps (%.0f s)", stage, output_dir, trainer.state.global_step, seconds
        )
    accelerator.wait_for_everyone()
    return summary


def history_rows(
    log_history: list[dict[str, Any]], names: dict[str, str] | None = None, required: tuple[str, ...] = ()
) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows, columns) of the Trainer's `state.log_history`, one row per logging step: `step` first,
    then the logged values in the order the Trainer logged them, renamed by `names`; `required`
    columns exist even if nothing logged them. A value not logged is nan (so that a plot skips it:
    DVC's plots draw an empty cell as 0). The end-of-training summary row (train_runtime, ...) and
    timings (step_time, ...) are left out: the same params give the same file.

    >>> rows, cols = history_rows([{"loss": 2.0, "rewards/f/mean": 0.5, "epoch": 0.1, "step_time": 0.3, "step": 10},
    ...                            {"train_runtime": 9.0, "train_loss": 1.5, "step": 10}],
    ...                           names={"rewards/f/mean": "f"}, required=("kl",))
    >>> cols, rows
    (['step', 'loss', 'f', 'epoch', 'kl'], [{'step': 10, 'loss': 2.0, 'f': 0.5, 'epoch': 0.1, 'kl': nan}])
    """
    names = names or {}
    logged = [
        {"step": entry.get("step"),
         **{names.get(k, k): v for k, v in entry.items() if k != "step" and not is_timing(k)}}
        for entry in log_history
        if "train_runtime" not in entry and set(entry) - {"step", "epoch"}
    ]
    columns = list(dict.fromkeys(["step", *(k for r in logged for k in r), *required]))
    return [{c: r.get(c, math.nan) for c in columns} for r in logged], columns
