"""Stage `data`: build the versioned, validated train and test splits.

Sources (params `data.train_source` / `data.test_source`):
  synthetic          a seeded generator of GSM8K-style word problems (components/problems/synthetic.py)
  jsonl:PATH         GSM8K's native lines {"question": ..., "answer": "...\\n#### 72"}
  hf:NAME[:CONFIG]   a Hugging Face dataset (e.g. hf:openai/gsm8k:main), or a local dataset
                     folder (files loadable by `datasets.load_dataset`, or `save_to_disk` output)

Writes `<data.output_dir>/train.jsonl` (the demonstrations SFT imitates), `grpo.jsonl` (the
problems GRPO trains on) and `test.jsonl`, one {"id", "question", "solution", "gold"} object per
line, and `stats.json` (counts, dropped rows with reasons, sha256 of each output).

GRPO's reward needs only the final answer, so its problems can be answer-only (`solution` ""):
`data.answer_only_share` withholds the solution of that share of the train rows (any source), and
`data.synthetic_answer_only_size` draws new synthetic problems from a harder band of steps
(`data.synthetic_answer_only_min_steps`..`max_steps`; `data.synthetic_test_max_steps` makes the
test split span both bands). SFT never sees them. With neither, `grpo.jsonl` holds the
demonstrations' questions (answers only), as GRPO trained before. Outputs appear atomically: a failed run
leaves the previous folder untouched.

    python -m components.data
    python -m components.data -S data.train_source=jsonl:gsm8k/train.jsonl \\
                              -S data.test_source=jsonl:gsm8k/test.jsonl -S data.output_dir=out
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common.entry import stage_main
from components.common.errors import ConfigError, DataError
from components.common.files import jsonl_bytes, replace_dir
from components.common.params import DataParams, Params
from components.problems.bands import by_steps
from components.problems.sources import (
    MAX_REPORTED,
    Record,
    bad_rows_message,
    convert_row,
    normalize_question,
    records,
)
from components.problems.synthetic import iter_synthetic

STAGE = "data"


@dataclass
class SplitResult:
    rows: list[dict[str, str]]
    origins: list[str]  # where each kept row came from, for overlap messages
    bad: list[str] = field(default_factory=list)  # "WHERE: reason"


def collect(rows: Iterable[Record]) -> SplitResult:
    """Validate (where, default_id, record-or-DataError) triples into a SplitResult."""
    result = SplitResult(rows=[], origins=[])
    for where, default_id, obj in rows:
        try:
            if isinstance(obj, DataError):
                raise obj
            result.rows.append(convert_row(obj, default_id))
            result.origins.append(where)
        except DataError as exc:
            result.bad.append(f"{where}: {exc}")
    return result


def load_split(source: str, split: str, cfg: DataParams, exclude: set[str] = frozenset()) -> SplitResult:
    if source == "synthetic":
        n = cfg.synthetic_train_size if split == "train" else cfg.synthetic_test_size
        steps = (cfg.synthetic_test_max_steps if split == "test" and cfg.synthetic_test_max_steps
                 else cfg.synthetic_max_steps)
        top = cfg.synthetic_test_top_band_size if split == "test" else 0
        return collect(iter_synthetic(n, cfg.seed, split, exclude, steps, cfg.synthetic_max_number, top_band=top))
    if source.startswith(("jsonl:", "hf:")):
        return collect(records(source, split))
    raise ConfigError(f"data source {source!r}: expected synthetic, jsonl:PATH or hf:NAME[:CONFIG]")


def find_overlap(train: SplitResult, test: SplitResult) -> list[str]:
    test_keys: dict[str, str] = {}
    for row, where in zip(test.rows, test.origins, strict=True):
        test_keys.setdefault(normalize_question(row["question"]), where)
    return [
        f"{where}: question also in the test split at {test_keys[key]}"
        for row, where in zip(train.rows, train.origins, strict=True)
        if (key := normalize_question(row["question"])) in test_keys
    ]


def answer_only(row: dict[str, str]) -> dict[str, str]:
    """A problem with its solution withheld: GRPO's reward needs only the final answer.

    >>> answer_only({"id": "train-1", "question": "Q?", "solution": "2 + 2 = 4", "gold": "4"})
    {'id': 'train-1', 'question': 'Q?', 'solution': '', 'gold': '4'}
    """
    return {**row, "solution": ""}


def split_bands(train: list[dict], cfg: DataParams) -> tuple[list[dict], list[dict], int]:
    """(demonstration candidates, answer-only problems, rows outside both bands) by step count:
    rows of at least `data.answer_only_min_steps` steps (and rows without steps) lose their solution,
    rows of more than `data.demo_max_steps` steps are no demonstrations (0 turns either rule off).

    >>> rows = [{"id": str(s), "solution": "s", "steps": s} for s in (1, 2, 3, 4, None)]
    >>> cfg = DataParams(demo_max_steps=2, answer_only_min_steps=4)
    >>> demos, problems, left = split_bands(rows, cfg)
    >>> [r["id"] for r in demos], [(r["id"], r["solution"]) for r in problems], left
    (['1', '2'], [('4', ''), ('None', '')], 1)
    """
    demos, problems, left = [], [], 0
    for row in train:
        steps = row.get("steps")
        if cfg.answer_only_min_steps and (steps is None or steps >= cfg.answer_only_min_steps):
            problems.append(answer_only(row))
        elif cfg.demo_max_steps and (steps is None or steps > cfg.demo_max_steps):
            left += 1
        else:
            demos.append(row)
    return demos, problems, left


def split_answer_only(train: list[dict[str, str]], cfg: DataParams, exclude: set[str]) -> tuple[list, list, int]:
    """(demonstrations, answer-only problems, rows outside the bands): the step bands first
    (`split_bands`), then `data.answer_only_share` of the remaining rows, drawn with `data.seed`, lose
    their solution and move to the GRPO split; `data.synthetic_answer_only_size` new synthetic problems
    of the harder band join them (none of them in `exclude`). With none of these the answer-only list is
    empty, and the caller gives GRPO the demonstrations' questions with their answers only."""
    train, problems, left = split_bands(train, cfg)
    rng = random.Random(f"{cfg.seed}:answer-only")
    withheld = set(rng.sample(range(len(train)), round(cfg.answer_only_share * len(train))))
    demos = [r for i, r in enumerate(train) if i not in withheld]
    problems += [answer_only(r) for i, r in enumerate(train) if i in withheld]
    if cfg.synthetic_answer_only_size and cfg.train_source == "synthetic":  # like every synthetic_* key
        seen = exclude | {normalize_question(r["question"]) for r in train + problems}
        made = collect(iter_synthetic(
            cfg.synthetic_answer_only_size, cfg.seed, "answer-only", seen, cfg.synthetic_answer_only_max_steps,
            cfg.synthetic_max_number, cfg.synthetic_answer_only_min_steps,
        ))
        problems += [answer_only(r) for r in made.rows]
    if not demos:
        raise DataError(
            f"no demonstrations left for SFT (data.demo_max_steps={cfg.demo_max_steps}, data.answer_only_min_steps="
            f"{cfg.answer_only_min_steps}, data.answer_only_share={cfg.answer_only_share}); "
            "widen the demonstrations' band"
        )
    return demos, problems, left


