"""Stage `prepare`: build the versioned, validated train and test splits.

Sources (params `data.train_source` / `data.test_source`):
  synthetic          a seeded generator of GSM8K-style word problems (1 to 3 arithmetic steps),
                     solutions in GSM8K's own format ending in `#### N`
  jsonl:PATH         GSM8K's native lines {"question": ..., "answer": "...\\n#### 72"}
  hf:NAME[:CONFIG]   a Hugging Face dataset (e.g. hf:openai/gsm8k:main), or a local dataset
                     folder (files loadable by `datasets.load_dataset`, or `save_to_disk` output)

Writes `<data.output_dir>/train.jsonl` and `test.jsonl`, one {"id", "question", "solution",
"gold"} object per line, and `stats.json` (counts, dropped rows with reasons, sha256 of each
output). Outputs appear atomically: a failed run leaves the previous folder untouched.

    python -m components.data
    python -m components.data -S data.train_source=jsonl:gsm8k/train.jsonl \\
                              -S data.test_source=jsonl:gsm8k/test.jsonl -S data.output_dir=out
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.atomic import replace_dir
from components.config import ConfigError, DataConfig, add_params_args, load_params
from components.gsm8k import normalize_number, split_gsm8k_answer

MAX_REPORTED = 10  # bad rows printed in full; the rest are counted


class DataError(ValueError):
    """Bad input data; the message names the file, the line and the field."""


@dataclass
class BadRow:
    where: str  # "FILE:LINE" or "hf:NAME[split]:ROW"
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


@dataclass
class SplitResult:
    rows: list[dict[str, str]]
    origins: list[str]  # where each kept row came from, for overlap messages
    bad: list[BadRow] = field(default_factory=list)


# --------------------------------------------------------------------------- row validation


def convert_row(obj: Any, default_id: str) -> dict[str, str]:
    """Validate one GSM8K-style record and turn it into {id, question, solution, gold}.

    Raises DataError with the reason (the caller adds where the row came from).

    >>> convert_row({"question": "Q?", "answer": "2 + 2 = <<2+2=4>>4\\n#### 4"}, "train-1")
    {'id': 'train-1', 'question': 'Q?', 'solution': '2 + 2 = 4', 'gold': '4'}
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
    return {"id": row_id, "question": obj["question"].strip(), "solution": solution, "gold": gold}


def collect(records: Iterable[tuple[str, str, Any]]) -> SplitResult:
    """Validate (where, default_id, record-or-DataError) triples into a SplitResult."""
    result = SplitResult(rows=[], origins=[])
    for where, default_id, obj in records:
        if isinstance(obj, DataError):
            result.bad.append(BadRow(where, str(obj)))
            continue
        try:
            result.rows.append(convert_row(obj, default_id))
            result.origins.append(where)
        except DataError as exc:
            result.bad.append(BadRow(where, str(exc)))
    return result


# --------------------------------------------------------------------------- sources


def iter_jsonl(path: Path, split: str) -> Iterator[tuple[str, str, Any]]:
    if not path.is_file():
        raise DataError(f"{path}: file not found (from source jsonl:{path})")
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, f"{split}-{lineno}", DataError(f"invalid JSON ({exc.msg} at column {exc.colno})")
                continue
            yield where, f"{split}-{lineno}", obj


def iter_hf(spec: str, split: str) -> Iterator[tuple[str, str, Any]]:
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


# Synthetic GSM8K-style problems. Numbers stay small so that a tiny model can learn the
# arithmetic; each step is written the GSM8K way, with a calculator annotation.
_NAMES = ["Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ivy", "Jack", "Kim", "Leo", "Mia", "Noah"]
_ITEMS = ["apples", "books", "coins", "pens", "cards", "eggs", "shells", "stickers", "marbles", "cookies"]


def _step(a: int, op: str, b: int) -> tuple[int, str]:
    c = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
    return c, f"{a} {op} {b} = <<{a}{op}{b}={c}>>{c}"


