"""Where GSM8K-style problems come from, read and validated the same way for every stage.

Source strings (params `data.train_source`, `data.test_source`, `evaluate.data`):
  jsonl:PATH         GSM8K's native lines {"question": ..., "answer": "...\\n#### 72"} (an optional
                     `id` is kept), or rows already prepared by the data stage
  hf:NAME[:CONFIG]   a Hugging Face dataset (e.g. hf:openai/gsm8k:main), or a local dataset folder
                     (files loadable by `datasets.load_dataset`, or `save_to_disk` output)

    records(source, split)     (where, default id, record or DataError) per row, for a caller that
                               reports every bad row (the data stage, evaluation)
    convert_row(record, id)    one validated {id, question, solution, gold} row
    load_problems(source)      every row of a source, validated; bad rows fail naming FILE:LINE
    read_split(path)           rows of a prepared split (the data stage's train.jsonl / test.jsonl)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components.common.errors import DataError, InputError
from components.common.files import JSONLineError, iter_jsonl
from components.problems.gsm8k import count_calculator, normalize_number, split_gsm8k_answer

MAX_REPORTED = 10  # bad rows printed in full; the rest are counted
Record = tuple[str, str, Any]  # (where, default id, record or DataError)


def convert_row(obj: Any, default_id: str) -> dict[str, str]:
    """Validate one GSM8K-style record and turn it into {id, question, solution, gold}.

    Raises DataError with the reason (the caller adds where the row came from).

    `steps` is the problem's number of reasoning steps (`count_steps`), or a prepared row's own
    `steps` (its solution has lost the annotations that counted them).

    >>> convert_row({"question": "Q?", "answer": "2 + 2 = <<2+2=4>>4\\n#### 4"}, "train-1")
    {'id': 'train-1', 'question': 'Q?', 'solution': '2 + 2 = 4', 'gold': '4', 'steps': 1}
    """
    if not isinstance(obj, dict):
        raise DataError(f"expected a JSON object, got {type(obj).__name__}")
    for key in ("question", "answer"):
        if key not in obj or obj[key] is None:
            raise DataError(f"field '{key}' is missing")
        if not isinstance(obj[key], str):
            raise DataError(f"field '{key}' must be a string, got {type(obj[key]).__name__}")
        if not obj[key].strip():
            raise DataError(f"field '{key}' is empty")
    try:
        solution, final = split_gsm8k_answer(obj["answer"])
    except ValueError:
        raise DataError("field 'answer' has no '#### <number>' final answer") from None
    gold = normalize_number(final)
    if gold is None:
        raise DataError(f"field 'answer': final answer {final[:40]!r} is not a number")
    row_id = obj.get("id")
    row_id = str(row_id) if row_id not in (None, "") else default_id
    if "steps" in obj:
        steps = obj["steps"]
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
            raise DataError(f"field 'steps' must be a non-negative integer or null, got {steps!r}")
    else:
        steps = count_steps(obj["answer"])
    return {"id": row_id, "question": obj["question"].strip(), "solution": solution, "gold": gold, "steps": steps}


def count_steps(answer: str) -> int | None:
    """A GSM8K-format answer's number of reasoning steps: its `<<...>>` calculator annotations, or
    where it has none its reasoning lines before `####`; None for an answer-only one (unbanded).

    >>> count_steps("48/2 = <<48/2=24>>24 clips\\n48+24 = <<48+24=72>>72\\n#### 72")
    2
    >>> count_steps("Half of 48 is 24.\\nSo 72 in all.\\n#### 72"), count_steps("#### 72")
    (2, None)
    """
    annotations = count_calculator(answer)
    if annotations:
        return annotations
    lines = [line for line in answer[: answer.rfind("####")].splitlines() if line.strip()]
    return len(lines) or None


def normalize_question(text: str) -> str:
    """Case- and whitespace-insensitive key used for the overlap check and de-duplication.

    >>> normalize_question("  How many\\tApples?  ")
    'how many apples?'
    """
    return re.sub(r"\s+", " ", text).strip().lower()


# --------------------------------------------------------------------------- sources


def jsonl_records(path: Path, split: str) -> Iterator[Record]:
    if not path.is_file():
        raise DataError(f"{path}: file not found (from source jsonl:{path})")
    for lineno, obj in iter_jsonl(path):
        if isinstance(obj, JSONLineError):
            obj = DataError(str(obj))
        yield f"{path}:{lineno}", f"{split}-{lineno}", obj


def hf_records(spec: str, split: str) -> Iterator[Record]:
    """Rows of `hf:NAME[:CONFIG]`'s `split`, from the hub or a local dataset folder."""
    name, _, config = spec.partition(":")
    import datasets  # heavy; only this source needs it

    local = Path(name)
    if local.is_dir() and ((local / "dataset_dict.json").exists() or (local / "state.json").exists()):
        ds = datasets.load_from_disk(str(local))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"hf:{spec}: no split '{split}' (has {', '.join(ds)})")
            ds = ds[split]
    else:
        try:
            ds = datasets.load_dataset(name, config or None, split=split)
        except Exception as exc:  # hub unreachable, unknown name/config/split
            raise DataError(
                f"hf:{spec}: could not load split '{split}' ({type(exc).__name__}: {str(exc)[:300]}); "
                "without hub access use jsonl:PATH or a local dataset folder"
            ) from None
    for i, obj in enumerate(ds, start=1):
        yield f"hf:{spec}[{split}]:{i}", f"{split}-{i}", obj


