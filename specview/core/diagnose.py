"""Why did the arms fork?  Near-tie flip, state bug, or nondeterminism.

The method (``docs/diagnosis.md`` has the user's version):

* **Two teacher-forced replays, on fresh contexts, in lockstep.**  The
  *single* replay feeds the shared prefix one token per forward pass, exactly
  as the vanilla arm did (same prefill chunks).  The *speculative* replay
  rebuilds the speculative arm's KV state from the trace: the same prefill,
  then every recorded verify batch ``[id_last] + draft_tokens`` with the same
  truncation after it, up to the verify pass that produced the fork token.
  Both walk the shared prefix together, so only one logits batch of each is
  ever held: memory is O(n_vocab x batch).
* **Reproduction.**  Each replay must give back what its arm recorded: the
  same token at every position and the recorded top logits within
  :data:`LOGIT_TOL`.  An arm that does not is replayed a second time from a
  clean context: if the two replays agree with each other the arm's own state
  was not the clean state its tokens imply (``state``); if they disagree the
  backend is not deterministic (``nondeterministic``).
* **The envelope.**  At each shared-prefix position the two shapes' logits are
  compared over the union of both top-k sets; the largest absolute difference
  is that position's shift.  Its max, p95 and median over the positions
  *before* the fork measure how far batched-versus-single numerics move
  logits on this model and backend.
* **The gap.**  At the fork, logit(a) - logit(b) in the single shape, where a
  is vanilla's token and b the speculative one.  A gap within reach of the
  envelope is a near-tie; a gap far beyond it (see :func:`far_threshold`) is
  not something rounding does.

Everything here runs on the :class:`~specview.core.session.Session`'s already
loaded models; nothing is loaded twice.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .compare import first_difference
from .engine import Engine, SpecviewError
from .generate import GenOptions, prefill, run_to_end, vanilla_greedy
from .topk import topk
from .trace import ArmResult, Trace

__all__ = [
    "diagnose",
    "format_verdict",
    "classify",
    "envelope_stats",
    "far_threshold",
    "at_risk_positions",
    "DiagnosisCancelled",
    "VERDICTS",
    "LOGIT_TOL",
    "FAR_FACTOR",
    "FAR_FLOOR",
]

VERDICTS = ("identical", "near-tie", "state", "nondeterministic")

#: A replayed logit may differ from the recorded one by this much and still
#: count as reproduced.  Traces store logits rounded to 5 decimals (an error
#: of at most 5e-6); a deterministic backend reproduces them bit for bit.
LOGIT_TOL = 1e-4
#: "Far beyond the envelope" is a gap above max(FAR_FACTOR x envelope max, FAR_FLOOR).
FAR_FACTOR = 4.0
#: Near-tie forks seen in public reports have gaps of 0.000-0.125 logits; one
#: engine gates its teacher-forced worst gap at 2.0.  A gap under this floor is
#: never called a state bug on the gap alone.
FAR_FLOOR = 2.0
#: Prefill chunk used by the prefill-chunk control (1 when the run itself used 7).
CONTROL_CHUNK = 7
SCHEMA_VERSION = 1

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]


class DiagnosisCancelled(SpecviewError):
    """The caller's cancel check returned True; no diagnosis was recorded."""


# -- pure logic (unit-tested on synthetic numbers) ----------------------------------
def envelope_stats(series: Sequence[float]) -> dict[str, float | None]:
    """max, p95 and median of per-position shifts (None for an empty series)."""
    if len(series) == 0:
        return {"max": None, "p95": None, "median": None}
    a = np.asarray(series, dtype=np.float64)
    return {
        "max": float(a.max()),
        "p95": float(np.percentile(a, 95)),
        "median": float(np.median(a)),
    }


def far_threshold(env_max: float | None, *, factor: float = FAR_FACTOR, floor: float = FAR_FLOOR) -> float:
    """The gap above which a fork is not a rounding effect: max(factor x envelope max, floor).

    Why a factor: a flip moves the difference logit(a) - logit(b) by the sum of
    both replays' gaps, and two logits that each move by at most m move their
    difference by at most 2m; the fork's own shift can also exceed the largest
    one seen before it.  4 = 2 x 2 covers both.
    """
    return max(factor * (env_max or 0.0), floor)


