"""Diagnosing an mlx_lm.server fork from the outside, with mlx-lm's own loops run in this process.

mlx_lm.server generates with ``mlx_lm.generate.generate_step`` (no draft
model) and ``speculative_generate_step`` (with one), and reports only tokens
and capped top log-probabilities.  Everything it does not report can be
recomputed here: the same folders are loaded by the in-process MLX engine
(:class:`~specview.backends.mlx.MLXModel`) and the same two loops run with the
same settings (prefill chunk, KV cache, ``num_draft_tokens``, ``max_tokens``):

* **Reproduction.**  The in-process vanilla loop must give back the vanilla
  arm's tokens and recorded log-probabilities up to the fork, and the
  in-process speculative loop the speculative arm's.  A loop that does not is
  run once more: two in-process runs that disagree make the backend
  ``nondeterministic``; a vanilla arm that this process cannot reproduce
  although it repeats itself leaves the fork ``inconclusive`` (the server does
  not compute what mlx-lm computes here: another mlx, other flags); a
  speculative arm that a clean speculative loop cannot reproduce, while vanilla
  is reproduced, is ``state``: the server's speculative state was not the state
  its tokens imply.
* **What the server hides.**  The in-process speculative loop says which
  tokens were accepted drafts and which verify pass (T rows, which row) emitted
  each token, so the fork gets its shape, as on the in-process engines.
* **The serial-verify control.**  The same speculative loop again, with the
  target computing every verify pass one row at a time (the prompt prefill is
  left as it is): every KV entry and every row is then what vanilla computes,
  so a correct loop reproduces the vanilla arm token for token.  If it does,
  the fork comes from batched-versus-single numerics, proven; if it does not,
  the loop or its cache is wrong.
* **Envelope and gap**, as in :mod:`specview.core.diagnose`: the largest
  relative logit shift between the two loops' rows before the fork, and
  logp(a) - logp(b) at the fork in the one-token shape; :func:`classify`
  decides with the same rules.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ...core.arms.compare import first_difference
from ...core.diagnose import (fork_fields, fork_of, require_complete, FAR_FACTOR, FAR_FLOOR, LOGIT_TOL, SCHEMA_VERSION, DiagnosisCancelled,
                              at_risk_positions, classify, envelope_stats, far_threshold, rank_of)
from ...core.errors import SpecviewError
from ...core.arms.topk import topk
from ...core.trace import ArmResult, Trace

__all__ = ["diagnose_from_outside", "LoopSettings", "vanilla_rows", "speculative_rows", "METHOD", "NOT_MEASURED"]

METHOD = "mlx_lm.server, from the outside: mlx-lm's own loops re-run in process on the same folders"
#: what stays unmeasured however the diagnosis goes
NOT_MEASURED = [
    "the server's own rounds and drafts: mlx_lm.server reports none; the rounds, draft flags and verify shapes in "
    "this diagnosis are those of mlx-lm's speculative loop re-run in process, which reproduces the server's tokens",
    "the top-k beyond the server's top_logprobs cap: tokens outside it were compared by the in-process rows only",
]

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]


class LoopSettings:
    """What the server's loops were run with (the same here)."""

    def __init__(self, *, max_tokens: int, prefill_step_size: int, num_draft_tokens: int,
                 kv_bits: int | None, kv_group_size: int, ban: Sequence[int] = ()):
        self.max_tokens = int(max_tokens)
        self.ban = tuple(int(t) for t in ban)  # what ignore_eos bans: the server's logit_bias of -inf
        self.prefill_step_size = int(prefill_step_size)
        self.num_draft_tokens = int(num_draft_tokens)
        self.kv_bits = kv_bits
        self.kv_group_size = int(kv_group_size)

    def kv(self) -> dict[str, Any]:
        if self.kv_bits is None:
            return {}
        return {"kv_bits": self.kv_bits, "kv_group_size": self.kv_group_size, "quantized_kv_start": 0}

    def loop(self) -> dict[str, Any]:
        """Keyword arguments of mlx-lm's loops: the KV settings, and the server's logit bias when it bans."""
        kw = self.kv()
        if self.ban:
            from mlx_lm.sample_utils import make_logits_processors

            kw["logits_processors"] = make_logits_processors(logit_bias={t: float("-inf") for t in self.ban})
        return kw


