"""The two arms, written once over the :class:`~specview.core.engine.Engine` interface.

Both are generators in the style of mlx-lm's ``generate_step``: they yield one
small dataclass per event (:class:`~specview.core.trace.Step` for every emitted
token, :class:`~specview.core.trace.Round` for every speculative round) and
return the finished :class:`~specview.core.trace.ArmResult`.  Each yield is a
cancel point; ``cancel`` is checked between forward passes.

Shapes are the point of specview, so they are exact and recorded:

* vanilla: the prompt is prefilled in ``n_batch`` chunks; the last chunk's last
  row gives token 0; then exactly one token per forward pass (T = 1).
* speculative (llama-server's loop): the same prefill gives token 0 (round 0);
  then each round drafts, verifies ``[id_last] + draft`` in ONE forward pass
  (T = 1 + len(draft)), accepts the longest prefix of the draft equal to the
  target's argmax plus one target token, and truncates the KV cache to exactly
  the accepted tokens.  So ``len(tokens) == n_accepted + n_rounds``.
* serial verify (``serial_verify=True``, the diagnosis' control): the same loop,
  but each verify pass is computed as T single-token passes on the same
  context, in order, one per row of ``[id_last] + draft``.  Drafting,
  acceptance, rollback and positions are unchanged; every KV entry and every
  row is then computed exactly as vanilla computes it, so a correct loop on a
  deterministic backend reproduces the vanilla arm token for token.  Rounds and
  steps keep the verify width T as ``batch_size`` and say ``serial=True``.
* rollback (a memory that is more than a KV cache: a recurrent or hybrid
  model's): the engine says how it drops the rejected tokens
  (:meth:`~specview.core.engine.Engine.rollback_mode`).  ``seq-rm`` and
  ``snapshots`` drop them and recompute nothing.  ``checkpoint`` is
  llama-server's checkpoint and replay: the state saved before the verify pass
  is restored and ``[id_last] + accepted + [the target's token]`` is verified
  again in one pass of another width (serially in a serial verify); the tokens
  are emitted from the replay's rows, one more than the verify alone gives (the
  token after the target's own), and the next round drafts after it.  The round
  records ``rollback`` and the replay's width ``replay``.
* ``ignore_eos`` is llama.cpp's ``--ignore-eos`` ("ignore end of stream token
  and continue generating (implies --logit-bias EOS-inf)"): every
  end-of-generation token of the target's vocabulary gets a logit of -inf in
  every row the arm picks from (prefill, verify, replay, each serial row), so
  it is never chosen, never accepted and never recorded among the top-k; the
  drafters keep their own samplers, as llama.cpp's do, and may draft one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Generator, Sequence, Union

import numpy as np

from .drafters import Drafter
from ..engine import ContextOverflow, Engine
from .topk import topk
from ..trace import ArmResult, Round, Step

Event = Union[Step, Round]
CancelCheck = Callable[[], bool]

DEFAULT_TOP_K = 8


@dataclass(frozen=True)
class GenOptions:
    max_tokens: int = 256
    ignore_eos: bool = False
    n_batch: int = 512  # prefill chunk size
    top_k: int = DEFAULT_TOP_K

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n_batch < 1:
            raise ValueError(f"n_batch must be >= 1, got {self.n_batch}")
        if self.top_k < 2:
            raise ValueError(f"top_k must be >= 2 to have a margin, got {self.top_k}")


def _never() -> bool:
    return False


def context_needed(n_prompt: int, max_tokens: int, n_max: int = 0) -> int:
    """KV positions a run can touch: prompt, generated tokens, and one verify batch of drafts."""
    return n_prompt + max_tokens + n_max + 1


def _asked(engine: Engine) -> str:
    """Why the context is not the size asked for, when it is not (llama.cpp pads it to a multiple of 256)."""
    asked = getattr(engine, "n_ctx_requested", None)
    if isinstance(asked, int) and 0 < asked != engine.n_ctx:
        return f" ({asked} was asked for; the engine {'rounded it up' if asked < engine.n_ctx else 'made it smaller'})"
    return ""


def check_fits(engine: Engine, n_prompt: int, max_tokens: int, n_max: int = 0) -> None:
    need = context_needed(n_prompt, max_tokens, n_max)
    if n_prompt == 0:
        raise ContextOverflow("the prompt is empty: give a prompt or at least one token id")
    if need > engine.n_ctx:
        raise ContextOverflow(
            f"the prompt is {n_prompt} tokens and the run generates up to {max_tokens}"
            + (f" (plus {n_max} draft tokens per verify)" if n_max else "")
            + f", which needs a context of {need}, "
            f"but the context is {engine.n_ctx}{_asked(engine)}. Raise --n-ctx to at least {need}, "
            "or lower --max-tokens, or shorten the prompt."
        )
    width = 1 + min(n_max, max_tokens - 1)  # a verify pass: the last token and what can still be drafted
    if width > engine.n_batch:
        raise ContextOverflow(
            f"a verify pass carries up to {width} tokens (the last token plus {width - 1} drafted), but this "
            f"context takes at most n_batch = {engine.n_batch} tokens per pass (llama.cpp makes n_batch at most "
            f"n_ctx). Raise --n-batch (and --n-ctx) to at least {width}, or draft fewer tokens."
        )


def make_step(
    row: np.ndarray,
    token: int,
    *,
    index: int,
    pos: int,
    piece: str,
    k: int,
    round: int = 0,
    from_draft: bool = False,
    batch_size: int = 1,
    batch_index: int = 0,
    serial: bool = False,
) -> Step:
    ids, vals = topk(row, k)
    return Step(
        index=index,
        token=int(token),
        piece=piece,
        pos=pos,
        top_ids=ids.tolist(),
        top_logits=vals.tolist(),
        margin=float(vals[0] - vals[1]) if len(vals) > 1 else float("inf"),
        round=round,
        from_draft=from_draft,
        batch_size=batch_size,
        batch_index=batch_index,
        serial=serial,
    )


def accepted_prefix(draft: Sequence[int], argmax: Sequence[int]) -> int:
    """How many leading draft tokens the target accepts: those equal to its argmax at their row.

    ``argmax[j]`` is the target's pick after row j of ``[id_last] + draft``, so
    draft token j is accepted when it equals ``argmax[j]`` and every earlier one
    was accepted.
    """
    n = 0
    while n < len(draft) and int(argmax[n]) == int(draft[n]):
        n += 1
    return n


Ban = Union[np.ndarray, None]


def banned(engine: Engine, ignore_eos: bool) -> Ban:
    """The token ids ``--ignore-eos`` bans on ``engine``'s vocabulary: every end-of-generation token (None: none)."""
    if not ignore_eos or not engine.vocab.eog:
        return None
    return np.fromiter(sorted(engine.vocab.eog), dtype=np.int64)