def at_risk_positions(margins: Sequence[float], threshold: float | None) -> list[int] | None:
    """Token indices whose top-1/top-2 margin is below ``threshold`` (the envelope's max)."""
    if threshold is None:
        return None
    return [j for j, m in enumerate(margins) if m is not None and m < threshold]


def classify(
    *,
    identical: bool,
    single_reproduced: bool = True,
    single_rerun_consistent: bool | None = None,
    spec_reproduced: bool = True,
    spec_rerun_consistent: bool | None = None,
    gap: float | None = None,
    env_max: float | None = None,
    factor: float = FAR_FACTOR,
    floor: float = FAR_FLOOR,
) -> tuple[str, str]:
    """The verdict and the rule that gave it.

    In order: identical arms are ``identical``; an arm whose replays disagree
    with each other is ``nondeterministic``; an arm whose clean replays agree
    with each other but not with what it recorded is ``state``; with both
    reproduced, a gap above :func:`far_threshold` is ``state``, anything else
    ``near-tie``.
    """
    if identical:
        return "identical", "identical"
    if not single_reproduced and single_rerun_consistent is False:
        return "nondeterministic", "vanilla-replays-disagree"
    if not spec_reproduced and spec_rerun_consistent is False:
        return "nondeterministic", "speculative-replays-disagree"
    if not single_reproduced:
        return "state", "vanilla-unreproducible"
    if not spec_reproduced:
        return "state", "speculative-unreproducible"
    if gap is None:
        raise ValueError("a gap is needed to classify a reproduced fork")
    if gap > far_threshold(env_max, factor=factor, floor=floor):
        return "state", "gap-far-beyond-envelope"
    return "near-tie", "gap-within-envelope" if env_max is not None and gap <= env_max else "gap-below-far"


def rank_of(row: np.ndarray, token: int) -> int:
    """1-based rank of ``token`` in ``row``, ties broken towards the lower id (as :func:`topk`)."""
    v = row[token]
    return int(np.count_nonzero(row > v) + np.count_nonzero(row[:token] == v) + 1)


# -- replays -------------------------------------------------------------------------
def _single_rows(eng: Engine, prompt: list[int], n_batch: int, tokens: Sequence[int], upto: int,
                 cancel: CancelFn) -> Iterator[tuple[int, np.ndarray, dict]]:
    """Rows for positions 0..upto, one token per pass after the chunked prefill (the vanilla shape)."""
    if cancel():
        raise DiagnosisCancelled("diagnosis cancelled")
    row, size = prefill(eng, prompt, n_batch)
    yield 0, row, {"round": 0, "batch_size": size, "batch_index": size - 1}
    for j in range(1, upto + 1):
        if cancel():
            raise DiagnosisCancelled("diagnosis cancelled")
        row = eng.eval([tokens[j - 1]], rows=[0])[0]
        yield j, row, {"round": 0, "batch_size": 1, "batch_index": 0}


def _spec_rows(eng: Engine, prompt: list[int], n_batch: int, spec: ArmResult, upto: int,
               cancel: CancelFn) -> Iterator[tuple[int, np.ndarray, dict]]:
    """Rows for positions 0..upto, rebuilt with the speculative arm's recorded batches and truncations."""
    if cancel():
        raise DiagnosisCancelled("diagnosis cancelled")
    row, size = prefill(eng, prompt, n_batch)
    yield 0, row, {"round": 0, "batch_size": size, "batch_index": size - 1}
    toks = spec.tokens
    for rnd in spec.rounds:
        if rnd.index == 0:
            continue
        fs = rnd.first_step
        if fs > upto:
            return
        if cancel():
            raise DiagnosisCancelled("diagnosis cancelled")
        batch = [toks[fs - 1], *rnd.draft_tokens]
        if len(batch) != rnd.batch_size or rnd.accepted > len(rnd.draft_tokens):
            raise SpecviewError(
                f"the trace's round {rnd.index} is inconsistent (batch of {rnd.batch_size}, "
                f"{len(rnd.draft_tokens)} draft tokens recorded, {rnd.accepted} accepted): "
                "cannot rebuild the speculative arm's state"
            )
        n_past = eng.n_past
        logits = eng.eval(batch, rows=range(len(batch)))
        eng.truncate(n_past + rnd.accepted + 1)
        for k in range(rnd.accepted + 1):
            j = fs + k
            if j > upto or j >= len(toks):
                return
            yield j, logits[k], {"round": rnd.index, "batch_size": len(batch), "batch_index": k}