class _SerialTarget:
    """The target with every multi-token pass past the prompt computed one token at a time."""

    def __init__(self, model: Any, n_prompt: int):
        self._model = model
        self._after = max(0, n_prompt - 1)  # mlx-lm prefills all prompt tokens but the last
        self.passes = 0

    def __getattr__(self, name: str) -> Any:  # layers, make_cache, ... of the real model
        return getattr(self._model, name)

    def __call__(self, x: Any, cache: Any = None, **kw: Any) -> Any:
        import mlx.core as mx

        offset = int(getattr(cache[0], "offset", 0)) if cache else 0
        if x.shape[1] == 1 or offset < self._after:
            self.passes += 1
            return self._model(x, cache=cache, **kw)
        rows = []
        for i in range(x.shape[1]):
            rows.append(self._model(x[:, i:i + 1], cache=cache, **kw))
            self.passes += 1
        return mx.concatenate(rows, axis=1)


def _np(row: Any) -> np.ndarray:
    import mlx.core as mx

    return np.array(row.astype(mx.float32), dtype=np.float32, copy=True)


def vanilla_rows(model: Any, prompt: Sequence[int], ls: LoopSettings, upto: int,
                 cancel: CancelFn) -> Iterator[tuple[int, np.ndarray]]:
    """(token, log-probability row) for tokens 0..upto, as ``mlx_lm.server`` without a draft computes them."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    gen = generate_step(mx.array(list(prompt), dtype=mx.uint32), model, max_tokens=ls.max_tokens,
                        prefill_step_size=ls.prefill_step_size, **ls.loop())
    try:
        for j, (tok, lp) in enumerate(gen):
            if cancel():
                raise DiagnosisCancelled("diagnosis cancelled")
            yield int(tok), _np(lp)
            if j >= upto:
                break
    finally:
        gen.close()


def speculative_rows(model: Any, draft: Any, prompt: Sequence[int], ls: LoopSettings, upto: int,
                     cancel: CancelFn) -> Iterator[tuple[int, np.ndarray, dict[str, Any]]]:
    """(token, row, shape) for tokens 0..upto, as ``mlx_lm.server`` with a draft computes them.

    The shape (round, accepted draft or not, T and row of the verify pass) is
    rebuilt from the loop's own ``from_draft`` flags: each round drafts
    ``min(max_tokens - emitted, num_draft_tokens)`` tokens, verifies them with
    the last token in one pass of that many + 1 rows, yields the accepted drafts
    and then (room permitting) the target's own token.
    """
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step

    gen = speculative_generate_step(mx.array(list(prompt), dtype=mx.uint32), model, draft,
                                    num_draft_tokens=ls.num_draft_tokens, max_tokens=ls.max_tokens,
                                    prefill_step_size=ls.prefill_step_size, **ls.loop())
    rnd, row, emitted, num_draft = 0, 0, 0, 0
    new_round = True
    try:
        for j, (tok, lp, from_draft) in enumerate(gen):
            if cancel():
                raise DiagnosisCancelled("diagnosis cancelled")
            if new_round:
                rnd += 1
                row = 0
                num_draft = min(ls.max_tokens - emitted, ls.num_draft_tokens)
            shape = {"round": rnd, "from_draft": bool(from_draft), "batch_size": num_draft + 1, "batch_index": row}
            yield int(tok), _np(lp), shape
            emitted += 1
            row += 1
            new_round = not from_draft  # a round ends with the target's own token
            if j >= upto:
                break
    finally:
        gen.close()


def _recorded_delta(row: np.ndarray, ids: Sequence[int], vals: Sequence[float]) -> float:
    """Largest |in-process - recorded| log-probability over the recorded top ids (0 with none recorded)."""
    if not ids:
        return 0.0
    return float(np.max(np.abs(row[np.asarray(ids, dtype=np.int64)].astype(np.float64) -
                               np.asarray(vals, dtype=np.float64))))


class _Check:
    """How one in-process run compares with the arm the server produced."""

    def __init__(self, arm: ArmResult):
        self.arm = arm
        self.tokens: list[int] = []
        self.rows: list[np.ndarray] = []
        self.shapes: list[dict[str, Any]] = []
        self.first_deviation: int | None = None
        self.max_delta = 0.0

    def see(self, j: int, tok: int, row: np.ndarray, shape: dict[str, Any] | None = None) -> None:
        self.tokens.append(tok)
        self.rows.append(row)
        self.shapes.append(shape or {})
        if j >= len(self.arm.steps):
            return
        st = self.arm.steps[j]
        delta = _recorded_delta(row, st.top_ids, st.top_logits)
        self.max_delta = max(self.max_delta, delta)
        if self.first_deviation is None and (tok != st.token or delta > LOGIT_TOL):
            self.first_deviation = j

    @property
    def reproduced(self) -> bool:
        return self.first_deviation is None


def _same_run(a: _Check, b: _Check) -> bool:
    """Two in-process runs of one loop gave the same tokens and rows."""
    return a.tokens == b.tokens and all(np.array_equal(x, y) for x, y in zip(a.rows, b.rows))


def _shift(r1: np.ndarray, r2: np.ndarray, k: int) -> float:
    """Largest change of logp(x) - logp(top-1) over the union of both rows' top-k (free of the normaliser)."""
    u = np.union1d(topk(r1, k)[0], topk(r2, k)[0])
    t = int(np.argmax(r1))
    d = (r1[u].astype(np.float64) - float(r1[t])) - (r2[u].astype(np.float64) - float(r2[t]))
    return float(np.max(np.abs(d)))


