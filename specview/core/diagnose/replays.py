"""Two teacher-forced replays of a trace, on fresh contexts, in lockstep.

* The *single* replay feeds the shared prefix one token per forward pass,
  exactly as the vanilla arm did (same prefill chunks).
* The *speculative* replay rebuilds the speculative arm's KV state from the
  trace: the same prefill, then every recorded verify batch ``[id_last] +
  draft_tokens`` (as one pass, or as single-token passes for a serial-verify
  round) with the same rollback after it, up to the verify pass that
  produced the fork token.  A round that replayed after a checkpoint restore
  (a hybrid target: ``rollback`` "checkpoint", ``replay`` its width) is rebuilt
  the same way: the state saved before its verify pass is restored and the
  replay pass run again, and its rows are the round's.  Nothing here starts a
  fresh context to stand for a rolled-back one: a recurrent state is only what
  the arm's own passes made it.

Both walk the shared prefix together, so only one logits batch of each is ever
held: memory is O(n_vocab x batch).  Each replay is compared with what its arm
recorded (:class:`ArmCheck`); at each position the two shapes' logits are
compared over the union of both top-k sets (the envelope's series).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..engine import Engine
from ..errors import SpecviewError
from ..arms.generate import Ban, ban_rows, banned, prefill, verify
from ..arms.topk import topk
from ..trace import ArmResult, Trace
from .classify import LOGIT_TOL, DiagnosisCancelled, rank_of

CancelFn = Callable[[], bool]
ProgressFn = Callable[[str], None]
Rows = Iterator[tuple[int, np.ndarray, dict]]


def single_rows(eng: Engine, prompt: list[int], n_batch: int, tokens: Sequence[int], upto: int,
                cancel: CancelFn) -> Rows:
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


def spec_rows(eng: Engine, prompt: list[int], n_batch: int, spec: ArmResult, upto: int, cancel: CancelFn) -> Rows:
    """Rows for positions 0..upto, rebuilt with the speculative arm's recorded batches and truncations."""
    if cancel():
        raise DiagnosisCancelled("diagnosis cancelled")
    eng.plan_rollbacks(max((r.drafted for r in spec.rounds), default=0))
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
        mode = eng.prepare_rollback(len(rnd.draft_tokens))
        logits = verify(eng, batch, serial=rnd.serial)
        width = len(batch)
        if rnd.replay and rnd.rollback == "checkpoint":
            if mode != "checkpoint":
                raise SpecviewError(f"the trace's round {rnd.index} replayed after a checkpoint restore, but this "
                                    f"context rolls back by {mode or 'nothing'}: re-run with --rollback checkpoint")
            eng.truncate(n_past)  # the checkpoint, restored
            again = [toks[fs - 1], *toks[fs:fs + rnd.replay - 1]]  # shorter only where the run ended inside it
            if len(again) != rnd.replay and fs + len(again) - 1 < len(toks):
                raise SpecviewError(f"the trace's round {rnd.index} records a replay of {rnd.replay} tokens that "
                                    "its tokens do not hold: cannot rebuild its state")
            logits = verify(eng, again, serial=rnd.serial)
            width = len(again)
        else:
            eng.truncate(n_past + rnd.accepted + 1)
        for k in range(rnd.emitted):
            j = fs + k
            if j > upto or j >= len(toks):
                return
            yield j, logits[k], {"round": rnd.index, "batch_size": width, "batch_index": k,
                                 "serial": rnd.serial}


def without_banned(rows: Rows, ban: Ban) -> Rows:
    """The replay's rows as the arms picked from them: with ``--ignore-eos`` every end-of-generation token at -inf."""
    for j, row, meta in rows:
        yield j, ban_rows(row, ban), meta


def recorded_delta(row: np.ndarray, step) -> tuple[bool, float]:
    """(same token as recorded, max |replayed - recorded| over the recorded top ids)."""
    ids = np.asarray(step.top_ids, dtype=np.int64)
    vals = np.asarray(step.top_logits, dtype=np.float64)
    same = int(np.argmax(row)) == int(step.token)
    if len(ids) == 0:
        return same, 0.0
    return same, float(np.max(np.abs(row[ids].astype(np.float64) - vals)))