def records(source: str, split: str) -> Iterator[Record]:
    """Raw records of a `jsonl:` or `hf:` source."""
    if source.startswith("jsonl:") and source[len("jsonl:") :]:
        return jsonl_records(Path(source[len("jsonl:") :]), split)
    if source.startswith("hf:") and source[len("hf:") :]:
        return hf_records(source[len("hf:") :], split)
    raise DataError(f"data source {source!r}: expected jsonl:PATH or hf:NAME[:CONFIG]")


def bad_rows_message(what: str, bad: list[str], hint: str = "") -> str:
    """`N bad row(s) in WHAT:` and the first MAX_REPORTED of them, one per line."""
    shown = "\n".join(f"  {b}" for b in bad[:MAX_REPORTED])
    more = f"\n  ... and {len(bad) - MAX_REPORTED} more" if len(bad) > MAX_REPORTED else ""
    return f"{len(bad)} bad row(s) in {what}:\n{shown}{more}" + (f"\n{hint}" if hint else "")


# --------------------------------------------------------------------------- whole sources


def _as_gsm8k_record(obj: Any) -> Any:
    """A prepared row ({id, question, solution, gold}) as a GSM8K-native one for convert_row."""
    if isinstance(obj, dict) and "answer" not in obj and "gold" in obj:
        gold = obj.get("gold")
        if not isinstance(gold, str) or not gold.strip():
            raise DataError("field 'gold' must be a non-empty string")
        solution = obj.get("solution") or ""
        if not isinstance(solution, str):
            raise DataError(f"field 'solution' must be a string, got {type(solution).__name__}")
        return {**obj, "answer": f"{solution}\n#### {gold}"}
    return obj


def load_problems(source: str, limit: int = 0, split: str = "test") -> list[dict[str, str]]:
    """Validated {id, question, solution, gold, answer} rows (GSM8K-native or prepared rows);
    any bad row fails naming file, line and field; ids must be unique (items pair by id)."""
    rows, bad = [], []
    for where, default_id, obj in records(source, split):
        if limit and len(rows) >= limit:
            break
        try:
            if isinstance(obj, DataError):
                raise obj
            record = _as_gsm8k_record(obj)
            row = convert_row(record, default_id)
        except DataError as exc:
            bad.append(f"{where}: {exc}")
            continue
        row["answer"] = record["answer"]  # GSM8K's full answer text, the lm-eval few-shot target
        rows.append(row)
    if bad:
        raise DataError(bad_rows_message(source, bad))
    if not rows:
        raise DataError(f"{source}: no problems")
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataError(f"{source}: id {dup!r} appears more than once; items are paired by id")
    return rows


def problems_sha256(problems: list[dict[str, str]]) -> str:
    """sha256 over the problems' id, question and gold, in order: which items an evaluation scored.

    >>> problems_sha256([{"id": "t-1", "question": "1 + 1?", "gold": "2"}])[:12]
    'a61cdd5028cd'
    """
    h = hashlib.sha256()
    for p in problems:
        h.update(json.dumps([p["id"], p["question"], p["gold"]], ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def read_split(path: str | os.PathLike, limit: int | None = None) -> list[dict[str, str]]:
    """Rows {id, question, solution, gold} of a prepared split; a bad line names FILE:LINE."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: data split not found; run `dvc repro data` first")
    rows = []
    for lineno, row in iter_jsonl(p):
        if limit is not None and len(rows) >= limit:
            break
        if isinstance(row, JSONLineError) or not (
            isinstance(row, dict) and all(isinstance(row.get(k), str) for k in ("question", "solution", "gold"))
        ):
            why = row if isinstance(row, JSONLineError) else "needs string fields question, solution, gold"
            raise InputError(f"{p}:{lineno}: bad row ({why})")
        rows.append(row)
    if not rows:
        raise InputError(f"{p}: no rows")
    return rows
