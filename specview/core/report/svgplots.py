"""The trace report's plots as inline SVG: margins, the Δ-margin / KL track under them, the acceptance histogram.

Every plot shares one x scale (token index) so a cursor drawn at a token lines
up across them; each token has an invisible hit target (``data-i``) the page's
script links to the arms' texts.  Nothing here needs a browser or a plotting
library: numbers in, SVG text out, every string escaped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .escape import esc

WIDTH = 960
LEFT, RIGHT = 58, 12
VANILLA, SPECULATIVE, FORK, ENVELOPE, BAND = "#1f6fb4", "#e07b00", "#c0143c", "#b9c9e8", "#6a3d9a"
ACCEPTED, DRAFTED = "#2e9e4f", "#c4c4c4"


@dataclass(frozen=True)
class XScale:
    n: int

    def __call__(self, i: float) -> float:
        span = max(1, self.n - 1)
        return LEFT + (WIDTH - LEFT - RIGHT) * (i / span)


def _f(x: float) -> str:
    return f"{x:.1f}"


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _frame(h: int, top: int, bottom: int, label: str, ticks: Sequence[tuple[float, str]], xs: XScale,
           plot_id: str) -> list[str]:
    out = [f"<svg class=plot id='{esc(plot_id)}' viewBox='0 0 {WIDTH} {h}' width='{WIDTH}' height='{h}' "
           f"role=img aria-label='{esc(label)}'>",
           f"<rect x='{LEFT}' y='{top}' width='{WIDTH - LEFT - RIGHT}' height='{bottom - top}' fill='#fcfcfc' "
           "stroke='#d0d0d0'/>",
           f"<text x='{LEFT + 6}' y='{top + 12}' class=axl>{esc(label)}</text>"]
    for y, text in ticks:
        out.append(f"<line x1='{LEFT - 4}' x2='{WIDTH - RIGHT}' y1='{_f(y)}' y2='{_f(y)}' stroke='#eee'/>"
                   f"<text x='{LEFT - 6}' y='{_f(y + 3)}' class=tick text-anchor=end>{esc(text)}</text>")
    return out


def _x_ticks(xs: XScale, y: int) -> list[str]:
    step = max(1, 10 ** math.floor(math.log10(max(1, xs.n))) // (1 if xs.n < 40 else 2))
    while xs.n / step > 12:
        step *= 2
    return [f"<text x='{_f(xs(i))}' y='{y}' class=tick text-anchor=middle>{i}</text>" for i in range(0, xs.n, step)]


def _cursor_and_hits(xs: XScale, top: int, bottom: int) -> list[str]:
    """The cursor line the script moves, then one hit target per token (on top, so hover reaches them)."""
    w = max(2.0, (WIDTH - LEFT - RIGHT) / max(1, xs.n))
    out = [f"<line class=cursor x1='0' x2='0' y1='{top}' y2='{bottom}' visibility='hidden'/>"]
    out += [f"<rect class=hit data-i='{i}' x='{_f(xs(i) - w / 2)}' y='{top}' width='{_f(w)}' height='{bottom - top}'/>"
            for i in range(xs.n)]
    return out


def _path(points: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{'M' if k == 0 else 'L'}{_f(x)},{_f(y)}" for k, (x, y) in enumerate(points))


def _segments(xs: XScale, values: Sequence[float | None], y_of: Any) -> list[list[tuple[float, float]]]:
    """Runs of finite values as point lists (a gap breaks the line)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((xs(i), y_of(v)))
    return [r for r in runs if r]


