"""GSM8K conventions shared by data preparation, rewards and evaluation.

One scorer for training and evaluation: the data stage normalizes gold answers
with `normalize_number`, rewards and evaluation extract and compare answers with
the functions here, so a completion is judged the same way everywhere.

- The prompt: `SYSTEM_PROMPT`, `build_messages`, `render_prompt` (the tokenizer's chat
  template where it has one, a short plain-text prompt otherwise).
- The completion format: `format_target` writes the SFT target
  `<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>`; `has_strict_format` checks it.
- Answer extraction, by mode (`extract_answer`): `strict` (the `<answer>` tag of a
  well-formed completion), `gsm8k` (the number after `####`), `flexible` (the last number
  in the text, like lm-evaluation-harness's flexible-extract).
- Comparison (`is_correct`, and `answers_match` from components/problems/answers.py): numbers equal
  within a relative tolerance of 1e-6; fractions, `\\boxed{}`, units and LaTeX understood.

Extraction and comparison are total and bounded: they never raise on any text (only an
unknown mode name raises), scan long texts linearly or only a bounded window of them, and
cap math-verify's time, so rewards built on them cannot hang.

    python -m doctest components/problems/gsm8k.py   # or: pytest components/problems/gsm8k.py
"""

from __future__ import annotations

import re
from typing import Any

from components.problems.answers import NUM_RE, answers_match, normalize_number, signed_number

__all__ = ["answers_match", "normalize_number"]  # re-exported: the scorer's public face

# GSM8K's calculator annotations, e.g. "48/2 = <<48/2=24>>24".
_CALC_RE = re.compile(r"<<[^<>]*>>")
_FINAL_RE = re.compile(r"####\s*(.*?)\s*$", re.DOTALL)


def strip_calculator(text: str) -> str:
    """Remove GSM8K's `<<...>>` calculator annotations.

    >>> strip_calculator("She sold 48/2 = <<48/2=24>>24 clips.")
    'She sold 48/2 = 24 clips.'
    """
    return _CALC_RE.sub("", text)


def count_calculator(text: str) -> int:
    """GSM8K's `<<...>>` calculator annotations in `text`: one per reasoning step.

    >>> count_calculator("48/2 = <<48/2=24>>24, 48+24 = <<48+24=72>>72")
    2
    """
    return len(_CALC_RE.findall(text))


def split_gsm8k_answer(answer: str) -> tuple[str, str]:
    """Split a GSM8K answer into (reasoning without annotations, raw final answer).

    Raises ValueError when there is no `#### N` line.

    >>> split_gsm8k_answer("48/2 = <<48/2=24>>24\\n#### 1,000")
    ('48/2 = 24', '1,000')
    """
    idx = answer.rfind("####")
    if idx < 0:
        raise ValueError("no '#### <final answer>' line")
    reasoning = strip_calculator(answer[:idx]).strip()
    final = answer[idx + 4 :].strip()
    return reasoning, final


# --------------------------------------------------------------------------- prompt and format

SYSTEM_PROMPT = (
    "Solve the math problem. Respond in the following format:\n"
    "<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n"
    "The answer is a single number."
)

REASONING_OPEN, REASONING_CLOSE = "<reasoning>", "</reasoning>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (REASONING_OPEN, REASONING_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

MODES = ("strict", "flexible", "gsm8k")


def build_messages(question: str) -> list[dict[str, str]]:
    """Chat messages for one problem: the system prompt, then the question.

    >>> [m["role"] for m in build_messages("What is 2 + 3?")]
    ['system', 'user']
    """
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def render_prompt(question: str, tokenizer: Any = None) -> str:
    r"""The prompt string: the tokenizer's chat template (with the generation prompt) where it
    has one, otherwise a short plain-text prompt the completion follows directly.

    >>> render_prompt("What is 2 + 3?")
    'Question: What is 2 + 3?\nAnswer:\n'
    """
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            build_messages(question), tokenize=False, add_generation_prompt=True
        )
    return f"Question: {question}\nAnswer:\n"


def format_target(solution: str, gold: str) -> str:
    """The SFT completion for a solution and its gold answer.

    >>> print(format_target("3 + 4 = 7", "7"))
    <reasoning>
    3 + 4 = 7
    </reasoning>
    <answer>
    7
    </answer>
    """
    return (f"{REASONING_OPEN}\n{solution.strip()}\n{REASONING_CLOSE}\n"
            f"{ANSWER_OPEN}\n{str(gold).strip()}\n{ANSWER_CLOSE}")


def _strict_parts(text: str) -> tuple[str, str] | None:
    """(reasoning, answer) of a well-formed completion, else None.

    Well-formed: optional whitespace, `<reasoning>`, text, `</reasoning>`, whitespace,
    `<answer>`, a non-empty answer, `</answer>`, optional whitespace; each tag exactly once.
    Plain `str` scans only, so the cost is linear in the text whatever it contains.
    """
    if not isinstance(text, str):
        return None
    s = text.strip()
    if not (s.startswith(REASONING_OPEN) and s.endswith(ANSWER_CLOSE)):
        return None
    if any(s.count(tag) != 1 for tag in TAGS):
        return None
    r_close = s.find(REASONING_CLOSE)
    a_open = s.find(ANSWER_OPEN)
    if a_open < r_close or s[r_close + len(REASONING_CLOSE) : a_open].strip():
        return None
    reasoning = s[len(REASONING_OPEN) : r_close].strip()
    answer = s[a_open + len(ANSWER_OPEN) : len(s) - len(ANSWER_CLOSE)].strip()
    if not answer:
        return None
    return reasoning, answer