def _recorded_delta(row: np.ndarray, step) -> tuple[bool, float]:
    """(same token as recorded, max |replayed - recorded| over the recorded top ids)."""
    ids = np.asarray(step.top_ids, dtype=np.int64)
    vals = np.asarray(step.top_logits, dtype=np.float64)
    same = int(np.argmax(row)) == int(step.token)
    if len(ids) == 0:
        return same, 0.0
    return same, float(np.max(np.abs(row[ids].astype(np.float64) - vals)))


class _ArmCheck:
    """How one replay compares with what its arm recorded."""

    def __init__(self, arm: ArmResult):
        self.arm = arm
        self.first_deviation: int | None = None
        self.max_delta = 0.0
        self.tops: list[tuple[np.ndarray, np.ndarray]] = []  # the replay's own top-k per position

    def see(self, j: int, row: np.ndarray, k: int, tol: float) -> None:
        ids, vals = topk(row, k)
        self.tops.append((ids, vals.copy()))
        if j >= len(self.arm.steps):
            return
        same, delta = _recorded_delta(row, self.arm.steps[j])
        self.max_delta = max(self.max_delta, delta)
        if self.first_deviation is None and (not same or delta > tol):
            self.first_deviation = j

    @property
    def reproduced(self) -> bool:
        return self.first_deviation is None


def _rerun_consistent(rows: Iterator[tuple[int, np.ndarray, dict]], check: _ArmCheck, upto: int, tol: float) -> bool:
    """Replay again up to ``upto`` and compare with the first replay's own top-k at every position."""
    for j, row, _ in rows:
        ids, vals = check.tops[j]
        if int(np.argmax(row)) != int(ids[0]):
            return False
        if float(np.max(np.abs(row[ids] - vals))) > tol:
            return False
        if j >= upto:
            break
    return True


# -- controls ------------------------------------------------------------------------
def _controls(session: Any, cfg: Any, trace: Trace, target: Any, n_ctx: int, opts: GenOptions,
              say: ProgressFn, cancel: CancelFn) -> list[dict[str, Any]]:
    vanilla = trace.vanilla.tokens
    prompt = [int(t) for t in trace.prompt["tokens"]]
    out: list[dict[str, Any]] = []

    def record(name: str, description: str, tokens: list[int] | None, t0: float, skipped: str | None = None):
        if skipped is not None:
            out.append({"name": name, "description": description, "identical": None, "first_mismatch": None,
                        "n_tokens": None, "seconds": 0.0, "skipped": skipped})
            return
        assert tokens is not None
        d = first_difference(vanilla, tokens)
        out.append({"name": name, "description": description, "identical": d is None, "first_mismatch": d,
                    "n_tokens": len(tokens), "seconds": round(time.perf_counter() - t0, 3), "skipped": None})

    def check_cancel():
        if cancel():
            raise DiagnosisCancelled("diagnosis cancelled")

    eng = session.engine("control-vanilla", target, cfg.engine, n_ctx)

    check_cancel()
    say("control: vanilla again on a fresh context")
    t0 = time.perf_counter()
    arm = run_to_end(vanilla_greedy(eng, prompt, opts, cancel=cancel))
    check_cancel()
    record("vanilla-twice", "plain greedy again on a fresh context", arm.tokens, t0)

    check_cancel()
    zcfg = replace(cfg, p_min=1.0) if cfg.uses_draft_model else replace(cfg, spec_type="none", draft=None)
    desc = ("the speculative loop with the draft model at p_min = 1 (nothing drafted)" if cfg.uses_draft_model
            else "the speculative loop with nothing drafted")
    say("control: zero-draft (" + ("p_min = 1" if cfg.uses_draft_model else "no drafter") + ")")
    t0 = time.perf_counter()
    zt = session.run(zcfg, cancel=cancel)
    check_cancel()
    record("zero-draft", desc, zt.speculative.tokens, t0)
    out[-1]["n_drafted"] = zt.speculative.n_drafted

    check_cancel()
    if cfg.spec_type == "ngram-simple":
        record("ngram", "ngram-simple speculation on the same target", None, 0.0, skipped="the run itself used ngram-simple")
    else:
        say("control: ngram-simple drafter on the same target")
        t0 = time.perf_counter()
        nt = session.run(replace(cfg, spec_type="ngram-simple", draft=None), cancel=cancel)
        check_cancel()
        record("ngram", "ngram-simple speculation on the same target (drafts only when the text repeats)",
               nt.speculative.tokens, t0)
        out[-1]["n_drafted"] = nt.speculative.n_drafted

    check_cancel()
    chunk = CONTROL_CHUNK if opts.n_batch != CONTROL_CHUNK else 1
    say(f"control: vanilla with a prefill chunk of {chunk}")
    t0 = time.perf_counter()
    arm = run_to_end(vanilla_greedy(eng, prompt, replace(opts, n_batch=chunk), cancel=cancel))
    check_cancel()
    record("prefill-chunk", f"plain greedy with the prompt prefilled in chunks of {chunk} (run: {opts.n_batch})",
           arm.tokens, t0)
    out[-1]["n_batch"] = chunk
    return out


