"""components/evaluation/stats.py against published values and basic properties.

    pytest -q tests/test_evaluate_stats.py
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components.evaluation.stats import (
    compare_paired,
    compare_paired_means,
    majority_vote,
    mcnemar_exact,
    mean_interval,
    paired_counts,
    paired_difference_interval,
    pass_at_k,
    wilson_interval,
    z_value,
)

# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table II,
# method 3 (Wilson score without continuity correction).
WILSON_CASES = [
    (81, 263, (0.2553, 0.3662)),
    (15, 148, (0.0624, 0.1605)),
    (0, 20, (0.0, 0.1611)),
    (1, 29, (0.0061, 0.1718)),
]


@pytest.mark.parametrize("k,n,expected", WILSON_CASES)
def test_wilson_matches_newcombe_table(k, n, expected):
    lo, hi = wilson_interval(k, n)
    assert (round(lo, 4), round(hi, 4)) == expected


@pytest.mark.parametrize(
    "b,c,expected",
    [
        (0, 0, 1.0),  # no discordant pairs: no evidence either way
        (5, 5, 1.0),
        (1, 7, 0.0703125),  # 2 * (1 + 8) / 2**8
        (0, 6, 0.03125),  # 2 / 2**6
        (6, 16, 0.052479),  # Cavo et al. 2012 in Fagerland, Lydersen & Laake (2017), ch. 8
        (0, 1, 1.0),
    ],
)
def test_mcnemar_exact_gives_the_published_p_values_either_way_round(b, c, expected):
    assert mcnemar_exact(b, c) == pytest.approx(expected, abs=5e-7)
    assert mcnemar_exact(c, b) == mcnemar_exact(b, c)


def test_mcnemar_matches_scipy_binomtest():
    scipy_stats = pytest.importorskip("scipy.stats")
    for b in range(0, 25, 3):
        for c in range(0, 25, 4):
            if b + c == 0:
                continue
            ref = scipy_stats.binomtest(min(b, c), b + c, 0.5).pvalue
            assert mcnemar_exact(b, c) == pytest.approx(ref, rel=1e-9, abs=1e-15)


def test_paired_interval_matches_fagerland_cavo_example():
    # Newcombe's square-and-add (method 10) for the Cavo et al. (2012) table 59/6/16/80:
    # estimate -0.0621, 95% CI -0.1186 to -0.0046 (Fagerland et al. 2017, ch. 8).
    lo, hi = paired_difference_interval(59, 6, 16, 80)
    assert (round(lo, 4), round(hi, 4)) == (-0.1186, -0.0046)


def test_z_value_is_the_normal_quantile_and_bad_counts_are_rejected():
    assert z_value(0.95) == pytest.approx(1.959964, abs=1e-6)
    with pytest.raises(ValueError):
        wilson_interval(5, 3)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)
    with pytest.raises(ValueError):
        paired_counts([True], [True, False])


def test_compare_paired_on_hand_made_items():
    a = [True, True, True, False, False, True, True, False]
    b = [True, False, False, False, True, False, True, False]
    r = compare_paired(a, b)
    assert (r["a"], r["b"], r["c"], r["d"]) == (2, 3, 1, 2)
    assert r["n"] == 8
    assert r["accuracy_a"] == 5 / 8 and r["accuracy_b"] == 3 / 8
    assert r["delta"] == pytest.approx(2 / 8)
    assert r["p_value"] == pytest.approx(2 * (1 + 4) / 16)  # b=3, c=1: 2 * P(X <= 1 | 4)
    lo, hi = r["ci95"]
    assert lo < r["delta"] < hi


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=60))
def test_paired_interval_holds_the_delta_and_flips_with_the_order(pairs):
    a = [x for x, _ in pairs]
    b = [y for _, y in pairs]
    r = compare_paired(a, b)
    lo, hi = r["ci95"]
    assert -1.0 <= lo <= r["delta"] + 1e-12 and r["delta"] - 1e-12 <= hi <= 1.0
    swapped = compare_paired(b, a)
    assert swapped["delta"] == pytest.approx(-r["delta"])
    assert swapped["ci95"][0] == pytest.approx(-hi) and swapped["ci95"][1] == pytest.approx(-lo)
    assert 0.0 < r["p_value"] <= 1.0 and math.isfinite(r["p_value"])


# --------------------------------------------------------------------------- sampled answers


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(nck):
    """Chen et al.'s estimator equals its definition: over every k of the n samples, the share
    that holds at least one correct one."""
    from itertools import combinations

    n, c, k = nck
    samples = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    expected = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_known_values_and_rejects_bad_counts():
    # HumanEval's numbers in Chen et al. use n = 200; pass@1 is then c / n.
    assert pass_at_k(200, 57, 1) == pytest.approx(57 / 200)
    assert pass_at_k(8, 8, 8) == 1.0 and pass_at_k(8, 0, 1) == 0.0
    for bad in ((4, 5, 1), (4, 1, 0), (4, 1, 5)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_majority_vote_breaks_ties_by_first_appearance():
    assert majority_vote(["3", "4", "4", "3"]) == ("3", 2)
    assert majority_vote([None, "4", None, None]) == ("4", 1)
    assert majority_vote([]) == (None, 0)


def test_mean_interval_is_the_normal_interval_over_items():
    scipy_stats = pytest.importorskip("scipy.stats")
    values = [0.0, 0.125, 0.5, 0.5, 0.875, 1.0, 0.25, 0.0]
    n = len(values)
    mean = sum(values) / n
    se = scipy_stats.sem(values)
    lo, hi = mean_interval(values)
    assert lo == pytest.approx(mean - 1.959963985 * se) and hi == pytest.approx(mean + 1.959963985 * se)
    assert mean_interval([1.0] * 10) == wilson_interval(10, 10)  # no spread: Wilson, not a point
    assert mean_interval([0.5]) == (0.0, 1.0)


def test_compare_paired_means_matches_a_z_test_on_differences():
    scipy_stats = pytest.importorskip("scipy.stats")
    a = [1.0, 0.75, 0.5, 0.875, 0.25, 1.0, 0.625, 0.5]
    b = [0.5, 0.75, 0.25, 0.5, 0.25, 0.75, 0.5, 0.125]
    r = compare_paired_means(a, b)
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    z = (sum(diffs) / len(diffs)) / scipy_stats.sem(diffs)
    assert r["delta"] == pytest.approx(sum(diffs) / len(diffs))
    assert r["p_value"] == pytest.approx(2 * scipy_stats.norm.sf(abs(z)))
    assert r["ci95"][0] < r["delta"] < r["ci95"][1]
    same = compare_paired_means([0.5, 0.25], [0.5, 0.25])
    assert (same["delta"], same["p_value"]) == (0.0, 1.0)
    with pytest.raises(ValueError):
        compare_paired_means([1.0], [1.0, 0.0])
