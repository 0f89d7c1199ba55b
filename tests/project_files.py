"""The project's own files in a checkout: what git tracks, less what a pipeline run writes there and its user
may commit (the README's `make demo` stages some of it: DVC's autostage). The run's files follow from
dvc.yaml as DVC reads it: dvc.lock, each stage's outs, metrics and plots, and the .gitignore files DVC writes
beside its cached outs (a .gitignore holding anything else is the project's).

The file list (tests/test_layout.py), the guide's copy of the project (tests/test_development.py) and the
docs' paths (tests/test_docs.py) read these, so that they check the same files on a fresh clone, after
`make demo` and after its run is committed (tests/slow/test_committed_run.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def tracked_files(root: Path) -> set[str] | None:
    """`git ls-files` of the checkout at `root` (None where it is not a git checkout)."""
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True)
    return set(filter(None, proc.stdout.split("\0"))) if proc.returncode == 0 else None


def run_outputs(root: Path) -> set[str]:
    """The paths a run of the checkout's dvc.yaml writes, relative to `root` (a folder out stands for what it
    holds): dvc.lock, the stages' outs, metrics and plots, and the .gitignore DVC writes beside a cached out."""
    from dvc.repo import Repo

    paths, ignores = {"dvc.lock"}, {}
    with Repo(str(root)) as repo:
        for stage in repo.index.stages:
            for out in stage.outs:
                path = Path(os.path.relpath(out.fs_path, repo.root_dir))
                paths.add(path.as_posix())
                if out.use_cache:  # DVC keeps it out of git: `/name` in the .gitignore of its folder
                    ignores.setdefault(path.parent / ".gitignore", set()).add(f"/{path.name}")
    for gitignore, entries in ignores.items():
        try:
            lines = {line.strip() for line in (root / gitignore).read_text().splitlines()} - {""}
        except OSError:
            continue
        if lines <= entries:
            paths.add(gitignore.as_posix())
    return paths


def project_files(root: Path) -> set[str] | None:
    """The files of the project at `root`: tracked, and not written by a run (None where it is not a git
    checkout)."""
    tracked = tracked_files(root)
    if tracked is None:
        return None
    written = run_outputs(root)
    return {f for f in tracked if not any(f == p or f.startswith(f"{p}/") for p in written)}