# -- the entry point -----------------------------------------------------------------
def _r(x: float | None, nd: int = 5) -> float | None:
    return None if x is None else round(float(x), nd)


def diagnose(
    session: Any,
    cfg: Any,
    trace: Trace,
    *,
    controls: bool = False,
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
    envelope_if_identical: bool = False,
) -> dict[str, Any]:
    """Explain the trace's fork (or confirm there is none); sets ``trace.diagnosis`` to the result.

    ``session`` must hold (or be able to load) the run's target; ``cfg`` is the
    run's :class:`~specview.core.session.RunConfig`.  With ``controls`` the
    control matrix runs too.  An identical run gets a cheap ``identical``
    verdict without replays unless ``envelope_if_identical`` asks for the
    envelope over the whole run.  Raises :class:`DiagnosisCancelled` when
    ``cancel()`` turns True, and :class:`SpecviewError` for a trace that cannot
    be diagnosed (a cancelled run, a trace without draft tokens).
    """
    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    t_start = time.perf_counter()
    v, s, comp = trace.vanilla, trace.speculative, trace.comparison
    for arm in (v, s):
        if arm.stop_reason == "cancelled":
            raise SpecviewError(f"the {arm.name} arm was cancelled: there is no complete run to diagnose")
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
        fm = comp.first_mismatch
        assert fm is not None
        if fm.vanilla_token is None or fm.speculative_token is None:
            short = v if fm.vanilla_token is None else s
            raise SpecviewError(
                f"the {short.name} arm stopped after {len(short.tokens)} tokens ({short.stop_reason}) while the "
                "other went on; the arms agree on every token they share, so there is no fork to diagnose"
            )
        fork = fm.index
        result.update(fork=fork, vanilla_token=fm.vanilla_token, speculative_token=fm.speculative_token,
                      vanilla_piece=fm.vanilla_piece, speculative_piece=fm.speculative_piece)

    need_replay = fork is not None or envelope_if_identical
    target = session.model(cfg.backend, cfg.target, cfg.engine)
    n_ctx = int(trace.config.get("n_ctx_used") or session.context_size(cfg, len(prompt), target))
    opts = GenOptions(max_tokens=cfg.max_tokens, ignore_eos=cfg.ignore_eos, n_batch=n_batch, top_k=top_k)

    single = spec = None
    series: list[float] = []
    fork_info: dict[str, Any] = {}
    if need_replay:
        if fork is None:
            upto = len(v.tokens) - 1
        else:
            upto = fork
        if upto > 0 and not any(r.index > 0 for r in s.rounds):
            raise SpecviewError("this trace has no per-round data for the speculative arm (its engine does not "
                                "report rounds), so the arm's state cannot be rebuilt; re-run it with specview")
        if any(r.index > 0 and r.first_step <= upto and len(r.draft_tokens) != r.drafted for r in s.rounds):
            raise SpecviewError("this trace does not record the draft tokens of each round, so the speculative "
                                "arm's state cannot be rebuilt; re-run it with specview")
        t0 = time.perf_counter()
        say(f"replaying {upto + 1} positions in both shapes (teacher-forced, fresh contexts)")
        e1 = session.engine("replay-single", target, cfg.engine, n_ctx)
        e2 = session.engine("replay-spec", target, cfg.engine, n_ctx)
        passes0 = e1.n_evals + e2.n_evals
        single, spec = _ArmCheck(v), _ArmCheck(s)
        g1 = _single_rows(e1, prompt, n_batch, v.tokens, upto, cancel)
        g2 = _spec_rows(e2, prompt, n_batch, s, upto, cancel)
        for j in range(upto + 1):
            j1, row1, _ = next(g1)
            try:
                j2, row2, meta2 = next(g2)
            except StopIteration:
                raise SpecviewError(f"the trace's speculative rounds stop before token {j}; cannot rebuild its state")
            assert j1 == j2 == j, (j1, j2, j)
            single.see(j, row1, top_k, LOGIT_TOL)
            spec.see(j, row2, top_k, LOGIT_TOL)
            u = np.union1d(single.tops[-1][0], spec.tops[-1][0])
            series.append(float(np.max(np.abs(row1[u] - row2[u]))))
            if fork is not None and j == fork:
                a, b = int(fm.vanilla_token), int(fm.speculative_token)
                fork_info = {
                    "single": {
                        "shape": "one token per forward pass (the vanilla shape)",
                        "token": int(np.argmax(row1)),
                        "logit_a": float(row1[a]), "logit_b": float(row1[b]),
                        "gap": float(row1[a] - row1[b]),
                        "rank_a": rank_of(row1, a), "rank_b": rank_of(row1, b),
                    },
                    "speculative": {
                        "shape": f"row {meta2['batch_index']} of the T={meta2['batch_size']} verify pass "
                                 f"of round {meta2['round']}",
                        "round": meta2["round"], "batch_size": meta2["batch_size"],
                        "batch_index": meta2["batch_index"],
                        "token": int(np.argmax(row2)),
                        "logit_a": float(row2[a]), "logit_b": float(row2[b]),
                        "gap": float(row2[b] - row2[a]),
                        "rank_a": rank_of(row2, a), "rank_b": rank_of(row2, b),
                    },
                }
            if j % 64 == 63:
                say(f"replayed {j + 1}/{upto + 1} positions")
        g1.close()
        g2.close()
        passes = e1.n_evals + e2.n_evals - passes0

        reruns: dict[str, bool | None] = {"single": None, "speculative": None}
        if not single.reproduced:
            d = single.first_deviation
            say(f"the vanilla replay deviates from the record at token {d}: replaying it again")
            reruns["single"] = _rerun_consistent(_single_rows(e1, prompt, n_batch, v.tokens, d, cancel),
                                                  single, d, LOGIT_TOL)
        if not spec.reproduced:
            d = spec.first_deviation
            say(f"the speculative replay deviates from the record at token {d}: replaying it again")
            reruns["speculative"] = _rerun_consistent(_spec_rows(e2, prompt, n_batch, s, d, cancel),
                                                       spec, d, LOGIT_TOL)

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

        def arm_json(check: _ArmCheck, key: str) -> dict[str, Any]:
            d = dict(fork_info.get(key, {}))
            for f in ("logit_a", "logit_b", "gap"):
                if f in d:
                    d[f] = _r(d[f])
            d.update({
                "reproduced": check.reproduced,
                "reproduces_token": None if fork is None else d.get("token") == (
                    result["vanilla_token"] if key == "single" else result["speculative_token"]),
                "first_deviation": check.first_deviation,
                "max_recorded_delta": _r(check.max_delta, 6),
                "rerun_consistent": reruns[key],
            })
            return d

        result["replays"] = {
            "positions": upto + 1,
            "passes": passes,
            "seconds": round(time.perf_counter() - t0, 3),
            "single": arm_json(single, "single"),
            "speculative": arm_json(spec, "speculative"),
        }
        if fork is not None:
            result["gap"] = _r(fork_info["single"]["gap"])
    else:
        thresholds["far"] = None

    gap = fork_info["single"]["gap"] if fork_info else None
    verdict, rule = classify(
        identical=comp.identical,
        single_reproduced=single.reproduced if single else True,
        single_rerun_consistent=result["replays"]["single"]["rerun_consistent"] if single else None,
        spec_reproduced=spec.reproduced if spec else True,
        spec_rerun_consistent=result["replays"]["speculative"]["rerun_consistent"] if spec else None,
        gap=gap,
        env_max=(result["envelope"] or {}).get("max"),
    )
    result["verdict"], result["rule"] = verdict, rule

    if controls:
        say("running the controls")
        result["controls"] = _controls(session, cfg, trace, target, n_ctx, opts, say, cancel)

    result["explanation"] = _explain(result, trace)
    result["seconds"] = round(time.perf_counter() - t_start, 3)
    trace.diagnosis = result
    return result


