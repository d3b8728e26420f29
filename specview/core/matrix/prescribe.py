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

**Rollback modes** (a hybrid or recurrent target, whose memory cannot drop
positions): at the largest ``n_max`` the map proves for the row (else the
fastest one measured), both arms are run once more in every
rollback mode llama.cpp has for it (``checkpoint``: restore and replay, what
llama-server does for draft-simple; ``snapshots``: n_rs_seq) and the mode is
measured for speed and for exactness.  A mode is *proven lossless* there when
the map proves the widths ``1..n_max+1`` and, on every prompt, every row the
speculative arm recorded equals the vanilla arm's bit for bit through at least
one rollback the mode did: with bit-identical widths any difference can only
come from the state a rollback left, so this checks the rollback itself,
exactly (no threshold).  The fastest proven mode is prescribed where it is
faster than the row's own; no mode is prescribed where none is proven.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from collections import Counter

from ..config import RunConfig
from ..errors import Cancelled, ConfigError
from ..eta import WorkEta
from ..kernels.map import KernelMap, TargetMap, kernel_map
from .rates import wilson  # the one 95% Wilson interval the matrix's rates use too
from .suite_results import match, rate_text, suite_rates
from ..prompts import PromptSpec

DEFAULT_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 15)
DEFAULT_TOKENS = 64
#: the rollback modes weighed for a target whose memory cannot drop positions (core/engine.py's names)
WEIGHED_ROLLBACKS = ("checkpoint", "snapshots")

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
    rollback: str | None = None  # how the target's context rolled back (the trace's context_used)
    restores: dict[str, int] = field(default_factory=dict)  # rounds per rollback kind, over every prompt
    rows_exact: bool = True  # every speculative row equals the vanilla row at its index, bit for bit

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
                "diverged": [list(x) for x in self.diverged], "acceptance": self.acceptance,
                "rollback": self.rollback, "restores": dict(self.restores), "rows_exact": self.rows_exact}


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
class RollbackOption:
    """One rollback mode of a hybrid target, at one n_max: its speed runs, or why it could not run."""

    mode: str
    measurement: Measurement | None
    proven: bool
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "proven": self.proven, "why": self.why,
                "measurement": self.measurement.to_json() if self.measurement else None}


@dataclass
class RollbackWeighing:
    """The rollback modes of one map row, weighed at one n_max, and the one prescribed (None: none)."""

    target: str
    n_max: int
    own: str | None  # the mode the row's runs used (what the run would decide)
    options: list[RollbackOption]
    prescribed: str | None
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "n_max": self.n_max, "own": self.own, "prescribed": self.prescribed,
                "why": self.why, "options": [o.to_json() for o in self.options]}

    def lines(self) -> list[str]:
        out = [f"Rollback modes of {self.target} at --spec-draft-n-max {self.n_max} (its memory cannot drop "
               f"positions; the runs above used {self.own}):"]
        for o in self.options:
            m = o.measurement
            speed = f"{m.speedup:.2f}x vanilla" if m and m.speedup else "not measured"
            out.append(f"  --rollback {o.mode:<10}  {speed:<14}  {'proven lossless' if o.proven else 'NOT proven'}: "
                       f"{o.why}")
        out.append(f"  prescribed: --rollback {self.prescribed} ({self.why})" if self.prescribed else
                   f"  no rollback mode prescribed: {self.why}")
        return out


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
    #: per hybrid map row, the rollback modes weighed (:class:`RollbackWeighing`)
    rollbacks: list["RollbackWeighing"] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"schema": "specview.prescription/1", "lossless": [c.to_json() for c in self.lossless],
                "fastest_lossy": self.fastest_lossy.to_json() if self.fastest_lossy else None,
                "fastest_lossy_divergence": self.lossy_rate, "nothing_lossless": list(self.nothing),
                "prompts": [p.to_json() for p in self.prompts], "max_tokens": self.max_tokens, "draft": self.draft,
                "environment": self.environment, "causes": list(self.causes),
                "rollbacks": [r.to_json() for r in self.rollbacks]}

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
        for r in self.rollbacks:
            lines.append("")
            lines += r.lines()
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
    rollback: str | None = None
    restores: Counter[str] = Counter()
    exact = True
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
        rollback = (trace.config.get("context_used") or {}).get("rollback", rollback)
        restores.update(r.rollback for r in trace.speculative.rounds[1:] if r.rollback)
        exact = exact and rows_equal(trace.vanilla, trace.speculative)
    return Measurement(target=target, settings=settings, n_max=n_max,
                       vanilla_tps=v_tok / (v_ms / 1000) if v_ms else 0.0,
                       speculative_tps=s_tok / (s_ms / 1000) if s_ms else 0.0,
                       runs=len(prompts), diverged=diverged, acceptance=accepted / drafted if drafted else None,
                       rollback=rollback, restores=dict(restores), rows_exact=exact)


def rows_equal(vanilla: Any, speculative: Any) -> bool:
    """Whether the speculative arm recorded, at every index, the very row vanilla did (top-k ids and logits, bit
    for bit) and the same tokens."""
    if vanilla.tokens != speculative.tokens or len(vanilla.steps) != len(speculative.steps):
        return False
    return all(a.top_ids == b.top_ids and a.top_logits == b.top_logits
               for a, b in zip(vanilla.steps, speculative.steps))


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
    rollbacks: list[RollbackWeighing] = field(default_factory=list)

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


