"""The entry point: explain a trace's fork (or confirm there is none)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import SpecviewError
from ..arms.generate import GenOptions
from .reference import reference_for_trace, wanted_for
from ..trace import Trace
from .classify import (FAR_FACTOR, FAR_FLOOR, LOGIT_TOL, SCHEMA_VERSION, at_risk_positions, classify,
                       envelope_stats, far_threshold)
from .controls import control_matrix, serial_verify_control, snapshot_rollbacks
from .replays import ArmCheck, Replays, check_replayable, replay
from .words import explain

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]


def _r(x: float | None, nd: int = 5) -> float | None:
    return None if x is None else round(float(x), nd)


def _arm_json(rp: Replays, check: ArmCheck, key: str, fork: int | None, result: dict[str, Any]) -> dict[str, Any]:
    d = dict(rp.fork_info.get(key, {}))
    for f in ("logit_a", "logit_b", "gap"):
        if f in d:
            d[f] = _r(d[f])
    d.update({
        "reproduced": check.reproduced,
        "reproduces_token": None if fork is None else d.get("token") == (
            result["vanilla_token"] if key == "single" else result["speculative_token"]),
        "first_deviation": check.first_deviation,
        "max_recorded_delta": _r(check.max_delta, 6),
        "rerun_consistent": rp.reruns[key],
    })
    return d


def require_complete(trace: Trace) -> None:
    """Every engine's diagnosis refuses a trace whose arms were cancelled: there is no whole run to explain."""
    for arm in (trace.vanilla, trace.speculative):
        if arm.stop_reason == "cancelled":
            raise SpecviewError(f"the {arm.name} arm was cancelled: there is no complete run to diagnose")


def fork_of(trace: Trace) -> Any:
    """The first mismatch of a forked trace, for every engine's diagnosis.

    Raises :class:`SpecviewError` when one arm only stopped earlier than the
    other: the arms then agree on every token they share and there is no fork.
    """
    fm = trace.comparison.first_mismatch
    assert fm is not None, "an identical trace has no fork"
    if fm.vanilla_token is None or fm.speculative_token is None:
        short = trace.vanilla if fm.vanilla_token is None else trace.speculative
        raise SpecviewError(
            f"the {short.name} arm stopped after {len(short.tokens)} tokens ({short.stop_reason}) while the "
            "other went on; the arms agree on every token they share, so there is no fork to diagnose"
        )
    return fm


def fork_fields(fm: Any) -> dict[str, Any]:
    """The diagnosis keys that say where the fork is and which two tokens part there."""
    return {"fork": fm.index, "vanilla_token": int(fm.vanilla_token), "speculative_token": int(fm.speculative_token),
            "vanilla_piece": fm.vanilla_piece, "speculative_piece": fm.speculative_piece}


def _blank_result() -> dict[str, Any]:
    """The diagnosis' keys in their printed order, each empty until a step fills it."""
    thresholds: dict[str, Any] = {
        "logit_tol": LOGIT_TOL,
        "far_factor": FAR_FACTOR,
        "far_floor": FAR_FLOOR,
        "near_tie": None,
        "far": None,
        "at_risk": None,
    }
    return {
        "version": SCHEMA_VERSION,
        "verdict": None,
        "rule": None,
        "fork": None,
        "vanilla_token": None,
        "speculative_token": None,
        "vanilla_piece": None,
        "speculative_piece": None,
        "gap": None,
        "serial_verify": None,
        "reference": None,
        "envelope": None,
        "at_risk": None,
        "thresholds": thresholds,
        "replays": None,
        "controls": None,
        "explanation": "",
        "seconds": None,
    }


@dataclass
class _Diagnosis:
    """What every step of one diagnosis works with: the run, its loaded target and context, and the result."""

    session: Any
    cfg: Any
    trace: Trace
    prompt: list[int]
    result: dict[str, Any]
    say: ProgressFn
    cancel: CancelFn
    fork: int | None = None
    target: Any = None
    n_ctx: int = 0
    opts: GenOptions | None = None


def _load_target(d: _Diagnosis, n_batch: int, top_k: int) -> None:
    """Load the target and fix the context size and generation options every replay and control uses."""
    cfg, trace = d.cfg, d.trace
    d.target = d.session.model(cfg.backend, cfg.target, cfg.engine)
    d.n_ctx = int(trace.config.get("n_ctx_used") or d.session.context_size(cfg, len(d.prompt), d.target))
    d.opts = GenOptions(max_tokens=cfg.max_tokens, ignore_eos=cfg.ignore_eos, n_batch=n_batch, top_k=top_k)


