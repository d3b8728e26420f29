"""Rates, not anecdotes: per setting, how often speculative decoding forks over many prompts.

For every setting of a matrix (all its axes but the prompt) :func:`rates`
gives, over the prompts that ran:

* the divergence rate with a 95% Wilson score interval (it stays inside
  [0, 1] and is honest at 0 of n and n of n, where the normal approximation
  collapses to a point);
* the distribution of fork positions (token indices): quartiles and a
  histogram over the run length;
* a severity histogram of the teacher-forced gaps at the forks: a fork is a
  **near-tie** when its gap is no larger than what batched-versus-single
  numerics can flip (its diagnosis' "far" threshold: four times the largest
  shift seen before the fork, and at least 2 logits, the gate one engine
  uses), and **material** when it is above; a fork nobody diagnosed has no gap;
* the same per prompt category (the suite tags each prompt with one);
* over a task suite, the paired outcomes of its answers (``answers``: both pass,
  both fail, only vanilla, only speculative, McNemar's exact p;
  :mod:`.quality`);
* where the matrix cites a kernel map, what it predicted for the setting's
  cells (``kernel_map``: the status they share, or ``mixed``, the count of
  each, and the contradictions).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..diagnose.classify import FAR_FLOOR
from ..diagnose.ties import band_label, combine, rate_text as tie_rate_text, says
from ..stats import pct
from ..quality.stats import wilson  # the Wilson interval of a rate: one formula for fork rates and pass rates
from .evidence import group_prediction, group_prediction_text
from .quality import answers, answers_text
from .summary import _setting_label, setting_key

#: edges of the gap histogram, in logits (the last bin is open: 2.0 is the gate one engine uses)
GAP_EDGES = (0.0, 0.01, 0.1, 0.5, 2.0)
SEVERITIES = ("near-tie", "material", "undiagnosed")
POSITION_BINS = 8


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def severity(cell: dict[str, Any]) -> str:
    """A fork's severity: near-tie (its gap within the cell's "far" threshold, or 2 logits where none was
    recorded), material (above it), or undiagnosed (no gap)."""
    gap = _num(cell.get("gap"))
    if gap is None:
        return "undiagnosed"
    far = _num(cell.get("far_threshold"))
    return "near-tie" if abs(gap) <= (FAR_FLOOR if far is None else far) else "material"


def gap_bin(gap: float) -> int:
    g = abs(gap)
    for i in range(len(GAP_EDGES) - 1, -1, -1):
        if g >= GAP_EDGES[i]:
            return i
    return 0


def gap_bin_labels() -> list[str]:
    e = GAP_EDGES
    return [f"{e[i]:g}–{e[i + 1]:g}" for i in range(len(e) - 1)] + [f"≥ {e[-1]:g}"]


def _quantile(xs: Sequence[int], q: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _group(cells: Sequence[dict[str, Any]], n_tokens: int) -> dict[str, Any]:
    ok = [c for c in cells if c.get("status") == "ok"]
    forks = [c for c in ok if not c.get("identical")]
    lo, hi = wilson(len(forks), len(ok))
    pos = sorted(int(c["first_mismatch"]) for c in forks if isinstance(c.get("first_mismatch"), int))
    width = max(1, math.ceil(max(n_tokens, (pos[-1] + 1) if pos else 1) / POSITION_BINS))
    hist = [0] * POSITION_BINS
    for p in pos:
        hist[min(POSITION_BINS - 1, p // width)] += 1
    sev = {s: 0 for s in SEVERITIES}
    gaps = [{s: 0 for s in SEVERITIES if s != "undiagnosed"} for _ in GAP_EDGES]
    for c in forks:
        s = severity(c)
        sev[s] += 1
        if s != "undiagnosed":
            gaps[gap_bin(_num(c.get("gap")) or 0.0)][s] += 1
    return {
        "n": len(ok),
        "forks": len(forks),
        "errors": len(cells) - len(ok),
        "rate": len(forks) / len(ok) if ok else None,
        "low": lo if ok else None,
        "high": hi if ok else None,
        "positions": {
            "values": pos,
            "min": pos[0] if pos else None,
            "q1": _quantile(pos, 0.25) if pos else None,
            "median": _quantile(pos, 0.5) if pos else None,
            "q3": _quantile(pos, 0.75) if pos else None,
            "max": pos[-1] if pos else None,
            "bin_width": width,
            "histogram": hist,
        },
        "severity": sev,
        "gaps": gaps,
        # positions in each tie band and the flips among them, over the cells' compared positions
        "ties": combine(c.get("ties") for c in ok),
    }


def _scored(g: dict[str, Any], cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A group with, over a task suite, whether its answers changed beside whether its texts forked."""
    a = answers(cells)
    if a is not None:
        g["answers"] = a
    return g


