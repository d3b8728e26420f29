"""The OpenAI-compatible endpoints local inference servers share: greedy requests, tokens and log-probabilities.

Covered endpoints, and what each server reports there (``null`` in a trace
where a server reports nothing):

============================  =========================================  =========================================
endpoint                      llama-server (llama.cpp)                   mlx_lm.server
============================  =========================================  =========================================
``GET /v1/models``            the loaded model                           the served model (and cached ones)
``POST /v1/completions``      prompt as text or token ids; per token:    prompt as text; per token: ``id`` and
                              ``id``, ``token``, ``bytes``, ``logprob``  ``logprob`` (``logprobs: true``), or a
                              and ``top_logprobs`` (ids, sorted)         top list (``top_logprobs`` <= 11) whose
                                                                         order is not sorted and which replaces
                                                                         the sampled token's own entry
``POST /v1/chat/completions`` the same per-token fields, chat template   the same as completions, chat template
                              applied by the server                      applied by the server
``usage``                     prompt, completion, cached prompt tokens   prompt, completion, cached prompt tokens
``timings`` (non-standard)    prompt/predicted ms, ``draft_n``,          not reported
                              ``draft_n_accepted``
============================  =========================================  =========================================

Neither server says which tokens came from a draft.  Greedy means
``temperature`` 0 and, where the server reads it, ``top_k`` 1; penalties stay
at their neutral values.  :func:`parse_logprobs` reads both shapes of the
``logprobs`` object (the chat-style ``content`` list and the legacy
``tokens``/``token_logprobs``/``top_logprobs`` lists) and always returns a
top list sorted best first, so a server's own ordering never matters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from .process import CancelFn, LocalServer

__all__ = ["TokenLogprob", "completion_body", "chat_body", "parse_logprobs", "stop_reason", "choice_of",
           "complete", "stream_complete", "model_ids", "STOP_REASONS"]

#: OpenAI finish reasons in specview's stop-reason words
STOP_REASONS = {"length": "max_tokens", "stop": "eos", None: "none"}


@dataclass
class TokenLogprob:
    """One generated token as an OpenAI-compatible server reports it; None where it does not."""

    id: int | None
    text: str | None
    logprob: float | None
    top_ids: list[int | None] = field(default_factory=list)  # best first
    top_texts: list[str | None] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)

    @property
    def margin(self) -> float | None:
        """Top-1 minus top-2 log-probability (a logit difference); None without two alternatives."""
        return self.top_logprobs[0] - self.top_logprobs[1] if len(self.top_logprobs) >= 2 else None


def _greedy(max_tokens: int, top_logprobs: int, stream: bool) -> dict[str, Any]:
    return {
        "max_tokens": int(max_tokens),
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 1,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "seed": 1234,
        "logprobs": True,
        "top_logprobs": int(top_logprobs),
        "stream": bool(stream),
    }


def completion_body(prompt: str | Sequence[int], max_tokens: int, *, model: str | None = None,
                    top_logprobs: int = 0, stream: bool = False, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A greedy ``/v1/completions`` request (a token-id prompt where the server accepts one)."""
    body = {"prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
            **_greedy(max_tokens, top_logprobs, stream)}
    if top_logprobs:
        body["logprobs"] = int(top_logprobs)  # the legacy completions API takes the count here
    if model:
        body["model"] = model
    body.update(extra or {})
    return body


def chat_body(messages: Sequence[dict[str, str]], max_tokens: int, *, model: str | None = None,
              top_logprobs: int = 0, stream: bool = False, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A greedy ``/v1/chat/completions`` request."""
    body = {"messages": [dict(m) for m in messages], **_greedy(max_tokens, top_logprobs, stream)}
    if model:
        body["model"] = model
    body.update(extra or {})
    return body


def choice_of(resp: Any) -> dict[str, Any]:
    choices = resp.get("choices") if isinstance(resp, dict) else None
    if not choices or not isinstance(choices[0], dict):
        return {}
    return choices[0]


def stop_reason(choice: dict[str, Any]) -> str:
    fr = choice.get("finish_reason")
    return STOP_REASONS.get(fr, str(fr))


def _num(x: Any) -> float | None:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else -math.inf


def _int(x: Any) -> int | None:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) else None


def _sorted_top(entries: list[tuple[int | None, str | None, float]]) -> tuple[list, list, list[float]]:
    entries = sorted(entries, key=lambda e: (-e[2], e[0] if e[0] is not None else 0))
    return [e[0] for e in entries], [e[1] for e in entries], [e[2] for e in entries]


def parse_logprobs(choice: dict[str, Any]) -> list[TokenLogprob]:
    """The per-token entries of a choice's ``logprobs`` (empty when the server sent none)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return []
    out: list[TokenLogprob] = []
    if isinstance(lp.get("content"), list):  # chat style, also llama-server's and mlx_lm's completions
        for e in lp["content"]:
            if not isinstance(e, dict):
                out.append(TokenLogprob(None, None, None))
                continue
            top = [(_int(t.get("id")), t.get("token"), _num(t.get("logprob")))
                   for t in (e.get("top_logprobs") or []) if isinstance(t, dict)]
            ids, texts, vals = _sorted_top([t for t in top if t[2] is not None])  # type: ignore[misc]
            out.append(TokenLogprob(_int(e.get("id")), e.get("token"), _num(e.get("logprob")), ids, texts, vals))
        return out
    tokens = lp.get("tokens") or []  # the legacy completions shape
    values = lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    for i, tok in enumerate(tokens):
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        ids, texts, vals = _sorted_top([(None, str(k), float(v)) for k, v in top.items() if _num(v) is not None])
        out.append(TokenLogprob(_int(tok), tok if isinstance(tok, str) else None,
                                _num(values[i]) if i < len(values) else None, ids, texts, vals))
    return out


def complete(server: LocalServer, path: str, body: dict[str, Any], *,
             cancel: CancelFn | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """POST a non-streamed request; (the first choice, the whole answer)."""
    resp = server.post(path, dict(body, stream=False), cancel=cancel)
    return choice_of(resp), resp


def stream_complete(server: LocalServer, path: str, body: dict[str, Any], *,
                    cancel: CancelFn | None = None) -> Iterator[dict[str, Any]]:
    """POST a streamed request and yield each chunk's first choice (with the chunk's own extra keys)."""
    for ev in server.stream(path, dict(body, stream=True), cancel=cancel):
        ch = choice_of(ev)
        extra = {k: v for k, v in ev.items() if k not in ("choices",)} if isinstance(ev, dict) else {}
        yield {**ch, "_chunk": extra}


def model_ids(server: LocalServer, *, cancel: CancelFn | None = None) -> list[str]:
    """The model ids ``GET /v1/models`` lists."""
    resp = server.get("/v1/models", cancel=cancel)
    data = resp.get("data") if isinstance(resp, dict) else None
    return [str(m.get("id")) for m in data or [] if isinstance(m, dict) and m.get("id") is not None]