def ban_rows(rows: np.ndarray, ban: Ban) -> np.ndarray:
    """``rows`` (one row or a stack of them) with the banned ids' logits at -inf (a copy; as given without a ban)."""
    if ban is None:
        return rows
    out = np.array(rows, dtype=np.float32, copy=True)
    out[..., ban] = -np.inf
    return out


def verify(engine: Engine, batch: Sequence[int], *, serial: bool = False, ban: Ban = None) -> np.ndarray:
    """The logits of every row of ``batch``: one T-token pass, or T single-token passes in order (banned ids -inf)."""
    if not serial:
        return ban_rows(engine.eval(batch, rows=range(len(batch))), ban)
    return ban_rows(np.stack([engine.eval([t], rows=[0])[0] for t in batch]), ban)


def replay_verify(engine: Engine, n_past: int, id_last: int, carry: list[int], *, serial: bool = False,
                  ban: Ban = None) -> tuple[np.ndarray, list[int], int, int]:
    """llama-server's replay after a checkpoint restore (``spec_is_replay``): ``[id_last] + carry`` verified again.

    ``carry`` is the accepted draft tokens and the target's own token.  The
    replay pass has its own width, so its rows may differ from the verify
    pass's: where it rejects a carried token the checkpoint is restored and the
    shorter carry replayed, as llama-server does.  Returns the replay's rows,
    the tokens it emits (every carried token and the one after them), how many
    of those are draft tokens, and the width of the last replay pass.
    """
    for _ in range(len(carry) + 1):
        engine.truncate(n_past)  # the checkpoint saved before the verify pass, restored
        batch = [id_last, *carry]
        logits = verify(engine, batch, serial=serial, ban=ban)
        argmax = np.argmax(logits, axis=1)
        n_ok = accepted_prefix(carry, argmax)
        if n_ok == len(carry):
            return logits, [*carry, int(argmax[n_ok])], len(carry) - 1, len(batch)
        carry = [*carry[:n_ok], int(argmax[n_ok])]
    # a backend that does not repeat itself: keep what the last replay accepted
    engine.truncate(n_past + len(carry))
    return logits, carry, len(carry) - 1, len(batch)