def _r(x: float | None, nd: int = 5) -> float | None:
    return None if x is None else round(float(x), nd)


def _blank_result() -> dict[str, Any]:
    """Core's diagnosis keys (and ``not_measured``) in their printed order, each empty until a step fills it."""
    thresholds: dict[str, Any] = {"logit_tol": LOGIT_TOL, "far_factor": FAR_FACTOR, "far_floor": FAR_FLOOR,
                                  "near_tie": None, "far": None, "at_risk": None}
    return {
        "version": SCHEMA_VERSION, "method": METHOD, "verdict": None, "rule": None, "fork": None,
        "vanilla_token": None, "speculative_token": None, "vanilla_piece": None, "speculative_piece": None,
        "gap": None, "envelope": None, "at_risk": None, "thresholds": thresholds, "replays": None,
        "serial_verify": None, "reference": None, "controls": None, "not_measured": list(NOT_MEASURED),
        "explanation": "", "seconds": None,
    }


def _vanilla_check(arm: ArmResult, target: Any, prompt: list[int], ls: LoopSettings, upto: int,
                   cancel: CancelFn) -> _Check:
    check = _Check(arm)
    for j, (tok, row) in enumerate(vanilla_rows(target, prompt, ls, upto, cancel)):
        check.see(j, tok, row)
    return check


def _speculative_check(arm: ArmResult, target: Any, draft: Any, prompt: list[int], ls: LoopSettings, upto: int,
                       cancel: CancelFn) -> _Check:
    check = _Check(arm)
    for j, (tok, row, shape) in enumerate(speculative_rows(target, draft, prompt, ls, upto, cancel)):
        check.see(j, tok, row, shape)
    return check


@dataclass
class _Loops:
    """mlx-lm's two loops re-run in process up to the fork, each compared with its arm."""

    single: _Check
    spec: _Check
    reruns: dict[str, bool | None]
    seconds: float


def _run_loops(target: Any, draft: Any, trace: Trace, prompt: list[int], ls: LoopSettings, fork: int,
               say: ProgressFn, cancel: CancelFn) -> _Loops:
    """Both loops up to the fork; a loop that does not give back its arm is run once more (``reruns``)."""
    v, s = trace.vanilla, trace.speculative
    t0 = time.perf_counter()
    say(f"re-running mlx-lm's vanilla and speculative loops in process up to token {fork}")
    single = _vanilla_check(v, target, prompt, ls, fork, cancel)
    if draft is not None:
        spec = _speculative_check(s, target, draft, prompt, ls, fork, cancel)
    else:  # no draft model: the "speculative" arm was the same loop again
        spec = _Check(s)
        for j, (tok, row) in enumerate(vanilla_rows(target, prompt, ls, fork, cancel)):
            spec.see(j, tok, row, {"round": 0, "from_draft": False, "batch_size": 1, "batch_index": 0})
    if len(single.rows) <= fork or len(spec.rows) <= fork:
        raise SpecviewError(f"mlx-lm's loops stopped before token {fork} in process (max_tokens "
                            f"{ls.max_tokens}); the trace's settings do not match its arms")
    reruns: dict[str, bool | None] = {"single": None, "speculative": None}
    if not single.reproduced:
        say(f"the in-process vanilla loop differs from the server's vanilla arm at token {single.first_deviation}: "
            "running it again")
        reruns["single"] = _same_run(single, _vanilla_check(v, target, prompt, ls, fork, cancel))
    if not spec.reproduced and draft is not None:
        say(f"the in-process speculative loop differs from the server's speculative arm at token "
            f"{spec.first_deviation}: running it again")
        reruns["speculative"] = _same_run(spec, _speculative_check(s, target, draft, prompt, ls, fork, cancel))
    return _Loops(single, spec, reruns, round(time.perf_counter() - t0, 3))


