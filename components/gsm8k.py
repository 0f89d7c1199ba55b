"""GSM8K conventions shared by data preparation, rewards and evaluation.

One scorer for training and evaluation: the data stage normalizes gold answers
with `normalize_number`, rewards and evaluation extract and compare answers with
the functions here, so a completion is judged the same way everywhere.
"""

from __future__ import annotations

import re

# GSM8K's calculator annotations, e.g. "48/2 = <<48/2=24>>24".
_CALC_RE = re.compile(r"<<[^<>]*>>")
_FINAL_RE = re.compile(r"####\s*(.*?)\s*$", re.DOTALL)
_NUMBER_RE = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)$")


def normalize_number(text: str) -> str | None:
    """Canonical string of a number, or None when `text` is not one.

    Commas, `$`, surrounding space and a trailing period are ignored; trailing
    zeros after the decimal point are dropped.

    >>> [normalize_number(s) for s in ["72", "1,000", "$18.00", "-3.50", "7.", "0.0", "abc"]]
    ['72', '1000', '18', '-3.5', '7', '0', None]
    """
    if text is None:
        return None
    s = str(text).strip().replace(",", "").replace("$", "").strip()
    if s.endswith(".") and s[:-1].strip():
        s = s[:-1].strip()
    if not _NUMBER_RE.match(s):
        return None
    sign = ""
    if s[0] in "+-":
        sign, s = ("-" if s[0] == "-" else ""), s[1:]
    if "." in s:
        whole, frac = s.split(".", 1)
        frac = frac.rstrip("0")
        whole = whole.lstrip("0") or "0"
        s = f"{whole}.{frac}" if frac else whole
    else:
        s = s.lstrip("0") or "0"
    if s == "0":
        sign = ""
    return sign + s


def strip_calculator(text: str) -> str:
    """Remove GSM8K's `<<...>>` calculator annotations.

    >>> strip_calculator("She sold 48/2 = <<48/2=24>>24 clips.")
    'She sold 48/2 = 24 clips.'
    """
    return _CALC_RE.sub("", text)


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