def _x(m: Measurement | None) -> str:
    return f"{m.speedup:.2f}x" if m is not None and m.speedup else "speed not measured"


def _rollback_proof(safe: int | None, n: int, m: Measurement, mode: str) -> tuple[bool, str]:
    """Whether ``m`` (the speed runs in rollback ``mode`` at ``n_max`` ``n``) proves the mode exact, and why."""
    if not safe or n > safe:
        return False, (f"the map does not prove widths 1-{n + 1} bit-identical, so a speculative row may differ "
                       "through the batched numerics and no run here can tell that from a rollback's state")
    done = sum(m.restores.values())
    if not done:
        return False, "no draft was rejected in the speed runs, so the mode never rolled back"
    kinds = ", ".join(f"{c} {k}" for k, c in sorted(m.restores.items()))
    if not m.rows_exact:
        return False, (f"every width 1-{n + 1} is bit-identical, yet a speculative row differed from vanilla's "
                       f"after its rollbacks ({kinds}): the rollback left another state; run `specview run "
                       f"--rollback {mode}` on this target and read the diagnosis")
    return True, (f"the map proves widths 1-{n + 1}, and every speculative row equals vanilla's bit for bit "
                  f"through its rollbacks ({kinds})")


def _weigh_rollbacks(pr: _Prescribing, t: TargetMap, safe: int | None, cache: dict[int, Measurement]) -> None:
    """A hybrid row: every rollback mode at the row's n_max (the largest proven one, else the fastest measured),
    for speed and exactness; the fastest proven one prescribed."""
    own = next((m.rollback for m in cache.values() if m.rollback), None)
    if own in (None, "seq-rm") or not cache:
        return  # a KV cache drops positions: there is nothing to weigh
    # the largest n_max the map proves (its rollbacks drop up to n_max tokens: the deepest the claims allow),
    # else the fastest one measured
    n = safe if safe and safe in cache else max(cache, key=lambda k: cache[k].speedup or 0.0)
    options = []
    for mode in WEIGHED_ROLLBACKS:
        if mode == own:
            m = cache[n]
        elif mode == "snapshots" and t.settings.n_ubatch <= n + 1:
            options.append(RollbackOption(mode, None, False, f"snapshots are kept only inside one micro-batch, which "
                                          f"must hold more than n_max + 1 = {n + 1} tokens (-ub "
                                          f"{t.settings.n_ubatch})"))
            continue
        else:
            try:
                m = pr.speed(t, n, replace(t.settings, rollback=mode))
            except ConfigError as exc:  # a mode this architecture does not have
                options.append(RollbackOption(mode, None, False, str(exc)))
                continue
        proven, why = _rollback_proof(safe, n, m, mode)
        options.append(RollbackOption(mode, m, proven, why))
    ok = sorted((o for o in options if o.proven), key=lambda o: -(o.measurement.speedup or 0.0))
    mine = next((o for o in options if o.mode == own), None)
    if not ok:
        pick, why = None, "none is proven lossless here"
    elif ok[0].mode == own:
        pick, why = own, "the run's own mode is the fastest proven one"
    else:
        best, pick = ok[0], ok[0].mode
        if mine is not None and mine.proven:  # both proven: the sort put the faster first
            why = (f"proven, and faster than --rollback {own}: {_x(best.measurement)} against "
                   f"{_x(mine.measurement)}")
        else:
            why = f"proven, where --rollback {own} is not"
    pr.rollbacks.append(RollbackWeighing(t.label, n, own, options, pick, why))


def _prescribe_row(pr: _Prescribing, t: TargetMap, cands: list[int], ub1: bool) -> None:
    """One map row: every candidate n_max measured, its claims, and -ub 1 where no n_max is safe enough."""
    safe = t.safe_n_max()
    todo = sorted(set(cands) | ({safe} if safe else set()))
    cache = _measure_all(pr, t, todo)
    _weigh_rollbacks(pr, t, safe, cache)
    if safe:
        _claim_safe(pr, t, safe, cache)
    lossy_here = [m for n, m in cache.items() if not safe or n > safe]
    pr.lossy += lossy_here
    ub_claim = _claim_ub1(pr, t, lossy_here) if ub1 and t.settings.n_ubatch != 1 and lossy_here else None
    _say_nothing(pr, t, safe, ub_claim)


def _lossy_rate(fastest_lossy: Measurement, suite_results: str | None, draft: str, max_tokens: int) -> str:
    """The fastest lossy setting's divergence rate: the suite results' entry for it, else the speed runs'."""
    r = match(suite_rates(suite_results), fastest_lossy, draft) if suite_results else None
    if r is not None:
        return rate_text(r, suite_results)
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
                        causes=causes, rollbacks=pr.rollbacks)


__all__ = ["DEFAULT_CANDIDATES", "WEIGHED_ROLLBACKS", "Claim", "Measurement", "Prescription", "RollbackOption",
           "RollbackWeighing", "measure", "prescribe", "rows_equal", "setting_flags", "suite_rates", "wilson"]