def has_strict_format(text: str) -> bool:
    """True when `text` is exactly one `<reasoning>` block followed by one non-empty
    `<answer>` block (whitespace around and between the blocks is allowed).

    >>> has_strict_format(format_target("3 + 4 = 7", "7"))
    True
    >>> has_strict_format("<reasoning>x</reasoning><answer>7</answer>")
    True
    >>> has_strict_format("Sure! <reasoning>x</reasoning><answer>7</answer>")
    False
    >>> has_strict_format("<reasoning>x</reasoning><answer> </answer>")
    False
    """
    return _strict_parts(text) is not None


# --------------------------------------------------------------------------- extraction

FLEX_WINDOW = 16_384  # flexible mode reads the last 16 KiB of a completion ...
MAX_NUMBER_CHARS = 2_048  # ... plus this much when the last number straddles the window edge
GSM8K_WINDOW = 4_096  # gsm8k mode reads this much after `####`


def _last_number(text: str) -> str | None:
    for window in (FLEX_WINDOW, FLEX_WINDOW + MAX_NUMBER_CHARS):
        offset = max(0, len(text) - window)
        tail = text[offset:]
        last = None
        for last in NUM_RE.finditer(tail):  # noqa: B007 (keeps the last match)
            pass
        if last is None:
            return None
        cut = offset > 0 and last.start() == 0 and text[offset - 1] in "0123456789,."
        if not cut:
            return signed_number(tail, last.start(), last.group())
    return None  # a number of more than MAX_NUMBER_CHARS characters is not an answer


def _after_hashes(text: str) -> str | None:
    idx = text.find("####")
    if idx < 0:
        return None
    seg = text[idx + 4 : idx + 4 + GSM8K_WINDOW]
    m = re.match(r"[ \t]*([-\u2212]?)[ \t]*\$?[ \t]*([-\u2212]?)", seg)
    rest = seg[m.end() :]
    num = NUM_RE.match(rest)
    if num is None or (len(num.group()) == len(rest) and len(seg) == GSM8K_WINDOW):
        return None
    return normalize_number(("-" if (m.group(1) or m.group(2)) else "") + num.group())


def extract_answer(text: str, mode: str = "strict") -> str | None:
    r"""The answer a completion gives, or None when it gives none in this mode.

    - `strict`: the stripped content of the `<answer>` tag of a well-formed completion
      (see `has_strict_format`), as written.
    - `gsm8k`: the number after the first `####`, normalized.
    - `flexible`: the last number in the text, normalized: `$`, thousands commas and a
      trailing period are ignored, a minus sign counts unless it is a subtraction.

    >>> extract_answer("<reasoning>25 * 4 = 100</reasoning>\n<answer>\n$1,000\n</answer>", "strict")
    '$1,000'
    >>> extract_answer("She pays 2 * 5 = 10 dollars.\n#### 10", "gsm8k")
    '10'
    >>> [extract_answer(t, "flexible") for t in ["A: 1,000", "A: $5.", "A: 5 dollars", "A: -3", "A: .5", "10-4"]]
    ['1000', '5', '5', '-3', '0.5', '4']
    """
    if not isinstance(text, str):
        return None
    if mode == "strict":
        parts = _strict_parts(text)
        return parts[1] if parts else None
    if mode == "flexible":
        return _last_number(text)
    if mode == "gsm8k":
        return _after_hashes(text)
    raise ValueError(f"unknown extraction mode {mode!r}; known modes: {', '.join(MODES)}")


def gold_from_answer(answer: str) -> str | None:
    r"""The gold number of a reference solution: GSM8K's `#### N` line, or the `A: N` last line
    of GSM8K's published model samples, or the whole text when it is a number; else None.

    >>> [gold_from_answer(a) for a in ["3 + 4 = 7\n#### 7", "3 + 4 = 7\nA: 1,000", "42", "seven"]]
    ['7', '1000', '42', None]
    """
    if not isinstance(answer, str):
        return None
    gold = extract_answer(answer, "gsm8k")
    if gold is not None:
        return gold
    last = answer.strip().rsplit("\n", 1)[-1].strip()
    if last.startswith("A:"):
        return normalize_number(last[2:])
    return normalize_number(answer)


def is_correct(text: str, gold: str | None, mode: str = "strict") -> bool:
    r"""True when the completion's answer in `mode` matches `gold`.

    >>> is_correct(format_target("325 - 48 = 277", "277"), "277")
    True
    >>> is_correct("Mr. Curtis has 325 - 28 = 297 hens ... 305 hens.\nA: 305", "277", mode="flexible")
    False
    """
    return answers_match(extract_answer(text, mode), gold)
