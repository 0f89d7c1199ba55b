"""components/common/files.py: atomic outputs leave the previous output intact on failure, JSONL errors
name the file and line, hashes are stable."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.common.errors import InputError
from components.common.files import (
    read_jsonl,
    replace_dir,
    sha256_tree,
    tree_digest,
    write_bytes,
    write_files,
)


def test_replace_dir_keeps_the_old_folder_on_failure(tmp_path):
    out = tmp_path / "models" / "sft"
    replace_dir(out, lambda d: (d / "a.txt").write_text("old"))

    def broken(d: Path) -> None:
        (d / "a.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        replace_dir(out, broken)
    assert (out / "a.txt").read_text() == "old"
    assert sorted(p.name for p in out.parent.iterdir()) == ["sft"]  # no temp folders left
    replace_dir(out, lambda d: (d / "b.txt").write_text("new"))
    assert sorted(p.name for p in out.iterdir()) == [".grpoflow-output", "b.txt"]


def test_write_bytes_and_write_files_leave_old_content_on_failure(tmp_path, monkeypatch):
    import os

    target = write_bytes(tmp_path / "r" / "a.json", b"old")
    write_files(tmp_path / "r", {"a.json": b"A1", "b.json": b"B1"})
    assert (tmp_path / "r" / "a.json").read_bytes() == b"A1" and target.stat().st_mode & 0o777 == 0o644

    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        write_files(tmp_path / "r", {"a.json": b"A2", "b.json": b"B2"})
    with pytest.raises(OSError):
        write_bytes(tmp_path / "r" / "a.json", b"A3")
    monkeypatch.undo()
    assert (tmp_path / "r" / "a.json").read_bytes() == b"A1" and (tmp_path / "r" / "b.json").read_bytes() == b"B1"
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["a.json", "b.json"]  # no temp files left


def test_read_jsonl_names_file_and_line(tmp_path):
    f = tmp_path / "rows.jsonl"
    f.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(InputError, match=r"rows\.jsonl:3: invalid JSON"):
        read_jsonl(f)
    with pytest.raises(InputError, match=r"missing\.jsonl: rows file not found"):
        read_jsonl(tmp_path / "missing.jsonl", what="rows file")


def test_sha256_tree_and_tree_digest(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("a")
    got = sha256_tree(tmp_path / "d")
    assert got == {"d/a.txt": "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"}
    one = tree_digest([tmp_path / "d"])
    (tmp_path / "d" / "a.txt").write_text("b")
    assert tree_digest([tmp_path / "d"]) != one


def test_replace_dir_never_replaces_a_folder_it_does_not_own(tmp_path):
    """A params path pointed at a user's folder: the folder and its files stay, the stage fails clearly."""
    user = tmp_path / "notes"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    with pytest.raises(InputError, match=r"notes holds files grpoflow did not write \(thesis\.tex\)"):
        replace_dir(user, lambda d: (d / "model.safetensors").write_text("w"))
    assert (user / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]
    # Its own output (marked), an empty folder, or one holding only what is rewritten: replaced.
    out = replace_dir(tmp_path / "out", lambda d: (d / "a.txt").write_text("1"))
    replace_dir(out, lambda d: (d / "b.txt").write_text("2"))
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["b.txt"]
    restored = tmp_path / "restored"  # e.g. `dvc pull` of the data stage's files, no marker
    restored.mkdir()
    (restored / "train.jsonl").write_text("old")
    replace_dir(restored, lambda d: (d / "train.jsonl").write_text("new"))
    assert (restored / "train.jsonl").read_text() == "new"