def synthetic_problem(rng: random.Random) -> dict[str, str]:
    """One seeded word problem with a GSM8K-format answer (1 to 3 steps)."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    steps = rng.choice([1, 2, 3])
    a = rng.randint(2, 20)
    question = [f"{name} has {a} {item}."]
    lines = []
    total = a
    for s in range(steps):
        kind = rng.choice(["buy", "lose", "times", "share"] if s else ["buy", "lose", "times"])
        if kind == "buy":
            b = rng.randint(1, 20)
            question.append(f"{name} buys {b} more {item}.")
            total, text = _step(total, "+", b)
            lines.append(f"After buying, {name} has {text} {item}.")
        elif kind == "lose" and total > 1:
            b = rng.randint(1, total - 1)
            question.append(f"{name} gives away {b} {item}.")
            total, text = _step(total, "-", b)
            lines.append(f"After giving some away, {name} has {text} {item}.")
        elif kind == "share" and total > 1:
            divisors = [d for d in range(2, 7) if total % d == 0]
            if not divisors:
                b = rng.randint(1, 9)
                question.append(f"{name} finds {b} more {item}.")
                total, text = _step(total, "+", b)
                lines.append(f"After finding more, {name} has {text} {item}.")
                continue
            b = rng.choice(divisors)
            question.append(f"{name} splits the {item} equally into {b} bags and keeps one bag.")
            total, text = _step(total, "/", b)
            lines.append(f"One bag holds {text} {item}.")
        else:
            b = rng.randint(2, 4) if total <= 50 else 2
            question.append(f"Then the number of {item} {name} has grows {b} times.")
            total, text = _step(total, "*", b)
            lines.append(f"Now {name} has {text} {item}.")
    question.append(f"How many {item} does {name} have now?")
    return {"question": " ".join(question), "answer": "\n".join(lines) + f"\n#### {total}"}


def iter_synthetic(n: int, seed: int, split: str, exclude: set[str]) -> Iterator[tuple[str, str, Any]]:
    rng = random.Random(f"{seed}:{split}")
    seen = set(exclude)
    made, attempts = 0, 0
    while made < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise DataError(f"synthetic:{split}: could only make {made} distinct problems of {n} requested")
        obj = synthetic_problem(rng)
        key = normalize_question(obj["question"])
        if key in seen:
            continue
        seen.add(key)
        made += 1
        yield f"synthetic:{split}:{made}", f"{split}-{made}", obj


def load_split(source: str, split: str, cfg: DataConfig, exclude: set[str] = frozenset()) -> SplitResult:
    if source == "synthetic":
        n = cfg.synthetic_train_size if split == "train" else cfg.synthetic_test_size
        return collect(iter_synthetic(n, cfg.seed, split, exclude))
    if source.startswith("jsonl:"):
        return collect(iter_jsonl(Path(source[len("jsonl:") :]), split))
    if source.startswith("hf:"):
        return collect(iter_hf(source[len("hf:") :], split))
    raise ConfigError(f"data source {source!r}: expected synthetic, jsonl:PATH or hf:NAME[:CONFIG]")


# --------------------------------------------------------------------------- checks and output


def normalize_question(text: str) -> str:
    """Case- and whitespace-insensitive key used for the overlap check.

    >>> normalize_question("  How many\\tApples?  ")
    'how many apples?'
    """
    return re.sub(r"\s+", " ", text).strip().lower()


def find_overlap(train: SplitResult, test: SplitResult) -> list[str]:
    test_keys: dict[str, str] = {}
    for row, where in zip(test.rows, test.origins, strict=True):
        test_keys.setdefault(normalize_question(row["question"]), where)
    return [
        f"{where}: question also in the test split at {test_keys[key]}"
        for row, where in zip(train.rows, train.origins, strict=True)
        if (key := normalize_question(row["question"])) in test_keys
    ]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_dir_atomically(out_dir: Path, files: dict[str, bytes]) -> None:
    """Write `files` into a temp sibling of out_dir, then swap it into place.

    A crash before the swap leaves out_dir as it was; readers never see a half-written set.
    """

    def write(tmp: Path) -> None:
        for name, data in files.items():
            (tmp / name).write_bytes(data)

    replace_dir(out_dir, write)


def _jsonl_bytes(rows: list[dict[str, str]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def _bad_rows_message(split: str, bad: list[BadRow]) -> str:
    shown = "\n".join(f"  {b}" for b in bad[:MAX_REPORTED])
    more = f"\n  ... and {len(bad) - MAX_REPORTED} more" if len(bad) > MAX_REPORTED else ""
    return (
        f"{len(bad)} bad row(s) in the {split} source:\n{shown}{more}\n"
        "(set data.on_bad_rows=skip to drop them and count them in stats.json)"
    )


def run(cfg: DataConfig) -> dict[str, Any]:
    """Load, validate and write both splits; returns the stats written to stats.json."""
    test = load_split(cfg.test_source, "test", cfg)
    exclude = {normalize_question(r["question"]) for r in test.rows} if cfg.train_source == "synthetic" else set()
    train = load_split(cfg.train_source, "train", cfg, exclude=exclude)

    for split, res in (("train", train), ("test", test)):
        if res.bad and cfg.on_bad_rows == "fail":
            raise DataError(_bad_rows_message(split, res.bad))
        if not res.rows:
            raise DataError(f"the {split} source ({getattr(cfg, split + '_source')}) has no valid rows")
    if not cfg.allow_overlap:
        overlap = find_overlap(train, test)
        if overlap:
            shown = "\n".join(f"  {o}" for o in overlap[:MAX_REPORTED])
            raise DataError(
                f"{len(overlap)} train question(s) also appear in the test split:\n{shown}\n"
                "(set data.allow_overlap=true to accept this)"
            )
    if cfg.max_train_rows:
        train.rows = train.rows[: cfg.max_train_rows]
    if cfg.max_test_rows:
        test.rows = test.rows[: cfg.max_test_rows]

    files = {"train.jsonl": _jsonl_bytes(train.rows), "test.jsonl": _jsonl_bytes(test.rows)}
    stats: dict[str, Any] = {
        "sources": {"train": cfg.train_source, "test": cfg.test_source},
        "counts": {"train": len(train.rows), "test": len(test.rows)},
        "dropped": {
            split: {"count": len(res.bad), "rows": [str(b) for b in res.bad[:1000]]}
            for split, res in (("train", train), ("test", test))
        },
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    }
    files["stats.json"] = (json.dumps(stats, indent=2) + "\n").encode("utf-8")
    write_dir_atomically(Path(cfg.output_dir), files)
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.data",
        description="Stage prepare: validate GSM8K-style data and write data/processed/{train,test}.jsonl "
        "and stats.json atomically.",
    )
    add_params_args(parser)
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params, args.overrides)
        stats = _run_tracked(params)
    except (ConfigError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    c, d = stats["counts"], stats["dropped"]
    print(
        f"prepare: wrote {c['train']} train and {c['test']} test rows to {params.data.output_dir} "
        f"(dropped {d['train']['count']} train, {d['test']['count']} test)"
    )
    return 0


def _run_tracked(params) -> dict[str, Any]:
    """Run the stage inside an MLflow child run when tracking is available."""
    try:
        from components.tracking import stage_run
    except ImportError:  # tracking not installed in a minimal container
        return run(params.data)
    with stage_run("prepare", params) as mlrun:
        stats = run(params.data)
        if mlrun is not None:
            import mlflow

            mlflow.log_metrics(
                {
                    "train_rows": stats["counts"]["train"],
                    "test_rows": stats["counts"]["test"],
                    "dropped_train": stats["dropped"]["train"]["count"],
                    "dropped_test": stats["dropped"]["test"]["count"],
                }
            )
            mlflow.log_dict(stats, "stats.json")
    return stats


if __name__ == "__main__":
    sys.exit(main())
