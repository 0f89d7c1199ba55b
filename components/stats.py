"""Small-sample statistics for evaluation reports (standard library only).

- `wilson_interval(k, n)`: score interval for one accuracy (Wilson 1927).
- `mcnemar_exact(b, c)`: exact two-sided McNemar test on the discordant pairs of a
  paired comparison (a binomial test of b against b + c at p = 0.5).
- `paired_difference_interval(a, b, c, d)`: interval for the difference of two
  accuracies measured on the same items (Newcombe 1998, method 10: Wilson score
  intervals combined through the phi correlation of the pairs).
- `compare_paired(correct_a, correct_b)`: the three above from two boolean lists;
  this is what `reports/eval/comparison.json` records for each pair of models.

Used by evaluation (components/scoring.py) and the promotion gate; no numpy/scipy so that it
runs in any environment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from statistics import NormalDist


def z_value(confidence: float = 0.95) -> float:
    """Two-sided standard normal quantile.

    >>> round(z_value(0.95), 4)
    1.96
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion k/n; (0.0, 1.0) when n == 0.

    >>> [round(x, 4) for x in wilson_interval(81, 263)]
    [0.2553, 0.3662]
    """
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    z = z_value(confidence)
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # Exact bounds at the edges (avoid 1e-17 rounding noise).
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for discordant counts b and c.

    b: items only the first model got right; c: items only the second got right.
    p = min(1, 2 * P(X <= min(b, c))) with X ~ Binomial(b + c, 1/2); 1.0 when b + c == 0.

    >>> mcnemar_exact(1, 7)
    0.0703125
    >>> round(mcnemar_exact(6, 16), 6)   # Cavo et al. (2012), Fagerland et al. ch. 8
    0.052479
    >>> mcnemar_exact(5, 5)
    1.0
    """
    if b < 0 or c < 0:
        raise ValueError(f"counts must be >= 0, got b={b}, c={c}")
    m = b + c
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(b, c) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**m)))


def paired_difference_interval(
    a: int, b: int, c: int, d: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Interval for p1 - p2 from a paired 2x2 table (Newcombe 1998, method 10).

    a: both right, b: first right only, c: second right only, d: both wrong;
    p1 = (a + b) / n, p2 = (a + c) / n, difference (b - c) / n.

    Cavo et al. (2012) as worked in Fagerland, Lydersen & Laake, "Statistical Analysis of
    Contingency Tables", ch. 8: 59 / 6 / 16 / 80 gives -0.0621 (-0.1186 to -0.0046).

    >>> [round(x, 4) for x in paired_difference_interval(59, 6, 16, 80)]
    [-0.1186, -0.0046]
    """
    if min(a, b, c, d) < 0:
        raise ValueError(f"counts must be >= 0, got {(a, b, c, d)}")
    n = a + b + c + d
    if n == 0:
        return -1.0, 1.0
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_interval(a + b, n, confidence)
    l2, u2 = wilson_interval(a + c, n, confidence)
    marginals = (a + b) * (c + d) * (a + c) * (b + d)
    # Newcombe's continuity-corrected phi: ad - bc shrunk by n/2 towards 0 when positive.
    cross = a * d - b * c
    if not marginals or 0 <= cross <= n / 2:
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > 0 else cross) / math.sqrt(marginals)
    theta = p1 - p2
    dl = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    du = (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
    lo = theta - math.sqrt(max(dl, 0.0))
    hi = theta + math.sqrt(max(du, 0.0))
    return max(-1.0, lo), min(1.0, hi)


def paired_counts(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> tuple[int, int, int, int]:
    """(a, b, c, d) of the paired table: both, A only, B only, neither.

    >>> paired_counts([True, True, False, False], [True, False, True, False])
    (1, 1, 1, 1)
    """
    if len(correct_a) != len(correct_b):
        raise ValueError(f"paired lists differ in length: {len(correct_a)} != {len(correct_b)}")
    a = b = c = d = 0
    for x, y in zip(correct_a, correct_b, strict=True):
        if x and y:
            a += 1
        elif x:
            b += 1
        elif y:
            c += 1
        else:
            d += 1
    return a, b, c, d


def compare_paired(correct_a: Sequence[bool], correct_b: Sequence[bool], confidence: float = 0.95) -> dict:
    """Accuracy difference A - B on the same items with its interval and exact McNemar p.

    >>> r = compare_paired([True] * 8 + [False] * 2, [True] * 2 + [False] * 8)
    >>> r["delta"], r["b"], r["c"], round(r["p_value"], 4)
    (0.6, 6, 0, 0.0312)
    """
    a, b, c, d = paired_counts(correct_a, correct_b)
    n = a + b + c + d
    lo, hi = paired_difference_interval(a, b, c, d, confidence)
    return {
        "n": n,
        "accuracy_a": (a + b) / n if n else 0.0,
        "accuracy_b": (a + c) / n if n else 0.0,
        "delta": (b - c) / n if n else 0.0,
        "ci95": [lo, hi] if confidence == 0.95 else None,
        "ci": [lo, hi],
        "confidence": confidence,
        "p_value": mcnemar_exact(b, c),
        "test": "exact McNemar (two-sided binomial on discordant pairs)",
        "interval": "Newcombe (1998) method 10, paired Wilson score",
        "a": a,
        "b": b,
        "c": c,
        "d": d,
    }
