"""The demo forks on every machine: which demo quantization's verify passes differ from single-token ones here.

Whether the default demo target (:data:`~specview.core.config.DEMO_TARGET`)
forks depends on this build's kernels: on x86 its fork comes from the repacked
Q4_K gemm, so with ``--no-repack``, on an ARM core without it, or on a GPU
build, its 4-row verify pass can compute exactly what single-token passes
compute, and the demo then shows nothing.  Before a demo run the picker
measures that directly, as the kernel map does (:func:`specview.core.kernels.map.map_target`):
a few positions of the demo prompt as single-token passes and as rows of
width-4 verify passes on the same KV prefix.  The default target is kept when
its rows differ; otherwise the first quantization of :data:`CANDIDATES` whose
rows differ is run instead, and the run says which and why.  Where none
differs it says so plainly.  The measurement runs in a throwaway worker (a
crash there costs nothing) and is cached per llama.cpp build, CPU and the
settings that pick kernels.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.config import DEMO_TARGET, EngineSettings, resolve_threads
from ...core.demo import DEMO_PROMPT, demo_quant
from ...core.errors import EngineCrashed
from .probe import ProbeCache, build_identity

#: tried in this order after the default; the drafter's own quantization last, F32 not at all (540 MB)
CANDIDATES = ("Q4_K_M", "BF16", "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_1", "Q4_0")
#: the demo's n_max of 3 verifies 4 tokens at once
WIDTH = 4
POSITIONS = 16
CACHE_NAME = "demo-pick.json"
PICK_TIMEOUT = 600.0

ProgressFn = Callable[[str], None]


@dataclass
class DemoPick:
    """What the demo runs here, and why."""

    target: str
    default: str = DEMO_TARGET
    #: one line for the run's output ("" when the default is kept)
    reason: str = ""
    #: per quantization measured: {"rows", "identical", "max_delta", "deterministic"}
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: whether some measured quantization's verify rows differ (so the demo can fork)
    can_fork: bool = True

    @property
    def changed(self) -> bool:
        return self.target != self.default

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "default": self.default, "reason": self.reason, "probes": self.probes,
                "can_fork": self.can_fork}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "DemoPick":
        return cls(target=str(d["target"]), default=str(d.get("default", DEMO_TARGET)), reason=str(d.get("reason", "")),
                   probes=dict(d.get("probes") or {}), can_fork=bool(d.get("can_fork", True)))


def differs(probe: dict[str, Any] | None) -> bool:
    """A quantization can fork here: its width-1 control held and some width-4 row was not bit-identical."""
    return bool(probe) and bool(probe.get("deterministic")) and int(probe.get("identical", 0)) < int(probe.get("rows", 0))


def order(default: str = DEMO_TARGET) -> list[str]:
    """The quantizations in the order they are tried: the default's first."""
    first = demo_quant(default)
    return [first] + [q for q in CANDIDATES if q != first]


def choose(probes: dict[str, dict[str, Any]], *, default: str = DEMO_TARGET, no_repack: bool = False) -> DemoPick:
    """The pick for measured ``probes`` ({quant: figures}): the default if it differs, else the first that does."""
    first = demo_quant(default)
    how = " with --no-repack" if no_repack else ""
    if differs(probes.get(first)):
        return DemoPick(target=default, default=default, probes=probes)
    for q in order(default):
        if differs(probes.get(q)):
            p, d = probes[q], probes.get(first) or {}
            why = (f"demo:{q} instead of {default}: on this build{how} a {WIDTH}-token verify pass of {first} computes "
                   f"the same logits as single-token passes ({d.get('identical', '?')} of {d.get('rows', '?')} rows "
                   f"of the demo prompt bit-identical), so it cannot fork; {q}'s rows differ (up to "
                   f"{float(p.get('max_delta') or 0):.3g} logits)")
            return DemoPick(target=f"demo:{q}", default=default, reason=why, probes=probes)
    tried = ", ".join(probes) or "none"
    why = (f"no demo quantization can fork on this build{how}: every {WIDTH}-token verify pass measured ({tried}) "
           f"computed the same logits as single-token passes, so the demo's arms will most likely be identical "
           f"here (on these kernels, greedy speculation on the demo is lossless); running {default}")
    return DemoPick(target=default, default=default, reason=why, probes=probes, can_fork=False)


