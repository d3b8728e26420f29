"""McNemar's exact test and the Wilson interval, against hand-worked values and computations written otherwise."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from specview.core.matrix.rates import wilson as matrix_wilson
from specview.core.quality.stats import EXACT_MAX, SADDLE_MIN, mcnemar_exact, wilson


def binomial_two_sided(b: int, c: int) -> Fraction:
    """The exact two-sided binomial p of b against Binomial(b + c, 1/2), summed as fractions over every outcome
    no more likely than the observed one (the definition scipy's binomtest uses), not as a doubled tail."""
    n = b + c
    if n == 0:
        return Fraction(1)
    pmf = [Fraction(math.comb(n, i), 2 ** n) for i in range(n + 1)]
    return min(Fraction(1), sum(q for q in pmf if q <= pmf[b]))


# (b, c, p) worked by hand: 2 * sum_{i <= min(b, c)} C(n, i) / 2^n
HAND = [
    (0, 0, 1.0),
    (0, 1, 1.0),                   # 2 * 1/2
    (0, 5, 2 / 32),                # 0.0625: five discordant pairs one way is not yet below 0.05
    (0, 6, 2 / 64),                # 0.03125: six is
    (6, 0, 2 / 64),
    (1, 7, 2 * (1 + 8) / 256),     # 0.0703125
    (2, 10, 2 * (1 + 12 + 66) / 4096),  # 0.03857421875
    (5, 5, 1.0),
]


@pytest.mark.parametrize("b,c,p", HAND)
def test_mcnemar_matches_the_hand_worked_table(b, c, p):
    assert mcnemar_exact(b, c) == pytest.approx(p, abs=1e-15)


@pytest.mark.parametrize("b,c", [(b, c) for b in range(0, 13) for c in range(0, 13)] + [(40, 71), (3, 250)])
def test_mcnemar_matches_an_independent_exact_computation(b, c):
    assert mcnemar_exact(b, c) == pytest.approx(float(binomial_two_sided(b, c)), rel=1e-12)


def test_mcnemar_against_scipy():
    from scipy import stats  # the dev extra installs it: an independent computation, never skipped
    for b, c in [(0, 6), (1, 7), (2, 10), (9, 4), (17, 30), (0, 0 + 1), (120, 95)]:
        assert mcnemar_exact(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9)


def test_mcnemar_refuses_what_is_not_a_count():
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="count"):
            mcnemar_exact(bad, 3)  # type: ignore[arg-type]


def test_wilson_hand_worked():
    # 0 of 10: [0, z^2 / (n + z^2)]; 10 of 10 mirrors it
    z2 = 1.959963984540054 ** 2
    assert wilson(0, 10) == (0.0, pytest.approx(z2 / (10 + z2)))
    lo, hi = wilson(10, 10)
    assert hi == 1.0 and lo == pytest.approx(10 / (10 + z2))
    # 5 of 10: centre 1/2, half-width z * sqrt(1/40 + z^2/400) / (1 + z^2/10)
    half = 1.959963984540054 * math.sqrt(0.25 / 10 + z2 / 400) / (1 + z2 / 10)
    assert wilson(5, 10) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    assert wilson(0, 0) == (0.0, 1.0)


def test_wilson_agrees_with_the_matrix_rates_and_scipy():
    for k, n in [(0, 1), (1, 3), (7, 20), (20, 20), (163, 164), (50, 257)]:
        assert wilson(k, n) == pytest.approx(matrix_wilson(k, n), abs=1e-12)
    from scipy import stats  # the dev extra installs it: an independent computation, never skipped
    for k, n in [(1, 3), (7, 20), (163, 164), (50, 257)]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson(k, n) == (pytest.approx(ci.low, abs=1e-9), pytest.approx(ci.high, abs=1e-9))


# -- large tables: the float and saddle-point paths, against exact sums and independent computations --------------
def doubled_tail(b: int, c: int) -> Fraction:
    """2 * P(X <= min(b, c)) under Binomial(b + c, 1/2), in exact rationals (fresh coefficients, no recurrence)."""
    n = b + c
    return min(Fraction(1), Fraction(2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)), 2 ** n))


@pytest.mark.parametrize("n", [EXACT_MAX - 1, EXACT_MAX, EXACT_MAX + 1, EXACT_MAX + 701])
def test_mcnemar_past_the_exact_sum_still_matches_it(n):
    sd = math.sqrt(n) / 2
    for k in sorted({0, 1, 7, n // 5, int(n / 2 - 9 * sd), int(n / 2 - 3 * sd), int(n / 2 - sd), n // 2 - 2}):
        assert mcnemar_exact(k, n - k) == pytest.approx(float(doubled_tail(k, n - k)), rel=1e-12, abs=0)


def _mp_doubled_tail(mp, n: int, k: int):
    """2 * P(X <= k) at 40 digits: mpmath's own C(n, k) / 2^n, then the terms below it until they stop mattering."""
    term = mp.binomial(n, k) / mp.mpf(2) ** n
    total, i = term, k
    while i > 0 and term > total * mp.mpf(10) ** -30:
        term = term * i / (n - i + 1)
        total, i = total + term, i - 1
    return 2 * total


def test_mcnemar_on_hundreds_of_thousands_agrees_with_mpmath():
    import mpmath as mp  # the dev extra installs it
    with mp.workdps(40):
        for n in (9_999, 99_000, 400_001):
            sd = math.sqrt(n) / 2
            for z in (0.05, 1, 2.5, 6, 15):
                k = int(n / 2 - z * sd)
                assert mcnemar_exact(k, n - k) == pytest.approx(float(_mp_doubled_tail(mp, n, k)), rel=1e-12), (n, k)


def test_mcnemar_the_issue_tables_against_scipy():
    from scipy import stats  # the dev extra installs it: an independent computation, never skipped
    for b, c in [(10_000, 10_000), (50_000, 49_000), (10_000, 9_700), (3, 40_000)]:
        assert mcnemar_exact(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9, abs=1e-300)


def test_the_saddle_point_and_the_sum_agree_where_one_hands_over_to_the_other():
    from specview.core.quality.stats import _tail_float, _tail_saddle

    n = SADDLE_MIN
    for z in (0.5, 3, 9):
        k = int(n / 2 - z * math.sqrt(n) / 2)
        assert _tail_saddle(n, k) == pytest.approx(_tail_float(n, k), rel=1e-11), z


def test_mcnemar_on_counts_past_floats_is_the_normal_limit():
    # b + c = 2e30: the symmetric binomial is normal to O(1/n); the distance from the mean is taken in integers
    b, c = 10**30, 10**30 - 10**15
    z = (b - c) / math.sqrt(b + c)
    assert mcnemar_exact(b, c) == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-9)
    assert mcnemar_exact(0, 10**18) == 0.0 and mcnemar_exact(10**18, 10**18) == 1.0


def test_mcnemar_falls_as_the_split_grows_more_uneven():
    n = 50_001
    ps = [mcnemar_exact(k, n - k) for k in range(n // 2, n // 2 - 1500, -37)]
    assert all(a >= b for a, b in zip(ps, ps[1:])) and ps[0] == 1.0 and ps[-1] < 1e-10
