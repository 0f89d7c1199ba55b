"""The arithmetic a completion shows, checked: every `a op b = c` it writes, evaluated.

A right final answer can come from wrong work. A small model that has never seen a 3-step
solution writes two steps with a wrong sum and lands on the gold number by chance, and GRPO's
answer reward pays that chance as much as a right solution. `work_holds` tells the two apart
with a rule: no equation the completion shows is wrong. Evaluation reports `accuracy_checked` (the
answer is right and no equation shown is wrong) beside the flexible and strict accuracies
(components/evaluation/metrics.py). A completion without equations passes the rule, so prose the
scanner cannot read never turns a right answer into a wrong one.

An equation is arithmetic (numbers, `+ - * /` and their other spellings `× · ÷ x`, parentheses)
on both sides of `=`, in prose or in GSM8K's calculator annotations (`<<48/2=24>>`); `$` and
thousands separators are dropped, and a chain `a = b = c` is read link by link. A result holds
when it equals its left side: exactly for a whole number (`7/2 = 4` does not hold), to the decimals
it is written with otherwise (`7/3 = 2.33` holds). What is not clearly an equation is skipped, not
judged: a side cut by a word or symbol (`20 apples - 5 + 3 = 18`, `= 25%`, `3:30`), a list
(`5, 6`), a side over 200 characters. Scanning is linear in the text.

    python -m doctest components/problems/arithmetic.py
"""

from __future__ import annotations

import ast
import math
import re

# Other spellings of the operators, read as + - * /; "x" only between two numbers ("3 x 4").
_SPELLINGS = (("÷", "/"), ("×", "*"), ("·", "*"), ("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"),
              ("−", "-"), ("–", "-"))
_TIMES = re.compile(r"([\d)])\s*x\s*(?=[\d($])")
# a maximal run of arithmetic characters, `=` included; a comma only inside a number (1,000): ", " ends a run
_RUN = re.compile(r"(?:[\d.+\-*/() $=]|,(?=\d))+")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
_LEADING = re.compile(r"\(*\s*(-?(?:\d+(?:\.\d*)?|\.\d+))")
_HAS_OPERATOR = re.compile(r"[\d.)]\s*[-+*/]\s*[(\d.-]")
_OPS = {ast.Add: float.__add__, ast.Sub: float.__sub__, ast.Mult: float.__mul__, ast.Div: float.__truediv__}
_MAX_SIDE = 200  # characters of one side: longer is not read (and no float overflows)


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("not arithmetic")


def _side(part: str) -> str | None:
    """One side of an equation, cleaned (`$` and thousands separators dropped), or None where it is
    not one: empty, too long, a list (`5, 6`), or cut by text before or after it (`- 5` of
    `20 apples - 5`, a trailing operator)."""
    side = _THOUSANDS.sub("", part.replace("$", "")).strip().rstrip(".").strip()  # "= 36." ends a sentence
    if not side or len(side) > _MAX_SIDE or "," in side or "**" in side or "//" in side:
        return None
    if side[0] in "+*/)" or side[-1] in "+-*/(" or re.match(r"-\s", side):
        return None
    return side


def _holds(value: float, written: str) -> bool:
    """`value` equals the number `written`: exactly for a whole number, to its decimals otherwise."""
    decimals = len(written.split(".")[1]) if "." in written else 0
    slack = 0.5 * 10**-decimals if decimals else 0.0
    return abs(value - float(written)) <= slack + 1e-9 * max(1.0, abs(value))


def _evaluate(side: str) -> float | None:
    """The value of one side; NaN for a division by zero (it never holds); None where it is not arithmetic."""
    try:
        return _value(ast.parse(side, mode="eval").body)
    except ZeroDivisionError:
        return float("nan")
    except (SyntaxError, ValueError, RecursionError, OverflowError, MemoryError):
        return None


def equations(text: str) -> list[tuple[str, bool]]:
    """Each equation in `text` as (the equation, whether it holds), in order. A chain
    `a = b = c` is read link by link; a link that restarts from the total (`2 + 3 = 5 + 4 = 9`, a
    running sum) holds when the total it starts from is right.

    >>> equations("Now Cara has 3 * 3 = 9 cookies. Then 9 * 3 = 36.")
    [('3 * 3 = 9', True), ('9 * 3 = 36', False)]
    >>> equations("She pays $1,000 + $5 = $1,005; each gets <<7/3=2.33>>2.33, so (3 + 4) x 2 = 14.")
    [('1000 + 5 = 1005', True), ('7/3 = 2.33', True), ('(3 + 4) * 2 = 14', True)]
    >>> equations("(3 + 4) * 2 = 7 * 2 = 14, 2 + 3 = 5 + 4 = 9, then 5 + 4 = 9 - 1 = 7")
    [('(3 + 4) * 2 = 7 * 2', True), ('7 * 2 = 14', True), ('2 + 3 = 5 + 4', True), ('5 + 4 = 9', True), ('5 + 4 = 9 - 1', True), ('9 - 1 = 7', False)]
    >>> equations("20 apples - 5 + 3 = 18, 1/4 = 25%, 3:30 - 1 = 2:30, 12 = 12, 7 / 0 = 1, numbers 5, 6 + 1 = 7")
    [('7 / 0 = 1', False), ('6 + 1 = 7', True)]
    """  # noqa: E501
    for old, new in _SPELLINGS:
        text = text.replace(old, new)
    text = _TIMES.sub(r"\1 * ", text)
    found = []
    for run in _RUN.finditer(text):
        parts = run.group().split("=")
        if len(parts) < 2:
            continue
        sides = [_side(part) for part in parts]
        before = text[run.start() - 1] if run.start() else " "
        after = text[run.end()] if run.end() < len(text) else " "
        if (before.isalnum() or before in ":%^\\") and not parts[0][:1].isspace():
            sides[0] = None  # "3:30 - 1", "2x + 10": the first side is cut
        if (after.isalnum() or after in ":%^\\") and not parts[-1][-1:].isspace():
            sides[-1] = None  # "= 25%", "= 2:30": the last side is cut
        for left, right in zip(sides, sides[1:], strict=False):
            if left is None or right is None or not _HAS_OPERATOR.search(left):
                continue
            value = _evaluate(left)
            if value is None:
                continue
            if _NUMBER.fullmatch(right):
                found.append((f"{left} = {right}", _holds(value, right)))
                continue
            total, start = _evaluate(right), _LEADING.match(right)
            if total is None:
                continue
            restart = start is not None and _holds(value, start.group(1))  # 2 + 3 = 5 + 4: a running sum
            same = abs(value - total) <= 1e-9 * max(1.0, abs(value))
            found.append((f"{left} = {right}", not math.isnan(total) and (restart or same)))  # 5 / 0 never holds
    return found


def work_holds(text: str) -> bool:
    """No equation the completion shows is wrong (true of a completion without equations).

    >>> work_holds("After buying, Ivy has 2 + 9 = 11 coins.\\nNow Ivy has 11 * 3 = 33 coins.")
    True
    >>> work_holds("Jack has 2 - 1 = 1 stickers.\\nJack has 4 - 1 = 1 stickers.")
    False
    >>> work_holds("2 hours at 60 minutes an hour is 120 minutes.")
    True
    """
    return all(holds for _, holds in equations(text))
