"""The arithmetic a completion shows, checked: every `a op b = c` it writes, evaluated.

A right final answer can come from wrong work. A small model that has never seen a 3-step
solution writes two steps with a wrong sum and lands on the gold number by chance, and GRPO's
answer reward pays that chance as much as a right solution. `work_holds` tells the two apart
with a rule: no equation the completion shows is wrong. Evaluation reports `accuracy_checked` (the
answer is right and no equation shown is wrong) beside the flexible and strict accuracies
(components/evaluation/metrics.py). A completion without equations passes the rule, so prose the
scanner cannot read never turns a right answer into a wrong one.

An equation is numbers joined by `+ - * / x ×` (and parentheses) then `=` and a number, in prose or
in GSM8K's calculator annotations (`<<48/2=24>>`); `$` and thousands separators are dropped. The result
holds when it equals the left side: exactly for a whole number (`7/2 = 4` does not hold), to the
decimals it is written with otherwise (`7/3 = 2.33` holds). Text that only looks like one (`5 apples + 3 = 8`, a percentage) is not an
equation and is skipped. Scanning is linear: the left side is at most 80 characters.

    python -m doctest components/problems/arithmetic.py
"""

from __future__ import annotations

import ast
import re

_NUMBER = r"-?\d+(?:,\d{3})*(?:\.\d+)?"
_EQUATION = re.compile(r"([\d.,+\-*/() $]{3,80}?)=\s*\$?(" + _NUMBER + ")")
_TIMES = re.compile(r"([\d)])\s*[x×]\s*(?=[\d($])")
_HAS_OPERATOR = re.compile(r"\d\s*\)?\s*[-+*/]\s*\(?\s*-?\d")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_OPS = {ast.Add: float.__add__, ast.Sub: float.__sub__, ast.Mult: float.__mul__, ast.Div: float.__truediv__}


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("not arithmetic")


def equations(text: str) -> list[tuple[str, bool]]:
    """Each equation in `text` as (the equation, whether it holds), in order.

    >>> equations("Now Cara has 3 * 3 = 9 cookies. Then 9 * 3 = 36.")
    [('3 * 3 = 9', True), ('9 * 3 = 36', False)]
    >>> equations("She pays $1,000 + $5 = $1,005; each gets <<7/3=2.33>>2.33, so (3 + 4) x 2 = 14.")
    [('1000 + 5 = 1005', True), ('7/3 = 2.33', True), ('(3 + 4) * 2 = 14', True)]
    >>> equations("5 apples + 3 = 8, 50% of 40 = 20, 12 = 12, 7 / 0 = 1, numbers 5, 6 + 1 = 7")
    [('7 / 0 = 1', False), ('6 + 1 = 7', True)]
    """
    found = []
    for match in _EQUATION.finditer(_TIMES.sub(r"\1 * ", text)):
        left = _THOUSANDS.sub("", match.group(1).replace("$", "")).rsplit(",", 1)[-1]  # "5, 6 + 1": a list's last part
        left = re.sub(r"^[^\d(-]+", "", left).strip()
        if not _HAS_OPERATOR.search(left) or "**" in left or "//" in left:
            continue
        result = match.group(2).replace(",", "")
        try:
            value = _value(ast.parse(left, mode="eval").body)
        except ZeroDivisionError:
            found.append((f"{left} = {result}", False))
            continue
        except (SyntaxError, ValueError, RecursionError):
            continue  # unbalanced parentheses and the like: not an equation we can read
        decimals = len(result.split(".")[1]) if "." in result else 0
        # a whole number is exact; a decimal holds to the places it is written with (7/3 = 2.33)
        slack = 0.5 * 10**-decimals if decimals else 0.0
        found.append((f"{left} = {result}", abs(value - float(result)) <= slack + 1e-9 * max(1.0, abs(value))))
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
