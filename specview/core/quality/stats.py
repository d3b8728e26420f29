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

#: the z of a two-sided 95% interval
Z95 = 1.959963984540054


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p: P(a split of the ``b + c`` discordant pairs at least as uneven as this one)
    under Binomial(b + c, 1/2), i.e. ``min(1, 2 * P(X <= min(b, c)))``; 1.0 when there is no discordant pair."""
    raise NotImplementedError


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``k`` passes out of ``n`` (``(0, 1)`` when ``n`` is 0)."""
    raise NotImplementedError


__all__ = ["Z95", "mcnemar_exact", "wilson"]