def _envelope(result: dict[str, Any], loops: _Loops, v: ArmResult, fork: int, top_k: int) -> float | None:
    """The envelope before the fork and the thresholds it gives, into ``result``; returns its max."""
    single, spec = loops.single, loops.spec
    series = [_shift(single.rows[j], spec.rows[j], top_k) for j in range(fork + 1)]
    stats = envelope_stats(series[:fork])
    result["envelope"] = {"max": _r(stats["max"]), "p95": _r(stats["p95"]), "median": _r(stats["median"]),
                          "at_fork": _r(series[fork]), "positions": fork, "top_k": top_k,
                          "series": [_r(x) for x in series],
                          "measure": "largest change of log-probability differences relative to the one-token "
                                     "top-1, between mlx-lm's vanilla and speculative loops, over the union of "
                                     "both rows' top-k"}
    result["thresholds"].update(near_tie=_r(stats["max"]), far=_r(far_threshold(stats["max"])),
                                at_risk=_r(stats["max"]))
    result["at_risk"] = at_risk_positions([st.margin for st in v.steps], stats["max"])
    return stats["max"]


def _arm_json(check: _Check, key: str, row: np.ndarray, own: int, other: int, shape_words: str, fork: int, a: int,
              b: int, reruns: dict[str, bool | None]) -> dict[str, Any]:
    tok = check.tokens[fork]
    return {"shape": shape_words, "token": tok, "logit_a": _r(float(row[a])), "logit_b": _r(float(row[b])),
            "gap": _r(float(row[own] - row[other])), "rank_a": rank_of(row, a), "rank_b": rank_of(row, b),
            "reproduced": check.reproduced, "reproduces_token": tok == (a if key == "single" else b),
            "first_deviation": check.first_deviation, "max_recorded_delta": _r(check.max_delta, 6),
            "rerun_consistent": reruns[key]}


def _replays(loops: _Loops, fork: int, a: int, b: int, has_draft: bool) -> dict[str, Any]:
    """Core's ``replays`` block: the fork row of each loop, the speculative one with its verify pass's shape."""
    single, spec, reruns = loops.single, loops.spec, loops.reruns
    r1, r2, shape = single.rows[fork], spec.rows[fork], spec.shapes[fork]
    spec_words = (f"row {shape['batch_index']} of the T={shape['batch_size']} verify pass of round {shape['round']}"
                  f"{', an accepted draft token' if shape.get('from_draft') else ''} (mlx-lm's loop in process)"
                  if has_draft else "one token per forward pass (no draft model)")
    return {
        "positions": fork + 1, "seconds": loops.seconds,
        "single": _arm_json(single, "single", r1, a, b, "one token per forward pass (mlx-lm's generate_step)",
                            fork, a, b, reruns),
        "speculative": {**_arm_json(spec, "speculative", r2, b, a, spec_words, fork, a, b, reruns), **shape,
                        "from_draft_flags": [bool(sh.get("from_draft")) for sh in spec.shapes]},
    }


def _verdict(result: dict[str, Any], loops: _Loops, gap: float, env_max: float | None,
             sv: dict[str, Any] | None) -> tuple[str, str]:
    """``inconclusive`` when this process cannot reproduce a vanilla arm that repeats itself, else core's rules."""
    single, spec, reruns = loops.single, loops.spec, loops.reruns
    if not single.reproduced and reruns["single"]:
        result["not_measured"].append(
            f"whether the server's vanilla arm is what mlx-lm computes: this process does not reproduce it (first "
            f"at token {single.first_deviation}, up to {single.max_delta:.4f} in log-probability) although it "
            "repeats itself; the server runs another mlx or mlx-lm, or flags specview does not mirror")
        return "inconclusive", "not-measured"
    return classify(
        identical=False,
        single_reproduced=single.reproduced, single_rerun_consistent=reruns["single"],
        spec_reproduced=spec.reproduced, spec_rerun_consistent=reruns["speculative"],
        gap=gap, env_max=env_max,
        serial_verify_identical=None if sv is None else sv["identical_to_vanilla"],
    )


