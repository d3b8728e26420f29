"""The statistics of a paired comparison: McNemar's exact test and the Wilson interval of a pass rate.

Both arms answer the same items, so their outcomes are paired: an item both
pass or both fail says nothing about which arm is better; only the discordant
items do (``b`` passed by vanilla alone, ``c`` by the speculative arm alone).
Under "speculation changes nothing" each discordant item is a fair coin, so
McNemar's exact test is the two-sided binomial test of ``b`` against
Binomial(b + c, 1/2).  It is computed with integers (exact binomial sums), so
it holds for any number of items without a normal approximation.
"""

from __future__ import annotations

import math
from fractions import Fraction

#: the z of a two-sided 95% interval
Z95 = 1.959963984540054


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p: P(a split of the ``b + c`` discordant pairs at least as uneven as this one)
    under Binomial(b + c, 1/2), i.e. ``min(1, 2 * P(X <= min(b, c)))``; 1.0 when there is no discordant pair."""
    for name, v in (("b", b), ("c", c)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"mcnemar_exact: {name} must be a count (an integer >= 0), got {v!r}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))  # exact, in integers
    return min(1.0, float(Fraction(2 * tail, 2 ** n)))


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``k`` passes out of ``n`` (``(0, 1)`` when ``n`` is 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(0.0, p * (1 - p)) / n + z * z / (4 * n * n)) / denom
    # at 0 of n and n of n the interval ends exactly at 0 and 1 (rounding would leave it a hair short)
    return (0.0 if k <= 0 else max(0.0, centre - half)), (1.0 if k >= n else min(1.0, centre + half))


__all__ = ["Z95", "mcnemar_exact", "wilson"]
