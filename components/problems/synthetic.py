"""The synthetic source: seeded GSM8K-style word problems for the embedded, offline default.

Each problem has 1 to `data.synthetic_max_steps` arithmetic steps on small integers (starting and
bought amounts up to `data.synthetic_max_number`), templated text and an answer in
GSM8K's own format (reasoning lines with `<<a+b=c>>` calculator annotations, then `#### N`),
so it flows through the same validation as real GSM8K rows. The same seed gives the same
problems; train, test and the answer-only GRPO problems draw from derived seeds and never share
a question. Each split has its own band of steps (the answer-only problems a harder one).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from components.common.errors import DataError
from components.problems.sources import Record, normalize_question

# Synthetic GSM8K-style problems. Numbers stay small so that a tiny model can learn the
# arithmetic; each step is written the GSM8K way, with a calculator annotation.
_NAMES = ["Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ivy", "Jack", "Kim", "Leo", "Mia", "Noah"]
_ITEMS = ["apples", "books", "coins", "pens", "cards", "eggs", "shells", "stickers", "marbles", "cookies"]


def _step(a: int, op: str, b: int) -> tuple[int, str]:
    c = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
    return c, f"{a} {op} {b} = <<{a}{op}{b}={c}>>{c}"


def synthetic_problem(
    rng: random.Random, max_steps: int = 3, max_number: int = 20, min_steps: int = 1
) -> dict[str, str]:
    """One seeded word problem with a GSM8K-format answer (`min_steps` to `max_steps` steps).

    `max_number` bounds the starting amount and the amounts bought: with the defaults
    (3, 20) this draws exactly the stream it always drew; smaller values make easier problems.

    >>> p = synthetic_problem(random.Random(0), max_steps=1, max_number=5)
    >>> p["answer"].count("\\n")  # one step line, then the final answer
    1
    """
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    steps = rng.choice(list(range(min_steps, max_steps + 1)))
    a = rng.randint(2, max_number)
    question = [f"{name} has {a} {item}."]
    lines = []
    total = a
    for s in range(steps):
        kind = rng.choice(["buy", "lose", "times", "share"] if s else ["buy", "lose", "times"])
        if kind == "buy":
            b = rng.randint(1, max_number)
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


def iter_synthetic(
    n: int, seed: int, split: str, exclude: set[str], max_steps: int = 3, max_number: int = 20, min_steps: int = 1,
    top_band: int = 0,
) -> Iterator[Record]:
    """`n` distinct problems (none of them in `exclude`) of `min_steps` to `max_steps` steps as
    (where, default id, record), then `top_band` more of exactly `max_steps` steps from the same stream
    (the first `n` are the problems a run without them makes)."""
    rng = random.Random(f"{seed}:{split}")
    seen = set(exclude)
    made, attempts, total = 0, 0, n + top_band
    while made < total:
        attempts += 1
        if attempts > 50 * total + 1000:
            raise DataError(f"synthetic:{split}: could only make {made} distinct problems of {total} requested")
        obj = synthetic_problem(rng, max_steps, max_number, min_steps if made < n else max_steps)
        key = normalize_question(obj["question"])
        if key in seen:
            continue
        seen.add(key)
        made += 1
        yield f"synthetic:{split}:{made}", f"{split}-{made}", obj