class ArmCheck:
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
        same, delta = recorded_delta(row, self.arm.steps[j])
        self.max_delta = max(self.max_delta, delta)
        if self.first_deviation is None and (not same or delta > tol):
            self.first_deviation = j

    @property
    def reproduced(self) -> bool:
        return self.first_deviation is None


def rerun_consistent(rows: Rows, check: ArmCheck, upto: int, tol: float) -> bool:
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


@dataclass
class Replays:
    """What the lockstep replays found."""

    upto: int
    single: ArmCheck
    spec: ArmCheck
    series: list[float] = field(default_factory=list)  # the shift between the shapes at every position
    fork_info: dict[str, Any] = field(default_factory=dict)  # both shapes at the fork
    reruns: dict[str, bool | None] = field(default_factory=lambda: {"single": None, "speculative": None})
    passes: int = 0
    seconds: float = 0.0


def check_replayable(trace: Trace, upto: int) -> None:
    """Refuse, clearly, a trace whose speculative arm cannot be rebuilt up to ``upto``."""
    s = trace.speculative
    if upto > 0 and not any(r.index > 0 for r in s.rounds):
        raise SpecviewError("this trace has no per-round data for the speculative arm (its engine does not "
                            "report rounds), so the arm's state cannot be rebuilt; re-run it with specview")
    if any(r.index > 0 and r.first_step <= upto and len(r.draft_tokens) != r.drafted for r in s.rounds):
        raise SpecviewError("this trace does not record the draft tokens of each round, so the speculative "
                            "arm's state cannot be rebuilt; re-run it with specview")


def replay(e1: Engine, e2: Engine, trace: Trace, *, prompt: list[int], n_batch: int, upto: int,
           fork: int | None, top_k: int, say: ProgressFn, cancel: CancelFn) -> Replays:
    """Walk positions 0..upto in both shapes on the fresh contexts ``e1`` (single) and ``e2`` (speculative)."""
    v, s = trace.vanilla, trace.speculative
    fm = trace.comparison.first_mismatch
    t0 = time.perf_counter()
    passes0 = e1.n_evals + e2.n_evals
    out = Replays(upto=upto, single=ArmCheck(v), spec=ArmCheck(s))
    single, spec, series = out.single, out.spec, out.series
    ban = banned(e1, bool(trace.config.get("ignore_eos")))
    g1 = without_banned(single_rows(e1, prompt, n_batch, v.tokens, upto, cancel), ban)
    g2 = without_banned(spec_rows(e2, prompt, n_batch, s, upto, cancel), ban)
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
            assert fm is not None
            a, b = int(fm.vanilla_token), int(fm.speculative_token)
            how = "single-token passes" if meta2.get("serial") else "pass"
            out.fork_info = {
                "single": {
                    "shape": "one token per forward pass (the vanilla shape)",
                    "token": int(np.argmax(row1)),
                    "logit_a": float(row1[a]), "logit_b": float(row1[b]),
                    "gap": float(row1[a] - row1[b]),
                    "rank_a": rank_of(row1, a), "rank_b": rank_of(row1, b),
                },
                "speculative": {
                    "shape": f"row {meta2['batch_index']} of the T={meta2['batch_size']} verify {how} "
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
    out.passes = e1.n_evals + e2.n_evals - passes0

    if not single.reproduced:
        d = single.first_deviation
        assert d is not None
        say(f"the vanilla replay deviates from the record at token {d}: replaying it again")
        out.reruns["single"] = rerun_consistent(without_banned(single_rows(e1, prompt, n_batch, v.tokens, d, cancel),
                                                               ban), single, d, LOGIT_TOL)
    if not spec.reproduced:
        d = spec.first_deviation
        assert d is not None
        say(f"the speculative replay deviates from the record at token {d}: replaying it again")
        out.reruns["speculative"] = rerun_consistent(without_banned(spec_rows(e2, prompt, n_batch, s, d, cancel),
                                                                    ban), spec, d, LOGIT_TOL)
    out.seconds = time.perf_counter() - t0
    return out