def _replays(d: _Diagnosis) -> Replays:
    """Both shapes replayed up to the fork (or over the whole run), with the envelope and thresholds they give."""
    fork, result, v = d.fork, d.result, d.trace.vanilla
    top_k = d.opts.top_k
    upto = len(v.tokens) - 1 if fork is None else fork
    check_replayable(d.trace, upto)
    d.say(f"replaying {upto + 1} positions in both shapes (teacher-forced, fresh contexts)")
    e1 = d.session.engine("replay-single", d.target, d.cfg.engine, d.n_ctx)
    e2 = d.session.engine("replay-spec", d.target, d.cfg.engine, d.n_ctx)
    rp = replay(e1, e2, d.trace, prompt=d.prompt, n_batch=d.opts.n_batch, upto=upto, fork=fork, top_k=top_k,
                say=d.say, cancel=d.cancel)
    series = rp.series
    prefix = series[:fork] if fork is not None else series
    stats = envelope_stats(prefix)
    result["envelope"] = {
        "max": _r(stats["max"]),
        "p95": _r(stats["p95"]),
        "median": _r(stats["median"]),
        "at_fork": _r(series[fork]) if fork is not None else None,
        "positions": len(prefix),
        "top_k": top_k,
        "series": [_r(x) for x in series],
    }
    thresholds = result["thresholds"]
    thresholds["near_tie"] = _r(stats["max"])
    thresholds["far"] = _r(far_threshold(stats["max"]))
    thresholds["at_risk"] = _r(stats["max"])
    result["at_risk"] = at_risk_positions([st.margin for st in v.steps], stats["max"])
    result["replays"] = {
        "positions": upto + 1,
        "passes": rp.passes,
        "seconds": round(rp.seconds, 3),
        "single": _arm_json(rp, rp.single, "single", fork, result),
        "speculative": _arm_json(rp, rp.spec, "speculative", fork, result),
    }
    if fork is not None:
        result["gap"] = _r(rp.fork_info["single"]["gap"])
    return rp


def _controls(d: _Diagnosis) -> dict[str, Any]:
    """The control matrix; returns its vanilla-twice control, which is the vanilla arm's repeat."""
    d.say("running the controls")
    d.result["controls"] = control_matrix(d.session, d.cfg, d.trace, d.target, d.n_ctx, d.opts, d.say, d.cancel)
    twice = next(c for c in d.result["controls"] if c["name"] == "vanilla-twice")
    return {k: twice[k] for k in ("identical", "first_mismatch", "n_tokens", "seconds")}


def _classify(d: _Diagnosis, rp: Replays | None, repeat: dict[str, Any] | None) -> tuple[str, str]:
    """The verdict and its rule from what the replays and controls measured."""
    result = d.result
    sv = result["serial_verify"]
    rep = repeat if repeat is not None else (sv or {}).get("vanilla_repeat")
    return classify(
        identical=d.trace.comparison.identical,
        single_reproduced=rp.single.reproduced if rp else True,
        single_rerun_consistent=rp.reruns["single"] if rp else None,
        spec_reproduced=rp.spec.reproduced if rp else True,
        spec_rerun_consistent=rp.reruns["speculative"] if rp else None,
        gap=rp.fork_info["single"]["gap"] if rp and rp.fork_info else None,
        env_max=(result["envelope"] or {}).get("max"),
        serial_verify_identical=sv["identical_to_vanilla"] if sv else None,
        vanilla_repeat_identical=rep["identical"] if rep else None,
        unproven=sv.get("unproven", 0) if sv else snapshot_rollbacks(d.trace),
    )


def diagnose(
    session: Any,
    cfg: Any,
    trace: Trace,
    *,
    controls: bool = False,
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
    envelope_if_identical: bool = False,
    serial_verify: bool = True,
    reference: bool | None = None,
) -> dict[str, Any]:
    """Explain the trace's fork (or confirm there is none); sets ``trace.diagnosis`` to the result.

    ``session`` must hold (or be able to load) the run's target; ``cfg`` is the
    run's :class:`~specview.core.config.RunConfig`.  A fork is replayed in both
    shapes and, with ``serial_verify`` (the default), checked with the
    serial-verify control, whose result decides the verdict where it can.  With
    ``controls`` the control matrix runs too.  ``reference`` runs the backend
    check (:mod:`specview.core.diagnose.reference`) first; None runs it when the run
    used a GPU.  An identical run gets a cheap ``identical`` verdict without
    replays unless ``envelope_if_identical`` asks for the envelope over the
    whole run.  Raises :class:`DiagnosisCancelled` when ``cancel()`` turns True,
    and :class:`SpecviewError` for a trace that cannot be diagnosed (a
    cancelled run, a trace without draft tokens).
    """
    t_start = time.perf_counter()
    require_complete(trace)
    top_k = int(trace.config.get("top_k") or cfg.top_k)
    d = _Diagnosis(session, cfg, trace, prompt=[int(t) for t in trace.prompt["tokens"]], result=_blank_result(),
                   say=progress or (lambda msg: None), cancel=cancel or (lambda: False))
    n_batch = int(cfg.engine.n_batch)
    result, say = d.result, d.say
    if not trace.comparison.identical:
        fm = fork_of(trace)
        d.fork = fm.index
        result.update(fork_fields(fm))
    _load_target(d, n_batch, top_k)
    if reference or (reference is None and wanted_for(cfg)):
        say("backend check: the same tokens teacher-forced on this build and on the reference")
        result["reference"] = reference_for_trace(session, cfg, trace, progress=say, cancel=d.cancel)
    rp = _replays(d) if d.fork is not None or envelope_if_identical else None
    repeat = _controls(d) if controls else None
    if d.fork is not None and serial_verify:
        result["serial_verify"] = serial_verify_control(session, cfg, trace, d.target, d.n_ctx, d.opts, say,
                                                        d.cancel, repeat=repeat)
    result["verdict"], result["rule"] = _classify(d, rp, repeat)
    if result["verdict"] == "near-tie":  # name the op where the fork's verify pass first departs (specview locate)
        from ..locate.find import departure

        say("locating where the fork's verify pass first departs from the single-token pass")
        result["departure"] = departure(session, trace, cancel=d.cancel)
    result["explanation"] = explain(result, trace)
    result["seconds"] = round(time.perf_counter() - t_start, 3)
    trace.diagnosis = result
    return result
