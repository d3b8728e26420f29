"""Near-tie density: how many positions of a run were close enough to flip, and how many did.

A flip count alone says little: ten flips in ten thousand near-tied positions
is rounding, ten flips at wide margins is a bug.  So for a run (and summed over
a suite or a matrix cell's prompts) this counts, per *tie band*:

* **positions in the band**: compared positions whose top-1/top-2 margin is
  no wider than the band;
* **flips in the band**: those where the speculative arm's token differs from
  vanilla's;
* **the rate** flips / positions in the band, with its 95% Wilson interval;
* **flips outside the band**: a flip at a margin wider than the band (what the
  band would call a bug).

Which positions are compared.  A position is compared only where both arms saw
the same context: the shared prefix and the first fork itself (``agree + 1``
positions when the arms part on a token; all of them when they are identical;
the tokens both have when one only stopped earlier).  After the first fork the
two arms condition on different texts, so "the speculative token differs from
vanilla's" no longer says anything about numerics: those positions are not
counted.  A run therefore has at most one flip; rates come from summing runs.

The margin of a position is the vanilla arm's: the row computed one token per
pass, the reference the speculative arm must reproduce.  It is read from the
trace's top-k logits of that row, in both units the public bands use:

* **nats**: log p(top-1) - log p(top-2) of the log-softmax over the recorded
  top-k;
* **logits**: logit(top-1) - logit(top-2).

The log-softmax subtracts the same normaliser from every logit of a row, so the
two are one number (they differ only by float rounding); a band in nats and a
band in logits are thresholds on the same quantity, compared here as such.

The bands:

* **calibrated** from this machine's measured envelope: twice the largest
  logit shift measured between the batched and single-token shapes (the
  diagnosis' replay envelope before the fork, or the backend check's width
  drift).  Each of the two top logits moves by at most that shift, so their
  margin moves by at most twice it: a margin inside that band is one the
  measured numerics could flip, one outside it is not;
* the fixed bands used upstream: 0.125 nats (vllm-metal's
  ``check_sd_lossless.py``), 0.5 nats (vllm.cpp), a 2.0-logit top-2 gap
  (tt-metal's MTP verify gate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..stats import pct as _pct, wilson  # the one Wilson interval: the quality suite's and the matrix's too

#: the calibrated band is this many times the measured envelope (two logits each moving by the envelope)
CALIBRATION_FACTOR = 2.0


@dataclass(frozen=True)
class Band:
    """A tie band: a margin no wider than ``width`` (in ``unit``) is a near-tie."""

    name: str
    width: float
    unit: str  # "nats" or "logits"
    source: str
    calibrated: bool = False


FIXED_BANDS = (
    Band("0.125 nats", 0.125, "nats", "vllm-metal check_sd_lossless.py"),
    Band("0.5 nats", 0.5, "nats", "vllm.cpp"),
    Band("2.0 logits", 2.0, "logits", "tt-metal MTP verify gate"),
)


@dataclass(frozen=True)
class Position:
    """One compared position: its vanilla margin in both units, whether it flipped, the speculative row's width."""

    index: int
    nats: float | None
    logits: float | None
    flipped: bool
    width: int | None  # T of the pass whose row chose the speculative token (None: not reported)


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def step_margins(step: Any) -> tuple[float | None, float | None]:
    """(nats, logits): the top-1/top-2 margin of a step's row from its recorded top-k logits.

    Falls back to the step's own ``margin`` (a logit difference) when fewer
    than two top-k logits are finite.
    """
    vals = sorted((v for v in (_finite(x) for x in (step.top_logits or [])) if v is not None), reverse=True)
    if len(vals) < 2:
        m = _finite(step.margin)
        return m, m
    top = vals[0]
    lse = top + math.log(sum(math.exp(v - top) for v in vals))
    return (vals[0] - lse) - (vals[1] - lse), vals[0] - vals[1]


def compared_count(trace: Any) -> int:
    """How many positions both arms computed on the same context (see the module's docstring)."""
    c = trace.comparison
    fm = c.first_mismatch
    if fm is not None and fm.vanilla_token is not None and fm.speculative_token is not None:
        return c.agree + 1
    return min(c.agree, len(trace.vanilla.steps), len(trace.speculative.steps))


def positions(trace: Any) -> list[Position]:
    """Every compared position of a trace, in order."""
    v, s = trace.vanilla, trace.speculative
    out = []
    for i in range(compared_count(trace)):
        nats, logits = step_margins(v.steps[i])
        width = s.steps[i].batch_size if i < len(s.steps) else None
        out.append(Position(i, nats, logits, v.tokens[i] != s.tokens[i], width))
    return out