# -- measuring (in a worker) -----------------------------------------------------------------------
def measure(quants: list[str], settings: dict[str, Any], *, positions: int = POSITIONS, width: int = WIDTH,
            stop_at_first: bool = True) -> dict[str, dict[str, Any]]:
    """Width-``width`` rows against single-token rows of the demo prompt, per demo quantization, in order.

    Stops after the first quantization whose rows differ (``stop_at_first``).
    Module-level and pickle-friendly: it runs in a throwaway worker.
    """
    from ...core.kernels.map import map_target
    from ...core.prompts import PromptSpec
    from ...core.session import Session

    from ...core.registry import Runner

    # the settings the decision is made for, every one given (nothing is left for a decision to make here)
    eng = Runner.resolve_settings(EngineSettings.from_dict(settings), backend="llama.cpp", measure=False)[0]
    out: dict[str, dict[str, Any]] = {}
    session = Session()
    try:
        for q in quants:
            t0 = time.perf_counter()
            row = map_target(session, f"demo:{q}", [PromptSpec(name="demo", text=DEMO_PROMPT)], (1, width),
                             positions, eng, stop_at_difference=True)
            w = row.widths[width]
            out[q] = {"rows": w.rows, "identical": w.identical, "max_delta": w.max_delta,
                      "deterministic": row.deterministic, "threads": row.threads_used,
                      "seconds": round(time.perf_counter() - t0, 3)}
            if stop_at_first and differs(out[q]):
                break
    finally:
        session.close()
    return out


def settings_key(settings: EngineSettings) -> dict[str, Any]:
    """The settings that pick kernels (as the kernel map keys them), with the thread count resolved."""
    d = settings.context_key.to_dict()
    for k in ("server_bin", "server_args"):
        d.pop(k, None)
    d["threads"] = resolve_threads(settings.threads)
    return d


def cache_key(settings: EngineSettings, default: str = DEMO_TARGET) -> str:
    blob = json.dumps({"build": build_identity(), "settings": settings_key(settings), "default": default,
                       "width": WIDTH, "positions": POSITIONS}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


CACHE = ProbeCache(CACHE_NAME)


def cached_pick(settings: EngineSettings, default: str = DEMO_TARGET) -> DemoPick | None:
    d = CACHE.get(cache_key(settings, default))
    try:
        return DemoPick.from_json(d) if d is not None else None
    except (KeyError, TypeError, ValueError):
        return None


def pick_demo_target(settings: EngineSettings | None = None, *, default: str = DEMO_TARGET,
                     progress: ProgressFn | None = None, isolate: Callable[..., Any] | None = None,
                     use_cache: bool = True) -> DemoPick:
    """The demo target to run with ``settings`` on this build (cached; measured in a worker when not)."""
    settings = settings or EngineSettings()
    if use_cache:
        hit = cached_pick(settings, default)
        if hit is not None:
            return hit
    if isolate is None:
        from ...core.worker import run_isolated as isolate
    say = progress or (lambda msg: None)
    say(f"checking which demo quantization's {WIDTH}-token verify passes differ from single-token passes on "
        "this build (once; cached)")
    try:
        probes = isolate(measure, order(default), settings.to_dict(), timeout=PICK_TIMEOUT)
    except EngineCrashed as exc:
        first = str(exc).splitlines()[0] if str(exc) else "the worker died"
        return DemoPick(target=default, default=default,
                        reason=f"could not check which demo quantization forks here ({first}); running {default}")
    pick = choose(probes, default=default, no_repack=settings.no_repack)
    CACHE.put(cache_key(settings, default), pick.to_json())
    return pick
