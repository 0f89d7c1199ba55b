"""git for the flow and its commands: the checkout's commit and dirty state, the files that differ from
the commit, and a clean working copy of a commit (what `grpoflow stage` and `grpoflow reproduce` run
in). The one place grpoflow calls git.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from components.common.errors import GrpoflowError

IMAGE_COMMIT_ENV = "GRPOFLOW_GIT_COMMIT"  # set in the images by infra/Dockerfile
# What an image without .git holds of the checkout, copied into a working copy.
IMAGE_CODE = ("components", "pipelines", "dvc.yaml", ".dvcignore", ".dvc/config", ".dvc/config.local", "pyproject.toml")


class WorkingCopyError(GrpoflowError):
    """A working copy of a commit could not be made (unknown commit, image of another commit, folder in use)."""


def git(args: list[str], cwd: str | os.PathLike) -> str:
    """`git ARGS` in `cwd`; its stdout, or a GrpoflowError naming the command and git's message."""
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise GrpoflowError(f"git {' '.join(args)} in {cwd}: {proc.stderr.strip()[:400]}")
    return proc.stdout


def git_state(root: str | os.PathLike) -> dict[str, str]:
    """{'git_commit': sha or 'unknown', 'git_dirty': 'true'|'false'|'unknown'} of the checkout."""
    try:
        sha = git(["rev-parse", "HEAD"], root).strip()
        status = git(["status", "--porcelain", "--untracked-files=no"], root)
    except (OSError, GrpoflowError):
        return {"git_commit": "unknown", "git_dirty": "unknown"}
    return {"git_commit": sha, "git_dirty": "true" if status.strip() else "false"}


def head_commit(root: str | os.PathLike) -> str:
    """The checkout's commit (a GrpoflowError outside a git checkout)."""
    return git(["rev-parse", "HEAD"], root).strip()


def changed_files(root: str | os.PathLike, *excluded: str) -> list[str]:
    """Tracked files that differ from the commit, but `excluded` paths."""
    out = git(["status", "--porcelain", "--untracked-files=no", "--", ".", *(f":!{p}" for p in excluded)], root)
    return [line[3:] for line in out.split("\n") if line.strip()]


def has_commit(root: str | os.PathLike, commit: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root,
                          capture_output=True).returncode == 0


@contextlib.contextmanager
def own_workdir(workdir: str | os.PathLike | None, prefix: str, keep: bool) -> Iterator[Path]:
    """The folder a working copy goes in, and afterwards (unless `keep`) the removal of what was made
    there, and only that. None: a new temporary path (missing, for `git clone` to make), removed after.
    A folder given: missing (made here) or empty, else refused before anything is written or removed;
    the working copy goes in a folder this run makes inside it (exclusively: one already there is refused),
    `DIR/<prefix without its dash>`, which alone is
    removed afterwards, then DIR too when it was made here and nothing else is in it: a file someone
    put in DIR meanwhile stays, and so does DIR."""
    if workdir is None:
        work = Path(tempfile.mkdtemp(prefix=prefix))
        work.rmdir()  # git clone makes it
        try:
            yield work
        finally:
            if not keep:
                shutil.rmtree(work, ignore_errors=True)
        return
    given = Path(workdir)
    if given.exists() and not (given.is_dir() and not any(given.iterdir())):
        raise WorkingCopyError(f"{given} is not empty; give a new folder")
    made = not given.exists()
    try:
        given.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where a parent folder should be, no permission
        raise WorkingCopyError(f"{given}: cannot make this folder ({exc.strerror}); give a new folder") from None
    work = given / prefix.rstrip("-")
    try:  # made here and now, exclusively: the one folder this run owns and removes (git clone fills it)
        work.mkdir()
    except OSError as exc:
        raise WorkingCopyError(f"{work}: cannot make this folder ({exc.strerror}); give a new folder") from None
    try:
        yield work
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
            if made:
                with contextlib.suppress(OSError):  # not empty: someone put something there; theirs, kept
                    given.rmdir()


def working_copy(source: Path, commit: str, workdir: Path) -> None:
    """The code at `commit` in `workdir` (missing or empty): a git clone of `source` checked out at
    `commit`, or, in an image without .git, a copy of the image's code when the image is that commit."""
    if workdir.exists() and any(workdir.iterdir()):
        raise WorkingCopyError(f"{workdir} is not empty; give a new folder")
    if (source / ".git").exists():
        if not has_commit(source, commit):
            raise WorkingCopyError(
                f"commit {commit} is not in the repository at {source}; fetch it first (e.g. `git fetch origin`)"
            )
        git(["clone", "--quiet", "--no-checkout", str(source), str(workdir)], source)
        git(["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit], workdir)
        return
    image_commit = os.environ.get(IMAGE_COMMIT_ENV, "unknown")
    if not (image_commit.startswith(commit) or commit.startswith(image_commit)) or image_commit == "unknown":
        raise WorkingCopyError(
            f"this image holds the code of commit {image_commit}, the pipeline runs {commit}: "
            "build and push the image of that commit (infra/build.sh) and redeploy"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    for rel in IMAGE_CODE:
        src = source / rel
        if src.is_dir():
            shutil.copytree(src, workdir / rel, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, workdir / rel)
