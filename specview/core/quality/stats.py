"""The statistics of a paired comparison: McNemar's exact test and the Wilson interval of a pass rate.

Both arms answer the same items, so their outcomes are paired: an item both
pass or both fail says nothing about which arm is better; only the discordant
items do (``b`` passed by vanilla alone, ``c`` by the speculative arm alone).
Under "speculation changes nothing" each discordant item is a fair coin, so
McNemar's exact test is the two-sided binomial test of ``b`` against
Binomial(b + c, 1/2).

It stays fast for any table.  Up to :data:`EXACT_MAX` discordant items the
tail is summed in integers (exact); above, the largest term of the tail comes
from Loader's saddle-point form of the binomial probability (the one R's
``dbinom`` uses: accurate to a few units of the last place, however large the
counts) and the rest of the tail is summed as ratios of it, stopping where the
terms no longer change the sum; past :data:`SADDLE_MIN` discordant items, where
even that sum would take seconds, the tail is Daniels' saddle-point
approximation with the lattice correction (it and the sum agree to about 1e-12
there, and its error shrinks as 1 / n).  Any table takes well under a second;
``bench/bench_stats.py`` prints the times.
"""

from __future__ import annotations

import math
from fractions import Fraction

from ..stats import Z95, wilson  # the one Wilson interval (core/stats.py), stated here with the pass rates it gives

#: up to this many discordant items the tail is summed exactly, in integers
EXACT_MAX = 2000
#: from this many discordant items on, the tail is Daniels' saddle-point approximation
SADDLE_MIN = 10**11

_LN_2PI = math.log(2 * math.pi)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p: P(a split of the ``b + c`` discordant pairs at least as uneven as this one)
    under Binomial(b + c, 1/2), i.e. ``min(1, 2 * P(X <= min(b, c)))``; 1.0 when there is no discordant pair."""
    for name, v in (("b", b), ("c", c)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"mcnemar_exact: {name} must be a count (an integer >= 0), got {v!r}")
    n, k = b + c, min(b, c)
    if n == 0 or 2 * k >= n - 1:  # the most even split there is: every split is at least as uneven
        return 1.0
    if n <= EXACT_MAX:
        return min(1.0, float(Fraction(2 * _tail_int(n, k), 2 ** n)))
    if n >= SADDLE_MIN and 4 * k >= n:  # near the mean the sum would take seconds; far from it, a few terms
        return min(1.0, 2.0 * _tail_saddle(n, k))
    return min(1.0, 2.0 * _tail_float(n, k))


def _tail_int(n: int, k: int) -> int:
    """sum_{i <= k} C(n, i), each term from the one before (exact)."""
    term = total = 1
    for i in range(1, k + 1):
        term = term * (n - i + 1) // i
        total += term
    return total


def _tail_float(n: int, k: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), k < n / 2: the largest term, then the others as its ratios."""
    top = _pmf_half(n, k)
    if top == 0.0:  # below the smallest float: so is the tail (it is at most twice its largest term here)
        return 0.0
    ratio = total = 1.0
    nf = float(n) + 1.0
    i = float(k)
    while i > 0.0:
        ratio *= i / (nf - i)
        total += ratio
        if ratio < total * 1e-17:
            break
        i -= 1.0
    return top * total


def _pmf_half(n: int, k: int) -> float:
    """C(n, k) / 2^n, accurate to a few units in the last place (Loader 2000, "Fast and accurate computation of
    binomial probabilities"): Stirling's remainders and a deviance that loses no digits near the mean."""
    if k == 0 or k == n:
        return math.ldexp(1.0, -n) if n < 1100 else math.exp(-n * math.log(2.0))
    half = n / 2.0
    lc = (_stirlerr(n) - _stirlerr(k) - _stirlerr(n - k) - _bd0(float(k), half) - _bd0(float(n - k), half))
    lf = _LN_2PI + math.log(k) + math.log1p(-k / n)
    return math.exp(lc - 0.5 * lf)


_S0, _S1, _S2, _S3, _S4 = 1 / 12, 1 / 360, 1 / 1260, 1 / 1680, 1 / 1188


def _stirlerr(n: int) -> float:
    """log(n!) - log(sqrt(2 pi n) (n / e)^n), n >= 1."""
    if n <= 15:
        return math.lgamma(n + 1.0) - (n + 0.5) * math.log(n) + n - 0.5 * _LN_2PI
    nn = float(n) * n
    if n > 500:
        return (_S0 - _S1 / nn) / n
    if n > 80:
        return (_S0 - (_S1 - _S2 / nn) / nn) / n
    if n > 35:
        return (_S0 - (_S1 - (_S2 - _S3 / nn) / nn) / nn) / n
    return (_S0 - (_S1 - (_S2 - (_S3 - _S4 / nn) / nn) / nn) / nn) / n


def _bd0(x: float, m: float, d: float | None = None) -> float:
    """x log(x / m) + m - x, without cancellation when x is near m (``d``: x - m, when it is known exactly)."""
    d = x - m if d is None else d
    if abs(d) < 0.1 * (x + m):
        v = d / (x + m)
        s = d * v
        ej = 2 * x * v
        v2 = v * v
        j = 1
        while True:
            ej *= v2
            s1 = s + ej / (2 * j + 1)
            if s1 == s:
                return s1
            s, j = s1, j + 1
    return x * math.log(x / m) + m - x


def _tail_saddle(n: int, k: int) -> float:
    """P(X <= k) = P(X >= n - k) for X ~ Binomial(n, 1/2), n / 4 <= k < n / 2, by Daniels' (1987) second-order
    continuity-corrected Lugannani-Rice formula: relative error O(1 / n), negligible at the counts it is used for.
    The distance from the mean is taken in integers, so counts past 2^53 lose nothing there."""
    delta = (n - 2 * k - 1) / 2  # m - n / 2 for the corrected point m = n - k - 1/2 of the upper tail
    half = n / 2
    m, rest = half + delta, half - delta  # m and n - m
    w = math.sqrt(2.0 * (_bd0(m, half, delta) + _bd0(rest, half, -delta)))  # 2 (s m - K(s)) at K'(s) = m
    s = math.log1p(2.0 * delta / rest)  # the saddle point: e^s = m / (n - m)
    u = 2.0 * math.sinh(s / 2.0) * math.sqrt(m * rest / n)  # 2 sinh(s / 2) sqrt(K''(s))
    if w < 1e-6:  # at the mean: the tail of a symmetric lattice variable past its middle
        return 0.5
    upper = 0.5 * math.erfc(w / math.sqrt(2.0))
    dens = math.exp(-0.5 * w * w) / math.sqrt(2 * math.pi)
    return upper + dens * (1.0 / u - 1.0 / w)


__all__ = ["Z95", "mcnemar_exact", "wilson"]
