"""McNemar's exact test on tables of every size: the time each takes, and its agreement with an exact sum.

    python bench/bench_stats.py [--exact-up-to N]

For each table (b, c) it prints the time of ``mcnemar_exact`` (best of a few
calls) and, where an exact rational sum is cheap enough (``b + c`` up to
``--exact-up-to``, default 6000), that sum's own time and the relative
difference between the two: the exact sum is the computation the test used
to be (``2 * sum(C(n, i)) / 2^n`` in integers), so its time is what a table
of that size used to cost.  The goal: every table well under a second.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specview.core.quality.stats import EXACT_MAX, SADDLE_MIN, mcnemar_exact  # noqa: E402

TABLES = [(5, 17), (300, 340), (1000, 1000), (1500, 1450), (3000, 2900), (10_000, 10_000), (10_000, 9_700),
          (50_000, 49_000), (10**6, 10**6 - 2_500), (10**8, 10**8 - 10**4), (SADDLE_MIN // 2 - 1, SADDLE_MIN // 2 - 10**5),
          (SADDLE_MIN // 2, SADDLE_MIN // 2 - 7 * 10**5), (10**15, 10**15 - 4 * 10**7), (10**30, 10**30 - 10**15),
          (0, 10**9), (12, 10**12)]


def exact_sum(b: int, c: int) -> float:
    """The test computed the way it was before: every term a fresh binomial coefficient, a Fraction at the end."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, float(Fraction(2 * tail, 2 ** n)))


def best(fn, *args, repeats: int = 3) -> tuple[float, float]:
    times, value = [], 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn(*args)
        times.append(time.perf_counter() - t0)
    return min(times), value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exact-up-to", type=int, default=6000, help="time the exact rational sum up to this b + c")
    args = ap.parse_args()
    print(f"exact integer tail up to b + c = {EXACT_MAX}; saddle point from {SADDLE_MIN:.0e} (near the mean)")
    print(f"{'b':>32} {'c':>32} {'p':>12} {'time':>10} {'exact sum':>10} {'rel diff':>9}")
    slowest = 0.0
    for b, c in TABLES:
        dt, p = best(mcnemar_exact, b, c)
        slowest = max(slowest, dt)
        tail = ""
        if b + c <= args.exact_up_to:
            et, ep = best(exact_sum, b, c, repeats=1)
            rel = abs(p - ep) / ep if ep else abs(p)
            tail = f" {et:>9.3f}s {rel:>9.1e}"
        print(f"{b:>32} {c:>32} {p:>12.4e} {dt * 1000:>8.2f}ms{tail}")
    print(f"slowest table: {slowest * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
