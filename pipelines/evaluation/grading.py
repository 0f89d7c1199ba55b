"""`grpoflow grade`: grade JSONL completions from any system against gold answers.

Each input line is a JSON object with `completion` (a string or a chat message list) and
either `gold` (the answer, e.g. "277") or a GSM8K-style `answer` (a reference solution ending
in `#### N`, or in `A: N` as in GSM8K's published model samples). Every row is written back,
with all its fields, plus `extracted` (the answer found in the completion, or null) and
`correct`; the output file appears atomically, only when every row is well-formed. The
accuracy is printed with its 95% Wilson interval. Answers are extracted and compared by
components/problems/gsm8k.py, the scorer that training rewards and evaluation use.

    grpoflow grade --input completions.jsonl --output graded.jsonl --mode flexible

A malformed row stops the command before anything is written: `FILE:LINE: reason` on
stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from components.common.errors import InputError
from components.common.files import write_jsonl
from components.evaluation.stats import wilson_interval
from components.problems import gsm8k
from components.training.rewards import completion_text

MAX_REPORTED = 20  # malformed rows listed in the error message


class GradeError(InputError):
    """The input cannot be graded; the message names FILE:LINE and the field."""


def _row_gold(row: dict[str, Any]) -> tuple[str | None, str | None]:
    """(gold, None) or (None, reason the row has no usable gold answer)."""
    gold = row.get("gold")
    if gold is not None:
        if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
            return None, f"field 'gold': expected a string or a number, got {type(gold).__name__}"
        gold = gold if isinstance(gold, str) else repr(gold)
        if not gold.strip():
            return None, "field 'gold' is empty"
        return gold.strip(), None
    if "answer" in row:
        answer = row["answer"]
        if not isinstance(answer, str):
            return None, f"field 'answer': expected a string, got {type(answer).__name__}"
        found = gsm8k.gold_from_answer(answer)
        if found is None:
            return None, "field 'answer': no final answer ('#### N' line, 'A: N' last line or a number)"
        return found, None
    return None, "missing field 'gold' (or a GSM8K-style 'answer')"


def _completion(row: dict[str, Any]) -> tuple[str | None, str | None]:
    if "completion" not in row:
        return None, "missing field 'completion'"
    c = row["completion"]
    if isinstance(c, str):
        return c, None
    if isinstance(c, list) and all(isinstance(m, dict) for m in c):
        return completion_text(c), None
    return None, f"field 'completion': expected a string or a list of chat messages, got {type(c).__name__}"


def read_rows(path: Path) -> list[tuple[dict[str, Any], str, str]]:
    """(row, completion text, gold) per non-blank line; GradeError listing every malformed line."""
    if not path.is_file():
        raise GradeError(f"{path}: file not found")
    rows: list[tuple[dict[str, Any], str, str]] = []
    errors: list[str] = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                errors.append(f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                errors.append(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})")
                continue
            if not isinstance(row, dict):
                errors.append(f"{where}: expected a JSON object, got {type(row).__name__}")
                continue
            text, reason = _completion(row)
            gold, gold_reason = _row_gold(row)
            reason = reason or gold_reason
            if reason:
                errors.append(f"{where}: {reason}")
                continue
            rows.append((row, text, gold))
    if errors:
        more = (
            f"\n... and {len(errors) - MAX_REPORTED} more malformed rows"
            if len(errors) > MAX_REPORTED
            else ""
        )
        raise GradeError("\n".join(errors[:MAX_REPORTED]) + more)
    if not rows:
        raise GradeError(f"{path}: no rows to grade")
    return rows


def grade_file(
    input_path: str | os.PathLike, output_path: str | os.PathLike, mode: str = "flexible"
) -> dict[str, Any]:
    """Grade every row of `input_path` into `output_path`; returns the summary."""
    if mode not in gsm8k.MODES:
        raise GradeError(f"mode {mode!r}: expected one of {', '.join(gsm8k.MODES)}")
    rows = read_rows(Path(input_path))
    graded = []
    for row, text, gold in rows:
        extracted = gsm8k.extract_answer(text, mode)
        graded.append({**row, "extracted": extracted, "correct": gsm8k.answers_match(extracted, gold)})
    write_jsonl(output_path, graded)
    n = len(graded)
    k = sum(r["correct"] for r in graded)
    low, high = wilson_interval(k, n, 0.95)
    return {
        "mode": mode,
        "n": n,
        "correct": k,
        "accuracy": k / n,
        "ci95": [low, high],
        "no_answer": sum(r["extracted"] is None for r in graded),
        "output": str(output_path),
    }


def format_grades(s: dict[str, Any]) -> str:
    """One line for the terminal.

    >>> format_grades({"mode": "flexible", "n": 4, "correct": 3, "accuracy": 0.75, "ci95": [0.3, 0.95],
    ...                 "no_answer": 1, "output": "g.jsonl"})
    'accuracy 0.7500 (3/4), 95% CI [0.3000, 0.9500] (Wilson); mode flexible; 1 without an answer; wrote g.jsonl'
    """
    low, high = s["ci95"]
    return (
        f"accuracy {s['accuracy']:.4f} ({s['correct']}/{s['n']}), 95% CI [{low:.4f}, {high:.4f}] (Wilson); "
        f"mode {s['mode']}; {s['no_answer']} without an answer; wrote {s['output']}"
    )


def cli_grade(args: argparse.Namespace) -> int:
    """Handler of `grpoflow grade` (args: input, output, mode)."""
    print(format_grades(grade_file(args.input, args.output, args.mode)))
    return 0
