"""What the kernel map's heat grid says: each cell's text and tint, each row's claim, each width's figures.

Pure functions of the map's own figures (:class:`~specview.core.kernels.map.WidthStats`), so the colours and
words the view shows can be checked against them; :mod:`.view` puts them on the screen."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...core import verdicts

#: (WidthStats attribute, what the metric menu and the legend call it)
METRICS: tuple[tuple[str, str], ...] = (
    ("max_delta", "max |Δlogit|"),
    ("identical_share", "bit-identical share"),
    ("p95_delta", "p95 |Δlogit|"),
    ("flips", "argmax flips"),
    ("below_shift", "positions below the shift"),
)
METRIC_NAMES = dict(METRICS)

#: a width whose every row equals the single-token row: the verdicts' "identical" green
IDENTICAL = verdicts.COLOURS["identical"]
#: the width-1 control failed (the same pass after a rollback gave other bits): the "nondeterministic" tint
CONTROL_FAILED = verdicts.COLOURS["nondeterministic"]
#: a width that differs, from a little to a lot (as the metric shown says): light amber to strong red
RAMP = (verdicts.COLOURS["near-tie"], verdicts.COLOURS["diverged"], verdicts.COLOURS["state"], "#e07a7a")
INK = "#111111"  # every tint is light, in every theme: dark text on all of them

#: per metric, the upper bounds of the ramp's first three steps (the fourth takes the rest), and their labels (the
#: legend's)
BINS: dict[str, tuple[tuple[float, ...], tuple[str, ...]]] = {
    # the share of identical rows: the fewer, the stronger
    "identical_share": ((0.75, 0.25, 0.0), ("≥ 75% rows identical", "25-75%", "under 25%", "no row identical")),
    # the CLI heatmap's classes (. o O #)
    "max_delta": ((0.01, 0.1, 1.0), ("< 0.01", "< 0.1", "< 1", "≥ 1")),
    "p95_delta": ((0.01, 0.1, 1.0), ("< 0.01", "< 0.1", "< 1", "≥ 1")),
    "flips": ((0, 1, 4), ("0", "1", "2-4", "≥ 5")),
    "below_shift": ((0, 4, 19), ("0", "1-4", "5-19", "≥ 20")),
}


@dataclass(frozen=True)
class CellLook:
    """What one heat cell shows: its text, its background and its step on the ramp (-1: not on it)."""

    text: str
    colour: str | None  # None: not measured
    level: int
    identical: bool


def fmt(x: float | None) -> str:
    """A |Δlogit| short enough for a cell."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x == 0:
        return "0"
    if x >= 10:
        return f"{x:.0f}"
    if x >= 0.1:
        return f"{x:.2f}"
    if x >= 0.001:
        return f"{x:.3f}"
    return f"{x:.0e}"


def level(metric: str, st: Any) -> int:
    """The ramp step (0-3) of a width that is not bit-identical, by ``metric``."""
    v = getattr(st, metric)
    if metric == "identical_share":
        return 0 if v >= 0.75 else 1 if v >= 0.25 else 2 if v > 0 else 3
    if isinstance(v, float) and math.isnan(v):
        return 3
    bounds = BINS[metric][0]
    if metric in ("max_delta", "p95_delta"):
        return next((i for i, b in enumerate(bounds) if v < b), 3)
    return next((i for i, b in enumerate(bounds) if v <= b), 3)


def metric_text(metric: str, st: Any) -> str:
    v = getattr(st, metric)
    if metric == "identical_share":
        pct = 100.0 * v
        return f"{pct:.0f}%" if pct >= 1 or pct == 0 else "<1%"
    if metric in ("max_delta", "p95_delta"):
        return fmt(v)
    return str(int(v))


def cell_look(st: Any, metric: str) -> CellLook:
    """The heat cell of one width (a :class:`~specview.core.kernels.map.WidthStats`, or None: not measured)."""
    if st is None or st.rows == 0:
        return CellLook("", None, -1, False)
    if st.bit_identical:
        return CellLook("=", IDENTICAL, -1, True)
    text = metric_text(metric, st)
    if st.flips and metric != "flips":
        text += " !"
    if st.stopped:
        text += " …"
    if st.width == 1:
        return CellLook(text, CONTROL_FAILED, -1, False)
    lv = level(metric, st)
    return CellLook(text, RAMP[lv], lv, False)


def row_claim(t: Any) -> str:
    """What a target row proves, in three or four words."""
    if not t.deterministic:
        return "not deterministic"
    n = t.safe_n_max()
    return "nothing proven" if n is None else f"proven lossless up to n_max {n}"