def step_counts(rows: list[dict]) -> dict[str, int]:
    """Rows per step count, in order.

    >>> step_counts([{"steps": 2}, {"steps": 1}, {"steps": None}, {"steps": 2}])
    {'1': 1, '2': 2, 'unbanded': 1}
    """
    return {key: len(group) for key, group in by_steps(rows).items()}


def write_splits(cfg: DataParams) -> dict[str, Any]:
    """Load, validate and write both splits; returns the stats written to stats.json."""
    test = load_split(cfg.test_source, "test", cfg)
    exclude = {normalize_question(r["question"]) for r in test.rows} if cfg.train_source == "synthetic" else set()
    train = load_split(cfg.train_source, "train", cfg, exclude=exclude)

    for split, res in (("train", train), ("test", test)):
        if res.bad and cfg.on_bad_rows == "fail":
            raise DataError(
                bad_rows_message(
                    f"the {split} source", res.bad,
                    "(set data.on_bad_rows=skip to drop them and count them in stats.json)",
                )
            )
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

    train.rows, answer_only_rows, outside = split_answer_only(train.rows, cfg, exclude)
    grpo_rows = answer_only_rows or [answer_only(r) for r in train.rows]
    files = {"train.jsonl": jsonl_bytes(train.rows), "grpo.jsonl": jsonl_bytes(grpo_rows),
             "test.jsonl": jsonl_bytes(test.rows)}
    stats: dict[str, Any] = {
        "sources": {"train": cfg.train_source, "test": cfg.test_source},
        "counts": {"train": len(train.rows), "test": len(test.rows)},
        # GRPO's problems: answer-only ones beside the demonstrations, or the demonstrations' questions
        "grpo": {"count": len(grpo_rows), "answer_only": bool(answer_only_rows)},
        # rows per step count (components/problems/bands.py): what each band holds
        "steps": {name: step_counts(rows) for name, rows in
                  (("train", train.rows), ("grpo", grpo_rows), ("test", test.rows))},
        "outside_bands": outside,  # train rows above data.demo_max_steps and below data.answer_only_min_steps
        "dropped": {
            split: {"count": len(res.bad), "rows": res.bad[:1000]}
            for split, res in (("train", train), ("test", test))
        },
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    }
    files["stats.json"] = (json.dumps(stats, indent=2) + "\n").encode("utf-8")

    def write(tmp: Path) -> None:
        for name, data in files.items():
            (tmp / name).write_bytes(data)

    replace_dir(cfg.output_dir, write)
    return stats


def run(params: Params) -> dict[str, Any]:
    """The stage inside its MLflow run: counts as metrics, stats.json as an artifact."""
    import mlflow

    from components.common.tracking import stage_run

    with stage_run(STAGE, params):
        stats = write_splits(params.data)
        mlflow.log_metrics(
            {
                "train_rows": stats["counts"]["train"],
                "test_rows": stats["counts"]["test"],
                "dropped_train": stats["dropped"]["train"]["count"],
                "dropped_test": stats["dropped"]["test"]["count"],
            }
        )
        mlflow.log_dict(stats, "stats.json")
    c, d = stats["counts"], stats["dropped"]
    print(
        f"data: wrote {c['train']} train (demonstrations), {stats['grpo']['count']} GRPO "
        f"({'answer-only' if stats['grpo']['answer_only'] else 'the demonstrations questions'}) "
        f"and {c['test']} test rows "
        f"to {params.data.output_dir} "
        f"(dropped {d['train']['count']} train, {d['test']['count']} test)"
    )
    print("data: problems per number of steps: " + "; ".join(
        f"{split} " + " ".join(f"{k}:{n}" for k, n in counts.items()) for split, counts in stats["steps"].items()
    ) + (f"; {stats['outside_bands']} train rows outside both bands left out" if stats["outside_bands"] else ""))
    return stats


def main(argv: list[str] | None = None) -> int:
    return stage_main(STAGE, __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
