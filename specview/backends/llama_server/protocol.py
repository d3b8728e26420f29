"""llama-server's native ``/completion`` endpoint: greedy requests on token ids, and arms rebuilt from the answers.

Three request forms, each a fixed shape of forward passes on a one-slot server:

* **one request** (``cache_prompt: false``): the prompt is evaluated from an
  empty cache in ``-b``-token chunks, then the server generates.  Streamed
  with ``timings_per_token``, every chunk carries one token and the slot's
  cumulative ``draft_n`` / ``draft_n_accepted`` and generation time, from which
  :func:`rebuild_rounds` recovers each verify round.
* **token by token** (:func:`vanilla_by_requests`): the first request
  evaluates the prompt from an empty cache and returns one token; each next
  request sends the prompt plus the tokens so far with ``cache_prompt: true``
  and ``n_predict: 1``, so the server evaluates exactly the one new token (a
  T = 1 pass, as plain decoding) and samples the next.  A request that may
  predict only one token never drafts (llama-server drafts at most
  ``n_predict - 1`` tokens), so this is plain decoding on any server, with or
  without a drafter loaded.
* **cached replays** (the diagnosis): requests that leave a chosen prefix in the
  cache and make the server evaluate exactly T new tokens in one pass.

What the server does not report stays None, never made up (see
``docs/llama-server.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

from ...core.errors import Cancelled
from ...core.trace import ArmResult, Round, Step
from ..local_server.process import CancelFn, LocalServer, ServerError

#: seed sent with every request (greedy decoding does not use it; it is fixed anyway)
SEED = 1234
STOP_TYPES = {"limit": "max_tokens", "eos": "eos", "word": "stop", "none": "none"}
#: request keys a build that takes per-request speculation settings reads
SPEC_REQUEST_KEYS = ("speculative.n_max", "speculative.n_min", "speculative.p_min")

EventFn = Callable[[Any], None]


def completion_body(prompt: Sequence[int], n_predict: int, *, n_probs: int, ignore_eos: bool = False,
                    cache_prompt: bool = False, stream: bool = False,
                    speculative: dict[str, Any] | None = None) -> dict[str, Any]:
    """A greedy ``/completion`` request on a token-id prompt, with every penalty and random sampler off.

    ``speculative`` adds per-request speculation settings (``speculative.n_max`` ...)
    for builds that read them.  Streamed requests ask for ``timings_per_token``.
    """
    body = {
        "prompt": [int(t) for t in prompt],
        "n_predict": int(n_predict),
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "min_p": 0.0,
        "typical_p": 1.0,
        "xtc_probability": 0.0,
        "dry_multiplier": 0.0,
        "repeat_penalty": 1.0,
        "repeat_last_n": 0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "mirostat": 0,
        "seed": SEED,
        "n_probs": int(n_probs),
        "post_sampling_probs": False,
        "return_tokens": True,
        "cache_prompt": bool(cache_prompt),
        "ignore_eos": bool(ignore_eos),
        "stream": bool(stream),
        "n_keep": 0,
    }
    if stream:
        body["timings_per_token"] = True
    if speculative:
        body.update({f"speculative.{k}" if not k.startswith("speculative.") else k: v
                     for k, v in speculative.items()})
    return body


def reads_request_speculation(resp: dict[str, Any]) -> bool:
    """Whether this build takes ``speculative.n_max`` & co. per request: its answer echoes them back.

    A build that ignores them (the llama.cpp in llama-cpp-python 0.3.36 has them
    switched off) does not list them in ``generation_settings``.
    """
    gs = resp.get("generation_settings") or {}
    return all(k in gs for k in SPEC_REQUEST_KEYS)


# -- one answer ---------------------------------------------------------------------------------
def top_from_entry(entry: dict[str, Any] | None) -> tuple[list[int], list[float]]:
    """(ids, log-probabilities) of one ``completion_probabilities`` entry, best first (empty without one)."""
    if not isinstance(entry, dict):
        return [], []
    top = entry.get("top_logprobs")
    conv = top is None
    if conv:
        top = entry.get("top_probs")
    ids, vals = [], []
    for t in top or []:
        if not isinstance(t, dict) or "id" not in t:
            continue
        v = t.get("prob") if conv else t.get("logprob")
        if v is None:
            continue
        v = float(v)
        if conv:
            v = math.log(v) if v > 0 else -math.inf
        ids.append(int(t["id"]))
        vals.append(v)
    return ids, vals


def make_step(i: int, tok: int, entry: dict[str, Any] | None, *, prompt_len: int,
              piece: Callable[[int], str]) -> Step:
    """A step with what the server reported (its round fields are filled by the caller, or stay None)."""
    ids, vals = top_from_entry(entry)
    margin = (vals[0] - vals[1]) if len(vals) >= 2 else None
    return Step(index=i, token=tok, piece=piece(tok), pos=prompt_len + i, top_ids=ids, top_logits=vals,
                margin=margin, round=None, from_draft=None, batch_size=None, batch_index=None)


def without_banned(arm: ArmResult, ban: Collection[int]) -> ArmResult:
    """``arm`` with the tokens ``ignore_eos`` bans taken out of every step's top-k, in place.

    llama-server reports ``n_probs`` from the row before its sampler applies the
    ``-inf`` logit bias, so a banned end-of-generation token can head a step's
    list though it was never a candidate; the in-process arms record the row the
    sampler picks from, and so does the trace (the margin is then the chosen
    token's over the next candidate).
    """
    ban = frozenset(int(t) for t in ban)
    if not ban:
        return arm
    for st in arm.steps:
        keep = [(i, v) for i, v in zip(st.top_ids, st.top_logits) if int(i) not in ban]
        if len(keep) == len(st.top_ids):
            continue
        st.top_ids, st.top_logits = [i for i, _ in keep], [v for _, v in keep]
        st.margin = (st.top_logits[0] - st.top_logits[1]) if len(keep) >= 2 else None
    return arm


def arm_from_response(name: str, resp: dict[str, Any], *, prompt_len: int, piece: Callable[[int], str]) -> ArmResult:
    """An :class:`ArmResult` from one non-streamed ``/completion`` answer; what it did not report stays None."""
    tokens = resp.get("tokens")
    probs = resp.get("completion_probabilities") or []
    if not isinstance(tokens, list) or not tokens and probs:
        tokens = [int(p["id"]) for p in probs if isinstance(p, dict) and "id" in p]
    tokens = [int(t) for t in tokens]
    # llama-server leaves a token out of completion_probabilities while its text is an incomplete UTF-8
    # sequence (a byte token of a multi-byte character), so the entries are a subsequence of the tokens:
    # walk both, and a token without its entry gets no top-k rather than its neighbour's
    entries: list[dict[str, Any] | None] = []
    p = 0
    for tok in tokens:
        entry = None
        if p < len(probs) and isinstance(probs[p], dict) and int(probs[p].get("id", -1)) == tok:
            entry = probs[p]
            p += 1
        entries.append(entry)
    return _arm_of(name, tokens, entries, resp, stop_reason(resp), prompt_len=prompt_len, piece=piece)


def _arm_of(name: str, tokens: list[int], entries: Sequence[dict[str, Any] | None], answer: dict[str, Any],
            stop: str, *, prompt_len: int, piece: Callable[[int], str]) -> ArmResult:
    """An arm of ``tokens``, each with its top-k entry (None: the server sent none for it), timed as ``answer``
    (a whole answer, or a stream's last event) says; llama-server reports no time inside forward passes."""
    steps = [make_step(i, tok, entry, prompt_len=prompt_len, piece=piece)
             for i, (tok, entry) in enumerate(zip(tokens, entries))]
    t = answer.get("timings") or {}
    return ArmResult(name=name, tokens=tokens, text="".join(s.piece for s in steps), steps=steps,
                     prompt_ms=float(t.get("prompt_ms") or 0.0), gen_ms=float(t.get("predicted_ms") or 0.0),
                     eval_ms=None, stop_reason=stop)


def stop_reason(resp: dict[str, Any]) -> str:
    if resp.get("truncated"):
        return "context"
    return STOP_TYPES.get(str(resp.get("stop_type", "")), str(resp.get("stop_type", "")))


# -- streamed answers and their rounds ------------------------------------------------------------
@dataclass
class Chunk:
    """One streamed token: its 1-based count, id, top-k entry and the slot's cumulative counters then."""

    n: int
    token: int
    entry: dict[str, Any] | None
    predicted_ms: float | None
    draft_n: int
    draft_n_accepted: int


@dataclass
class StreamResult:
    chunks: list[Chunk] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    timings_per_token: bool = False
    cancelled: bool = False  # the caller cancelled: ``chunks`` holds what arrived before


def parse_chunk(ev: dict[str, Any]) -> Chunk | None:
    toks = ev.get("tokens") or []
    if ev.get("stop") or not toks:
        return None
    t = ev.get("timings")
    probs = ev.get("completion_probabilities") or []
    entry = probs[0] if probs and isinstance(probs[0], dict) and int(probs[0].get("id", -1)) == int(toks[0]) else None
    return Chunk(n=int(ev.get("tokens_predicted") or 0), token=int(toks[0]), entry=entry,
                 predicted_ms=None if not isinstance(t, dict) else float(t.get("predicted_ms") or 0.0),
                 draft_n=int((t or {}).get("draft_n") or 0), draft_n_accepted=int((t or {}).get("draft_n_accepted") or 0))


def stream_completion(server: LocalServer, body: dict[str, Any], *, cancel: CancelFn | None = None,
                      on_chunk: Callable[[Chunk], None] | None = None, stop_on_cancel: bool = True) -> StreamResult:
    """Send a streamed ``/completion`` and collect its chunks and final answer.

    A cancel returns what arrived so far (``cancelled`` set); with
    ``stop_on_cancel=False`` the server is left running (the connection is
    closed, which makes llama-server drop the task).
    """
    out = StreamResult()
    try:
        for ev in server.stream("/completion", dict(body, stream=True), cancel=cancel, stop_on_cancel=stop_on_cancel):
            if not isinstance(ev, dict):
                continue
            if ev.get("stop"):
                out.final = ev
                continue
            ch = parse_chunk(ev)
            if ch is None:
                continue
            if ch.predicted_ms is not None:
                out.timings_per_token = True
            out.chunks.append(ch)
            if on_chunk is not None:
                on_chunk(ch)
    except Cancelled:
        out.cancelled = True
    return out


def wait_idle(server: LocalServer, timeout: float = 5.0) -> bool:
    """Wait until no slot of ``server`` is processing (after a dropped stream); False if it stays busy."""
    import time as _t

    deadline = _t.monotonic() + timeout
    while _t.monotonic() < deadline:
        try:
            slots = server.get("/slots", timeout=2.0)
        except ServerError:
            return False
        if isinstance(slots, list) and not any(isinstance(x, dict) and x.get("is_processing") for x in slots):
            return True
        _t.sleep(0.05)
    return False


@dataclass
class RoundsResult:
    """Per-round data rebuilt from a stream, or None fields and the reason it could not be."""

    rounds: list[Round] | None
    step_rounds: list[tuple[int, bool, int, int]] | None  # per token: (round, from_draft, batch_size, batch_index)
    reason: str | None = None
    step_ms: list[float | None] = field(default_factory=list)  # per round: wall time of its step (draft + verify)


def rebuild_rounds(chunks: Sequence[Chunk], n_tokens: int, *, prefill_chunk: int | None) -> RoundsResult:
    """Each verify round's drafted/accepted counts and each token's round, from streamed cumulative counters.

    llama-server sends one chunk per emitted token; with ``timings_per_token``
    each carries the slot's cumulative ``draft_n`` (tokens drafted so far,
    counted before the verify pass), ``draft_n_accepted`` and ``predicted_ms``
    (generation time up to the step that emitted it).  All tokens of one step
    share those three numbers, and consecutive steps differ in ``predicted_ms``.
    So a run of equal counters is one step: drafted = the rise of ``draft_n``,
    accepted = the rise of ``draft_n_accepted``, and it emitted accepted + 1
    tokens (fewer only when the run stopped inside it); a step with nothing
    drafted is a plain one-token pass.  Token 0 is the prompt's own (round 0).
    On a target whose memory cannot drop positions (a hybrid) the server
    restores a checkpoint after a partial acceptance and verifies the accepted
    tokens and its own again (``spec_is_replay``): that step emits accepted + 2
    tokens, from the replay pass of that width, and is recorded as such
    (``rollback`` "checkpoint", ``replay`` its width).

    ``prefill_chunk`` is the size of the last prompt chunk (``-b``-sized chunks),
    round 0's ``batch_size``.  A token whose text was an incomplete UTF-8
    character is not streamed; the rounds still add up when its step is known
    from its neighbours, else the result is None with the reason.
    """
    if n_tokens == 0:
        return RoundsResult([], [])
    if not chunks or any(c.predicted_ms is None for c in chunks):
        return RoundsResult(None, None, "the server streamed no per-token timings (timings_per_token), so the "
                                        "steps that emitted each token are unknown")
    ordered = sorted(chunks, key=lambda c: c.n)
    groups: list[list[Chunk]] = []
    first_ms = None
    for c in ordered:
        if c.n == 1:
            first_ms = c.predicted_ms
            continue  # the prompt's token: round 0
        key = (c.predicted_ms, c.draft_n, c.draft_n_accepted)
        if groups and (groups[-1][0].predicted_ms, groups[-1][0].draft_n, groups[-1][0].draft_n_accepted) == key:
            groups[-1].append(c)
        else:
            groups.append([c])
    rounds = [Round(index=0, drafted=0, accepted=0, draft_ms=None, verify_ms=None,
                    batch_size=int(prefill_chunk or 0), first_step=0)]
    step_ms: list[float | None] = [None]
    per_token: list[tuple[int, bool, int, int] | None] = [None] * n_tokens
    per_token[0] = (0, False, int(prefill_chunk or 0), max(0, int(prefill_chunk or 1) - 1))
    prev_d, prev_a, prev_ms = 0, 0, first_ms
    start = 1
    for gi, g in enumerate(groups):
        c0 = g[0]
        drafted, accepted = c0.draft_n - prev_d, c0.draft_n_accepted - prev_a
        if drafted < 0 or accepted < 0 or accepted > drafted:
            return RoundsResult(None, None, f"the streamed draft counters go backwards at token {c0.n - 1}")
        size = accepted + 1
        # a checkpoint replay (a hybrid target): the step emitted one token past accepted + 1
        replayed = drafted > accepted and any(c.n - 1 == start + size for c in g)
        size += replayed
        last = gi == len(groups) - 1
        if last:
            size = min(size, n_tokens - start)
        end = start + size  # exclusive
        if size < 1 or any(not start <= c.n - 1 < end for c in g):
            return RoundsResult(None, None, f"the streamed tokens do not add up to whole verify steps at token "
                                            f"{c0.n - 1} (a token was not streamed: its text was an incomplete "
                                            "UTF-8 character)")
        T = 1 + drafted
        idx = len(rounds)
        ms = None if prev_ms is None else round(c0.predicted_ms - prev_ms, 3)
        rounds.append(Round(index=idx, drafted=drafted, accepted=min(accepted, size) if last else accepted,
                            draft_ms=None, verify_ms=None, batch_size=T, first_step=start,
                            rollback="checkpoint" if replayed else "", replay=accepted + 2 if replayed else 0))
        step_ms.append(ms)
        for j in range(size):
            per_token[start + j] = (idx, j < accepted, accepted + 2 if replayed else T, j)
        prev_d, prev_a, prev_ms = c0.draft_n, c0.draft_n_accepted, c0.predicted_ms
        start = end
    if start != n_tokens or any(x is None for x in per_token):
        return RoundsResult(None, None, f"the streamed steps cover {start} of {n_tokens} tokens (a token was not "
                                        "streamed: its text was an incomplete UTF-8 character)")
    return RoundsResult(rounds, per_token, None, step_ms)  # type: ignore[arg-type]


def held_back_ids(server: LocalServer, sr: StreamResult, body: dict[str, Any], *,
                  cancel: CancelFn | None = None) -> list[int] | None:
    """The token ids of a streamed answer that held tokens back, from the same request unstreamed; else None.

    llama-server does not stream a token whose text ends inside a multi-byte
    character, so such an answer's ids come from asking again without
    streaming (greedy, so the same tokens).
    """
    n_total = int(sr.final.get("tokens_predicted") or 0)
    if sorted(c.n for c in sr.chunks) == list(range(1, n_total + 1)):
        return None
    resp = server.post("/completion", dict(body, stream=False, timings_per_token=False), cancel=cancel)
    return [int(t) for t in resp.get("tokens") or []]


def arm_from_stream(name: str, sr: StreamResult, *, prompt_len: int, n_batch: int, piece: Callable[[int], str],
                    tokens: Sequence[int] | None = None) -> tuple[ArmResult, RoundsResult]:
    """An arm from a streamed answer, with its rounds where they can be rebuilt.

    ``tokens`` (from a non-streamed answer to the same request) fills tokens the
    stream left out (incomplete UTF-8 characters are not streamed).
    """
    final = sr.final
    by_n = {c.n: c for c in sr.chunks}
    n_total = int(final.get("tokens_predicted") or max(by_n, default=0))
    if tokens is None:
        if sr.cancelled:  # what arrived before the cancel, up to the first token not streamed
            n_total = next((k - 1 for k in range(1, n_total + 2) if k not in by_n), n_total)
        if sorted(by_n)[:n_total] != list(range(1, n_total + 1)):
            raise ServerError("the streamed answer left tokens out (incomplete UTF-8 characters); "
                              "their ids need a non-streamed answer")
        tokens = [by_n[k].token for k in range(1, n_total + 1)]
    tokens = [int(t) for t in tokens]
    chunks = [by_n.get(i + 1) for i in range(len(tokens))]
    entries = [c.entry if c is not None and c.token == tok else None for c, tok in zip(chunks, tokens)]
    arm = _arm_of(name, tokens, entries, final, "cancelled" if sr.cancelled else stop_reason(final),
                  prompt_len=prompt_len, piece=piece)
    last = ((prompt_len - 1) % n_batch) + 1 if prompt_len else 0
    rr = rebuild_rounds([c for c in sr.chunks if c.n <= len(tokens)], len(tokens), prefill_chunk=last)
    if rr.rounds is not None and rr.step_rounds is not None:
        arm.rounds = rr.rounds
        for st, (r, fd, T, k) in zip(arm.steps, rr.step_rounds):
            st.round, st.from_draft, st.batch_size, st.batch_index = r, fd, T, k
    return arm, rr


# -- plain decoding, one request per token ---------------------------------------------------------
@dataclass
class TokenByToken:
    """What the token-by-token requests evaluated: the shape of each pass, as the server counted it."""

    evaluated: list[int] = field(default_factory=list)  # timings.prompt_n of each request
    cached: list[int] = field(default_factory=list)  # timings.cache_n of each request
    drafted: int = 0  # draft_n over all requests (must stay 0)
    prompt_ms: float = 0.0
    gen_ms: float = 0.0

    def off_shape(self, prompt_len: int) -> list[int]:
        """Requests that did not evaluate what plain decoding evaluates (the prompt, then one token each)."""
        want = [prompt_len] + [1] * (len(self.evaluated) - 1)
        return [j for j, (e, w) in enumerate(zip(self.evaluated, want)) if e != w]


def vanilla_by_requests(server: LocalServer, prompt: Sequence[int], n: int, *, n_probs: int, ignore_eos: bool,
                        n_batch: int, piece: Callable[[int], str], cancel: CancelFn | None = None,
                        on_step: EventFn | None = None, name: str = "vanilla") -> tuple[ArmResult, TokenByToken]:
    """Plain greedy decoding as ``n`` one-token requests (see the module docstring); the arm and its shapes.

    ``cancel`` is checked between requests; a cancelled arm keeps its tokens so
    far and says ``cancelled``.
    """
    cancel = cancel or (lambda: False)
    prompt = [int(t) for t in prompt]
    arm = ArmResult(name=name)
    info = TokenByToken()
    tokens: list[int] = []
    stop = "max_tokens"
    for j in range(n):
        if cancel():  # between requests: each is one short pass, so the arm stops within one token
            stop = "cancelled"
            break
        body = completion_body(prompt + tokens, 1, n_probs=n_probs, ignore_eos=ignore_eos, cache_prompt=j > 0)
        resp = server.post("/completion", body)
        toks = resp.get("tokens") or []
        if not toks:
            raise ServerError(f"{server.name} answered a one-token request with no token (token {j} of the "
                              "vanilla arm)")
        tok = int(toks[0])
        probs = resp.get("completion_probabilities") or []
        entry = probs[0] if probs and isinstance(probs[0], dict) and int(probs[0].get("id", -1)) == tok else None
        t = resp.get("timings") or {}
        info.evaluated.append(int(t.get("prompt_n") or 0))
        info.cached.append(int(t.get("cache_n") or 0))
        info.drafted += int(t.get("draft_n") or 0)
        if j == 0:
            info.prompt_ms = float(t.get("prompt_ms") or 0.0)
        else:
            info.gen_ms += float(t.get("prompt_ms") or 0.0) + float(t.get("predicted_ms") or 0.0)
        st = make_step(j, tok, entry, prompt_len=len(prompt), piece=piece)
        st.round, st.from_draft = 0, False
        last = ((len(prompt) - 1) % n_batch) + 1
        st.batch_size, st.batch_index = (1, 0) if j > 0 else (last, last - 1)
        tokens.append(tok)
        arm.steps.append(st)
        if on_step is not None:
            on_step(st)
        if resp.get("truncated"):
            stop = "context"
            break
        if not ignore_eos and resp.get("stop_type") == "eos":
            stop = "eos"
            break
    arm.tokens = tokens
    arm.text = "".join(s.piece for s in arm.steps)
    arm.prompt_ms, arm.gen_ms, arm.eval_ms = info.prompt_ms, info.gen_ms, None
    arm.stop_reason = stop
    return arm, info