def rates(doc: dict[str, Any]) -> dict[str, Any]:
    """Per setting (and per setting and prompt category): divergence rate, interval, fork positions, gaps.

    ``doc`` is a matrix document (its cells validated); settings are listed in
    the order their first cell ran.
    """
    spec = doc.get("spec") or {}
    n_tokens = spec.get("max_tokens") if isinstance(spec.get("max_tokens"), int) else 0
    cats = {p.get("name"): p.get("category") for p in spec.get("prompts") or [] if isinstance(p, dict)}
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in doc.get("cells", []):
        groups.setdefault(setting_key(c["params"]), []).append(c)
    out = []
    for cells in groups.values():
        g = _group(cells, n_tokens)
        g["label"] = _setting_label(cells[0]["params"])
        g["params"] = {k: v for k, v in cells[0]["params"].items() if k != "prompt"}
        by_cat: dict[str, list[dict[str, Any]]] = {}
        for c in cells:
            cat = c.get("category") if isinstance(c.get("category"), str) else cats.get(c["params"].get("prompt"))
            if isinstance(cat, str):
                by_cat.setdefault(cat, []).append(c)
        g["categories"] = [_scored(dict(_group(cs, n_tokens), category=cat), cs) for cat, cs in by_cat.items()]
        kp = group_prediction(cells)
        if kp is not None:
            g["kernel_map"] = kp
        out.append(_scored(g, cells))
    return {"confidence": 0.95, "gap_edges": list(GAP_EDGES), "gap_bins": gap_bin_labels(), "settings": out}


def rate_text(g: dict[str, Any]) -> str:
    """``7 of 40 fork (17.5%, 95% CI 8.7–32.0%)``."""
    if not g["n"]:
        return "no finished cell"
    return f"{g['forks']} of {g['n']} fork ({pct(g['rate'])}, 95% CI {pct(g['low'])}–{pct(g['high'])})"


def positions_text(g: dict[str, Any]) -> str:
    p = g["positions"]
    if p["min"] is None:
        return "no fork"
    return f"fork at token {p['min']} to {p['max']}, median {p['median']:g} (quartiles {p['q1']:g}, {p['q3']:g})"


def severity_text(g: dict[str, Any]) -> str:
    s = g["severity"]
    return ", ".join(f"{s[k]} {k}" for k in SEVERITIES if s[k]) or "no fork"


def bar(count: int, most: int, width: int = 20) -> str:
    """A bar of block characters for a text histogram."""
    if count <= 0 or most <= 0:
        return ""
    return "█" * max(1, round(width * count / most))


def format_rates(r: dict[str, Any]) -> list[str]:
    """The rates as lines of plain text for the terminal."""
    lines: list[str] = []
    labels = r["gap_bins"]
    for g in r["settings"]:
        lines.append(f"{g['label']}: {rate_text(g)}" + (f"; {answers_text(g['answers'])}" if g.get("answers") else ""))
        if g["forks"]:
            lines.append(f"  positions  {positions_text(g)}")
            diagnosed = g["forks"] - g["severity"]["undiagnosed"]
            lines.append(f"  gaps       {severity_text(g)}"
                         + (" (near-tie: within what batched numerics can flip)" if diagnosed else
                            " (run with --diagnose for the gaps)"))
            most = max((sum(b.values()) for b in g["gaps"]), default=0)
            for label, b in zip(labels, g["gaps"]):
                n = sum(b.values())
                if n:
                    lines.append(f"    {label:>9} logits  {bar(b['near-tie'], most)}{'▒' * 0}"
                                 f"{bar(b['material'], most).replace('█', '▓')} {b['near-tie']} near-tie, "
                                 f"{b['material']} material")
        lines += ties_lines(g.get("ties"))
        for c in g["categories"]:
            lines.append(f"  {c['category']:<20} {rate_text(c)}")
        if isinstance(g.get("kernel_map"), dict):
            lines.append(f"  kernel map  {group_prediction_text(g['kernel_map'])}")
    return lines


def ties_lines(t: dict[str, Any] | None) -> list[str]:
    """A setting's near-tie density, a line per band (none for cells recorded before it was kept)."""
    if not t:
        return []
    out = [f"  near-ties  {t['positions']} positions compared over {t['runs']} run(s), {t['flips']} flip(s)"]
    for b in t["bands"]:
        out.append(f"    {band_label(b):<30} {tie_rate_text(b)}; {says(b)}")
    return out


def ties_summary(t: dict[str, Any] | None) -> str:
    """One clause for a setting's line: its calibrated band's count (else the first band's), or "" without one."""
    if not t or not t.get("bands"):
        return ""
    b = next((b for b in t["bands"] if b.get("calibrated")), t["bands"][0])
    return (f"; near-ties: {b['in_band']} of {t['positions']} compared positions in the {band_label(b)} band, "
            f"{b['flipped']} flipped" + (f", {b['flipped_outside']} outside it" if b["flipped_outside"] else ""))


def ties_block(settings: list[dict[str, Any]]) -> str:
    """Every setting's near-tie density as plain text, for a fenced block ("" when no setting has one)."""
    lines: list[str] = []
    for g in settings:
        t = g.get("ties")
        if t:
            lines += [g["label"], *ties_lines(t), ""]
    return "\n".join(lines).rstrip("\n")