def envelope_of(trace: Any, diagnosis: dict[str, Any] | None = None) -> tuple[float | None, str]:
    """The measured envelope (largest logit shift between the shapes) a trace's diagnosis (or ``diagnosis``)
    carries, and where it came from."""
    d = diagnosis if isinstance(diagnosis, dict) else trace.diagnosis if isinstance(trace.diagnosis, dict) else {}
    env = d.get("envelope") if isinstance(d.get("envelope"), dict) else {}
    m = _finite(env.get("max"))
    if m is not None and env.get("positions"):
        return m, f"this run's replay envelope ({env['positions']} positions before the fork)"
    ref = d.get("reference") if isinstance(d.get("reference"), dict) else {}
    drift = width_drift(ref)
    if drift is not None:
        return drift, "the backend check's width drift (the setup under test at each width against width 1)"
    return None, ("no envelope measured on this run (a diagnosis measures one at a fork; `specview check "
                  "--widths` measures this machine's width drift)")


def width_drift(check: dict[str, Any]) -> float | None:
    """The largest |logit difference| between a width > 1 and width 1 in a backend check's ``widths`` block."""
    rows = check.get("widths") if isinstance(check, dict) else None
    if not isinstance(rows, list):
        return None
    vals = [_finite((r.get("drift") or {}).get("max_logit_delta")) for r in rows
            if isinstance(r, dict) and isinstance(r.get("drift"), dict) and r.get("width") != 1]
    vals = [x for x in vals if x is not None]
    return max(vals) if vals else None


def calibrated_band(env_max: float | None, source: str = "") -> Band | None:
    """The band this machine's measured envelope gives (None when nothing was measured)."""
    if env_max is None:
        return None
    return Band("calibrated", CALIBRATION_FACTOR * env_max, "logits", source, calibrated=True)


def bands_for(env_max: float | None, source: str = "") -> list[Band]:
    cal = calibrated_band(env_max, source)
    return ([cal] if cal is not None else []) + list(FIXED_BANDS)


def _margin(p: Position, band: Band) -> float | None:
    return p.nats if band.unit == "nats" else p.logits


def count(ps: Sequence[Position], band: Band) -> dict[str, Any]:
    """The band's counts over ``ps``: in the band, flipped in it, flipped outside it, the rate and its interval."""
    inside = {p.index for p in ps if (m := _margin(p, band)) is not None and m <= band.width}
    flipped = sum(1 for p in ps if p.flipped and p.index in inside)
    outside = sum(1 for p in ps if p.flipped and p.index not in inside)
    return {"name": band.name, "width": round(band.width, 6), "unit": band.unit, "source": band.source,
            "calibrated": band.calibrated, **rate_fields(len(inside), flipped), "flipped_outside": outside}


def rate_fields(in_band: int, flipped: int) -> dict[str, Any]:
    lo, hi = wilson(flipped, in_band)
    return {"in_band": in_band, "flipped": flipped, "rate": flipped / in_band if in_band else None,
            "low": lo if in_band else None, "high": hi if in_band else None}


def tie_density(trace: Any, *, envelope: float | None = None, source: str = "",
                diagnosis: dict[str, Any] | None = None) -> dict[str, Any]:
    """The near-tie density of one run (JSON-able); ``envelope`` (logits) overrides the one the trace's diagnosis
    (or ``diagnosis``) carries."""
    if envelope is None:
        envelope, source = envelope_of(trace, diagnosis)
    ps = positions(trace)
    bands = bands_for(envelope, source)
    flips = [p for p in ps if p.flipped]
    fork = flips[0] if flips else None
    widths: dict[int, list[Position]] = {}
    for p in ps:
        if p.width is not None:
            widths.setdefault(p.width, []).append(p)
    return {
        "positions": len(ps),
        "flips": len(flips),
        "fork": None if fork is None else {"index": fork.index, "nats": _r(fork.nats), "logits": _r(fork.logits),
                                           "width": fork.width},
        "envelope": {"max": _r(envelope), "source": source, "factor": CALIBRATION_FACTOR},
        "bands": [count(ps, b) for b in bands],
        "by_width": [{"width": w, "positions": len(wp), "bands": [
            {k: c[k] for k in ("name", "in_band", "flipped")} for c in (count(wp, b) for b in bands)]}
            for w, wp in sorted(widths.items())],
    }


def _r(x: float | None, nd: int = 5) -> float | None:  # a trace's own precision: a reloaded trace gives the same
    return None if x is None else round(float(x), nd)


