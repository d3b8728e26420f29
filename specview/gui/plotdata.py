"""The numbers the plots draw: growing arrays for a streaming run, and a diagnosis' series read defensively."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


class Series:
    """A growing float array: amortized appends, views without copies (a streaming run's margins and rounds)."""

    def __init__(self, capacity: int = 1024):
        self._a = np.empty(capacity, float)
        self.n = 0

    def extend(self, values: Sequence[float]) -> None:
        k = len(values)
        if self.n + k > len(self._a):
            bigger = np.empty(max(2 * len(self._a), self.n + k), float)
            bigger[:self.n] = self._a[:self.n]
            self._a = bigger
        self._a[self.n:self.n + k] = values
        self.n += k

    def view(self) -> np.ndarray:
        return self._a[:self.n]


def _finite(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def envelope_series(env: Any) -> tuple[np.ndarray, np.ndarray]:
    """Read a diagnosis envelope's per-position series defensively.

    Accepts ``{"series": [v0, v1, ...]}``, ``{"series": [{"index"|"position": i, "max"|"gap"|"value": v}, ...]}``,
    ``{"series": {"i": v}}`` or ``{"series": [[i, v], ...]}``; anything else gives empty arrays.
    """
    if not isinstance(env, dict):
        return np.empty(0), np.empty(0)
    s = env.get("series")
    xs: list[float] = []
    ys: list[float] = []
    if isinstance(s, dict):
        for k, v in s.items():
            try:
                xs.append(float(k))
            except (TypeError, ValueError):
                continue
            ys.append(_value(v))
    elif isinstance(s, list):
        for i, v in enumerate(s):
            if isinstance(v, dict):
                pos = v.get("index", v.get("position", v.get("pos", i)))
                xs.append(_finite(pos))
                ys.append(_value(v))
            elif isinstance(v, (list, tuple)) and len(v) >= 2:
                xs.append(_finite(v[0]))
                ys.append(_finite(v[1]))
            else:
                xs.append(float(i))
                ys.append(_finite(v))
    x = np.array(xs, float)
    y = np.array(ys, float)
    ok = np.isfinite(x) & np.isfinite(y)
    return x[ok], y[ok]


def _value(v: Any) -> float:
    if isinstance(v, dict):
        for key in ("max", "gap", "value", "p95", "delta"):
            if key in v:
                return _finite(v[key])
        return math.nan
    return _finite(v)


def at_risk_positions(v: Any) -> list[int]:
    out: list[int] = []
    if not isinstance(v, list):
        return out
    for item in v:
        if isinstance(item, dict):
            item = item.get("index", item.get("position", item.get("pos")))
        try:
            out.append(int(item))
        except (TypeError, ValueError):
            continue
    return out


def track_arrays(delta: Sequence[float | None], kl: Sequence[float | None]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, Δ-margin, x, KL) of a run's per-token tracks, each pair keeping only the finite values."""
    d = np.array([_finite(v) for v in delta], float)
    k = np.array([_finite(v) for v in kl], float)
    xd, xk = np.arange(len(d), dtype=float), np.arange(len(k), dtype=float)
    okd, okk = np.isfinite(d), np.isfinite(k)
    return xd[okd], d[okd], xk[okk], k[okk]
