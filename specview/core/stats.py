"""Statistics vocabulary every room shares: the 95% z, the Wilson score interval of a rate, and a share in words.

One definition, imported by whoever states a rate with its interval: the
quality suite's pass rates (:mod:`specview.core.quality.stats`, which the
matrix's fork rates use through it) and the near-tie densities of
:mod:`specview.core.diagnose.ties`.  It imports nothing of specview's, so any
room may import it without closing a cycle between sibling packages
(``diagnose`` may not import ``quality``, whose runner reaches the session that
composes ``diagnose``).
"""

from __future__ import annotations

import math

#: the z of a two-sided 95% interval
Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``k`` successes out of ``n`` (``(0, 1)`` when ``n`` is 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(0.0, p * (1 - p)) / n + z * z / (4 * n * n)) / denom
    # at 0 of n and n of n the interval ends exactly at 0 and 1 (rounding would leave it a hair short)
    return (0.0 if k <= 0 else max(0.0, centre - half)), (1.0 if k >= n else min(1.0, centre + half))


def pct(x: float | None) -> str:
    """A share as a percentage with one decimal (``17.5%``); ``n/a`` for none (or a share that is not finite)."""
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


__all__ = ["Z95", "pct", "wilson"]
