"""Answer comparison shared by rewards, evaluation and grading: are two answers the same number?

Numbers are equal within a relative tolerance of 1e-6 after dropping `$`, commas and a trailing
period; simple fractions, `\\boxed{}`, `\\frac{}{}`, percent signs and unit words are handled
here; math-verify adds the rest (LaTeX expressions) within a 20 ms CPU-time budget, in the main
thread only. Every function is total and bounded: none raises on any text or hangs.

    normalize_number("1,000")        '1000'
    answers_match("$18.00", "18")    True
"""

from __future__ import annotations

import gc
import re
import signal
import threading
import time
from fractions import Fraction
from typing import Any

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


# An unsigned number as lm-evaluation-harness's flexible-extract sees it, but with at least
# one digit and commas only between digits. Each alternative is deterministic (no nested
# or overlapping quantifiers), so matching is linear even on thousands of digits.
NUM_RE = re.compile(r"\d(?:,?\d)*(?:\.\d+)?|\.\d+")
_MINUSES = "-\u2212"  # ASCII hyphen-minus and the Unicode minus sign


def signed_number(text: str, start: int, digits: str) -> str | None:
    """`digits` (found at `start` in `text`) with a minus sign when one precedes it, possibly
    with `$` in between ("-5", "-$5", "$-5"), and is not a subtraction ("10-5")."""
    i = start - 1
    if i >= 0 and text[i] == "$":
        i -= 1
    negative = i >= 0 and text[i] in _MINUSES
    if negative and i > 0:
        before = text[i - 1]
        negative = not (before.isalnum() or before in ")]}")
    if not negative and start > 0 and text[start - 1] == "$" and start > 1 and text[start - 2] in _MINUSES:
        negative = True
    return normalize_number(("-" if negative else "") + digits)


# --------------------------------------------------------------------------- comparison

REL_TOL = 1e-6
MAX_CHEAP_CHARS = 200  # answers longer than this are compared as plain numbers only
MATH_VERIFY_MAX_CHARS = 100  # longer answers never reach math-verify
MATH_VERIFY_BUDGET_S = 0.02  # CPU-time budget of one math-verify comparison

_UNWRAP_RE = re.compile(r"^(?:\\boxed\{(.*)\}|\\\((.*)\\\)|\\\[(.*)\\\]|\$(.*)\$)$", re.DOTALL)
_TEXT_RE = re.compile(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}")
_FRAC_RE = re.compile(r"^([-+]?)\s*\\[dt]?frac\{\s*([-+]?\d+)\s*\}\{\s*(\d+)\s*\}$|^([-+]?\d+)\s*/\s*(\d+)$")
# Answers that may go to math-verify: LaTeX or an arithmetic expression ("2 + 2" is 4). Prose such as
# "18 or 19" does not (math-verify would pick one of its numbers: a hedge that pays).
_MATHY_RE = re.compile(r"[\\^{}/*+()=]")


def _to_fraction(text: str) -> Fraction | None:
    """An exact value for a plain-number answer, else None: a number with `$`, commas, `%`
    or words around it, a fraction `a/b` or `\\frac{a}{b}`, in `\\boxed{}` or `$...$`."""
    s = text.strip()
    if len(s) > MAX_CHEAP_CHARS:
        norm = normalize_number(s)
        return _fraction(norm) if norm is not None else None
    for _ in range(3):  # nested wrappers: $\boxed{18}$
        m = _UNWRAP_RE.match(s)
        if not m:
            break
        s = next(g for g in m.groups() if g is not None).strip()
    s = _TEXT_RE.sub(r"\1", s)
    s = (
        s.replace("\\$", "$")
        .replace("\\%", "%")
        .replace("{,}", ",")
        .replace("\\,", "")
        .replace("\\!", "")
        .strip()
    )
    m = _FRAC_RE.match(s)
    if m:
        sign, num, den = (
            (m.group(1), m.group(2), m.group(3)) if m.group(2) is not None else ("", m.group(4), m.group(5))
        )
        value = _fraction(num), _fraction(den)
        if value[0] is None or not value[1]:
            return None
        return (-1 if sign == "-" else 1) * value[0] / value[1]
    # One number, whatever surrounds it, is the answer: "18", "$18.00", "50%", "18 dollars",
    # "A: 18", "x = -3". Two or more numbers ("18 or 19", "2 + 2") are not a plain answer.
    if _MATHY_RE.search(s.replace("=", "")):  # "\\sqrt{4}", "2^3": an expression, not a number
        return None
    numbers = NUM_RE.finditer(s)
    first = next(numbers, None)
    if first is None or next(numbers, None) is not None:
        return None
    norm = signed_number(s, first.start(), first.group())
    return _fraction(norm) if norm is not None else None


def _fraction(norm: str) -> Fraction | None:
    try:  # int() refuses strings of more than 4300 digits; such numbers are compared as text
        return Fraction(norm)
    except (ValueError, ZeroDivisionError):
        return None


def _close(a: Fraction, b: Fraction) -> bool:
    return a == b or abs(a - b) <= Fraction(REL_TOL) * max(abs(a), abs(b))


class _Deadline(BaseException):
    """Raised by the SIGPROF handler; a BaseException so math-verify's `except Exception` lets it through."""


_mv_state: dict[str, Any] = {}
# One comparison per common answer form: each form's first use builds parser and sympy state
# (10-150 ms) that must not count against a later comparison's budget.
_WARM_UP = [
    ("$\\frac{1}{2}$", "$0.5$"),
    ("$2^{3}$", "$8$"),
    ("$\\sqrt{4}$", "$2$"),
    ("$3 \\times 4$", "$12$"),
    ("$5 \\cdot 3$", "$15$"),
    ("$x = 5$", "$5$"),
    ("$1.5\\%$", "$1.5$"),
    ("$\\boxed{18}$", "$18$"),
    ("$2 + 2$", "$4$"),  # ASCII arithmetic: sympy's addition, subtraction, products and brackets
    ("$10 - 3$", "$7$"),
    ("$(1 + 2) * 3$", "$9$"),
]