# -- words ---------------------------------------------------------------------------
def _piece(trace: Trace, token: int | None) -> str:
    if token is None:
        return "(none)"
    for arm in (trace.vanilla, trace.speculative):
        for st in arm.steps:
            if st.token == token:
                return repr(st.piece)
    return f"#{token}"


def _controls_sentence(ctrls: list[dict[str, Any]] | None) -> str:
    if not ctrls:
        return ""
    same = [c["name"] for c in ctrls if c.get("identical")]
    diff = [f"{c['name']} (at token {c['first_mismatch']})" for c in ctrls if c.get("identical") is False]
    parts = []
    if same:
        parts.append("stayed identical to vanilla: " + ", ".join(same))
    if diff:
        parts.append("diverged: " + ", ".join(diff))
    return " Controls " + "; ".join(parts) + "." if parts else ""


def _explain(d: dict[str, Any], trace: Trace) -> str:
    verdict, rule = d["verdict"], d["rule"]
    ctrl = _controls_sentence(d.get("controls"))
    if verdict == "identical":
        return (f"The speculative arm produced exactly vanilla's {trace.comparison.agree} tokens: greedy "
                f"speculative decoding was lossless on this run.{ctrl}")
    rp = d["replays"]
    env = d["envelope"]
    th = d["thresholds"]
    a, b = _piece(trace, d["vanilla_token"]), _piece(trace, d["speculative_token"])
    sp = rp["speculative"]
    if verdict == "near-tie":
        how = ("within the largest shift seen before the fork" if rule == "gap-within-envelope"
               else f"above the largest shift seen before the fork but under the far threshold {th['far']:.3f}")
        return (f"Both teacher-forced replays reproduce what the arms did, from clean contexts: one token per "
                f"pass picks {a} by {d['gap']:.4f} logits over {b}; the speculative arm's own {sp['shape']} "
                f"picks {b} by {sp['gap']:.4f}. Between the two shapes this target's logits move by up to "
                f"{env['max']:.4f} (p95 {env['p95']:.4f}) over the shared prefix, and the gap is {how}: the "
                f"argmax flipped on a near-tie through batched-versus-single rounding. This is expected on "
                f"quantized targets and is not a bug in the speculative loop.{ctrl}")
    if verdict == "state":
        if rule == "speculative-unreproducible":
            dev = sp["first_deviation"]
            st = trace.speculative.steps[dev]
            return (f"Rebuilding the speculative arm's KV state from its own recorded batches on a clean context "
                    f"gives different logits from what the arm recorded, from token {dev} on (round {st.round}, "
                    f"up to {sp['max_recorded_delta']:.4f} logits off), and a second clean replay agrees with the "
                    f"first. So the arm's state was not the state its accepted tokens imply"
                    f"{'; from a clean state its verify pass picks ' + _piece(trace, sp['token']) + ', not ' + b if not sp['reproduces_token'] else ''}. "
                    f"Suspect the KV rollback (a rejected draft kept), wrong positions, or injected state. "
                    f"This is worth a bug report: attach the trace.{ctrl}")
        if rule == "vanilla-unreproducible":
            dev = rp["single"]["first_deviation"]
            return (f"Replaying plain greedy on a clean context gives different logits from what the vanilla arm "
                    f"recorded, from token {dev} on, while two clean replays agree: the vanilla arm's context was "
                    f"not clean. This is worth a bug report: attach the trace.{ctrl}")
        return (f"Both replays reproduce their tokens, but the gap at the fork, {d['gap']:.4f} logits, is far "
                f"beyond what batched-versus-single numerics move logits anywhere else in the shared prefix "
                f"(max {env['max']:.4f}; far means above {th['far']:.3f}). Rounding does not do that: suspect "
                f"positions or batch handling in the verify pass. This is worth a bug report: attach the "
                f"trace.{ctrl}")
    # nondeterministic
    which = "vanilla" if rule == "vanilla-replays-disagree" else "speculative"
    key = "single" if which == "vanilla" else "speculative"
    dev = rp[key]["first_deviation"]
    return (f"The {which} arm does not reproduce itself: replaying it twice from clean contexts in its own shape "
            f"gives different logits (first at token {dev}). With a nondeterministic backend a fork between the "
            f"arms says nothing about speculative decoding; report the nondeterminism to the backend "
            f"(threads, GPU atomics) and run the controls.{ctrl}")