def margin_svg(vanilla: Sequence[float | None], speculative: Sequence[float | None], *, fork: int | None,
               envelope: Sequence[float | None] = (), band: float | None = None) -> str:
    """Both arms' top-1/top-2 margins (log scale), the fork, the replay envelope and the calibrated band."""
    n = max(len(vanilla), len(speculative), 1)
    xs = XScale(n)
    h, top, bottom = 230, 8, 200
    vals = [v for v in (*vanilla, *speculative, *envelope, band) if v is not None and v > 0]
    lo = 10 ** math.floor(math.log10(max(1e-4, min(vals)))) if vals else 1e-3
    hi = 10 ** math.ceil(math.log10(max(vals))) if vals else 10.0
    hi = max(hi, lo * 10)

    def y(v: float) -> float:
        v = min(max(v, lo), hi)
        return bottom - (bottom - top) * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    ticks = [(y(10.0 ** e), f"{10.0 ** e:g}") for e in range(int(math.log10(lo)), int(math.log10(hi)) + 1)]
    out = _frame(h, top, bottom, "margin (logits)", ticks, xs, "plot-margins")
    env = [(i, v) for i, v in enumerate(envelope) if v is not None and v > 0]
    if env:
        pts = [(xs(i), y(v)) for i, v in env]
        poly = pts + [(pts[-1][0], bottom), (pts[0][0], bottom)]
        out.append(f"<polygon class=envelope points='{' '.join(f'{_f(a)},{_f(b)}' for a, b in poly)}' "
                   f"fill='{ENVELOPE}' fill-opacity='0.55'><title>replay envelope</title></polygon>")
    if band is not None and band > 0:
        out.append(f"<line x1='{LEFT}' x2='{WIDTH - RIGHT}' y1='{_f(y(band))}' y2='{_f(y(band))}' stroke='{BAND}' "
                   f"stroke-dasharray='6 3'><title>calibrated tie band {band:.3g} logits</title></line>")
    # vanilla (the reference) drawn over a wider speculative stroke: where the arms agree both show
    for values, colour, name, width in ((speculative, SPECULATIVE, "speculative", 2.6),
                                        (vanilla, VANILLA, "vanilla", 1.1)):
        for run in _segments(xs, [None if v is None else max(v, lo) for v in values], y):
            out.append(f"<path class='line {name}' d='{_path(run)}' fill=none stroke='{colour}' "
                       f"stroke-width='{width}'/>")
    if fork is not None:
        out.append(f"<line class=fork x1='{_f(xs(fork))}' x2='{_f(xs(fork))}' y1='{top}' y2='{bottom}' "
                   f"stroke='{FORK}' stroke-width='1.5' stroke-dasharray='5 3'><title>fork at token {fork}</title>"
                   "</line>")
    out += _x_ticks(xs, bottom + 14)
    out.append(f"<text x='{WIDTH - RIGHT}' y='{h - 4}' class=tick text-anchor=end>token</text>")
    out += _legend([(VANILLA, "vanilla"), (SPECULATIVE, "speculative"), (FORK, "fork")]
                   + ([(ENVELOPE, "replay envelope")] if env else []) + ([(BAND, "calibrated band")] if band else []),
                   h - 4)
    out += _cursor_and_hits(xs, top, bottom)
    out.append("</svg>")
    return "".join(out)


def _legend(items: Sequence[tuple[str, str]], y: int) -> list[str]:
    out, x = [], LEFT
    for colour, name in items:
        out.append(f"<rect x='{x}' y='{y - 8}' width='12' height='8' fill='{colour}'/>"
                   f"<text x='{x + 16}' y='{y}' class=tick>{esc(name)}</text>")
        x += 24 + 7 * len(name)
    return out