def prefill(engine: Engine, prompt: Sequence[int], n_batch: int, cancel: CancelCheck = _never):
    """Feed the prompt in ``n_batch`` chunks; return (last row logits, last chunk size), or None if cancelled."""
    engine.reset()
    n_batch = min(n_batch, engine.n_batch)  # the context may hold less than asked (llama.cpp clamps n_batch to n_ctx)
    row = None
    size = 0
    for start in range(0, len(prompt), n_batch):
        if cancel():
            return None
        chunk = prompt[start:start + n_batch]
        row = engine.eval(chunk, rows=[-1])[0]
        size = len(chunk)
    return row, size


def prefill_arm(engine: Engine, prompt: Sequence[int], opts: GenOptions, arm: ArmResult, cancel: CancelCheck,
                then: Callable[[], None] | None = None):
    """The prompt prefilled for ``arm`` (``then`` runs right after, inside the timing: the drafter's own prefill);
    ``arm.prompt_ms`` is what it took.  Returns :func:`prefill`'s (row, size) and the time it ended, or None with
    the arm marked cancelled."""
    t0 = time.perf_counter()
    pre = prefill(engine, prompt, opts.n_batch, cancel)
    if then is not None:
        then()
    t1 = time.perf_counter()
    arm.prompt_ms = (t1 - t0) * 1000.0
    if pre is None:
        arm.stop_reason = "cancelled"
        return None
    return pre, t1


def vanilla_greedy(
    engine: Engine,
    prompt: Sequence[int],
    opts: GenOptions,
    *,
    cancel: CancelCheck = _never,
) -> Generator[Step, None, ArmResult]:
    """Plain greedy decoding: prefill in chunks, then one token per forward pass."""
    prompt = list(prompt)
    check_fits(engine, len(prompt), opts.max_tokens)
    arm = ArmResult(name="vanilla")
    eval0 = engine.eval_seconds
    opened = prefill_arm(engine, prompt, opts, arm, cancel)
    if opened is None:
        return arm
    (row, size), t1 = opened
    n_prompt = len(prompt)
    batch_size, batch_index = size, size - 1
    tokens = arm.tokens
    ban = banned(engine, opts.ignore_eos)
    row = ban_rows(row, ban)
    while True:
        tok = int(np.argmax(row))
        step = make_step(
            row, tok, index=len(tokens), pos=n_prompt + len(tokens), piece=engine.piece(tok),
            k=opts.top_k, batch_size=batch_size, batch_index=batch_index,
        )
        tokens.append(tok)
        arm.steps.append(step)
        yield step
        if not opts.ignore_eos and engine.is_eog(tok):
            arm.stop_reason = "eos"
            break
        if len(tokens) >= opts.max_tokens:
            arm.stop_reason = "max_tokens"
            break
        if cancel():
            arm.stop_reason = "cancelled"
            break
        row = ban_rows(engine.eval([tok], rows=[0])[0], ban)
        batch_size, batch_index = 1, 0
    arm.gen_ms = (time.perf_counter() - t1) * 1000.0
    arm.eval_ms = (engine.eval_seconds - eval0) * 1000.0
    arm.text = "".join(s.piece for s in arm.steps)
    return arm


