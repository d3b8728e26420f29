"""The near-tie density of a quality run: per arm, how many steps were close enough to flip, and where forks were.

For each item both arms' traces give, per step, the top-1/top-2 margin of the
row that chose the token (:func:`specview.core.diagnose.ties.step_margins`, in
nats and in logits).  An item records, per arm:

* ``steps``: the tokens the arm emitted;
* ``measured``: those whose row has a margin (two finite top-k logits, or the
  engine's own margin); ``steps - measured`` had none and are in no band;
* ``near``: per tie band, the measured steps whose margin is no wider than the
  band;

and, where its texts differed, the margin at the fork: the vanilla row's (the
one-token-per-pass reference the speculative arm must reproduce, as
:mod:`specview.core.diagnose.ties` reads a fork) and, per band, whether it is a
near-tie.  A fork with no vanilla row (vanilla stopped where the speculative arm
went on) has no margin.

The suite's figures (:func:`summarise`) sum the items: per band and arm, near
steps of measured steps with the 95% Wilson interval; and of the items whose
texts differed (and of those whose answer changed), how many forked at a
near-tie, at a wider margin, or with no margin: the three add up to the items.
A density of near-ties far below the share of forks at near-ties says the forks
went where the numerics are close, which is what batched-versus-single rounding
does; forks at wide margins are what a near-tie cannot explain.

The bands are the fixed ones of :data:`specview.core.diagnose.ties.FIXED_BANDS`:
the calibrated band needs a measured envelope, which a quality item has only
where its fork was diagnosed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from ..diagnose.ties import FIXED_BANDS, Band, step_margins
from ..stats import pct as _pct, wilson
from .suites import QualityError

#: the bands every item is counted in
BANDS: tuple[Band, ...] = FIXED_BANDS
ARMS = ("vanilla", "speculative")


def _within(margin: tuple[float | None, float | None], band: Band) -> bool | None:
    m = margin[0] if band.unit == "nats" else margin[1]
    return None if m is None else m <= band.width


@dataclass(frozen=True)
class ArmTies:
    """One arm's steps, those with a margin, and per band name those in the band."""

    steps: int
    measured: int
    near: dict[str, int]

    @classmethod
    def of(cls, arm: Any, bands: Iterable[Band] = BANDS) -> "ArmTies":
        margins = [step_margins(s) for s in arm.steps]
        measured = [m for m in margins if m[0] is not None]
        return cls(len(margins), len(measured), {b.name: sum(1 for m in measured if _within(m, b)) for b in bands})

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "measured": self.measured, "near": dict(self.near)}

    @classmethod
    def from_dict(cls, d: Any, *, where: str) -> "ArmTies":
        if not isinstance(d, dict):
            raise QualityError(f"{where} must be an object (steps, measured, near)")
        steps, measured = _count(d, "steps", where), _count(d, "measured", where)
        if measured > steps:
            raise QualityError(f"{where}.measured ({measured}) must be at most steps ({steps})")
        near = d.get("near")
        if not isinstance(near, dict):
            raise QualityError(f"{where}.near must be an object (band name: steps in the band)")
        out = {}
        for name in near:
            k = _count(near, name, f"{where}.near")
            if k > measured:
                raise QualityError(f"{where}.near[{name!r}] ({k}) must be at most measured ({measured})")
            out[str(name)] = k
        return cls(steps, measured, out)


