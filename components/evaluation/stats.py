"""Small-sample statistics for evaluation reports (standard library only).

- `wilson_interval(k, n)`: score interval for one accuracy (Wilson 1927).
- `mcnemar_exact(b, c)`: exact two-sided McNemar test on the discordant pairs of a
  paired comparison (a binomial test of b against b + c at p = 0.5).
- `paired_difference_interval(a, b, c, d)`: interval for the difference of two
  accuracies measured on the same items (Newcombe 1998, method 10: Wilson score
  intervals combined through the phi correlation of the pairs).
- `compare_paired(correct_a, correct_b)`: the three above from two boolean lists;
  this is what `reports/eval/comparison.json` records for each pair of models.
- `pass_at_k(n, c, k)`: the unbiased pass@k estimator of Chen et al. (2021) from n samples
  of which c are correct.
- `majority_vote(answers)`: the most frequent answer (maj@k), ties to the earliest.
- `mean_interval(values)` / `compare_paired_means(a, b)`: a normal interval for a mean of
  per-item values in [0, 1] (mean sampled accuracy) and the paired difference of two.

Used by evaluation (components/evaluation/scoring.py) and the promotion gate; no numpy/scipy so that it
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


# --------------------------------------------------------------------------- sampled answers


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021, eq. 1): 1 - C(n - c, k) / C(n, k), the chance that k of
    the n samples drawn without replacement hold at least one of the c correct ones.

    >>> pass_at_k(8, 0, 8), pass_at_k(8, 1, 8), pass_at_k(8, 2, 1)
    (0.0, 1.0, 0.25)
    >>> round(pass_at_k(10, 3, 2), 4)   # 1 - C(7,2)/C(10,2) = 1 - 21/45
    0.5333
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_vote(answers: Sequence[str | None]) -> tuple[str | None, int]:
    """(most frequent answer, its count) among the answers given; None counts as no vote. Ties go
    to the answer seen first, so the vote does not depend on anything but the samples' order.

    >>> majority_vote(["18", None, "20", "20", "18"])
    ('18', 2)
    >>> majority_vote([None, None])
    (None, 0)
    """
    counts: dict[str, int] = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
    if not counts:
        return None, 0
    best = max(counts.values())
    return next(a for a in counts if counts[a] == best), best  # dicts keep first-seen order


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Normal (CLT) interval for the mean of per-item values in [0, 1], over items: the k samples of
    one item are correlated, the items are not, so the item is the unit. Where every item has the
    same value (all 0 or all 1, typically) the normal interval collapses to a point; there the
    Wilson interval of the items is used instead. (0.0, 1.0) below 2 items.

    >>> [round(x, 4) for x in mean_interval([0.0, 0.25, 0.5, 0.75, 1.0])]
    [0.1535, 0.8465]
    >>> mean_interval([0.0] * 20) == wilson_interval(0, 20)
    True
    """
    n = len(values)
    if n < 2:
        return 0.0, 1.0
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    if sd == 0:
        return wilson_interval(round(mean * n), n, confidence)
    half = z_value(confidence) * sd / math.sqrt(n)
    return max(0.0, mean - half), min(1.0, mean + half)


def compare_paired_means(values_a: Sequence[float], values_b: Sequence[float], confidence: float = 0.95) -> dict:
    """Difference of two per-item means on the same items (A - B), with a normal interval over the
    item differences and a two-sided z test (the paired analysis of mean sampled accuracy).

    >>> r = compare_paired_means([1.0, 0.5, 0.5, 1.0], [0.5, 0.5, 0.0, 0.5])
    >>> r["delta"], [round(x, 4) for x in r["ci95"]], round(r["p_value"], 4)
    (0.375, [0.13, 0.62], 0.0027)
    """
    if len(values_a) != len(values_b):
        raise ValueError(f"paired lists differ in length: {len(values_a)} != {len(values_b)}")
    n = len(values_a)
    diffs = [a - b for a, b in zip(values_a, values_b, strict=True)]
    delta = sum(diffs) / n if n else 0.0
    sd = math.sqrt(sum((d - delta) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    se = sd / math.sqrt(n) if n else 0.0
    if se > 0:
        half = z_value(confidence) * se
        lo, hi = max(-1.0, delta - half), min(1.0, delta + half)
        p = 2.0 * (1.0 - NormalDist().cdf(abs(delta) / se))
    else:  # every item differs by the same amount (or there are fewer than 2 items)
        lo, hi = (delta, delta) if n > 1 else (-1.0, 1.0)
        p = 1.0 if delta == 0 or n < 2 else 0.0
    return {
        "n": n,
        "accuracy_a": sum(values_a) / n if n else 0.0,
        "accuracy_b": sum(values_b) / n if n else 0.0,
        "delta": delta,
        "ci95": [lo, hi] if confidence == 0.95 else None,
        "ci": [lo, hi],
        "confidence": confidence,
        "p_value": p,
        "test": "two-sided z test on the per-item differences",
        "interval": "normal, over per-item differences",
    }