def combine(densities: Iterable[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Sum the densities of many runs (a suite, a matrix setting) band by band; None when none has one.

    A calibrated band is each run's own (its envelope); the sum reports the
    range of widths it took.
    """
    ds = [d for d in densities if isinstance(d, dict) and isinstance(d.get("bands"), list)]
    if not ds:
        return None
    order: list[str] = []
    acc: dict[str, dict[str, Any]] = {}
    for d in ds:
        for b in d["bands"]:
            a = acc.get(b["name"])
            if a is None:
                order.append(b["name"])
                a = acc[b["name"]] = {k: b.get(k) for k in ("name", "unit", "source", "calibrated")}
                a.update(in_band=0, flipped=0, flipped_outside=0, widths=[], runs=0)
            a["in_band"] += int(b.get("in_band") or 0)
            a["flipped"] += int(b.get("flipped") or 0)
            a["flipped_outside"] += int(b.get("flipped_outside") or 0)
            a["widths"].append(b.get("width"))
            a["runs"] += 1
    bands = []
    for name in order:
        a = acc[name]
        ws = [w for w in a.pop("widths") if isinstance(w, (int, float))]
        a["width"] = (min(ws) if ws and min(ws) == max(ws) else None) if ws else None
        a["width_range"] = [min(ws), max(ws)] if ws else None
        a.update(rate_fields(a["in_band"], a["flipped"]))
        bands.append(a)
    return {"runs": len(ds), "positions": sum(int(d.get("positions") or 0) for d in ds),
            "flips": sum(int(d.get("flips") or 0) for d in ds), "bands": bands}


# -- words ---------------------------------------------------------------------------------
def band_label(b: dict[str, Any]) -> str:
    """``calibrated (0.0312 logits)``, ``0.5 nats``; a summed calibrated band gives its range."""
    if not b.get("calibrated"):
        return b["name"]
    if b.get("width") is not None:
        return f"calibrated ({b['width']:.3g} logits)"
    wr = b.get("width_range")
    return f"calibrated ({wr[0]:.3g}–{wr[1]:.3g} logits)" if wr else "calibrated"


def says(b: dict[str, Any]) -> str:
    """What the band would have said on these positions, in a few words."""
    if b["flipped"] == 0 and b["flipped_outside"] == 0:
        return f"no flip; {b['in_band']} position(s) at risk"
    if b["flipped_outside"]:
        return f"{b['flipped_outside']} flip(s) outside the band: a bug by this band"
    return f"near-tie: {b['flipped']} flip(s) inside the band"


def rate_text(b: dict[str, Any]) -> str:
    if not b["in_band"]:
        return "no position in the band"
    return (f"{b['flipped']} of {b['in_band']} flipped ({_pct(b['rate'])}, 95% CI {_pct(b['low'])}–"
            f"{_pct(b['high'])})")


TABLE_HEADERS = ("band", "positions in band", "flipped", "rate (95% CI)", "flips outside", "would say")


def table_rows(d: dict[str, Any]) -> list[tuple[str, ...]]:
    """The density's bands as rows of plain strings (:data:`TABLE_HEADERS`)."""
    rows = []
    for b in d["bands"]:
        rate = "n/a" if not b["in_band"] else f"{_pct(b['rate'])} ({_pct(b['low'])}–{_pct(b['high'])})"
        rows.append((band_label(b), str(b["in_band"]), str(b["flipped"]), rate, str(b["flipped_outside"]), says(b)))
    return rows


def intro(d: dict[str, Any]) -> str:
    """One sentence: what was compared and where the calibrated band came from."""
    env = d.get("envelope") or {}
    what = (f"{d['positions']} positions where both arms saw the same context (the shared prefix"
            + (" and the fork" if d.get("flips") else "") + f"), {d['flips']} flip(s)")
    if env.get("max") is not None:
        cal = (f"; calibrated band {CALIBRATION_FACTOR:g} x {env['max']:.3g} logits from {env.get('source')}")
    elif env:
        cal = f"; no calibrated band: {env.get('source')}"
    else:
        cal = ""
    return what + cal + ". Margins are the vanilla row's top-1/top-2; nats and logits are the same number."


def format_ties(d: dict[str, Any] | None) -> str:
    """The lines ``specview run`` prints."""
    if not d:
        return ""
    lines = ["near-tie density  " + intro(d)]
    for b in d["bands"]:
        lines.append(f"  {band_label(b):<28} {rate_text(b)}; {says(b)}")
    return "\n".join(lines)


__all__ = ["Band", "CALIBRATION_FACTOR", "FIXED_BANDS", "Position", "TABLE_HEADERS", "band_label", "bands_for",
           "calibrated_band", "combine", "compared_count", "count", "envelope_of", "format_ties", "intro",
           "positions", "rate_fields", "rate_text", "says", "step_margins", "table_rows", "tie_density",
           "width_drift"]
