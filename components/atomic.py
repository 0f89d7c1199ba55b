"""Atomic outputs shared by every stage: a reader never sees a half-written file or folder,
and a failure leaves the previous output exactly as it was.

    replace_dir(out_dir, write)   call write(tmp) on a temporary sibling folder, then swap it in
    write_bytes(path, data)       write a temporary sibling file, then rename it over path
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def replace_dir(out_dir: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Call `write(tmp)` on a temporary sibling folder, then move it to `out_dir`.

    A failure inside `write` leaves an existing `out_dir` untouched; the swap itself is two
    renames on the same file system.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; an output folder is an ordinary folder
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            old.rmdir()
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to a temporary sibling of `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