def diagnose_from_outside(target: Any, draft: Any, trace: Trace, ls: LoopSettings, *,
                          progress: ProgressFn | None = None, cancel: CancelFn | None = None) -> dict[str, Any]:
    """Explain an mlx_lm.server trace's fork; ``target``/``draft`` are the in-process mlx-lm models
    (``nn.Module``) of the same folders (``draft`` None for a run without a draft model)."""
    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    t_start = time.perf_counter()
    v = trace.vanilla
    require_complete(trace)
    top_k = int(trace.config.get("top_k") or 8)
    prompt = [int(t) for t in trace.prompt["tokens"]]
    result = _blank_result()
    if trace.comparison.identical:
        result["verdict"], result["rule"] = classify(identical=True)
        from ...core.diagnose.words import identical_words

        result["explanation"] = identical_words(trace)
        result["seconds"] = round(time.perf_counter() - t_start, 3)
        return result
    fm = fork_of(trace)
    fork, a, b = fm.index, int(fm.vanilla_token), int(fm.speculative_token)
    result.update(fork_fields(fm))
    loops = _run_loops(target, draft, trace, prompt, ls, fork, say, cancel)
    env_max = _envelope(result, loops, v, fork, top_k)
    r1 = loops.single.rows[fork]
    gap = float(r1[a] - r1[b])
    result["gap"] = _r(gap)
    result["replays"] = _replays(loops, fork, a, b, draft is not None)
    sv = None
    if draft is not None and loops.single.reproduced:
        sv = _serial_verify(target, draft, prompt, ls, v, loops.single, say, cancel)
        result["serial_verify"] = sv
    result["verdict"], result["rule"] = _verdict(result, loops, gap, env_max, sv)
    result["explanation"] = _explain(result, trace)
    result["seconds"] = round(time.perf_counter() - t_start, 3)
    return result


def _serial_verify(target: Any, draft: Any, prompt: list[int], ls: LoopSettings, v: ArmResult, single: _Check,
                   say: ProgressFn, cancel: CancelFn) -> dict[str, Any]:
    """mlx-lm's speculative loop with every verify pass as single-token passes, against the vanilla arm."""
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step

    say("serial-verify control: mlx-lm's speculative loop with every verify row as its own single-token pass")
    t0 = time.perf_counter()
    serial = _SerialTarget(target, len(prompt))
    gen = speculative_generate_step(mx.array(prompt, dtype=mx.uint32), serial, draft,
                                    num_draft_tokens=ls.num_draft_tokens, max_tokens=ls.max_tokens,
                                    prefill_step_size=ls.prefill_step_size, **ls.loop())
    tokens: list[int] = []
    try:
        for tok, _lp, _fd in gen:
            if cancel():
                raise DiagnosisCancelled("diagnosis cancelled")
            tokens.append(int(tok))
            j = len(tokens) - 1
            if j >= len(v.tokens) - 1 or tokens[j] != v.tokens[j]:
                break
    finally:
        gen.close()
    d = first_difference(v.tokens, tokens)
    if d is not None and d >= len(tokens):
        d = None  # the server's vanilla stopped at an end-of-generation token the loop does not stop at
    out: dict[str, Any] = {
        "form": "single-token-passes",
        "description": "mlx-lm's speculative loop, in process, with the target computing every verify pass as "
                       "single-token passes, one per row (drafting, acceptance and rollback unchanged)",
        "identical_to_vanilla": d is None, "first_mismatch": d, "n_tokens": len(tokens), "passes": serial.passes,
        "reused_run": False, "vanilla_repeat": None, "seconds": None,
    }
    if d is not None:
        # vanilla again, in process, up to there: does the vanilla arm repeat itself that far?
        rep = _Check(v)
        for j, (tok, row) in enumerate(vanilla_rows(target, prompt, ls, d, cancel)):
            rep.see(j, tok, row)
        dd = first_difference(v.tokens[: len(rep.tokens)], rep.tokens)
        out["vanilla_repeat"] = {"identical": dd is None, "first_mismatch": dd, "n_tokens": len(rep.tokens)}
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def _explain(d: dict[str, Any], trace: Trace) -> str:
    from ...core.diagnose import explain

    tail = (" mlx_lm.server reports no rounds or drafts: the shapes named here are those of mlx-lm's speculative "
            "loop re-run in process on the same folders, which gives back the server's tokens.")
    if d["verdict"] == "inconclusive":
        return ("Inconclusive: " + d["not_measured"][-1] + ". Without that, a fork between the server's arms "
                "cannot be attributed from outside the server.")
    if d["rule"] == "speculative-unreproducible":
        sp = d["replays"]["speculative"]
        return (f"mlx-lm's speculative loop, re-run in process from a clean state on the same folders, does not "
                f"give back the server's speculative arm (first at token {sp['first_deviation']}, up to "
                f"{sp['max_recorded_delta']:.4f} in log-probability), while the vanilla loop gives back the vanilla "
                f"arm and a second clean run agrees with the first. So the server's speculative state was not the "
                f"state its tokens imply: suspect its draft or prompt cache handling, a rollback that kept a "
                f"rejected draft, or injected state. Worth a bug report to mlx-lm with the trace." + tail)
    return explain(d, trace) + tail
