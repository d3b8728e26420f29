"""A llama-server fork explained from the outside, with core's :func:`~specview.core.diagnose.classify`.

What is measured, and what each measurement may conclude:

* **Repeats** (determinism, and only they): the vanilla arm's own requests, and
  the speculative arm's own request, sent again on a fresh slot.  Only a repeat
  that disagrees with its arm makes the verdict ``nondeterministic``.
* **The serial-verify control** (the threshold-free test): the same server with
  ``-ub 1``, both arms on it.  Every pass then computes one token, so a verify
  row is computed exactly as plain decoding computes it; speculative identical
  to vanilla there proves the fork comes from batched numerics (``near-tie``),
  different proves the loop or its cache wrong (``state``).
* **Shape replays** (evidence about shapes, supporting numbers): the prefix
  ending at the fork evaluated as one T-token pass, and the shared prefix
  written T tokens per pass, each on the run's server.  A shape that moves the
  fork row is what a near-tie is; none of them says anything about determinism.
  They give the envelope and thresholds that decide only when the control is
  not available.

Every replay records its shape and how many tokens the server says it
evaluated, so a reader can check the shape was the one named.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ...core.diagnose import FAR_FACTOR, FAR_FLOOR, LOGIT_TOL, SCHEMA_VERSION, classify, envelope_stats, far_threshold
from ...core.diagnose import at_risk_positions, fork_fields, fork_of, require_complete
from ...core.diagnose.words import identical_words
from ...core.errors import Cancelled, SpecviewError
from ...core.llama_flags import UB1_REFUSED
from ...core.trace import ArmResult, Trace
from ..local_server.process import LocalServer
from .protocol import (arm_from_stream, completion_body, held_back_ids, stream_completion, top_from_entry,
                       vanilla_by_requests)

# the runner and its plan (specview.backends.llama_server.runner) are passed in, never imported here
ServerRunner = Any
Plan = Any

ProgressFn = Callable[[str], None]
#: a speculative repeat generates this many tokens past the fork (at least every draft near the fork is as long)
REPEAT_MARGIN = 128
METHOD = "llama-server (from the outside)"


def _r(x: float | None, nd: int = 5) -> float | None:
    return None if x is None else round(float(x), nd)


def _gap(ids: list[int], vals: list[float], a: int, b: int) -> tuple[float | None, bool]:
    """lp(a) - lp(b) in one row, and whether it is only a lower bound (b outside the reported top-k)."""
    if a not in ids:
        return None, False
    la = vals[ids.index(a)]
    if b in ids:
        return la - vals[ids.index(b)], False
    return (la - vals[-1], True) if vals else (None, False)


def _rank(ids: list[int], tok: int) -> int | None:
    return ids.index(tok) + 1 if tok in ids else None


def _relative_shift(ids: list[int], vals: list[float], rec_ids: list[int], rec_vals: list[float]) -> float | None:
    """Largest change of lp(x) - lp(top-1) over tokens both rows report (top-1: the recorded row's).

    Differences of log-probabilities within a row are logit differences, so this
    is how far the logits moved relative to each other, free of each row's normaliser.
    """
    if not rec_ids or rec_ids[0] not in ids:
        return None
    ref_new, ref_old = vals[ids.index(rec_ids[0])], rec_vals[0]
    rec = dict(zip(rec_ids, rec_vals))
    ds = [abs((v - ref_new) - (rec[t] - ref_old)) for t, v in zip(ids, vals) if t in rec]
    return max(ds) if ds else None


def _row_delta(ids: list[int], vals: list[float], rec_ids: list[int], rec_vals: list[float]) -> float | None:
    rec = dict(zip(rec_ids, rec_vals))
    ds = [abs(v - rec[t]) for t, v in zip(ids, vals) if t in rec]
    return max(ds) if ds else None


def compare_repeat(arm: ArmResult, again: ArmResult, upto: int) -> dict[str, Any]:
    """How a repeat agrees with its arm over tokens 0..upto: tokens, and log-probabilities where both have them."""
    first = None
    max_delta = 0.0
    for j in range(upto + 1):
        x = arm.steps[j] if j < len(arm.steps) else None
        y = again.steps[j] if j < len(again.steps) else None
        if x is None or y is None or x.token != y.token:
            first = j if first is None else first
            break
        d = _row_delta(y.top_ids, y.top_logits, x.top_ids, x.top_logits) if x.top_ids and y.top_ids else None
        if d is not None:
            max_delta = max(max_delta, d)
            if d > LOGIT_TOL and first is None:
                first = j
    return {"identical": first is None, "first_mismatch": first, "positions": upto + 1,
            "max_logprob_delta": _r(max_delta, 6)}


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for j, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))


def _cancel_check(cancel: Callable[[], bool]) -> None:
    if cancel():
        raise Cancelled("diagnosis cancelled")


# -- the measurements ----------------------------------------------------------------------
def vanilla_repeat(runner: ServerRunner, plan: Plan, trace: Trace, n: int, cancel: Callable[[], bool]
                   ) -> tuple[ArmResult, dict[str, Any]]:
    """The vanilla arm's own requests again, on a fresh slot, for its first ``n`` tokens."""
    rec = (trace.extra.get("server") or {}).get("vanilla") or {}
    cfg = trace.config
    vm = runner.vocab(plan.target)
    n_probs = max(int(cfg.get("top_k") or 8), 2)
    if rec.get("form") == "one-request":
        srv, _ = runner.server(plan, "vanilla", cancel=cancel)
        resp = srv.post("/completion", completion_body(plan.tokens, n, n_probs=n_probs,
                                                       ignore_eos=bool(cfg.get("ignore_eos"))), cancel=cancel)
        from .protocol import arm_from_response

        arm = arm_from_response("vanilla", resp, prompt_len=len(plan.tokens), piece=vm.piece)
        shape = "the vanilla arm's request again on a fresh slot of a server without the drafter"
    else:
        srv, _ = runner.server(plan, "speculative", cancel=cancel)
        arm, _ = vanilla_by_requests(srv, plan.tokens, n, n_probs=n_probs, ignore_eos=bool(cfg.get("ignore_eos")),
                                     n_batch=int(cfg["engine"]["n_batch"]), piece=vm.piece, cancel=cancel)
        shape = ("the vanilla arm's one-token requests again from a fresh slot (the prompt in -b chunks, then one "
                 "token per request)")
    return arm, {"shape": shape, "requests": n if rec.get("form") != "one-request" else 1}


def speculative_repeat(runner: ServerRunner, plan: Plan, trace: Trace, n: int, cancel: Callable[[], bool]
                       ) -> tuple[ArmResult, dict[str, Any]]:
    """The speculative arm's own request again on a fresh slot, for ``n`` tokens (streamed, for its rounds)."""
    cfg = trace.config
    srv, _ = runner.server(plan, "speculative", cancel=cancel)
    body = completion_body(plan.tokens, n, n_probs=max(int(cfg.get("top_k") or 8), 2),
                           ignore_eos=bool(cfg.get("ignore_eos")), stream=True,
                           speculative={"n_max": cfg.get("n_max"), "n_min": cfg.get("n_min"), "p_min": cfg.get("p_min")})
    sr = stream_completion(srv, body, cancel=cancel)
    tokens = held_back_ids(srv, sr, body, cancel=cancel)
    arm, _ = arm_from_stream("speculative", sr, prompt_len=len(plan.tokens), n_batch=int(cfg["engine"]["n_batch"]),
                             piece=runner.vocab(plan.target).piece, tokens=tokens)
    t = sr.final.get("timings") or {}
    arm.reported_drafted = int(t.get("draft_n") or 0)
    arm.reported_accepted = int(t.get("draft_n_accepted") or 0)
    return arm, {"shape": f"the speculative arm's request again on a fresh slot ({n} tokens)"}


def serial_verify(runner: ServerRunner, plan: Plan, trace: Trace, cancel: Callable[[], bool],
                  say: ProgressFn) -> dict[str, Any]:
    """The serial-verify control from outside: both arms on the same server with ``-ub 1``."""
    cfg = trace.config
    n = int(cfg.get("max_tokens") or len(trace.vanilla.tokens))
    t0 = time.perf_counter()
    srv, started = runner.server(plan, "speculative", cancel=cancel, ubatch=1)
    say(f"serial-verify control: both arms on llama-server with -ub 1 (pid {srv.pid})")
    vm = runner.vocab(plan.target)
    n_probs = max(int(cfg.get("top_k") or 8), 2)
    van, tbt = vanilla_by_requests(srv, plan.tokens, n, n_probs=n_probs, ignore_eos=bool(cfg.get("ignore_eos")),
                                   n_batch=int(cfg["engine"]["n_batch"]), piece=vm.piece, cancel=cancel)
    _cancel_check(cancel)
    body = completion_body(plan.tokens, n, n_probs=n_probs, ignore_eos=bool(cfg.get("ignore_eos")), stream=True)
    sr = stream_completion(srv, body, cancel=cancel)
    tokens = held_back_ids(srv, sr, body, cancel=cancel)
    spec, rr = arm_from_stream("speculative", sr, prompt_len=len(plan.tokens), n_batch=int(cfg["engine"]["n_batch"]),
                               piece=vm.piece, tokens=tokens)
    t = sr.final.get("timings") or {}
    drafted, accepted = int(t.get("draft_n") or 0), int(t.get("draft_n_accepted") or 0)
    first = _first_difference(van.tokens, spec.tokens)
    out: dict[str, Any] = {
        "form": "ub1-server",
        "identical_to_vanilla": first is None,
        "first_mismatch": first,
        "n_tokens": len(van.tokens),
        "n_drafted": drafted,
        "n_accepted": accepted,
        "vanilla_matches_run": _first_difference(van.tokens, trace.vanilla.tokens) is None,
        "speculative_rounds": None if rr.rounds is None else len(rr.rounds) - 1,
        "vanilla_shape": f"{tbt.evaluated[:1]} then one token per request" if tbt.evaluated else None,
        "server": {"args": srv.command()[1:], "pid": srv.pid, "started": started},
        "skipped": None,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if drafted == 0:
        out["identical_to_vanilla"] = None
        out["skipped"] = ("nothing was drafted on the -ub 1 server, so its speculative arm is plain decoding and "
                          "proves nothing about the verify pass")
    return out


def shape_replays(server: LocalServer, prompt: list[int], vanilla: ArmResult, fork: int, a: int, b: int,
                  shapes: Sequence[int], top_k: int, cancel: Callable[[], bool]) -> dict[str, Any]:
    """Replays in other shapes on the run's server (cached prompt), with the tokens each pass evaluated.

    * ``at_fork``: the last T prefix tokens evaluated in one pass, the fork row last;
    * ``chunked``: the whole shared prefix written T tokens per pass, each pass's
      last row compared with the vanilla arm's one-token row there (the envelope).
    """
    shared = vanilla.tokens[:fork]
    full = prompt + shared
    at_fork = []
    for T in shapes:
        if T > len(full) - 1:
            continue
        _cancel_check(cancel)
        # leave the cache holding full[:-T] and one other token, so the next request evaluates exactly T tokens
        other = full[-T] + 1 if full[-T] > 0 else 1
        server.post("/completion", completion_body(full[:-T] + [other], 1, n_probs=0, cache_prompt=True), cancel=cancel)
        resp = server.post("/completion", completion_body(full, 1, n_probs=top_k, cache_prompt=True), cancel=cancel)
        ids, vals = _row(resp)
        g, lb = _gap(ids, vals, b, a)
        at_fork.append({"T": T, "shape": f"the last {T} prefix tokens in one pass, the fork row last",
                        "evaluated": (resp.get("timings") or {}).get("prompt_n"), "token": _picked(resp, ids),
                        "gap_b_minus_a": _r(g), "gap_is_lower_bound": lb, "rank_a": _rank(ids, a),
                        "rank_b": _rank(ids, b), "top_ids": ids, "top_logprobs": [round(x, 5) for x in vals]})
    chunked = []
    series: list[dict[str, Any]] = []
    for T in shapes:
        if fork < 1 or T > max(1, fork):
            continue
        _cancel_check(cancel)
        server.post("/completion", completion_body(prompt, 1, n_probs=0, cache_prompt=False), cancel=cancel)
        evaluated = []
        ids, vals = [], []
        for m in list(range(T, fork, T)) + [fork]:
            _cancel_check(cancel)
            resp = server.post("/completion", completion_body(prompt + shared[:m], 1, n_probs=top_k, cache_prompt=True),
                               cancel=cancel)
            evaluated.append((resp.get("timings") or {}).get("prompt_n"))
            ids, vals = _row(resp)
            if m < fork:
                st = vanilla.steps[m]
                sh = _relative_shift(ids, vals, st.top_ids, st.top_logits)
                if sh is not None:
                    series.append({"index": m, "T": T, "shift": round(sh, 5)})
        g, lb = _gap(ids, vals, b, a)
        chunked.append({"T": T, "shape": f"the shared prefix written {T} tokens per pass", "passes": len(evaluated),
                        "evaluated": evaluated, "token": _picked(resp, ids), "gap_b_minus_a": _r(g),
                        "gap_is_lower_bound": lb, "rank_a": _rank(ids, a), "rank_b": _rank(ids, b)})
    return {"at_fork": at_fork, "chunked": chunked, "series": series}


def _row(resp: dict[str, Any]) -> tuple[list[int], list[float]]:
    probs = resp.get("completion_probabilities") or []
    return top_from_entry(probs[0] if probs else None)


def _picked(resp: dict[str, Any], ids: list[int]) -> int | None:
    toks = resp.get("tokens") or []
    return int(toks[0]) if toks else (ids[0] if ids else None)


# -- the diagnosis ------------------------------------------------------------------------------
def _blank_diagnosis() -> dict[str, Any]:
    """Core's diagnosis keys (and ``outside``) in their printed order, each empty until a step fills it."""
    thresholds: dict[str, Any] = {"logit_tol": LOGIT_TOL, "far_factor": FAR_FACTOR, "far_floor": FAR_FLOOR,
                                  "near_tie": None, "far": None, "at_risk": None}
    return {
        "version": SCHEMA_VERSION, "method": METHOD, "verdict": None, "rule": None, "fork": None,
        "vanilla_token": None, "speculative_token": None, "vanilla_piece": None, "speculative_piece": None,
        "gap": None, "gap_is_lower_bound": False, "envelope": None, "at_risk": None, "thresholds": thresholds,
        "replays": None, "serial_verify": None, "controls": None, "outside": None, "explanation": "", "seconds": None,
    }


def _finish(d: dict[str, Any], trace: Trace, t_start: float) -> dict[str, Any]:
    d["seconds"] = round(time.perf_counter() - t_start, 3)
    trace.diagnosis = d
    return d


def _repeats(runner: ServerRunner, plan: Plan, trace: Trace, i: int, n: int, say: ProgressFn,
             cancel: Callable[[], bool]) -> tuple[dict[str, Any], ArmResult, dict[str, Any]]:
    """Determinism: each arm's own request(s) again, on a fresh slot; (vanilla repeat, its arm, speculative repeat)."""
    say(f"repeating the vanilla arm's requests up to the fork (token {i})")
    _cancel_check(cancel)
    vagain, vshape = vanilla_repeat(runner, plan, trace, i + 1, cancel)
    vrep = {**vshape, **compare_repeat(trace.vanilla, vagain, i)}
    say("repeating the speculative arm's request")
    _cancel_check(cancel)
    sagain, sshape = speculative_repeat(runner, plan, trace, min(n, i + 1 + REPEAT_MARGIN), cancel)
    sfirst = _first_difference(trace.speculative.tokens[:i + 1], sagain.tokens[:i + 1])
    srep = {**sshape, "identical": sfirst is None, "first_mismatch": sfirst, "positions": i + 1}
    return vrep, vagain, srep


def _control(runner: ServerRunner, plan: Plan, trace: Trace, i: int, vrep: dict[str, Any], say: ProgressFn,
             cancel: Callable[[], bool]) -> dict[str, Any]:
    """The serial-verify control: the run itself when it had -ub 1, else a -ub 1 server where the spec type allows."""
    v, s = trace.vanilla, trace.speculative
    if plan.ubatch == 1:
        sv = {"form": "ub1-server", "identical_to_vanilla": False, "first_mismatch": i, "n_tokens": len(v.tokens),
              "n_drafted": s.n_drafted, "n_accepted": s.n_accepted, "skipped": None,
              "note": "this run is itself the serial-verify control (both arms with -ub 1)"}
        if s.n_drafted == 0:
            sv.update(identical_to_vanilla=None, skipped="nothing was drafted in this -ub 1 run")
    elif trace.config.get("spec_type") in UB1_REFUSED:
        sv = {"form": "ub1-server", "identical_to_vanilla": None, "skipped": UB1_REFUSED[trace.config["spec_type"]]}
        say(f"serial-verify control: not possible here: {sv['skipped']}")
    else:
        try:
            sv = serial_verify(runner, plan, trace, cancel, say)
        except Cancelled:
            raise
        except SpecviewError as exc:
            sv = {"form": "ub1-server", "identical_to_vanilla": None, "skipped": f"the -ub 1 server failed: {exc}"}
    sv["vanilla_repeat"] = {"identical": vrep["identical"], "first_mismatch": vrep["first_mismatch"]}
    return sv


def _shapes(runner: ServerRunner, plan: Plan, trace: Trace, i: int, a: int, b: int, top_k: int,
            not_measured: list[str], say: ProgressFn, cancel: Callable[[], bool]
            ) -> tuple[dict[str, Any], int | None]:
    """Shape replays on the run's own server (evidence about shapes); (the replays, the fork's verify row)."""
    s = trace.speculative
    fork_step = s.steps[i] if i < len(s.steps) else None
    row = fork_step.batch_index if fork_step is not None and fork_step.batch_index is not None else None
    n_max = int(trace.config.get("n_max") or 3)
    shapes = sorted(set(range(2, max(2, n_max + 1) + 1)) | ({row + 1} if row else set()))
    say(f"replaying the fork in other shapes (T = {', '.join(map(str, shapes))})")
    srv, _ = runner.server(plan, "speculative", cancel=cancel)
    reps = shape_replays(srv, plan.tokens, trace.vanilla, i, a, b, shapes, top_k, cancel)
    off = [x["T"] for x in reps["at_fork"] if x["evaluated"] is not None and x["evaluated"] != x["T"]]
    if off:
        not_measured.append(f"the one-pass replays with T = {', '.join(map(str, off))}: the server evaluated another "
                            "number of tokens (it reused its cache differently)")
    return reps, row


def _gap_and_envelope(d: dict[str, Any], v: ArmResult, i: int, a: int, b: int, reps: dict[str, Any], top_k: int,
                      not_measured: list[str]) -> tuple[float | None, bool, float | None]:
    """The gap at the fork, the envelope and the thresholds, into ``d``; (gap, gap is a lower bound, envelope max)."""
    vst = v.steps[i]
    gap, lower = _gap(vst.top_ids, vst.top_logits, a, b)
    if gap is None:
        not_measured.append("the gap at the fork: llama-server reported no top-k for the vanilla token there "
                            "(its text is an incomplete UTF-8 character)")
    d["gap"], d["gap_is_lower_bound"] = _r(gap), lower
    at_fork_moves = [abs(x["gap_b_minus_a"] + gap) for x in reps["at_fork"]
                     if gap is not None and not lower and x["gap_b_minus_a"] is not None and not x["gap_is_lower_bound"]
                     and x["evaluated"] == x["T"]]
    shifts = [x["shift"] for x in reps["series"]]
    stats = envelope_stats(shifts + at_fork_moves)
    env_max = stats["max"]
    d["envelope"] = {"max": _r(env_max), "p95": _r(stats["p95"]), "median": _r(stats["median"]),
                     "positions": len(shifts) + (1 if at_fork_moves else 0), "top_k": top_k,
                     "at_fork": _r(max(at_fork_moves)) if at_fork_moves else None,
                     "measure": "largest change of log-probability differences (logit differences) between the "
                                "vanilla arm's one-token rows and the same rows computed in T-token passes",
                     "series": reps["series"]}
    thresholds = d["thresholds"]
    if env_max is not None:
        thresholds.update(near_tie=_r(env_max), far=_r(far_threshold(env_max)), at_risk=_r(env_max))
        d["at_risk"] = at_risk_positions([st.margin for st in v.steps], env_max)
    else:
        thresholds["far"] = _r(far_threshold(None))
    return gap, lower, env_max


def _verdict(vrep: dict[str, Any], srep: dict[str, Any], sv: dict[str, Any], gap: float | None, lower: bool,
             env_max: float | None, not_measured: list[str]) -> tuple[str | None, str | None]:
    """The verdict by core's rules, or (None, None) when neither the control nor the gap was measured."""
    try:
        return classify(
            identical=False,
            vanilla_repeat_identical=vrep["identical"],
            spec_reproduced=srep["identical"],
            spec_rerun_consistent=None if srep["identical"] else False,
            serial_verify_identical=sv.get("identical_to_vanilla"),
            gap=None if lower else gap,
            env_max=env_max,
        )
    except ValueError:
        not_measured.append("a verdict: neither the serial-verify control nor the gap at the fork could be measured")
        return None, None


def diagnose_run(runner: ServerRunner, trace: Trace, cfg: Any, *, progress: ProgressFn | None = None,
                 cancel: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Explain the trace's fork (or confirm there is none) on the runner's servers; sets ``trace.diagnosis``.

    The result has core's diagnosis schema (``verdict``, ``rule``, ``fork``,
    ``gap``, ``serial_verify``, ``envelope``, ``thresholds``, ``replays`` ...)
    so :func:`specview.core.diagnose.format_verdict` prints it, plus
    ``outside``: every repeat and shape replay with its shape, and what could
    not be measured from outside the server.
    """
    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    t_start = time.perf_counter()
    v = trace.vanilla
    d = _blank_diagnosis()
    require_complete(trace)
    if trace.comparison.identical:
        d["verdict"], d["rule"] = classify(identical=True)
        d["explanation"] = identical_words(trace)
        return _finish(d, trace, t_start)
    fm = fork_of(trace)
    i, a, b = fm.index, int(fm.vanilla_token), int(fm.speculative_token)
    d.update(fork_fields(fm))
    plan = runner.plan(cfg)
    top_k = max(int(trace.config.get("top_k") or 8), 2)
    n = int(trace.config.get("max_tokens") or len(v.tokens))
    not_measured = [
        "the speculative server's verify rows themselves: llama-server reports no top-k for tokens its verify "
        "step emits, so the gap in the speculative shape comes from a replay in the nearest shape",
        "the speculative server's KV state: it cannot be read from outside, so a state fault that only moves "
        "logits a little shows only through the serial-verify control",
    ]
    outside: dict[str, Any] = {"not_measured": not_measured}
    vrep, vagain, srep = _repeats(runner, plan, trace, i, n, say, cancel)
    outside.update(vanilla_repeat=vrep, speculative_repeat=srep)
    d["serial_verify"] = sv = _control(runner, plan, trace, i, vrep, say, cancel)
    reps, row = _shapes(runner, plan, trace, i, a, b, top_k, not_measured, say, cancel)
    outside["shapes"] = reps
    gap, lower, env_max = _gap_and_envelope(d, v, i, a, b, reps, top_k, not_measured)
    d["verdict"], d["rule"] = _verdict(vrep, srep, sv, gap, lower, env_max, not_measured)
    d["replays"] = _printable_replays(vrep, vagain, reps, i, a, b, gap, lower, row)
    d["outside"] = outside
    d["explanation"] = explain_outside(d, trace)
    return _finish(d, trace, t_start)


def _printable_replays(vrep: dict[str, Any], vagain: ArmResult, reps: dict[str, Any], i: int, a: int, b: int,
                       gap: float | None, lower: bool, row: int | None) -> dict[str, Any] | None:
    """Core's ``replays`` block (one-token shape and speculative shape at the fork) when every number in it was measured.

    The speculative shape is the one-pass replay whose rows match the verify
    pass that emitted the fork token up to the fork row; it is printed only
    when that replay picks the speculative token (otherwise ``outside.shapes``
    has it, with the others).
    """
    at = reps["at_fork"]
    flipped = [x for x in at if x["token"] == b and x["evaluated"] == x["T"]]
    pick = next((x for x in flipped if row and x["T"] == row + 1), None) or next(iter(flipped), None)
    if gap is None or lower or pick is None or pick["token"] != b or pick["gap_b_minus_a"] is None:
        return None
    st = vagain.steps[i] if i < len(vagain.steps) else None
    return {
        "single": {"shape": vrep["shape"], "token": st.token if st else None, "gap": _r(gap),
                   "rank_a": 1, "rank_b": _rank(st.top_ids, b) if st else None, "reproduced": vrep["identical"],
                   "first_deviation": vrep["first_mismatch"], "max_recorded_delta": vrep["max_logprob_delta"],
                   "rerun_consistent": None, "reproduces_token": st is not None and st.token == a},
        "speculative": {"shape": pick["shape"], "token": pick["token"], "gap": pick["gap_b_minus_a"],
                        "rank_a": pick["rank_a"], "rank_b": pick["rank_b"], "reproduced": True,
                        "first_deviation": None, "max_recorded_delta": 0.0, "rerun_consistent": None,
                        "reproduces_token": True, "T": pick["T"], "evaluated": pick["evaluated"]},
    }


def _piece(trace: Trace, token: int | None) -> str:
    for arm in (trace.vanilla, trace.speculative):
        for st in arm.steps:
            if st.token == token:
                return repr(st.piece)
    return f"#{token}"


def explain_outside(d: dict[str, Any], trace: Trace) -> str:
    """The diagnosis in sentences, naming each measurement's shape and what could not be measured."""
    out = d["outside"]
    vrep, srep = out["vanilla_repeat"], out["speculative_repeat"]
    sv = d["serial_verify"] or {}
    a, b = _piece(trace, d["vanilla_token"]), _piece(trace, d["speculative_token"])
    gap = d["gap"]
    gap_txt = "not measured" if gap is None else f"{gap:.4f}"
    parts: list[str] = []
    rule = d["rule"]
    if rule == "vanilla-repeat-disagrees":
        parts.append(f"The vanilla arm's own requests sent again on a fresh slot give different results (first at "
                     f"token {vrep['first_mismatch']}): this llama-server is not deterministic, so a fork between the "
                     f"arms says nothing about speculative decoding.")
    elif rule == "speculative-replays-disagree":
        parts.append(f"The speculative arm's own request sent again on a fresh slot gives different tokens (first at "
                     f"token {srep['first_mismatch']}): the speculative server is not deterministic, so its fork says "
                     f"nothing about the verify pass.")
    else:
        parts.append(f"Both arms repeat themselves exactly on a fresh slot ({vrep['positions']} vanilla positions, "
                     f"{srep['positions']} speculative), so the server is deterministic here.")
        if rule == "serial-verify-reproduces-vanilla":
            parts.append(f"On the same server with -ub 1 (every pass one token) the speculative arm equals plain "
                         f"decoding over all {sv.get('n_tokens')} tokens ({sv.get('n_drafted')} drafted), so drafting, "
                         f"acceptance and the cache are right: the fork at token {d['fork']} ({a} against {b}, gap "
                         f"{gap_txt}) comes from the verify pass computing several rows at once, a near-tie flipped "
                         f"by batched-versus-single numerics.")
        elif rule == "serial-verify-differs":
            parts.append(f"On the same server with -ub 1 (every pass one token, so every row is computed as plain "
                         f"decoding computes it) the speculative arm still differs from plain decoding at token "
                         f"{sv.get('first_mismatch')}: the speculative loop or its cache is wrong. Worth a bug report "
                         f"to llama.cpp with the trace.")
        elif d["verdict"] == "state":
            parts.append(f"One token per pass the target picks {a} over {b} by {gap_txt}, far beyond what passes of "
                         f"other shapes move this target's logits (far means above {d['thresholds']['far']}): "
                         f"rounding does not do that; suspect the verify pass.")
        elif d["verdict"] == "near-tie":
            parts.append(f"The -ub 1 control could not decide ({sv.get('skipped') or 'not run'}); one token per pass "
                         f"the target picks {a} over {b} by {gap_txt}, within reach of what other pass shapes move "
                         f"its logits, so a near-tie is the likely cause (by the thresholds, not proven).")
        else:
            parts.append("No verdict: " + "; ".join(out["not_measured"][2:]) + ".")
    flips = [x["T"] for x in (out.get("shapes") or {}).get("at_fork", []) if x["token"] == d["speculative_token"]]
    if flips:
        parts.append(f"Evaluating the prefix's last T tokens in one pass picks {b} for T = "
                     f"{', '.join(map(str, flips))}: the pass shape alone moves this row.")
    parts.append("Not measurable from outside the server: " + "; ".join(out["not_measured"]) + ".")
    return " ".join(parts)