def _math_verify() -> tuple[Any, Any] | None:
    """(parse, verify) from math-verify, imported and warmed up once (the first parse builds
    its grammar, ~0.1 s, which must not count against the per-comparison budget)."""
    if "funcs" not in _mv_state:
        try:
            import math_verify.grader
            import math_verify.parser
            from math_verify import parse, verify

            # We supply the timeout ourselves (a sub-second SIGPROF timer), so silence its
            # one-time "timeout is disabled" warning.
            math_verify.parser.TIMEOUT_WARNING_SHOWN = True
            math_verify.grader.TIMEOUT_WARNING_SHOWN = True
            for pred, gold in _WARM_UP:
                verify(
                    parse(gold, parsing_timeout=None), parse(pred, parsing_timeout=None), timeout_seconds=None
                )
            _mv_state["funcs"] = (parse, verify)
        except Exception:  # not installed or broken: the built-in equivalences still apply
            _mv_state["funcs"] = None
    return _mv_state["funcs"]


def warm_up() -> None:
    """Import and warm math-verify now, so that no later comparison pays for it.
    `rewards.get_reward_funcs` calls it; otherwise the first comparison that needs
    math-verify does it, outside its budget."""
    _math_verify()


def _math_verify_equal(pred: str, gold: str) -> bool:
    """math-verify's judgement within MATH_VERIFY_BUDGET_S, or False.

    math-verify's own timeouts are whole seconds of `signal.alarm`, which only works in the
    main thread; here a sub-second `setitimer` in the main thread bounds parse and verify
    together, and any other thread skips math-verify (built-in equivalences only). The
    budget counts CPU time (ITIMER_PROF), so that a busy machine does not turn a slow but
    valid comparison into a wrong one; a timer and handler set by someone else are restored.
    """
    if len(pred) > MATH_VERIFY_MAX_CHARS or len(gold) > MATH_VERIFY_MAX_CHARS:
        return False
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "ITIMER_PROF"):
        return False
    funcs = _math_verify()
    if funcs is None:
        return False
    parse, verify = funcs

    active = True

    def on_alarm(signum, frame):
        if active:  # a signal delivered after we are done must not raise in our caller
            raise _Deadline

    start = time.process_time()
    try:
        old_handler = signal.signal(signal.SIGPROF, on_alarm)
    except ValueError:  # not the main interpreter
        return False
    # First at the budget, then every 2 ms: a _Deadline raised where Python ignores exceptions
    # (a __del__, a weakref or gc callback) is followed by another one.
    old_delay, old_interval = signal.setitimer(signal.ITIMER_PROF, MATH_VERIFY_BUDGET_S, 0.002)
    # A collection of the whole heap inside the budget runs in C, where no signal handler
    # can stop it (tens of ms with sympy's caches); garbage made here waits until after.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    result = False
    try:
        g = parse(gold if "$" in gold else f"${gold}$", parsing_timeout=None)
        p = parse(pred if "$" in pred else f"${pred}$", parsing_timeout=None)
        result = bool(g and p and verify(g, p, timeout_seconds=None))
    except _Deadline:
        result = False
    except Exception:
        result = False
    finally:
        active = False
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old_handler)
        if gc_was_enabled:
            gc.enable()
        if old_delay > 0:  # give a timer that was running before us its remaining time back
            signal.setitimer(
                signal.ITIMER_PROF, max(old_delay - (time.process_time() - start), 1e-3), old_interval
            )
    return result


def answers_match(pred: str | None, gold: str | None) -> bool:
    r"""True when the predicted answer equals the gold answer.

    Plain numbers compare by value within a relative tolerance of 1e-6 (`$`, commas,
    trailing zeros and a trailing period do not matter); fractions, `\boxed{}`, percent
    signs and unit words are understood; other expressions go to math-verify.

    >>> [answers_match(p, "18") for p in ["18", "18.0", "$18", "18.00", "18 dollars", "\\boxed{18}", "19"]]
    [True, True, True, True, True, True, False]
    >>> answers_match("1,000", "1000"), answers_match("9.999999999999999", "10"), answers_match("1/2", "0.5")
    (True, True, True)
    >>> answers_match(None, "3"), answers_match("", "")
    (False, False)
    """
    if pred is None or gold is None:
        return False
    pred, gold = str(pred).strip(), str(gold).strip()
    if not pred or not gold:
        return False
    p_norm, g_norm = normalize_number(pred), normalize_number(gold)
    if p_norm is not None and p_norm == g_norm:
        return True
    p, g = _to_fraction(pred), _to_fraction(gold)
    if p is not None and g is not None:
        return _close(p, g)
    if p_norm is not None and g_norm is not None:
        return False  # plain numbers too long for exact arithmetic, and not equal as text
    # math-verify only for an ASCII expression against a number or an expression: LaTeX
    # answers are ASCII, and prose or unicode noise would only spend its budget.
    if len(pred) > MATH_VERIFY_MAX_CHARS or not (pred.isascii() and _MATHY_RE.search(pred)):
        return False
    if g is None and not _MATHY_RE.search(gold):
        return False
    if pred.count("{") != pred.count("}") or pred.count("(") != pred.count(")"):
        return False  # unbalanced: not an expression, and the slowest kind of input for its parser
    try:
        return _math_verify_equal(pred, gold)
    except _Deadline:  # belt and braces: a deadline that surfaced outside the guarded block
        return False