def _count(d: dict[str, Any], key: str, where: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise QualityError(f"{where}.{key} must be a count (an integer >= 0), got {v!r}")
    return v


def _number(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise QualityError(f"{where} must be a finite number or null (got {v!r})")
    return float(v)


@dataclass(frozen=True)
class ItemTies:
    """An item's two arms' counts and, where its texts differed, the fork's margin and its bands.

    ``fork_near`` (band name: True / False) is empty for a fork with no margin; ``forked`` is False for an item
    whose texts were the same."""

    vanilla: ArmTies
    speculative: ArmTies
    forked: bool = False
    fork_nats: float | None = None
    fork_logits: float | None = None
    fork_near: dict[str, bool] | None = None

    @classmethod
    def of(cls, trace: Any, bands: Iterable[Band] = BANDS) -> "ItemTies":
        """The counts of ``trace`` (a :class:`~specview.core.trace.Trace`)."""
        bands = tuple(bands)
        c = trace.comparison
        fm = c.first_mismatch if not c.identical else None
        v, s = ArmTies.of(trace.vanilla, bands), ArmTies.of(trace.speculative, bands)
        if fm is None:
            return cls(v, s)
        margin = step_margins(trace.vanilla.steps[fm.index]) if fm.index < len(trace.vanilla.steps) else (None, None)
        if margin[0] is None:
            return cls(v, s, forked=True, fork_near={})
        return cls(v, s, forked=True, fork_nats=round(margin[0], 5), fork_logits=round(margin[1], 5),
                   fork_near={b.name: bool(_within(margin, b)) for b in bands})

    def to_dict(self) -> dict[str, Any]:
        fork = None
        if self.forked:
            fork = {"nats": self.fork_nats, "logits": self.fork_logits, "near": dict(self.fork_near or {})}
        return {"vanilla": self.vanilla.to_dict(), "speculative": self.speculative.to_dict(), "fork": fork}

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "ties") -> "ItemTies":
        if not isinstance(d, dict):
            raise QualityError(f"{where} must be an object (vanilla, speculative, fork)")
        v = ArmTies.from_dict(d.get("vanilla"), where=f"{where}.vanilla")
        s = ArmTies.from_dict(d.get("speculative"), where=f"{where}.speculative")
        fork = d.get("fork")
        if fork is None:
            return cls(v, s)
        if not isinstance(fork, dict) or not isinstance(fork.get("near"), dict):
            raise QualityError(f"{where}.fork must be null or an object with nats, logits and near")
        near = fork["near"]
        for name, x in near.items():
            if not isinstance(x, bool):
                raise QualityError(f"{where}.fork.near[{name!r}] must be true or false (got {x!r})")
        return cls(v, s, forked=True, fork_nats=_number(fork.get("nats"), f"{where}.fork.nats"),
                   fork_logits=_number(fork.get("logits"), f"{where}.fork.logits"), fork_near=dict(near))

    def counted_in(self, band: Band) -> bool:
        """Whether this record counts ``band`` (a record from another set of bands may not)."""
        return all(band.name in a.near for a in (self.vanilla, self.speculative)) and \
            (not self.forked or not self.fork_near or band.name in self.fork_near)


def _share(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n)
    return {"rate": k / n if n else None, "low": lo if n else None, "high": hi if n else None}


def _forks(records: list[tuple[Any, ItemTies]], band: Band) -> dict[str, int | float | None]:
    forked = [t for _, t in records if t.forked]
    near = sum(1 for t in forked if t.fork_near and t.fork_near.get(band.name) is True)
    wide = sum(1 for t in forked if t.fork_near and t.fork_near.get(band.name) is False)
    return {"items": len(forked), "at_near_tie": near, "wide": wide, "no_margin": len(forked) - near - wide,
            **_share(near, near + wide)}


def summarise(items: Iterable[Any], bands: Iterable[Band] = BANDS) -> dict[str, Any]:
    """The suite's near-tie figures from its items (each an :class:`~specview.core.quality.result.ItemOutcome`
    with its ``ties``); JSON-able.

    ``items`` counts the items that ran and carry counts; ``uncounted`` those that ran without (a result written
    before the counts were kept); an item that could not run is in neither.  Per band: each arm's ``near`` of
    ``measured`` steps (of ``steps``) with ``density`` and its Wilson interval; ``forked`` and ``changed``: of
    the items whose texts differed (whose answer changed), how many forked ``at_near_tie``, ``wide`` of the band
    or with ``no_margin`` (the three add up to ``items``), and the share at a near-tie of those with a margin."""
    ran = [o for o in items if o.error is None]
    bands = tuple(bands)
    records = [(o, o.ties) for o in ran if o.ties is not None and all(o.ties.counted_in(b) for b in bands)]
    arms = {arm: {"steps": sum(getattr(t, arm).steps for _, t in records),
                  "measured": sum(getattr(t, arm).measured for _, t in records)} for arm in ARMS}
    out_bands = []
    for b in bands:
        row: dict[str, Any] = {"name": b.name, "width": b.width, "unit": b.unit, "source": b.source}
        for arm in ARMS:
            n = arms[arm]["measured"]
            k = sum(getattr(t, arm).near[b.name] for _, t in records)
            d = _share(k, n)
            row[arm] = {"near": k, "measured": n, "density": d["rate"], "low": d["low"], "high": d["high"]}
        row["forked"] = _forks(records, b)
        row["changed"] = _forks([(o, t) for o, t in records if o.discordant], b)
        out_bands.append(row)
    return {"items": len(records), "uncounted": len(ran) - len(records), "arms": arms, "bands": out_bands}


# -- words -------------------------------------------------------------------------------------
def density_text(a: dict[str, Any]) -> str:
    """``12 of 480 steps (2.5%, 95% CI 1.4–4.3%)``."""
    if not a["measured"]:
        return "no step with a margin"
    return f"{a['near']} of {a['measured']} steps ({_pct(a['density'])}, 95% CI {_pct(a['low'])}–{_pct(a['high'])})"


def forks_text(f: dict[str, Any]) -> str:
    """``7 of 8 at a near-tie (87.5%, 95% CI …), 1 wider`` (and ``, 1 with no margin``); ``none`` without forks;
    the share is of the forks with a margin."""
    if not f["items"]:
        return "none"
    out = f"{f['at_near_tie']} of {f['items']} at a near-tie"
    if f["rate"] is not None and f["at_near_tie"] + f["wide"]:
        out += f" ({_pct(f['rate'])}, 95% CI {_pct(f['low'])}–{_pct(f['high'])})"
    if f["wide"]:
        out += f", {f['wide']} wider"
    if f["no_margin"]:
        out += f", {f['no_margin']} with no margin"
    return out


TABLE_HEADERS = ("band", "vanilla near-tie steps", "speculative near-tie steps", "texts differed: fork at a near-tie",
                 "answer changed: fork at a near-tie")


def table_rows(summary: dict[str, Any]) -> list[tuple[str, ...]]:
    """The summary's bands as rows of plain strings (:data:`TABLE_HEADERS`)."""
    return [(b["name"], density_text(b["vanilla"]), density_text(b["speculative"]), forks_text(b["forked"]),
             forks_text(b["changed"])) for b in summary["bands"]]


def intro(summary: dict[str, Any]) -> str:
    """What was counted: the items, each arm's steps, and those without a margin or without counts."""
    a = summary["arms"]
    parts = [f"{summary['items']} item(s): vanilla {a['vanilla']['steps']} steps, speculative "
             f"{a['speculative']['steps']} steps"]
    missing = {arm: a[arm]["steps"] - a[arm]["measured"] for arm in ARMS}
    if any(missing.values()):
        parts.append("without a margin (in no band): " + ", ".join(f"{arm} {n}" for arm, n in missing.items()))
    if summary["uncounted"]:
        parts.append(f"{summary['uncounted']} item(s) recorded without counts are left out")
    return ("; ".join(parts) + ". A step is a near-tie when its row's top-1/top-2 margin is no wider than the band; "
            "a fork's margin is the vanilla row's there. Were forks blind to the margin, the share of forks at a "
            "near-tie would be about the vanilla density; far above it, the forks went where the numerics are "
            "close; forks at wider margins are what a near-tie does not explain.")


__all__ = ["ARMS", "BANDS", "TABLE_HEADERS", "ArmTies", "ItemTies", "density_text", "forks_text", "intro",
           "summarise", "table_rows"]