def _round_zero(engine: Engine, arm: ArmResult, row: np.ndarray, size: int, n_prompt: int, k: int
                ) -> tuple[Step, Round]:
    """Round 0: the prefill's own token, exactly as vanilla gets it, recorded on ``arm``."""
    tok = int(np.argmax(row))
    step = make_step(row, tok, index=0, pos=n_prompt, piece=engine.piece(tok), k=k,
                     round=0, batch_size=size, batch_index=size - 1)
    arm.tokens.append(tok)
    arm.steps.append(step)
    rnd = Round(index=0, drafted=0, accepted=0, draft_ms=0.0, verify_ms=arm.prompt_ms,
                batch_size=size, first_step=0)
    arm.rounds.append(rnd)
    return step, rnd


@dataclass
class _Loop:
    """What the speculative loop keeps from round to round: the target, the arm so far, the KV cache's tokens."""

    engine: Engine
    arm: ArmResult
    opts: GenOptions
    n_prompt: int
    serial: bool
    history: list[int]  # tokens in the target's KV cache, in order; only ever appended to
    ban: Ban = None  # what --ignore-eos bans (see the module docstring)

    def verify_draft(self, r: int, id_last: int, draft: list[int], draft_ms: float, t_drafted: float
                     ) -> tuple[Round, list[Step], str]:
        """Round ``r`` once drafted: verify ``[id_last] + draft``, accept, roll back, emit the tokens onto the arm.

        Returns the round, its new steps and why the arm stops after it ("" to go on).
        """
        engine, arm, opts, serial = self.engine, self.arm, self.opts, self.serial
        tokens, k, n_prompt = arm.tokens, opts.top_k, self.n_prompt
        batch = [id_last, *draft]
        T = len(batch)
        n_past = engine.n_past
        engine.prepare_rollback(len(draft))  # a checkpoint engine saves its state here
        logits = verify(engine, batch, serial=serial, ban=self.ban)
        argmax = np.argmax(logits, axis=1)
        n_acc = accepted_prefix(draft, argmax)
        emitted = [*draft[:n_acc], int(argmax[n_acc])]
        how, replay, width = "", 0, T
        if n_acc < len(draft):
            how = engine.rollback_mode(len(draft) - n_acc)
        if how == "checkpoint":
            # llama-server's checkpoint and replay: the rows of the replay choose the tokens
            logits, emitted, n_acc, replay = replay_verify(engine, n_past, id_last, emitted, serial=serial,
                                                          ban=self.ban)
            width = replay
        else:
            # keep [id_last] + accepted drafts; drop the rejected tail exactly
            done = engine.truncate(n_past + n_acc + 1)
            if done is not None and how:
                how, replay = done.mode, done.replay
        rnd = Round(index=r, drafted=len(draft), accepted=n_acc, draft_ms=draft_ms,
                    verify_ms=(time.perf_counter() - t_drafted) * 1000.0, batch_size=T, first_step=len(tokens),
                    draft_tokens=list(draft), serial=serial, rollback=how, replay=replay)
        self.history.extend([id_last, *emitted[:-1]])
        stop = ""
        new_steps = []
        for j, t in enumerate(emitted):
            step = make_step(
                logits[j], t, index=len(tokens), pos=n_prompt + len(tokens), piece=engine.piece(t), k=k,
                round=r, from_draft=j < n_acc, batch_size=width, batch_index=j, serial=serial,
            )
            tokens.append(t)
            arm.steps.append(step)
            new_steps.append(step)
            if not opts.ignore_eos and engine.is_eog(t):
                stop = "eos"
                break
            if len(tokens) >= opts.max_tokens:
                stop = "max_tokens"
                break
        if stop == "eos" and len(new_steps) < len(emitted):
            # an accepted draft token was EOS: the run ends there, like vanilla's
            rnd.accepted = sum(1 for s in new_steps if s.from_draft)
        arm.rounds.append(rnd)
        return rnd, new_steps, stop


