"""Files every stage writes and reads: atomic outputs, content hashes and JSON Lines.

Atomic: a reader never sees a half-written file or folder, and a failure leaves the previous
output exactly as it was. No other module writes a temporary file and renames it.

    replace_dir(out_dir, write)         call write(tmp) on a temporary sibling folder, then swap it in
    write_bytes(path, data)             a temporary sibling file, then a rename over `path`
    write_text(path, text) / write_json(path, obj) / write_jsonl(path, rows)   the same, encoded
    write_files(out_dir, {name: bytes}) several files into a folder: nothing changes until all are written
    iter_jsonl(path) / read_jsonl(path) JSON Lines, a bad line named as FILE:LINE
    csv_bytes(rows, columns)            CSV with a header (training histories, DVC plots data)
    sha256_file, sha256_tree, md5_file, tree_digest   content hashes
    repo_root()                         the checkout a path belongs to (nearest .dvc/ or dvc.yaml)
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from components.common.errors import InputError

_CHUNK = 1 << 20

# --------------------------------------------------------------------------- atomic outputs


OUTPUT_MARKER = ".grpoflow-output"  # in every folder replace_dir writes: "this folder is ours to replace"


def _foreign_entries(out: Path, new: Path, marker: str, stage_output: bool) -> list[str]:
    """What in the existing `out` grpoflow may not replace: nothing when `out` is empty or carries the
    marker; for a stage's output also when it holds only names the new folder has too (the stage's
    declared DVC outs, restored by `dvc pull` without the marker)."""
    if not out.is_dir():
        return [out.name]  # a file where a folder should go
    names = sorted(p.name for p in out.iterdir())
    if not names or marker in names:
        return []
    return [n for n in names if not stage_output or not (new / n).exists()]


def replace_dir(out_dir: str | os.PathLike, write: Callable[[Path], object], *, marker: str = OUTPUT_MARKER,
                refusal: str = "Point the stage's output param at a folder of its own, or move those files away.",
                ) -> Path:
    """Call `write(tmp)` on a temporary sibling folder, then move it to `out_dir`.

    A failure inside `write` leaves an existing `out_dir` untouched; the swap itself is two
    renames on the same file system. The new folder carries `marker`. An existing `out_dir` is
    replaced only when it is empty or carries `marker` (a stage's output, the default marker, also
    when it holds only the names it is rewriting: its DVC outs restored by `dvc pull`); otherwise
    InputError (its message ends with `refusal`), and nothing changes.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write(tmp)
        (tmp / marker).write_text("written by grpoflow; it replaces this folder when asked to write here again\n")
        tmp.chmod(0o755)  # mkdtemp makes it private; an output folder is an ordinary folder
        old = None
        if out.exists() or out.is_symlink():
            foreign = _foreign_entries(out, tmp, marker, stage_output=marker == OUTPUT_MARKER)
            if foreign:
                shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
                raise InputError(
                    f"{out} holds files grpoflow did not write ({shown}); refusing to replace it. {refusal}"
                )
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


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def json_bytes(obj: Any) -> bytes:
    """Indented JSON with sorted keys and a final newline (stable diffs, DVC metrics files)."""
    return (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_bytes(path, json_bytes(obj))


def jsonl_bytes(rows: Iterable[Any]) -> bytes:
    """One JSON object per line, non-ASCII kept as is."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> Path:
    return write_bytes(path, jsonl_bytes(rows))


def csv_bytes(rows: Iterable[dict[str, Any]], columns: list[str] | None = None) -> bytes:
    """CSV with a header row (`columns`, default: every key in order of first appearance); a key a
    row lacks is an empty cell (DVC plots and pandas read it as missing).

    >>> print(csv_bytes([{"step": 1, "loss": 0.5}, {"step": 2, "kl": 0.01}]).decode(), end="")
    step,loss,kl
    1,0.5,
    2,,0.01
    """
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode("utf-8")


def write_files(out_dir: str | os.PathLike, files: dict[str, bytes]) -> list[Path]:
    """Write every file into a temporary folder inside `out_dir`, then rename each into place.

    Nothing in `out_dir` changes until all files are written, so a failure leaves the
    previous files as they were; other files in the folder are left alone. A name may hold a
    subfolder (`metrics/sft.json`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out))
    try:
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)
            (tmp / name).chmod(0o644)
        for name in files:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / name, out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [out / name for name in files]


# --------------------------------------------------------------------------- JSON Lines


class JSONLineError(ValueError):
    """A line of a JSONL file that is not valid JSON (yielded by iter_jsonl, not raised)."""


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for each non-empty line; a line that is not JSON gives a
    JSONLineError in place of the object, so that callers can report every bad line."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                yield lineno, JSONLineError(f"invalid JSON ({exc.msg} at column {exc.colno})")


def read_jsonl(path: str | os.PathLike, what: str = "file") -> list[Any]:
    """Every object of a JSONL file; a missing file or a bad line raises InputError naming it."""
    if not Path(path).is_file():
        raise InputError(f"{path}: {what} not found")
    rows = []
    for lineno, obj in iter_jsonl(path):
        if isinstance(obj, JSONLineError):
            raise InputError(f"{path}:{lineno}: {obj}")
        rows.append(obj)
    return rows


# --------------------------------------------------------------------------- hashes


def _update(h: Any, path: Path) -> None:
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    _update(h, Path(path))
    return h.hexdigest()


def md5_file(path: str | os.PathLike) -> str:
    h = hashlib.md5()
    _update(h, Path(path))
    return h.hexdigest()


def _files_under(p: Path) -> list[Path]:
    return [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())


def sha256_tree(path: str | os.PathLike) -> dict[str, str]:
    """sha256 of a file, or of every file under a folder, keyed by path relative to `path`'s parent."""
    p = Path(path)
    return {str(f.relative_to(p.parent)): sha256_file(f) for f in _files_under(p)}


def tree_digest(paths: Iterable[str | os.PathLike]) -> str:
    """One sha256 over the contents of files and folders (a folder: its files by relative path)."""
    h = hashlib.sha256()
    for path in paths:
        p = Path(path)
        for f in _files_under(p):
            h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
            _update(h, f)
    return h.hexdigest()


# --------------------------------------------------------------------------- the checkout


def repo_root(start: str | os.PathLike | None = None) -> Path:
    """The nearest folder at or above `start` (default: cwd) holding `.dvc` or `dvc.yaml`; else `start`."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / ".dvc").is_dir() or (folder / "dvc.yaml").is_file():
            return folder
    return here