def track_svg(delta: Sequence[float | None], kl: Sequence[float | None], n: int, *, fork: int | None) -> str:
    """Under the margins, on the same x scale: Δ-margin (linear, around 0) and the top-k KL (log scale)."""
    xs = XScale(max(1, n))
    h = 190
    t1, b1, t2, b2 = 6, 84, 100, 170
    dvals = [abs(d) for d in delta if d is not None]
    dm = max(dvals) if dvals and max(dvals) > 0 else 1.0

    def yd(v: float) -> float:
        return (t1 + b1) / 2 - (b1 - t1) / 2 * (v / dm)

    kv = [k for k in kl if k is not None and k > 0]
    klo = 10 ** math.floor(math.log10(min(kv))) if kv else 1e-8
    khi = 10 ** math.ceil(math.log10(max(kv))) if kv else 1.0
    khi = max(khi, klo * 10)

    def yk(v: float) -> float:
        v = min(max(v, klo), khi)
        return b2 - (b2 - t2) * (math.log10(v) - math.log10(klo)) / (math.log10(khi) - math.log10(klo))

    out = _frame(h, t1, b1, "Δ-margin (logits)", [(yd(dm), f"{dm:.2g}"), (yd(0), "0"), (yd(-dm), f"{-dm:.2g}")],
                 xs, "plot-track")
    out.append(f"<rect x='{LEFT}' y='{t2}' width='{WIDTH - LEFT - RIGHT}' height='{b2 - t2}' fill='#fcfcfc' "
               "stroke='#d0d0d0'/>")
    out.append(f"<text x='{LEFT + 6}' y='{t2 + 12}' class=axl>KL over the shared top-k (nats)</text>")
    for e in range(int(math.log10(klo)), int(math.log10(khi)) + 1, max(1, (int(math.log10(khi / klo)) + 3) // 4)):
        out.append(f"<text x='{LEFT - 6}' y='{_f(yk(10.0 ** e) + 3)}' class=tick text-anchor=end>1e{e}</text>")
    bw = max(1.0, (WIDTH - LEFT - RIGHT) / max(1, n) * 0.7)
    for i, d in enumerate(delta):
        if d is None:
            continue
        y0, y1 = sorted((yd(0), yd(d)))
        out.append(f"<rect class=dm x='{_f(xs(i) - bw / 2)}' y='{_f(y0)}' width='{_f(bw)}' "
                   f"height='{_f(max(0.6, y1 - y0))}' fill='{FORK if i == fork else SPECULATIVE}'/>")
    for i, k in enumerate(kl):
        if k is None:
            continue
        out.append(f"<circle class=kl cx='{_f(xs(i))}' cy='{_f(yk(k) if k > 0 else b2)}' r='1.8' fill='{VANILLA}'/>")
    if fork is not None:
        out.append(f"<line x1='{_f(xs(fork))}' x2='{_f(xs(fork))}' y1='{t1}' y2='{b2}' stroke='{FORK}' "
                   "stroke-dasharray='5 3'/>")
    out += _x_ticks(xs, b2 + 14)
    out += _cursor_and_hits(xs, t1, b2)
    out.append("</svg>")
    return "".join(out)


def acceptance_svg(hist: dict[str, Any]) -> str:
    """Per position in the draft: rounds that drafted that far (grey) and accepted that far (green)."""
    pos = hist.get("positions") or []
    w, h, top, bottom, left = 460, 200, 10, 160, 44
    most = max((p["drafted"] for p in pos), default=0) or 1
    out = [f"<svg class=plot id='plot-acceptance' viewBox='0 0 {w} {h}' width='{w}' height='{h}' role=img "
           "aria-label='accepted length by position in the draft'>",
           f"<rect x='{left}' y='{top}' width='{w - left - 8}' height='{bottom - top}' fill='#fcfcfc' stroke='#d0d0d0'/>"]
    if not pos:
        out.append(f"<text x='{w / 2}' y='{(top + bottom) / 2}' class=tick text-anchor=middle>no verify rounds "
                   "with drafts</text></svg>")
        return "".join(out)
    slot = (w - left - 8) / len(pos)
    bw = min(40.0, slot * 0.38)
    for k, p in enumerate(pos):
        x = left + slot * (k + 0.5)
        for j, (count, colour, what) in enumerate(((p["drafted"], DRAFTED, "drafted"),
                                                   (p["accepted"], ACCEPTED, "accepted"))):
            hh = (bottom - top) * count / most
            out.append(f"<rect class='bar {what}' x='{_f(x - bw + j * bw)}' y='{_f(bottom - hh)}' width='{_f(bw)}' "
                       f"height='{_f(hh)}' fill='{colour}'><title>position {p['position']}: {count} rounds {what}"
                       "</title></rect>")
        rate = "" if p["rate"] is None else f"{100 * p['rate']:.0f}%"
        out.append(f"<text x='{_f(x)}' y='{bottom + 14}' class=tick text-anchor=middle>{p['position']}</text>"
                   f"<text x='{_f(x)}' y='{bottom + 27}' class=tick text-anchor=middle>{rate}</text>")
    out.append(f"<text x='{left}' y='{h - 4}' class=tick>position in the draft (share accepted that far); "
               f"{hist['rounds']} rounds</text>")
    out.append(f"<text x='4' y='{top + 10}' class=tick>{most}</text><text x='4' y='{bottom}' class=tick>0</text>")
    out.append("</svg>")
    return "".join(out)


def lengths_svg(hist: dict[str, Any]) -> str:
    """Rounds by accepted length (0 .. the most drafted)."""
    by = hist.get("by_length") or []
    w, h, top, bottom, left = 460, 200, 10, 160, 44
    most = (max(by, default=0) or 1) * 1.12  # headroom for the count above the tallest bar
    out = [f"<svg class=plot id='plot-lengths' viewBox='0 0 {w} {h}' width='{w}' height='{h}' role=img "
           "aria-label='rounds by accepted length'>",
           f"<rect x='{left}' y='{top}' width='{w - left - 8}' height='{bottom - top}' fill='#fcfcfc' stroke='#d0d0d0'/>"]
    slot = (w - left - 8) / max(1, len(by))
    for a, count in enumerate(by):
        x = left + slot * (a + 0.5)
        hh = (bottom - top) * count / most
        out.append(f"<rect class='bar length' x='{_f(x - slot * 0.3)}' y='{_f(bottom - hh)}' width='{_f(slot * 0.6)}' "
                   f"height='{_f(hh)}' fill='{ACCEPTED}'><title>{count} rounds accepted {a}</title></rect>"
                   f"<text x='{_f(x)}' y='{bottom + 14}' class=tick text-anchor=middle>{a}</text>"
                   f"<text x='{_f(x)}' y='{_f(bottom - hh - 3)}' class=tick text-anchor=middle>{count}</text>")
    out.append(f"<text x='{left}' y='{h - 4}' class=tick>accepted drafts per round</text>")
    out.append("</svg>")
    return "".join(out)


__all__ = ["acceptance_svg", "lengths_svg", "margin_svg", "track_svg"]
