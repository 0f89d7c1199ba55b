"""Table-driven tests of components/problems/gsm8k.py: prompt, strict format, the three extraction
modes, answer comparison (numbers, fractions, LaTeX via math-verify) and its time bound.

    pytest -q tests/test_gsm8k.py
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components.problems import answers, gsm8k
from components.problems.gsm8k import (
    answers_match,
    build_messages,
    extract_answer,
    format_target,
    gold_from_answer,
    has_strict_format,
    is_correct,
    normalize_number,
    render_prompt,
)

REPO = Path(__file__).resolve().parents[1]

CURTIS = (
    "Mr. Curtis has 325 chickens on his farm where 28 are roosters and the rest are hens. Twenty hens "
    "do not lay eggs while the rest of the egg-laying hens do. How many egg-laying hens does Mr. Curtis "
    "have on his farm?"
)
CURTIS_SOLUTION = "Mr. Curtis has 325 - 28 = 297 hens.\nOnly 297 - 20 = 277 hens lay eggs."


# --------------------------------------------------------------------------- prompt


def test_plain_prompt_is_short_and_ends_where_the_completion_starts():
    prompt = render_prompt(CURTIS)
    assert prompt == f"Question: {CURTIS}\nAnswer:\n"
    assert len(prompt) - len(CURTIS) < 30


def test_chat_template_prompt_carries_system_prompt_and_generation_prompt():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")), unk_token="[UNK]"
    )
    assert render_prompt("Q?", tok) == "Question: Q?\nAnswer:\n"  # no template: plain text
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    prompt = render_prompt("What is 2 + 3?", tok)
    assert prompt == f"<|system|>{gsm8k.SYSTEM_PROMPT}\n<|user|>What is 2 + 3?\n<|assistant|>"
    assert build_messages("x")[0] == {"role": "system", "content": gsm8k.SYSTEM_PROMPT}
    assert "<reasoning>" in gsm8k.SYSTEM_PROMPT and "<answer>" in gsm8k.SYSTEM_PROMPT


# --------------------------------------------------------------------------- format


def test_sft_target_has_strict_format_and_round_trips():
    target = format_target(CURTIS_SOLUTION, "277")
    assert target == f"<reasoning>\n{CURTIS_SOLUTION}\n</reasoning>\n<answer>\n277\n</answer>"
    assert has_strict_format(target)
    assert has_strict_format("\n  " + target + "\n\n")
    assert extract_answer(target, "strict") == "277"


@pytest.mark.parametrize(
    "text, ok",
    [
        ("<reasoning>\nx\n</reasoning>\n<answer>\n7\n</answer>", True),
        ("<reasoning>x</reasoning><answer>7</answer>", True),
        ("<reasoning></reasoning>\n<answer>7</answer>", True),  # empty reasoning is still the format
        ("  <reasoning>x</reasoning>  \n\n <answer> 7 </answer>\n", True),
        ("<reasoning>x</reasoning>\n<answer>\n</answer>", False),  # empty answer
        ("Sure: <reasoning>x</reasoning><answer>7</answer>", False),  # text before
        ("<reasoning>x</reasoning><answer>7</answer> Done.", False),  # text after
        ("<reasoning>x</reasoning> so <answer>7</answer>", False),  # text between
        ("<answer>7</answer><reasoning>x</reasoning>", False),  # order
        ("<reasoning>x</reasoning><answer>7</answer><answer>8</answer>", False),  # two answers
        ("<reasoning><reasoning>x</reasoning></reasoning><answer>7</answer>", False),  # nested
        ("<reasoning>x<answer>7</answer>", False),  # unclosed reasoning
        ("<REASONING>x</REASONING><ANSWER>7</ANSWER>", False),  # tags are exact
        ("", False),
    ],
)
def test_strict_format_is_reasoning_then_answer_and_nothing_else(text, ok):
    assert has_strict_format(text) is ok
    assert (extract_answer(text, "strict") is not None) is ok


# --------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Mr. Curtis has 297 hens.\nA: 277", "277"),
        ("A: 1,000", "1000"),
        ("A: 90,000", "90000"),
        ("A: $5.", "5"),
        ("A: 5 dollars", "5"),
        ("A: 5.", "5"),
        ("A: 5...", "5"),
        ("A: -3", "-3"),
        ("A: -$3", "-3"),
        ("A: $-3", "-3"),
        ("A: \u22127", "-7"),  # Unicode minus sign
        ("The difference is 10-4", "4"),  # a subtraction, not a negative number
        ("A: 0.5", "0.5"),
        ("A: .5", "0.5"),
        ("A: 0.50", "0.5"),
        ("A: 30.00", "30"),
        ("A: 1,234,567.5", "1234567.5"),
        ("costs $.50 each", "0.5"),
        ("2 / 4 = <<2/4=0.5>>.5\nA: .5", "0.5"),
        ("She pays 7 * 3 = $<<7*3=21>>21", "21"),
        ("first 12 then 15, finally 18 apples.", "18"),
        ("no digits here", None),
        ("", None),
        ("...", None),  # lm-eval's regex would match '...'; a number needs a digit
    ],
)
def test_flexible_extraction_reads_the_last_number(text, expected):
    assert extract_answer(text, "flexible") == expected


def test_flexible_reads_a_bounded_tail_of_long_text_exactly():
    filler = "word " * 50_000  # 250 KB of text without numbers
    assert extract_answer("A: 12" + filler, "flexible") is None  # beyond the 16 KiB window
    assert extract_answer(filler + "A: 12" + " x" * 100, "flexible") == "12"
    # A number straddling the window edge is read whole, not cut.
    n = "7" * 20
    text = "x " * 10 + n + " y" * ((gsm8k.FLEX_WINDOW - 5) // 2)
    assert extract_answer(text, "flexible") == n
    # A number longer than MAX_NUMBER_CHARS is not an answer.
    assert extract_answer("9" * 1_000_000, "flexible") is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("48/2 = 24\n#### 72", "72"),
        ("#### 1,000", "1000"),
        ("####-5", "-5"),
        ("#### $18.00", "18"),
        ("#### 7\nQuestion: next\n#### 9", "7"),  # the first final answer, like lm-eval's strict-match
        ("#### seven", None),
        ("no final line: 72", None),
        ("####", None),
    ],
)
def test_gsm8k_extraction_reads_the_first_final_answer_line(text, expected):
    assert extract_answer(text, "gsm8k") == expected


def test_unknown_mode_is_rejected_with_the_known_ones():
    with pytest.raises(ValueError, match="strict, flexible, gsm8k"):
        extract_answer("A: 1", "loose")


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("a\n#### 277", "277"),
        ("a = 277\nA: 277", "277"),
        ("A: 1,000", "1000"),
        ("277", "277"),
        ("a\nb", None),
    ],
)
def test_gold_is_read_from_the_final_line_of_an_answer(answer, expected):
    assert gold_from_answer(answer) == expected


# --------------------------------------------------------------------------- comparison


@pytest.mark.parametrize(
    "pred, gold, ok",
    [
        ("277", "277", True),
        ("305", "277", False),
        ("18", "18", True),
        ("18.0", "18", True),
        ("$18", "18", True),
        ("18.00", "18", True),
        ("1,000", "1000", True),
        ("1000", "1,000", True),
        ("9.999999999999999", "10", True),  # float noise within 1e-6
        ("10.0001", "10", False),  # outside 1e-6
        ("-3", "-3", True),
        ("3", "-3", False),
        ("0.5", ".5", True),
        ("1/2", "0.5", True),
        ("\\frac{1}{2}", "0.5", True),
        ("\\dfrac{3}{4}", "0.75", True),
        ("-\\frac{1}{2}", "-0.5", True),
        ("\\boxed{18}", "18", True),
        ("$\\boxed{18}$", "18", True),
        ("18 dollars", "18", True),
        ("\\text{18 dollars}", "18", True),
        ("50%", "50", True),
        ("A: 277", "277", True),
        ("18 or 19", "18", False),  # a hedge is not an answer
        ("3/0", "3", False),
        ("", "18", False),
        (None, "18", False),
        ("18", None, False),
    ],
)
def test_answers_match_as_numbers_fractions_and_latex_but_a_hedge_does_not(pred, gold, ok):
    assert answers_match(pred, gold) is ok


@pytest.mark.parametrize(
    "pred, gold, ok",
    [("\\sqrt{4}", "2", True), ("2^{3}", "8", True), ("3 \\times 4", "12", True), ("\\sqrt{5}", "2", False),
     ("2 + 2", "4", True), ("2 + 2", "5", False)],
)
def test_answers_match_through_math_verify(pred, gold, ok, monkeypatch):
    # Equivalence, not speed, is tested here: a generous budget keeps a busy machine from
    # turning a slow comparison into a wrong one.
    monkeypatch.setattr(answers, "MATH_VERIFY_BUDGET_S", 5.0)
    assert answers_match(pred, gold) is ok


def test_an_arithmetic_answer_is_judged_the_same_on_its_first_comparison_in_a_process():
    """The reward of an answer does not depend on what was compared before it: each common form's first
    comparison in a fresh process, under the real 20 ms budget, gives what a later one gives. (The first
    `2 + 2` once spent 31 ms building sympy's addition and read as wrong; a repeat read as right.)"""
    pairs = [("2 + 2", "4"), ("12 - 2 * 3", "6"), ("3 * 4", "12"), ("(1 + 2) * 3", "9"), ("2^3", "8"), ("2 + 2", "5")]
    code = ("import json, sys; from components.problems.answers import answers_match as m; "
            f"print(json.dumps([[m(p, g), m(p, g)] for p, g in {pairs!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first_and_second = json.loads(proc.stdout)
    assert first_and_second == [[True, True]] * 5 + [[False, False]]


def test_numbers_with_thousands_of_digits_compare_without_error():
    big = "1" * 5000
    assert answers_match(big, big)
    assert not answers_match(big, "1" * 4999 + "2")
    assert not answers_match(big, "7")
    assert answers_match("1" * 3000, "1" * 2999 + "2")  # relative tolerance 1e-6


@pytest.mark.parametrize(
    "mode, text",
    [
        ("strict", format_target(CURTIS_SOLUTION, "277")),
        ("flexible", CURTIS_SOLUTION + "\nA: 277"),
        ("gsm8k", CURTIS_SOLUTION + "\n#### 277"),
    ],
)
def test_every_mode_accepts_the_right_answer_and_rejects_a_wrong_one(mode, text):
    assert is_correct(text, "277", mode)
    assert not is_correct(text.replace("277", "305"), "277", mode)


def test_normalize_number_is_unchanged_for_the_data_stage():
    assert [normalize_number(s) for s in ["72", "1,000", "$18.00", "-3.50", "7.", "0.0", "abc", None]] == [
        "72",
        "1000",
        "18",
        "-3.5",
        "7",
        "0",
        None,
        None,
    ]


# --------------------------------------------------------------------------- math-verify's bound


@pytest.mark.parametrize("expr", ["9^{9^{9^{9}}}", "(x+1)^{1000}-(x-1)^{1000}", "10^{10^{10}}"])
def test_math_verify_is_cut_off_by_its_budget(expr):
    # Unbounded, math-verify works on these for seconds to forever (9^{9^{9^{9}}} does not
    # finish); the budget is MATH_VERIFY_BUDGET_S. The 1 s check leaves room for a busy machine.
    answers.warm_up()
    start = time.monotonic()
    assert answers_match(expr, "5") is False
    assert time.monotonic() - start < 1.0


def test_math_verify_restores_a_running_timer_and_handler(monkeypatch):
    monkeypatch.setattr(answers, "MATH_VERIFY_BUDGET_S", 5.0)
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        assert answers_match("\\sqrt{4}", "2")
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25.0 < remaining <= 30.0
        assert signal.getsignal(signal.SIGALRM) is not old and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_other_threads_skip_math_verify_but_keep_the_built_in_equivalences():
    results = {}

    def work():
        results["frac"] = answers_match("\\frac{1}{2}", "0.5")
        results["sqrt"] = answers_match("\\sqrt{4}", "2")

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert results == {"frac": True, "sqrt": False}
