"""The lock files (requirements/*.lock, written by infra/lock.py) against each other and against
pyproject.toml, offline: one pin per package across the CPU, CUDA and CPU-vLLM sets, every pin inside
the project's bounds, and those bounds closed for the packages whose internals the code uses.
Whether the sets still resolve against the package index is tests/slow/test_locks.py's job."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("lock", REPO / "infra" / "lock.py")
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# The packages whose private names the code overrides, reads or patches (tests/test_private_names.py).
BOUNDED = ("trl", "transformers", "peft", "vllm")


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    return reqs + [Requirement(r) for extra in extras for r in PROJECT["optional-dependencies"][extra]]


@pytest.mark.parametrize("name", [n for n in lock.SETS if lock.SETS[n]["under"]])
def test_each_set_keeps_the_pins_it_was_resolved_under(name):
    """The CPU set holds the CUDA set's version of every package both have, and the CPU-vLLM set the
    CPU set's: every package but torch's build and the vLLM builds' own has one version everywhere."""
    found = lock.read(name)
    for under in lock.SETS[name]["under"]:
        for pkg, version in lock.read(under).items():
            assert found.get(pkg, version) == version, f"{pkg}: {version} in {under}.lock, {found[pkg]} in {name}.lock"


@pytest.mark.parametrize("name,extras", [("cpu", ("dev",)), ("cuda", ("dev", "vllm")), ("cpu-vllm", ("dev",))])
def test_each_lock_pins_the_project_requirements_inside_their_bounds(name, extras):
    pins = lock.read(name)
    for req in requirements(extras):
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        version = pins.get(lock.normalize(req.name))
        assert version, f"{name}.lock does not pin {req.name}: re-run `make lock`"
        assert req.specifier.contains(Version(version), prereleases=True), (
            f"{name}.lock pins {req.name}=={version}, outside pyproject.toml's {req}: re-run `make lock`")


@pytest.mark.parametrize("package", BOUNDED)
def test_packages_whose_internals_the_code_uses_are_bounded_below_their_next_minor(package):
    req = next(r for r in requirements(("vllm",)) if lock.normalize(r.name) == package)
    upper = [s for s in req.specifier if s.operator == "<"]
    assert upper, f"pyproject.toml: {req} has no upper bound"
    pinned = Version(lock.read("cuda")[package])
    bound = Version(upper[0].version)
    assert (bound.major, bound.minor) == (pinned.major, pinned.minor + 1) and bound.micro == 0, (
        f"pyproject.toml: {req}: bound it below the next minor release of the locked {pinned}")


def test_the_cpu_sets_are_resolved_under_the_cuda_pins():
    assert lock.SETS["cpu"]["under"] == ["cuda"] and lock.SETS["cpu-vllm"]["under"] == ["cpu"]
    assert lock.SETS["cuda"]["isolated"], "the CUDA set resolves on the index alone (no local CPU wheels)"
    for name in lock.SETS:
        head = lock.lock_path(name).read_text().splitlines()[:3]
        assert any(" ".join(lock.SETS[name]["asks"]) in line for line in head), (
            f"{name}.lock was resolved from other asks than infra/lock.py's: re-run `make lock`")