def first_difference(st: Any, *, short: bool = False) -> str:
    fd = st.first_difference
    if not fd:
        return ""
    return f"{fd[0]} {fd[1]} (row {fd[2]})" if short else f"{fd[0]} token {fd[1]}, row {fd[2]}"


def cell_details(t: Any, st: Any) -> list[str]:
    """Every figure of one width of one target, as plain lines (the tooltip and the accessible text)."""
    if st is None or st.rows == 0:
        return [f"{t.label}, width {st.width if st else '?'}: not measured"]
    w = st.width
    what = "the rollback control: the walk's own single-token pass, run again" if w == 1 else (
        f"a verify pass of the last token and {w - 1} draft token{'s' if w > 2 else ''} (n_max {w - 1} and above)")
    lines = [f"{t.label}, width {w}: {what}",
             (f"{st.identical} of {st.rows} rows bit-identical to the single-token rows "
              f"({100.0 * st.identical_share:.1f}%)")]
    if not st.bit_identical:
        lines.append(f"max |Δlogit| {fmt(st.max_delta)}, p95 |Δlogit| {fmt(st.p95_delta)} (over both rows' top-k)")
        flips = f"{st.flips} argmax flip{'s' if st.flips != 1 else ''}"
        if st.flip_at:
            at = ", ".join(f"{p} token {j}" for p, j in st.flip_at[:6]) + (" …" if len(st.flip_at) > 6 else "")
            flips += f" ({at})"
        lines.append(flips)
        lines.append(f"{st.below_shift} measured positions have a top-1/top-2 margin below the max shift")
        lines.append(f"first difference: {first_difference(st)}")
        by_row = [f"{i}: {n}" for i, n in enumerate(st.differing_by_row) if n]
        if by_row:
            lines.append("differing rows by their row in the pass: " + ", ".join(by_row))
        if st.stopped:
            lines.append("measuring stopped at the first difference: these figures cover the rows measured")
    elif w == 1:
        lines.append("the control held: this target computes the same bits again after a rollback")
    else:
        lines.append(f"= speculative decoding with a {w}-token verify pass cannot change the text here")
    return lines


DETAIL_COLUMNS = ("Width", "Rows", "Bit-identical", "max |Δ|", "p95 |Δ|", "Flips", "Below shift", "First difference")
#: what each column of the per-width table means (its header's tooltip)
DETAIL_TIPS = ("verify width T: the last token plus T-1 drafts", "rows compared at this width",
               "rows whose every logit equals the single-token row's, bit for bit",
               "largest |logit difference| over both rows' top-k", "95th percentile of the same",
               "rows whose argmax differs from the single-token row's",
               "measured positions whose single-token top-1/top-2 margin is below this width's max shift",
               "the earliest row that was not bit-identical: prompt, token, its row in the pass")


def environment_text(km: Any) -> str:
    """Where and how the map was made: engine, versions, CPU, threads, prompts, positions, wall time."""
    env = km.environment or {}
    bits = [str(km.backend)]
    for key, name in (("llama_cpp_python", "llama-cpp-python"), ("mlx_lm", "mlx-lm"), ("mlx", "mlx")):
        if env.get(key):
            bits.append(f"{name} {env[key]}")
            break
    devices = [d.get("description") or d.get("name") for d in env.get("ggml_devices") or [] if isinstance(d, dict)]
    cpu = env.get("cpu")
    if cpu:
        bits.append(f"CPU {cpu}")
    gpus = [d for d in devices if d and d != cpu]
    if gpus:
        bits.append("devices " + ", ".join(str(d) for d in gpus))
    machine_threads = (env.get("setup") or {}).get("machine.threads") if isinstance(env.get("setup"), dict) else None
    used = sorted({t.threads_used for t in km.targets if t.threads_used})
    if not used:  # an engine that does not say how many it used: what was asked
        used = sorted({t.settings.threads or "every core" for t in km.targets}, key=str)
    if used:
        bits.append("threads " + ", ".join(map(str, used))
                    + (f" (of {machine_threads} on the machine)" if machine_threads else ""))
    prompts = ", ".join(p.name for p in km.prompts)
    bits.append(f"prompts {prompts} x {km.positions} positions")
    bits.append(f"top-{km.top_k}")
    if km.seconds:
        m, s = divmod(km.seconds, 60)
        bits.append(f"computed in {int(m)} min {s:.0f} s" if m else f"computed in {s:.1f} s")
    if env.get("created"):
        bits.append(f"made {str(env['created']).replace('T', ' ')}")
    return " · ".join(bits)
