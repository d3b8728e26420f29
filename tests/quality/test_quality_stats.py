"""McNemar's exact test and the Wilson interval, against hand-worked values and computations written otherwise."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from specview.core.matrix.rates import wilson as matrix_wilson
from specview.core.quality.stats import mcnemar_exact, wilson


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
    stats = pytest.importorskip("scipy.stats")
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
    stats = pytest.importorskip("scipy.stats")
    for k, n in [(1, 3), (7, 20), (163, 164), (50, 257)]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson(k, n) == (pytest.approx(ci.low, abs=1e-9), pytest.approx(ci.high, abs=1e-9))
