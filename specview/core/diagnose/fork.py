"""The entry point: explain a trace's fork (or confirm there is none)."""

from __future__ import annotations

import time
from typing import Any, Callable

from ..errors import SpecviewError
from ..arms.generate import GenOptions
from ..reference import reference_for_trace, wanted_for
from ..trace import Trace
from .classify import (FAR_FACTOR, FAR_FLOOR, LOGIT_TOL, SCHEMA_VERSION, at_risk_positions, classify,
                       envelope_stats, far_threshold)
from .controls import control_matrix, serial_verify_control
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
    check (:mod:`specview.core.reference`) first; None runs it when the run
    used a GPU.  An identical run gets a cheap ``identical`` verdict without
    replays unless ``envelope_if_identical`` asks for the envelope over the
    whole run.  Raises :class:`DiagnosisCancelled` when ``cancel()`` turns True,
    and :class:`SpecviewError` for a trace that cannot be diagnosed (a
    cancelled run, a trace without draft tokens).
    """
    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    t_start = time.perf_counter()
    v, comp = trace.vanilla, trace.comparison
    require_complete(trace)
    top_k = int(trace.config.get("top_k") or cfg.top_k)
    prompt = [int(t) for t in trace.prompt["tokens"]]
    n_batch = int(cfg.engine.n_batch)

    thresholds: dict[str, Any] = {
        "logit_tol": LOGIT_TOL,
        "far_factor": FAR_FACTOR,
        "far_floor": FAR_FLOOR,
        "near_tie": None,
        "far": None,
        "at_risk": None,
    }
    result: dict[str, Any] = {
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

    fork: int | None = None
    if not comp.identical:
        fm = fork_of(trace)
        fork = fm.index
        result.update(fork_fields(fm))

    target = session.model(cfg.backend, cfg.target, cfg.engine)
    n_ctx = int(trace.config.get("n_ctx_used") or session.context_size(cfg, len(prompt), target))
    opts = GenOptions(max_tokens=cfg.max_tokens, ignore_eos=cfg.ignore_eos, n_batch=n_batch, top_k=top_k)

    if reference or (reference is None and wanted_for(cfg)):
        say("backend check: the same tokens teacher-forced on this build and on the reference")
        result["reference"] = reference_for_trace(session, cfg, trace, progress=say, cancel=cancel)

    rp: Replays | None = None
    if fork is not None or envelope_if_identical:
        upto = len(v.tokens) - 1 if fork is None else fork
        check_replayable(trace, upto)
        say(f"replaying {upto + 1} positions in both shapes (teacher-forced, fresh contexts)")
        e1 = session.engine("replay-single", target, cfg.engine, n_ctx)
        e2 = session.engine("replay-spec", target, cfg.engine, n_ctx)
        rp = replay(e1, e2, trace, prompt=prompt, n_batch=n_batch, upto=upto, fork=fork, top_k=top_k, say=say,
                    cancel=cancel)
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

    repeat = None
    if controls:
        say("running the controls")
        result["controls"] = control_matrix(session, cfg, trace, target, n_ctx, opts, say, cancel)
        twice = next(c for c in result["controls"] if c["name"] == "vanilla-twice")
        repeat = {k: twice[k] for k in ("identical", "first_mismatch", "n_tokens", "seconds")}

    if fork is not None and serial_verify:
        result["serial_verify"] = serial_verify_control(session, cfg, trace, target, n_ctx, opts, say, cancel,
                                                        repeat=repeat)
    sv = result["serial_verify"]
    rep = repeat if repeat is not None else (sv or {}).get("vanilla_repeat")

    verdict, rule = classify(
        identical=comp.identical,
        single_reproduced=rp.single.reproduced if rp else True,
        single_rerun_consistent=rp.reruns["single"] if rp else None,
        spec_reproduced=rp.spec.reproduced if rp else True,
        spec_rerun_consistent=rp.reruns["speculative"] if rp else None,
        gap=rp.fork_info["single"]["gap"] if rp and rp.fork_info else None,
        env_max=(result["envelope"] or {}).get("max"),
        serial_verify_identical=sv["identical_to_vanilla"] if sv else None,
        vanilla_repeat_identical=rep["identical"] if rep else None,
    )
    result["verdict"], result["rule"] = verdict, rule
    if verdict == "near-tie":  # name the op where the fork's verify pass first departs (specview locate)
        from ..locate.find import departure

        say("locating where the fork's verify pass first departs from the single-token pass")
        result["departure"] = departure(session, trace, cancel=cancel)
    result["explanation"] = explain(result, trace)
    result["seconds"] = round(time.perf_counter() - t_start, 3)
    trace.diagnosis = result
    return result