def speculative_greedy(
    engine: Engine,
    drafter: Drafter,
    prompt: Sequence[int],
    opts: GenOptions,
    *,
    n_max_hint: int = 16,
    serial_verify: bool = False,
    cancel: CancelCheck = _never,
) -> Generator[Event, None, ArmResult]:
    """Greedy speculative decoding with llama.cpp's draft-simple semantics.

    ``n_max_hint`` is only used for the up-front context check (the most
    tokens a verify batch can carry beyond the generated ones).  With
    ``serial_verify`` every verify pass is computed as single-token passes
    (see the module docstring); nothing else changes.
    """
    prompt = list(prompt)
    check_fits(engine, len(prompt), opts.max_tokens, n_max_hint)
    arm = ArmResult(name="speculative", drafter=drafter.spec_type)
    eval0 = engine.eval_seconds
    deval0 = drafter.eval_seconds
    used0 = rollbacks_used(engine, drafter)
    engine.plan_rollbacks(n_max_hint)  # a snapshot context keeps as many states as a round can drop
    opened = prefill_arm(engine, prompt, opts, arm, cancel, then=lambda: drafter.begin(prompt))
    if opened is None:
        return arm
    (row, size), t1 = opened
    n_prompt = len(prompt)
    tokens = arm.tokens
    ban = banned(engine, opts.ignore_eos)
    step, rnd = _round_zero(engine, arm, ban_rows(row, ban), size, n_prompt, opts.top_k)
    yield step
    yield rnd
    loop = _Loop(engine, arm, opts, n_prompt, serial_verify, history=list(prompt), ban=ban)
    history = loop.history
    stop = ("eos" if not opts.ignore_eos and engine.is_eog(step.token) else
            "max_tokens" if len(tokens) >= opts.max_tokens else "")
    r = 0
    while not stop:
        if cancel():
            stop = "cancelled"
            break
        r += 1
        id_last = tokens[-1]
        budget = opts.max_tokens - len(tokens) - 1  # leave room for the target's own token
        td0 = time.perf_counter()
        draft = drafter.draft(history, id_last, budget) if budget > 0 else []
        td1 = time.perf_counter()
        if cancel():
            stop = "cancelled"
            break
        rnd, new_steps, stop = loop.verify_draft(r, id_last, draft, (td1 - td0) * 1000.0, td1)
        for s in new_steps:
            yield s
        yield rnd
    arm.stop_reason = stop
    arm.gen_ms = (time.perf_counter() - t1) * 1000.0
    arm.eval_ms = (engine.eval_seconds - eval0 + drafter.eval_seconds - deval0) * 1000.0
    arm.rollbacks = rollbacks_since(used0, engine, drafter)
    arm.text = "".join(s.piece for s in arm.steps)
    return arm


def rollbacks_used(engine: Engine, drafter: Drafter | None = None) -> dict[str, dict[str, int]]:
    """The rollbacks each context has done so far, by mechanism (``target``; ``draft`` for a draft model's)."""
    out = {"target": engine.rollbacks()}
    d_engine = getattr(drafter, "engine", None)
    if isinstance(d_engine, Engine):
        out["draft"] = d_engine.rollbacks()
    return {k: v for k, v in out.items() if v}


def rollbacks_since(before: dict[str, dict[str, int]], engine: Engine, drafter: Drafter | None = None
                    ) -> dict[str, dict[str, int]]:
    """The rollbacks each context did since ``before`` (:func:`rollbacks_used`), by mechanism."""
    return {k: {m: c - before.get(k, {}).get(m, 0) for m, c in v.items()}
            for k, v in rollbacks_used(engine, drafter).items()}


def run_to_end(gen: Generator[Event, None, ArmResult], on_event: Callable[[Event], None] | None = None) -> ArmResult:
    """Drain an arm generator and return its result."""
    while True:
        try:
            ev = next(gen)
        except StopIteration as stop:
            return stop.value
        if on_event is not None:
            on_event(ev)
