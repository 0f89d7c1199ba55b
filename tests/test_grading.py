"""Tests of `grpoflow grade` (pipelines/evaluation/grading.py): the round trip, malformed rows, and
agreement with correctness labels on solutions in the style of GSM8K's published model
samples (openai/grade-school-math `example_model_solutions.jsonl`: per question a
`ground_truth` and, per model, `{"is_correct", "solution"}` whose reasoning lines carry
`<<a*b=c>>` calculator annotations and end in `A: N`).

    pytest -q tests/test_grading.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from components.evaluation.stats import wilson_interval
from components.problems.gsm8k import format_target
from pipelines.cli import main as cli

DATA = Path(__file__).parent / "data" / "gsm8k_model_samples.jsonl"
MODELS = ["6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def grade(tmp_path: Path, rows, mode: str, capsys=None) -> tuple[int, list[dict] | None]:
    src = write_jsonl(tmp_path / f"in-{mode}.jsonl", rows)
    out = tmp_path / f"out-{mode}.jsonl"
    code = cli(["grade", "--input", str(src), "--output", str(out), "--mode", mode])
    return code, read_jsonl(out) if out.exists() else None


def model_sample_rows(path: Path = DATA) -> list[dict]:
    """One grade row per model solution: completion, GSM8K-style answer (`... A: N`), label."""
    rows = []
    for obj in read_jsonl(path):
        for model in MODELS:
            rows.append(
                {
                    "completion": obj[model]["solution"],
                    "answer": obj["ground_truth"],
                    "is_correct": obj[model]["is_correct"],
                    "model": model,
                }
            )
    return rows


def rewrap(solution: str) -> str:
    """The same solution in the tag format: reasoning lines, then the `A: N` value as the answer
    (a solution cut off before its `A:` line gets an empty answer)."""
    lines = solution.rstrip().split("\n")
    if lines[-1].startswith("A:"):
        return format_target("\n".join(lines[:-1]), lines[-1][2:].strip())
    return format_target(solution, "")


# --------------------------------------------------------------------------- solutions in the GSM8K model-sample style


def synthetic_model_samples(n: int, seed: int = 0) -> list[dict]:
    """`n` solutions in the published samples' style with labels known by construction: the
    final value is right or wrong on purpose, written in the forms models use (`1,000`,
    `$5`, `$5.`, `5 dollars`, `5.`, `0.5`, `.5`, `-3`, `30.00`); a few are cut off in a
    repetition loop before any `A:` line (labelled wrong, as in the published file)."""
    rng = random.Random(seed)
    items = ["apples", "eggs", "cookies", "marbles", "stickers", "pages"]
    rows = []
    for i in range(n):
        a, b, c = rng.randrange(2, 60), rng.randrange(2, 40), rng.randrange(1, 30)
        item = rng.choice(items)
        kind = rng.random()
        if kind < 0.1:  # a decimal answer
            gold_value = (a * b) / 4
            lines = [
                f"She has {a} * {b} = <<{a}*{b}={a * b}>>{a * b} {item}.",
                f"A quarter of them is {a * b} / 4 = <<{a * b}/4={gold_value}>>{gold_value} {item}.",
            ]
        elif kind < 0.15:  # a negative answer
            gold_value = c - a - b
            lines = [f"The change is {c} - {a} - {b} = <<{c}-{a}-{b}={gold_value}>>{gold_value} degrees."]
        else:
            total = a * b
            gold_value = total + c * 10 * rng.choice([1, 1, 1, 10, 100])
            lines = [
                f"He buys {a} boxes of {b} {item}, so {a} * {b} = <<{a}*{b}={total}>>{total} {item}.",
                f"Then he gets {gold_value - total} more, for {total} + {gold_value - total} = "
                f"<<{total}+{gold_value - total}={gold_value}>>{gold_value} {item}.",
            ]
        gold = (
            gold_value
            if isinstance(gold_value, int)
            else (int(gold_value) if gold_value.is_integer() else gold_value)
        )
        right = rng.random() < 0.5
        value = gold if right else gold + rng.choice([1, -1, 2, 10, 0.5, gold or 3])
        truncated = rng.random() < 0.03
        if truncated:
            loop = "".join(f"Step {k}: he counts the {item} again.\n" for k in range(3, 40))
            completion = "\n".join(lines) + "\n" + loop[: rng.randrange(20, len(loop))]
            right = False
        else:
            completion = "\n".join(lines) + "\nA: " + _written(value, rng)
        answer = "\n".join(lines) + f"\nA: {gold}"
        rows.append({"completion": completion, "answer": answer, "is_correct": right, "id": f"s{i}"})
    return rows


def _written(value, rng: random.Random) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, float):
        text = rng.choice(
            [f"{value}", f"{value:.2f}", f"{value:.2f}".lstrip("0") if 0 < value < 1 else f"{value}"]
        )
    else:
        text = rng.choice([f"{value}", f"{value:,}"])
    if value < 0:
        return text + rng.choice(["", ".", " degrees"])
    return rng.choice(["{}", "{}.", "${}", "${}.", "{} dollars", "{} items"]).format(text)


def agreement(graded: list[dict]) -> float:
    return sum(r["correct"] == r["is_correct"] for r in graded) / len(graded)


@pytest.mark.parametrize("source", ["published-style fixture", "generated"])
def test_flexible_grading_agrees_with_labels_and_strict_agrees_on_rewrapped(tmp_path, source):
    rows = model_sample_rows() if source == "published-style fixture" else synthetic_model_samples(3000)
    code, graded = grade(tmp_path, rows, "flexible")
    assert code == 0
    disagree = [r for r in graded if r["correct"] != r["is_correct"]]
    assert agreement(graded) >= 0.999, disagree[:5]

    wrapped = [{**r, "completion": rewrap(r["completion"])} for r in rows]
    code, graded = grade(tmp_path, wrapped, "strict")
    assert code == 0
    disagree = [r for r in graded if r["correct"] != r["is_correct"]]
    assert agreement(graded) >= 0.999, disagree[:5]
    if source == "published-style fixture":  # hand-checked: every row agrees
        assert not disagree


def test_the_published_style_fixture_covers_the_edge_cases():
    rows = model_sample_rows()
    finals = [r["completion"].rsplit("\n", 1)[-1] for r in rows]
    for form in [
        "A: 1,000",
        "A: $1,000",
        "A: $5.",
        "A: 4 dollars",
        "A: 277.",
        "A: -3",
        "A: 0.5",
        "A: .5",
        "A: 30.00",
        "A: 18,000",
    ]:
        assert form in finals, form
    assert any(not f.startswith("A:") for f in finals)  # a solution cut off before its answer
    assert sum(r["is_correct"] for r in rows) not in (0, len(rows))


# --------------------------------------------------------------------------- round trip


def test_grade_round_trip_keeps_fields_and_prints_the_wilson_interval(tmp_path, capsys):
    right = format_target("Mr. Curtis has 325 - 28 = 297 hens.\nOnly 297 - 20 = 277 lay eggs.", "277")
    rows = [
        {"id": "curtis-right", "completion": right, "gold": "277"},
        {"id": "curtis-wrong", "completion": right.replace("\n277\n", "\n305\n"), "gold": "277"},
        {
            "id": "gsm8k-answer",
            "completion": format_target("x", "1,000"),
            "answer": "25 * 40 = <<25*40=1000>>1000\n#### 1000",
        },
        {"id": "numeric-gold", "completion": format_target("x", "0.5"), "gold": 0.5, "extra": [1, 2]},
        {"id": "chat", "completion": [{"role": "assistant", "content": right}], "gold": "277"},
        {"id": "untagged", "completion": "The answer is 277.", "gold": "277"},
    ]
    code, graded = grade(tmp_path, rows, "strict")
    assert code == 0
    assert [r["id"] for r in graded] == [r["id"] for r in rows]
    assert [r["extracted"] for r in graded] == ["277", "305", "1,000", "0.5", "277", None]
    assert [r["correct"] for r in graded] == [True, False, True, True, True, False]
    assert graded[3]["extra"] == [1, 2] and graded[4]["completion"] == rows[4]["completion"]
    low, high = wilson_interval(4, 6)
    out = capsys.readouterr().out
    assert f"accuracy 0.6667 (4/6), 95% CI [{low:.4f}, {high:.4f}] (Wilson)" in out
    assert "1 without an answer" in out

    code, graded = grade(tmp_path, rows, "flexible")
    assert [r["correct"] for r in graded] == [True, False, True, True, True, True]


@pytest.mark.parametrize(
    "mode, text, gold, extracted, correct",
    [
        ("gsm8k", "Mr. Curtis has 325 - 28 = 297 hens.\n297 - 20 = 277\n#### 277", "277", "277", True),
        ("gsm8k", "325 - 20 = 305\n#### 305", "277", "305", False),
        ("gsm8k", "no final line, 277", "277", None, False),
        ("flexible", "325 - 20 = 305\nA: 305", "277", "305", False),
        ("flexible", "297 - 20 = 277\nA: 277", "277", "277", True),
    ],
)
def test_grade_extracts_and_checks_the_answer_in_the_mode_asked(tmp_path, mode, text, gold, extracted, correct):
    code, graded = grade(tmp_path, [{"completion": text, "gold": gold}], mode)
    assert code == 0
    assert (graded[0]["extracted"], graded[0]["correct"]) == (extracted, correct)


# --------------------------------------------------------------------------- malformed input


GOOD = json.dumps({"completion": "A: 1", "gold": "1"})


@pytest.mark.parametrize(
    "bad_line, reason",
    [
        ('{"completion": "A: 1", "gold": "1"', "invalid JSON"),
        ('["completion", "gold"]', "expected a JSON object, got list"),
        ('{"gold": "1"}', "missing field 'completion'"),
        (
            '{"completion": 7, "gold": "1"}',
            "field 'completion': expected a string or a list of chat messages",
        ),
        ('{"completion": "A: 1"}', "missing field 'gold' (or a GSM8K-style 'answer')"),
        ('{"completion": "A: 1", "gold": ""}', "field 'gold' is empty"),
        ('{"completion": "A: 1", "gold": true}', "field 'gold': expected a string or a number"),
        ('{"completion": "A: 1", "answer": "no final answer here"}', "field 'answer': no final answer"),
        ('{"completion": "A: 1", "answer": 5}', "field 'answer': expected a string"),
    ],
)
def test_malformed_row_names_file_and_line_and_writes_nothing(tmp_path, capsys, bad_line, reason):
    src = write_jsonl(tmp_path / "in.jsonl", [GOOD, "", bad_line, GOOD])
    out = tmp_path / "out.jsonl"
    out.write_text("previous results\n")
    code = cli(["grade", "--input", str(src), "--output", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{src}:3: {reason}" in err
    assert out.read_text() == "previous results\n"  # left as it was
    assert not list(tmp_path.glob(".out.jsonl.tmp-*"))


def test_every_malformed_row_is_listed_and_invalid_utf8_is_one(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"completion": "x"}\n\xff\xfe\n' + GOOD.encode() + b"\n")
    code = cli(["grade", "--input", str(src), "--output", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{src}:1: missing field 'gold'" in err and f"{src}:2: not valid UTF-8" in err
    assert not (tmp_path / "o.jsonl").exists()


def test_grade_on_a_missing_or_empty_input_fails_in_one_line(tmp_path, capsys):
    assert cli(["grade", "--input", str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "nope.jsonl: file not found" in capsys.readouterr().err
    empty = write_jsonl(tmp_path / "empty.jsonl", ["", "  "])
    assert cli(["grade", "--input", str(empty), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "no rows to grade" in capsys.readouterr().err
