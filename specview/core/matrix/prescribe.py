"""The prescription: which speculative settings are proven lossless on this machine, and which is fastest.

It combines two measurements taken here:

* **The kernel map** (:mod:`specview.core.kernels.map`): a draft of ``n_max``
  tokens uses verify widths ``1..n_max+1``; a setting is *proven lossless*
  only where the map found every row of every one of those widths
  bit-identical to the single-token row, for the target under exactly those
  engine settings (quantization, flash attention, micro-batch).  The claim
  names the prompts and positions it rests on.
* **Speed**: short runs of both arms through the Session for each candidate
  ``n_max`` on the map's prompts; the speedup is the speculative arm's
  tokens per second over the vanilla arm's.  The same runs also check the
  claims: a proven-lossless setting whose arms differ there is reported as
  contradicted (that would be a state bug or a map that missed a shape).

``-ub 1`` (every verify row computed in its own single-token micro-batch) is
mapped too, at the fastest ``n_max`` that is not proven lossless without it,
over that ``n_max``'s widths, and measured: the price of forcing that speed
to be lossless.  The fastest lossy setting is shown for comparison, with its
divergence rate from a suite result file (``specview matrix --suite``) when
one is given, else from the short runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..config import RunConfig
from ..errors import Cancelled
from ..eta import WorkEta
from ..kernels.map import KernelMap, TargetMap, kernel_map
from .rates import wilson  # the one 95% Wilson interval the matrix's rates use too
from ..prompts import PromptSpec
from ..trace import read_json

DEFAULT_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 15)
DEFAULT_TOKENS = 64

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]


def setting_flags(settings: Any, n_max: int) -> str:
    """The llama.cpp flags that make this setting: ``--spec-draft-n-max 3 -ub 1 -fa on``."""
    from ..config import EngineSettings

    base = EngineSettings()
    out = [f"--spec-draft-n-max {n_max}"]
    for name, flag in (("n_ubatch", "-ub"), ("flash_attn", "-fa"), ("n_batch", "-b"), ("threads", "-t"),
                       ("kv_type", "-ctk/-ctv")):
        v = getattr(settings, name)
        if v != getattr(base, name):
            out.append(f"{flag} {v}")
    return " ".join(out)


@dataclass
class Measurement:
    """Both arms of one speculative setting on every prompt, short runs."""

    target: str
    settings: Any  # EngineSettings
    n_max: int
    vanilla_tps: float
    speculative_tps: float
    runs: int
    diverged: list[tuple[str, int]] = field(default_factory=list)  # (prompt, first mismatch)
    acceptance: float | None = None

    @property
    def speedup(self) -> float | None:
        return self.speculative_tps / self.vanilla_tps if self.vanilla_tps > 0 else None

    @property
    def flags(self) -> str:
        return setting_flags(self.settings, self.n_max)

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "settings": self.settings.to_dict(), "n_max": self.n_max,
                "flags": self.flags, "vanilla_tokens_per_s": self.vanilla_tps,
                "speculative_tokens_per_s": self.speculative_tps, "speedup": self.speedup, "runs": self.runs,
                "diverged": [list(x) for x in self.diverged], "acceptance": self.acceptance}


@dataclass
class Claim:
    """A setting the map proves lossless (or, for the comparison line, does not)."""

    kind: str  # "n_max" (widths bit-identical at the map's settings) or "ub1" (-ub 1)
    target: str
    n_max: int
    proven: bool
    evidence: str
    measurement: Measurement | None = None
    note: str = ""

    @property
    def contradicted(self) -> bool:
        """A proven setting whose arms nevertheless differed in the speed runs."""
        return self.proven and self.measurement is not None and bool(self.measurement.diverged)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "n_max": self.n_max, "proven": self.proven,
                "contradicted": self.contradicted, "evidence": self.evidence, "note": self.note,
                "measurement": self.measurement.to_json() if self.measurement else None}


@dataclass
class Prescription:
    lossless: list[Claim]
    fastest_lossy: Measurement | None
    lossy_rate: str | None
    nothing: list[str]
    prompts: list[PromptSpec]
    max_tokens: int
    draft: str
    environment: dict[str, Any] = field(default_factory=dict)
    #: per map row, the widths grouped by the op they first differ at and the settings that remove each cause
    causes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"schema": "specview.prescription/1", "lossless": [c.to_json() for c in self.lossless],
                "fastest_lossy": self.fastest_lossy.to_json() if self.fastest_lossy else None,
                "fastest_lossy_divergence": self.lossy_rate, "nothing_lossless": list(self.nothing),
                "prompts": [p.to_json() for p in self.prompts], "max_tokens": self.max_tokens, "draft": self.draft,
                "environment": self.environment, "causes": list(self.causes)}

    def text(self) -> str:
        env = self.environment
        where = ", ".join(str(x) for x in (env.get("backend"), env.get("cpu")) if x)
        lines = [f"The settings proven lossless here ({where}; draft {self.draft}; speed from "
                 f"{len(self.prompts)} prompt(s) x {self.max_tokens} tokens per arm):"]
        if not self.lossless:
            lines.append("  none.")
        rows = [(c, f"{c.measurement.target if c.measurement else c.target} "
                    f"{setting_flags(c.measurement.settings, c.n_max) if c.measurement else c.n_max}")
                for c in self.lossless]
        w = max([len(r[1]) for r in rows] + [20])
        for c, what in rows:
            m = c.measurement
            speed = f"{m.speedup:.2f}x vanilla" if m and m.speedup else "speed not measured"
            lines.append(f"  {what:<{w}}  {speed}" + (f"  ({c.note})" if c.note else ""))
            lines.append(f"      proven by the kernel map: {c.evidence}")
            if c.contradicted:
                lines.append(f"      CONTRADICTED: the arms still differed in the speed runs at "
                             f"{', '.join(f'{p} token {j}' for p, j in m.diverged)}; batched numerics cannot do "
                             "that where every row is bit-identical: run `specview run` with these settings and "
                             "read the diagnosis")
        for s in self.nothing:
            lines.append(f"  {s}")
        measured = [c.measurement.speedup for c in self.lossless if c.measurement and c.measurement.speedup]
        if self.fastest_lossy is not None and self.fastest_lossy.speedup:
            measured.append(self.fastest_lossy.speedup)
        if measured and max(measured) < 1.0:
            lines.append("  Plain decoding is faster than every speculative setting measured here: the draft "
                         "costs more than the verify passes save (a smaller or faster draft model changes that).")
        if self.causes:
            lines.append("")
            lines.append("Why the other widths differ (a locate at each one's first differing row):")
            lines += [f"  {c}" for c in self.causes]
        if self.fastest_lossy is not None:
            m = self.fastest_lossy
            speed = f"{m.speedup:.2f}x vanilla" if m.speedup else "speed not measured"
            lines.append("")
            lines.append(f"Fastest lossy setting, for comparison: {m.target} {m.flags}: {speed}; {self.lossy_rate}")
        return "\n".join(lines)


# -- measuring ---------------------------------------------------------------------------
def measure(session: Any, target: str, draft: str, settings: Any, n_max: int, prompts: Sequence[PromptSpec],
            max_tokens: int, *, backend: str = "llama.cpp", cancel: CancelFn | None = None) -> Measurement:
    """Both arms on every prompt (the vanilla arm is the Session's cached one); tokens per second summed."""
    v_tok = v_ms = s_tok = s_ms = 0.0
    drafted = accepted = 0
    diverged = []
    for p in prompts:
        cfg = RunConfig(target=target, draft=draft, spec_type="draft-simple", n_max=n_max, max_tokens=max_tokens,
                        ignore_eos=True, backend=backend, engine=settings, chat=p.chat if p.tokens is None else False,
                        prompt=p.text if p.tokens is None else None,
                        prompt_tokens=tuple(p.tokens) if p.tokens is not None else None)
        trace = session.run(cfg, cancel=cancel)
        if "cancelled" in (trace.vanilla.stop_reason, trace.speculative.stop_reason):
            raise Cancelled("prescription cancelled")
        v_tok += len(trace.vanilla.tokens)
        v_ms += trace.vanilla.gen_ms
        s_tok += len(trace.speculative.tokens)
        s_ms += trace.speculative.gen_ms
        drafted += trace.speculative.n_drafted
        accepted += trace.speculative.n_accepted
        if not trace.comparison.identical:
            diverged.append((p.name, trace.comparison.first_mismatch.index))
    return Measurement(target=target, settings=settings, n_max=n_max,
                       vanilla_tps=v_tok / (v_ms / 1000) if v_ms else 0.0,
                       speculative_tps=s_tok / (s_ms / 1000) if s_ms else 0.0,
                       runs=len(prompts), diverged=diverged, acceptance=accepted / drafted if drafted else None)


# -- suite results -----------------------------------------------------------------------
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


def _match(rates: list[dict[str, Any]], m: Measurement, draft: str) -> dict[str, Any] | None:
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


def _rate_text(r: dict[str, Any], source: str) -> str:
    s = f"divergence rate {100 * r['rate']:.0f}%"
    if r.get("k") is not None and r.get("n") is not None:
        s += f" ({r['k']} of {r['n']} prompts)"
    ci = r.get("interval")
    if ci and all(isinstance(x, (int, float)) for x in ci):
        s += f", 95% interval {100 * ci[0]:.0f}-{100 * ci[1]:.0f}%"
    return s + f" in {source}"


# -- the prescription --------------------------------------------------------------------
@dataclass
class _Prescribing:
    """One prescription's inputs, and the claims and measurements it has made so far over the map's rows."""

    session: Any
    kmap: KernelMap
    draft: str
    prompts: list[PromptSpec]
    max_tokens: int
    say: ProgressFn
    progress: ProgressFn | None
    cancel: CancelFn | None
    lossless: list[Claim] = field(default_factory=list)
    nothing: list[str] = field(default_factory=list)
    lossy: list[Measurement] = field(default_factory=list)

    def speed(self, t: TargetMap, n: int, settings: Any = None) -> Measurement:
        """Both arms of ``t``'s target at ``n_max`` ``n`` (under ``settings``, the row's own by default)."""
        settings = t.settings if settings is None else settings
        self.say(f"prescription: {t.target} {setting_flags(settings, n)}: both arms on {len(self.prompts)} "
                 f"prompt(s), {self.max_tokens} tokens")
        return measure(self.session, t.target, self.draft, settings, n, self.prompts, self.max_tokens,
                       backend=self.kmap.backend, cancel=self.cancel)


def _measure_all(pr: _Prescribing, t: TargetMap, todo: list[int]) -> dict[int, Measurement]:
    """Every n_max of ``todo`` measured on ``t``'s settings, with an ETA line after each when there are several."""
    eta = WorkEta(dict.fromkeys(todo, 1), label=f"prescription: {t.target}", unit="n_max measured", every=0.0)
    cache: dict[int, Measurement] = {}
    for n in todo:
        cache[n] = pr.speed(t, n)
        if len(todo) > 1 and (line := eta.done(n, what=f"n_max {n}")):
            pr.say(line)
    return cache


def _claim_safe(pr: _Prescribing, t: TargetMap, safe: int, cache: dict[int, Measurement]) -> None:
    """The largest n_max the map proves, and the fastest proven one when that is another."""
    best_safe = max((cache[n] for n in cache if n <= safe), key=lambda m: m.speedup or 0.0)
    pr.lossless.append(Claim("n_max", t.label, safe, True, t.evidence(range(1, safe + 2)), cache[safe],
                             note="largest n_max the map proves"))
    if best_safe.n_max != safe:
        pr.lossless.append(Claim("n_max", t.label, best_safe.n_max, True,
                                 t.evidence(range(1, best_safe.n_max + 2)), best_safe,
                                 note="fastest of the proven n_max"))


def _claim_ub1(pr: _Prescribing, t: TargetMap, lossy_here: list[Measurement]) -> Claim:
    """-ub 1 can make a lossy n_max lossless: mapped and measured at the fastest lossy one."""
    kmap = pr.kmap
    base = max(lossy_here, key=lambda m: m.speedup or 0.0)
    n = base.n_max
    st1 = replace(t.settings, n_ubatch=1)
    pr.say(f"prescription: mapping {t.target} with -ub 1 over widths 1-{n + 1}")
    km1 = kernel_map(pr.session, [t.target], pr.prompts, range(1, n + 2), kmap.positions, st1, backend=kmap.backend,
                     top_k=kmap.top_k, progress=pr.progress, cancel=pr.cancel, stop_at_difference=True)
    t1 = km1.targets[0]
    proven = t1.safe_n_max() is not None and t1.safe_n_max() >= n
    m1 = pr.speed(t, n, st1)
    cost = ""
    if m1.speedup and base.speedup:
        ratio = m1.speedup / base.speedup
        cost = (f"-ub 1 costs {100 * (1 - ratio):.0f}% of the speed of the same n_max at "
                f"-ub {t.settings.n_ubatch}" if ratio < 1 else
                f"-ub 1 measured no slower than the same n_max at -ub {t.settings.n_ubatch}")
    ub_claim = Claim("ub1", t.label, n, proven, t1.evidence(), m1, note=cost)
    if proven:
        pr.lossless.append(ub_claim)
    else:
        pr.lossy.append(m1)
    return ub_claim


def _say_nothing(pr: _Prescribing, t: TargetMap, safe: int | None, ub_claim: Claim | None) -> None:
    """The line for a row where no n_max is proven lossless: why, and what forcing it takes."""
    if not safe and not (ub_claim and ub_claim.proven):
        w2 = t.widths.get(2)
        why = ("the width-1 control failed (not deterministic)" if not t.deterministic else
               f"width 2 already differs at {w2.rows - w2.identical} of {w2.rows} rows" if w2 else
               "width 2 was not mapped")
        force = ("only plain decoding (--spec-draft-p-min 1, 1.00x) is lossless for certain" if ub_claim is None
                 else f"-ub 1 was mapped too and is not bit-identical either ({ub_claim.evidence}); "
                 "only plain decoding is lossless for certain")
        pr.nothing.append(f"{t.label}: nothing is proven lossless: {why}; {force}")
    elif not safe and ub_claim is not None:
        w2 = t.widths.get(2)
        if w2 is not None:
            pr.nothing.append(f"{t.label}: no n_max is lossless at -ub {t.settings.n_ubatch} (width 2 differs at "
                              f"{w2.rows - w2.identical} of {w2.rows} rows); forcing it takes -ub 1 (above)")


def _prescribe_row(pr: _Prescribing, t: TargetMap, cands: list[int], ub1: bool) -> None:
    """One map row: every candidate n_max measured, its claims, and -ub 1 where no n_max is safe enough."""
    safe = t.safe_n_max()
    todo = sorted(set(cands) | ({safe} if safe else set()))
    cache = _measure_all(pr, t, todo)
    if safe:
        _claim_safe(pr, t, safe, cache)
    lossy_here = [m for n, m in cache.items() if not safe or n > safe]
    pr.lossy += lossy_here
    ub_claim = _claim_ub1(pr, t, lossy_here) if ub1 and t.settings.n_ubatch != 1 and lossy_here else None
    _say_nothing(pr, t, safe, ub_claim)


def _lossy_rate(fastest_lossy: Measurement, suite_results: str | None, draft: str, max_tokens: int) -> str:
    """The fastest lossy setting's divergence rate: the suite results' entry for it, else the speed runs'."""
    r = _match(suite_rates(suite_results), fastest_lossy, draft) if suite_results else None
    if r is not None:
        return _rate_text(r, suite_results)
    k, n = len(fastest_lossy.diverged), fastest_lossy.runs
    lo, hi = wilson(k, n)
    rate = (f"diverged on {k} of {n} prompt(s) in these {max_tokens}-token runs (95% interval "
            f"{100 * lo:.0f}-{100 * hi:.0f}%)")
    if suite_results:
        rate += f"; the suite results {suite_results} have no entry for this setting"
    return rate


def prescribe(
    session: Any,
    kmap: KernelMap,
    *,
    draft: str,
    candidates: Sequence[int] = DEFAULT_CANDIDATES,
    max_tokens: int = DEFAULT_TOKENS,
    ub1: bool = True,
    suite_results: str | None = None,
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
) -> Prescription:
    """The prescription for every target row of ``kmap`` (see the module docstring)."""
    say = progress or (lambda msg: None)
    prompts = list(kmap.prompts)
    max_width = max(kmap.widths)
    cands = sorted({n for n in candidates if 1 <= n and n + 1 <= max_width})
    pr = _Prescribing(session, kmap, draft, prompts, max_tokens, say, progress, cancel)
    for t in kmap.targets:
        _prescribe_row(pr, t, cands, ub1)
    lossless = pr.lossless
    lossless.sort(key=lambda c: -(c.measurement.speedup or 0.0) if c.measurement else 0.0)
    fastest_lossy = max(pr.lossy, key=lambda m: m.speedup or 0.0) if pr.lossy else None
    rate = None if fastest_lossy is None else _lossy_rate(fastest_lossy, suite_results, draft, max_tokens)
    from ..kernels.causes import prescription_lines

    causes = [line for t in kmap.targets for line in prescription_lines(t)]
    return Prescription(lossless=lossless, fastest_lossy=fastest_lossy, lossy_rate=rate, nothing=pr.nothing,
                        prompts=prompts, max_tokens=max_tokens, draft=draft, environment=dict(kmap.environment),
                        causes=causes)


__all__ = ["DEFAULT_CANDIDATES", "Claim", "Measurement", "Prescription", "measure", "prescribe", "setting_flags",
           "suite_rates", "wilson"]
