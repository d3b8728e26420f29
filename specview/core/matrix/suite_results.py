"""Divergence rates read from a suite result file (``specview matrix --suite``), for the prescription's
comparison line: tolerant of where a file puts its settings, and matched to a measured setting."""

from __future__ import annotations

from typing import Any, Sequence

from ..trace import read_json
from .rates import wilson  # the one 95% Wilson interval the matrix's rates use too


_RATE_KEYS = ("divergence_rate", "diverged_rate", "rate", "diverged_share", "share")
_K_KEYS = ("diverged", "n_diverged", "k", "forks")
_N_KEYS = ("n", "runs", "total", "cells", "n_cells", "prompts")


def _first(d: dict, keys: Sequence[str]) -> Any:
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    return None


def _setting_of(d: dict) -> dict[str, Any]:
    """target / n_max / flash_attn / draft from an entry, wherever the file put them."""
    out: dict[str, Any] = {}
    for src in (d, d.get("setting") or {}, d.get("params") or {}, d.get("key") if isinstance(d.get("key"), dict)
                else {}, d.get("config") or {}):
        if not isinstance(src, dict):
            continue
        for k, names in (("target", ("target",)), ("n_max", ("n_max",)), ("flash_attn", ("flash_attn",)),
                         ("draft", ("draft", "drafter"))):
            if k not in out:
                v = _first(src, names)
                if v is not None:
                    out[k] = v
        eng = src.get("engine")
        if isinstance(eng, dict) and "flash_attn" not in out and eng.get("flash_attn") is not None:
            out["flash_attn"] = eng["flash_attn"]
    return out


def suite_rates(path: str) -> list[dict[str, Any]]:
    """Per-setting divergence rates from a suite result file, read tolerantly.

    Entries under ``rates`` (a list, or a mapping of entries) with a rate
    field are used as they are; failing that, the ``cells`` are grouped by
    setting and counted.  Each result: target, n_max, flash_attn, draft (where
    known), rate, k, n, interval.
    """
    d = read_json(path)
    out: list[dict[str, Any]] = []
    rates = d.get("rates") if isinstance(d, dict) else None
    entries: list[Any] = []
    if isinstance(rates, list):
        entries = rates
    elif isinstance(rates, dict):
        for v in rates.values():
            entries.extend(v if isinstance(v, list) else [v])
    for e in entries:
        if not isinstance(e, dict):
            continue
        rate, k, n = _first(e, _RATE_KEYS), _first(e, _K_KEYS), _first(e, _N_KEYS)
        if isinstance(rate, dict):  # {"value": .., "low": .., "high": ..}
            e = {**e, **rate}
            rate = _first(rate, ("value", "rate", "p"))
        if not isinstance(rate, (int, float)) and isinstance(k, int) and isinstance(n, int) and n > 0:
            rate = k / n
        if not isinstance(rate, (int, float)):
            continue
        ci = _first(e, ("interval", "ci", "wilson", "ci95"))
        if not (isinstance(ci, (list, tuple)) and len(ci) == 2):
            lo, hi = _first(e, ("low", "lo", "lower")), _first(e, ("high", "hi", "upper"))
            ci = (lo, hi) if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) else (
                wilson(k, n) if isinstance(k, int) and isinstance(n, int) else None)
        out.append({**_setting_of(e), "rate": float(rate), "k": k, "n": n, "interval": ci})
    if out or not isinstance(d, dict) or not isinstance(d.get("cells"), list):
        return out
    groups: dict[tuple, list[bool]] = {}
    for c in d["cells"]:
        if not isinstance(c, dict) or c.get("identical") is None:
            continue
        s = _setting_of(c)
        key = tuple(sorted((k, str(v)) for k, v in s.items()))
        groups.setdefault(key, []).append(not c["identical"])
    for key, div in groups.items():
        k, n = sum(div), len(div)
        out.append({**dict(key), "rate": k / n, "k": k, "n": n, "interval": wilson(k, n)})
    return out


def match(rates: list[dict[str, Any]], m: Any, draft: str) -> dict[str, Any] | None:
    for r in rates:
        if str(r.get("target")) != m.target:
            continue
        if "n_max" in r and str(r["n_max"]) != str(m.n_max):
            continue
        if "flash_attn" in r and str(r["flash_attn"]) != str(m.settings.flash_attn):
            continue
        if "draft" in r and str(r["draft"]) != draft:
            continue
        return r
    return None


def rate_text(r: dict[str, Any], source: str) -> str:
    s = f"divergence rate {100 * r['rate']:.0f}%"
    if r.get("k") is not None and r.get("n") is not None:
        s += f" ({r['k']} of {r['n']} prompts)"
    ci = r.get("interval")
    if ci and all(isinstance(x, (int, float)) for x in ci):
        s += f", 95% interval {100 * ci[0]:.0f}-{100 * ci[1]:.0f}%"
    return s + f" in {source}"
