"""The arithmetic check behind `accuracy_checked`: which right answers come with work that holds."""

import json
from pathlib import Path

from components.evaluation import metrics, reports, scoring
from components.problems.arithmetic import equations, work_holds

DATA = Path(__file__).parent / "data" / "gsm8k_model_samples.jsonl"


def test_gsm8k_reference_solutions_hold_and_a_wrong_annotation_does_not():
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    references = [r["ground_truth"] for r in rows]
    assert all(equations(text) for text in references)  # every reference shows its calculator annotations
    assert all(work_holds(text) for text in references)
    wrong = references[0].replace("<<325-28=297>>", "<<325-28=298>>")
    assert not work_holds(wrong)
    assert ("325-28 = 298", False) in equations(wrong)
    # GSM8K's own answer field: thousands separators, money and decimals
    assert work_holds("12 * 1000 = <<12*1000=12000>>12,000\n#### 12,000")
    assert work_holds("3.50-1=<<3.50-1=2.50>>2.50\n#### $2.50")
    # a whole-number result is exact; a decimal one holds to the places it is written with
    assert not work_holds("Now Hugo has 7 / 2 = 4 stickers.") and not work_holds("10 / 3 = 3")
    assert work_holds("7 / 2 = 3.5, 20 / 3 = 6.67 and 20/3=<<20/3=6.666666666666667>>6.666666666666667")


HOLDS = [  # worked-solution text from real models: none of it shows a wrong equation
    "(3 + 4) * 2 = 7 * 2 = 14", "20 - 4 * 2 = 20 - 8 = 12", "$12 * 3 + $5 = $36 + $5 = $41", "2 + 3 = 5 + 4 = 9",
    "20 apples - 5 + 3 = 18", "2 hours * 60 + 30 = 150", "60 km/h * 2 + 10 = 130", "10% * 50 + 5 = 10",
    "12 ÷ 4 + 2 = 5", "3 \\times 4 + 2 = 14", "3 · 4 + 1 = 13", "10 − 3 + 2 = 9", "2x + 10 - 4 = 20", "3:30 - 1 = 2:30",
    "$.25 * 8 = $2", "1/4 = 25%", "1/2 + 1/4 = 3/4", "30 / 60 = 1/2 hour", "1000 + 1 = 1 001", "10,5 + 1 = 11,5",
    "He earns $1,200.50 + $300 = $1,500.50.", "5-10 = -5", "-3 + 5 = 2", "1 + 2 = 3. 4 + 5 = 9.",
    " + ".join(["1234", "2345", "3456", "4567", "5678"] * 4) + " = 69120",
]
WRONG = ["2 + 3 = 5 + 4 = 10", "5+3=8-2=7", "(3 + 4) * 2 = 7 * 2 = 15", "3 * 3 = 10 cookies", "12 ÷ 4 = 4",
         "7 / 0 = 1", "2 + 3 = 5 / 0"]  # a division by zero shown, on either side, is wrong work


def test_chains_units_symbols_and_cut_sides_are_read_as_a_reader_would():
    assert [t for t in HOLDS if not work_holds(t)] == []
    assert [t for t in WRONG if work_holds(t)] == []


def test_text_that_could_break_a_scanner_is_not_judged_and_the_next_line_still_is():
    """Empty text, `=` alone, a side of 80,000 characters or behind 500 open parentheses, a 100,000-digit
    number, floats at their limit: no equation the scanner reads (too long, cut, or none), so the work holds
    as prose's does; a wrong equation on the next line is still found, a right one still holds."""
    for text in ("", "=" * 1000, "1 + " * 20000 + "= 5", "(" * 500 + "1+1=2", "9" * 100000, "1e308 * 1e308 = 1"):
        assert equations(text) == [] and work_holds(text) is True, text[:40]
        assert equations(text + "\n2 + 2 = 5") == [("2 + 2 = 5", False)] and not work_holds(text + "\n2 + 2 = 5")
        assert work_holds(text + "\n2 + 2 = 4") is True, text[:40]


def test_a_right_answer_from_wrong_work_counts_as_correct_but_not_checked():
    """The tiny model's 3-step 'gains': two steps, a wrong sum, and the gold number by chance."""
    def completion(work: str, answer: str) -> str:
        return f"<reasoning>\n{work}\n</reasoning>\n<answer>\n{answer}\n</answer>"

    guess = completion("Jack has 2 - 1 = 1 stickers.\nJack has 4 - 1 = 1 stickers.", "1")
    worked = completion("Jack has 4 - 1 = 3 stickers.\nJack has 3 - 2 = 1 stickers.", "1")
    rows = {
        "sft": [scoring.score_item({"id": str(i), "gold": "1"}, completion("4 - 1 = 3", "3"), 9, "grpoflow")
                for i in range(40)],
        "grpo": [scoring.score_item({"id": str(i), "gold": "1"}, guess if i < 20 else worked if i < 22 else
                                    completion("4 - 1 = 3", "3"), 9, "grpoflow") for i in range(40)],
    }
    m = metrics.item_metrics(rows["grpo"])
    assert m["accuracy_flexible"] == 22 / 40 and m["accuracy_checked"] == 2 / 40
    res = metrics.compare(rows["grpo"], rows["sft"], "accuracy_flexible")
    assert res["by_metric"]["accuracy_checked"]["delta"] == 2 / 40
    line = reports.headline("grpo", "sft", res["by_metric"])
    assert line.startswith("accuracy_checked (right, no equation shown wrong) sft 0.0% -> grpo 5.0%, "
                           "+5.0 points (95% CI ")
    assert line.endswith("correctness rose, but not with work that holds: "
                         "most new right answers come with wrong equations")
    # items files written before the column: no checked metric, the verdict as before
    old = [{k: v for k, v in r.items() if k != "correct_checked"} for r in rows["grpo"]]
    assert "accuracy_checked" not in metrics.item_metrics(old)
    assert reports.headline(
        "grpo", "sft", metrics.compare(old, rows["sft"], "accuracy_flexible")["by_metric"]
    ).endswith(": correctness rose")


def test_the_verdict_follows_a_significant_checked_change_that_correctness_does_not_share():
    """A headline whose first clause is a significant rise in checked accuracy must not end in 'no significant
    change': the demo's seed-2024 run read '+9.5 points, p = 0.0075; ...: no significant change' when correctness
    (flexible) missed 0.05."""
    rose = {"delta": 0.095, "p_value": 0.0075}
    flat = {"delta": 0.06, "p_value": 0.09}
    assert reports.verdict(flat, flat, checked=rose) == (
        "work that holds rose (checked accuracy); the rise in correctness alone is not significant")
    fell = {"delta": -0.07, "p_value": 0.01}
    assert reports.verdict(flat, flat, checked=fell) == (
        "work that holds fell (checked accuracy): more right answers come with an equation shown wrong")
    # a format-only strict gain with a significant checked rise is not 'format, not correctness'
    assert reports.verdict({"delta": 0.2, "p_value": 1e-9}, flat, checked=rose).startswith("work that holds rose")
    # without a significant checked change, the verdicts stay as they were
    assert reports.verdict(flat, flat, checked=flat) == "no significant change in correctness"
    assert reports.verdict(flat, flat) == "no significant change in correctness"
