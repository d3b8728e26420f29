"""The kernel map as text: the per-width table, an ASCII heatmap (target x width), and widths as text."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from ..config import settings_label  # noqa: F401  (re-exported: the settings part of every label)
from ..errors import ConfigError

# the map's classes (specview.core.kernels.map) are duck-typed here: kernels imports this module, not the reverse
KernelMap = TargetMap = WidthStats = Any

#: heatmap cell classes by max |logit difference|, after "=" for bit-identical
LEVELS = ((0.01, "."), (0.1, "o"), (1.0, "O"), (math.inf, "#"))
LEGEND = ("= bit-identical to single-token rows at every position;  max |dlogit| . <0.01  o <0.1  O <1  # >=1;  "
          "! an argmax flipped")


def _num(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x == 0:
        return "0"
    if x < 1e-3:
        return f"{x:.1e}"
    return f"{x:.4f}" if x < 100 else f"{x:.1f}"


def ranges(ws: Sequence[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    out, i = [], 0
    ws = sorted(ws)
    while i < len(ws):
        j = i
        while j + 1 < len(ws) and ws[j + 1] == ws[j] + 1:
            j += 1
        out.append(str(ws[i]) if i == j else f"{ws[i]}-{ws[j]}")
        i = j + 1
    return ", ".join(out)


def parse_widths(text: str) -> tuple[int, ...]:
    """``"1-16"``, ``"1,2,4-8"`` -> sorted widths; width 1 (the control) is always included."""
    out: set[int] = {1}
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ConfigError(f"{part!r} is not a width or a range like 1-16", setting="widths") from None
        if a < 1 or b < a:
            raise ConfigError(f"{part!r}: widths are >= 1 and ranges run low-high", setting="widths")
        out.update(range(a, b + 1))
    return tuple(sorted(out))


def cell(st: WidthStats | None) -> str:
    """Three characters for one heatmap cell."""
    if st is None or st.rows == 0:
        return "   "
    if st.bit_identical:
        c = "="
    else:
        d = st.max_delta if st.max_delta == st.max_delta else math.inf  # no figure (NaN): the worst mark
        c = next((ch for lim, ch in LEVELS if d < lim), LEVELS[-1][1])
    return f" {c}{'!' if st.flips else ' '}"


def width_note(w: int, st: WidthStats) -> str:
    """What one width's row of the table says beside its figures: bit-identical, the control, stopped early."""
    note = ""
    if st.bit_identical:
        note = "= single-token" if w > 1 else "= control (the same pass after a rollback)"
    elif w == 1:
        note = "control failed: not deterministic"
    if st.stopped:
        note += (" " if note else "") + "(stopped at the first difference)"
    return note


def heatmap(km: KernelMap) -> str:
    labels = [t.label for t in km.targets]
    lw = max([len(x) for x in labels] + [6])
    lines = [f"{'width':>{lw}} |" + "".join(f"{w:>3}" for w in km.widths)]
    lines.append("-" * lw + "-+" + "-" * (3 * len(km.widths)))
    for t in km.targets:
        lines.append(f"{t.label:<{lw}} |" + "".join(cell(t.widths.get(w)) for w in km.widths))
    lines.append(LEGEND)
    return "\n".join(lines)


def _first(st: WidthStats) -> str:
    fd = st.first_difference
    return f", the first at {fd[0]} token {fd[1]}" if fd else ""


def verdict_line(t: TargetMap) -> str:
    """One sentence: which draft lengths the map proves lossless for this target."""
    if not t.deterministic:
        w1 = t.widths.get(1)
        where = f" (first at {w1.first_difference[0]} token {w1.first_difference[1]})" if w1 and w1.first_difference else ""
        return ("NOT DETERMINISTIC: the same single-token pass gave different logits after a rollback" + where +
                "; the map proves nothing on this build (check the thread count and the backend)")
    safe = t.safe_widths()
    n = t.safe_n_max()
    first_bad = next((w for w in sorted(t.widths) if not t.widths[w].bit_identical), None)
    if n is None:
        bad = t.widths.get(2)
        if bad is None:
            return "width 2 was not measured: no draft length can be proven lossless from this map"
        return (f"no draft length is proven lossless: width 2 already differs at {bad.rows - bad.identical} of "
                f"{bad.rows} rows{_first(bad)} (max |dlogit| {_num(bad.max_delta)}, {bad.flips} argmax flips)")
    s = f"n_max <= {n} is proven lossless here (widths 1-{n + 1} bit-identical; {t.evidence(range(1, n + 2))})"
    if first_bad is not None:
        b = t.widths[first_bad]
        s += (f"; width {first_bad} differs at {b.rows - b.identical} of {b.rows} rows{_first(b)} "
              f"(max |dlogit| {_num(b.max_delta)}, {b.flips} argmax flips)")
    others = [w for w in safe if w > n + 1]
    if others:
        s += f"; wider widths also bit-identical: {ranges(others)}"
    return s


def target_table(t: TargetMap, by_cause: Callable[[TargetMap], str] | None = None) -> str:
    """One row's table; ``by_cause`` gives its widths grouped by cause (:func:`~.kernel_causes.groups_line`)."""
    q = t.model.get("quantization") or "?"
    threads = f"threads {t.threads_used}; " if t.threads_used else ""
    head = (f"{t.label}  ({q}; {threads}{len(t.prompts)} prompt(s) x "
            f"{t.prompts[0].positions if t.prompts else 0} positions; {t.seconds:.1f} s)")
    cols = (f"  {'width':>5} {'rows':>6} {'bit-identical':>16} {'max|Δ|':>9} {'p95|Δ|':>9} {'flips':>6} "
            f"{'margin<max|Δ|':>14}")
    lines = [head, cols]
    for w in sorted(t.widths):
        st = t.widths[w]
        share = f"{st.identical} ({100.0 * st.identical_share:.1f}%)"
        note = width_note(w, st)
        mark = ("  ! " + note if w == 1 and not st.bit_identical else "  " + note) if note else ""
        lines.append(f"  {w:>5} {st.rows:>6} {share:>16} {_num(st.max_delta):>9} {_num(st.p95_delta):>9} "
                     f"{st.flips:>6} {st.below_shift:>14}{mark}")
    lines.append("  " + verdict_line(t))
    grouped = by_cause(t) if by_cause is not None else ""
    if grouped:
        lines.append("  widths by cause: " + grouped)
    return "\n".join(lines)


def table(km: KernelMap, by_cause: Callable[[TargetMap], str] | None = None) -> str:
    parts = [target_table(t, by_cause) for t in km.targets]
    return "\n\n".join(parts)