def format_verdict(diag: dict[str, Any]) -> str:
    """The readable lines ``specview run`` prints after its summary."""
    verdict = diag.get("verdict")
    th = diag.get("thresholds") or {}
    lines = [f"VERDICT  {str(verdict).upper()}"]
    rp = diag.get("replays")
    env = diag.get("envelope")
    if diag.get("fork") is not None and rp:
        si, sp = rp["single"], rp["speculative"]
        vp, sp_ = diag.get("vanilla_piece"), diag.get("speculative_piece")
        lines.append(f"  fork at token {diag['fork']}: a = vanilla {diag['vanilla_token']}"
                     f"{'' if vp is None else ' ' + repr(vp)}, b = speculative {diag['speculative_token']}"
                     f"{'' if sp_ is None else ' ' + repr(sp_)}")
        lines.append(f"  gap (one token per pass)  logit(a) - logit(b) = {si['gap']:.4f}; ranks a {si['rank_a']}, "
                     f"b {si['rank_b']}; replay picks {si['token']} "
                     f"({'reproduces vanilla' if si['reproduced'] else 'does NOT reproduce vanilla'})")
        lines.append(f"  speculative shape ({sp['shape']})  logit(b) - logit(a) = {sp['gap']:.4f}; "
                     f"ranks b {sp['rank_b']}, a {sp['rank_a']}; replay picks {sp['token']} "
                     f"({'reproduces the speculative arm' if sp['reproduced'] else 'does NOT reproduce the speculative arm'})")
        for key, name in (("single", "vanilla"), ("speculative", "speculative")):
            r = rp[key]
            if not r["reproduced"]:
                rr = r["rerun_consistent"]
                lines.append(f"  {name} replay deviates from the record at token {r['first_deviation']} "
                             f"(up to {r['max_recorded_delta']:.4f} logits); a second clean replay "
                             f"{'agrees with the first' if rr else 'differs from the first'}")
    if env:
        at_fork = f", at the fork {env['at_fork']:.4f}" if env.get("at_fork") is not None else ""
        if env["max"] is None:
            lines.append(f"  envelope  no shared positions before the fork{at_fork}")
        else:
            lines.append(f"  envelope  max {env['max']:.4f}, p95 {env['p95']:.4f}, median {env['median']:.4f} "
                         f"logits over {env['positions']} shared positions (top-{env['top_k']} union){at_fork}")
    if th.get("far") is not None:
        nt = th.get("near_tie")
        lines.append(f"  thresholds  near-tie: both replays reproduce and gap <= far; within the envelope: gap <= "
                     f"max {'n/a' if nt is None else f'{nt:.4f}'}; state: gap > far = max({th['far_factor']:g} x "
                     f"envelope max, {th['far_floor']:g}) = {th['far']:.4f}, or a replay that does not reproduce "
                     f"its arm (tolerance {th['logit_tol']:g} logits)")
    else:
        lines.append(f"  thresholds  identical: every token equal; replays run only on a fork "
                     f"(far factor {th.get('far_factor', FAR_FACTOR):g}, floor {th.get('far_floor', FAR_FLOOR):g}, "
                     f"tolerance {th.get('logit_tol', LOGIT_TOL):g})")
    ar = diag.get("at_risk")
    if ar is not None and th.get("at_risk") is not None:
        lines.append(f"  at risk  {len(ar)} vanilla positions have a top-1/top-2 margin below the envelope max "
                     f"{th['at_risk']:.4f}" + (f": {', '.join(map(str, ar[:12]))}{' ...' if len(ar) > 12 else ''}"
                                                if ar else ""))
    ctrls = diag.get("controls")
    if ctrls:
        lines.append("  controls")
        for c in ctrls:
            if c.get("skipped"):
                res = f"skipped ({c['skipped']})"
            elif c["identical"]:
                drafted = f", {c['n_drafted']} drafted" if c.get("n_drafted") is not None else ""
                res = f"identical ({c['n_tokens']} tokens{drafted})"
            else:
                res = f"diverges at token {c['first_mismatch']}"
            lines.append(f"    {c['name']:<14} {res}  - {c['description']}")
    lines.append("  " + diag.get("explanation", ""))
    return "\n".join(lines)
