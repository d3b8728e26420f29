"""What specview asks ``mlx_lm.server`` and how it reads the answers.

Requests go through the OpenAI-compatible bodies of
:mod:`specview.backends.local_server.openai`, with what mlx_lm.server reads
differently:

* ``logprobs`` is a boolean on both endpoints (the legacy completions API's
  count goes in ``top_logprobs``), and ``top_logprobs`` is capped by the server
  (mlx-lm 0.32: 11).  :func:`probe_top_logprobs_cap` asks the server itself: a
  request for more is refused with the cap in its error, before any work;
* ``seed`` is set (greedy ignores it), which also keeps a draft-less server on
  its single-request path (``stream_generate``), the path a server with a draft
  model always takes, instead of its batch generator;
* ``num_draft_tokens`` is sent per request to the speculative server (n_max),
  so changing n_max needs no new server;
* ``ignore_eos`` is sent as llama.cpp defines it: a ``logit_bias`` of -inf on
  every end-of-generation token (mlx_lm.server adds it to every row it samples
  from, before its log-probabilities), so none is ever emitted.

The answers: with ``top_logprobs`` > 0 each ``logprobs.content`` entry is the
server's unsorted top list, and the entry's own ``id``/``logprob`` are those
of the list's first member, not of the emitted token.  Under greedy decoding
the emitted token is the argmax of its row, so specview takes the best entry
of the sorted list (ties to the lower id, as ``mx.argmax``), and checks the
count against ``usage.completion_tokens``.  The in-process diagnosis replays
mlx-lm's own loops and must give back these tokens.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Collection

from ...core.trace import ArmResult, Step
from ..local_server import openai
from ..local_server.process import LocalServer, ServerError

__all__ = ["NOT_REPORTED", "MARGIN_MEANING", "TOP_LOGITS_MEANING", "arm_request", "arm_from_answer",
           "probe_top_logprobs_cap"]

#: what mlx_lm.server does not report, and therefore stays null (or empty) in a trace, with the reason
NOT_REPORTED: dict[str, str] = {
    "steps[].round, steps[].from_draft, steps[].batch_size, steps[].batch_index, speculative.rounds":
        "mlx_lm.server says nothing about rounds or drafts: its answers carry tokens and log-probabilities only "
        "(mlx-lm's loop knows from_draft but the server drops it)",
    "speculative.reported_drafted, speculative.reported_accepted":
        "no draft totals either (llama-server has timings.draft_n; mlx_lm.server has no timings)",
    "prompt_ms":
        "no timings: 0 in the trace; gen_ms is the request's wall time measured by specview, prefill included",
    "eval_ms":
        "no time inside forward passes",
    "steps[].top_ids beyond the cap":
        "top_logprobs is capped by the server (see top_logprobs_cap); the trace records at most that many",
}
MARGIN_MEANING = ("log-probability difference top-1 minus top-2 of the target's row (equal to the logit "
                  "difference: log-softmax shifts a row by one constant)")
TOP_LOGITS_MEANING = "log-probabilities (logits minus the row's log-sum-exp), from mlx_lm.server's top_logprobs"
#: asked for in the cap probe: more than any server caps at, fewer than any vocabulary
_PROBE = 1000
_CAP = re.compile(r"top_logprobs must be at most (\d+)")


def ban_bias(ban: Collection[int]) -> dict[str, float]:
    """``logit_bias`` banning ``ban``, as llama.cpp's ``--ignore-eos`` does (-inf; JSON's ``-Infinity``)."""
    return {str(int(t)): float("-inf") for t in sorted(ban)}


def arm_request(prompt: str, *, chat: bool, max_tokens: int, top_logprobs: int,
                num_draft_tokens: int | None = None, ban: Collection[int] = ()) -> tuple[str, dict[str, Any]]:
    """The endpoint and body of one arm's greedy request (``ban``: the ids ``ignore_eos`` bans)."""
    extra: dict[str, Any] = {"logprobs": True}
    if num_draft_tokens is not None:
        extra["num_draft_tokens"] = int(num_draft_tokens)
    if ban:
        extra["logit_bias"] = ban_bias(ban)
    if chat:
        return "/v1/chat/completions", openai.chat_body([{"role": "user", "content": prompt}], max_tokens,
                                                        top_logprobs=top_logprobs, extra=extra)
    return "/v1/completions", openai.completion_body(prompt, max_tokens, top_logprobs=top_logprobs, extra=extra)


def probe_top_logprobs_cap(server: LocalServer) -> tuple[int | None, str]:
    """(the most top_logprobs the server gives, None if it took :data:`_PROBE`; its own words)."""
    body = openai.completion_body("a", 1, top_logprobs=_PROBE, extra={"logprobs": True})
    try:
        server.post("/v1/completions", body, timeout=60.0)
    except ServerError as exc:
        m = _CAP.search(str(exc))
        if m:
            return int(m.group(1)), m.group(0)
        raise
    return None, f"top_logprobs={_PROBE} accepted"


def arm_from_answer(name: str, choice: dict[str, Any], resp: dict[str, Any], *, prompt_len: int,
                    piece: Callable[[int], str], top_k: int) -> ArmResult:
    """An :class:`ArmResult` from one answer; what the server does not report stays None."""
    entries = openai.parse_logprobs(choice)
    usage = resp.get("usage") or {}
    n = usage.get("completion_tokens")
    if n is not None and n != len(entries):
        raise ServerError(f"mlx_lm.server ({name}) reported {n} completion tokens but {len(entries)} logprobs "
                          "entries; specview cannot tell which token each entry belongs to")
    arm = ArmResult(name=name)
    for i, e in enumerate(entries):
        if e.top_ids:
            tok = e.top_ids[0]  # greedy: the emitted token is its row's argmax (see the module docstring)
        elif e.id is not None:
            tok = e.id
        else:
            raise ServerError(f"mlx_lm.server ({name}) sent a logprobs entry without a token at position {i}")
        ids = [int(t) for t in e.top_ids[:top_k] if t is not None]
        vals = [float(v) for v in e.top_logprobs[:top_k]]
        arm.steps.append(Step(index=i, token=int(tok), piece=piece(int(tok)), pos=prompt_len + i, top_ids=ids,
                              top_logits=vals, margin=(vals[0] - vals[1]) if len(vals) >= 2 else None,
                              round=None, from_draft=None, batch_size=None, batch_index=None))
    arm.tokens = [s.token for s in arm.steps]
    arm.text = "".join(s.piece for s in arm.steps)
    arm.stop_reason = openai.stop_reason(choice)
    arm.prompt_ms = 0.0
    arm.eval_ms = None
    return arm
