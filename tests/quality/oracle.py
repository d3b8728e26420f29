"""An engine that knows the answers: a character-level fake whose greedy reply to a suite item's prompt is the
item's expected answer, for testing a quality run's bookkeeping against facts known in advance.

* ``oracle`` answers every registered prompt correctly, then stops (EOS);
* ``oracle-draft`` drafts the same replies but gets the token at reply position
  ``WRONG_AT`` wrong, so every speculative run rejects a draft (and rolls back)
  early in the reply: what a planted rollback fault
  (:class:`fakes.FaultyEngine`) needs to fire;
* ``oracle-tie:K`` answers correctly but, at reply position K, the right token
  and a wrong one are ``TIE`` logits apart, and rows of a pass wider than one
  token see the wrong one ahead by ``TIE``: batched-versus-single numerics that
  flip a near-tie, and with it the answer.

A context that strays from the reply (a fault shifted it, or a near-tie sent
it elsewhere) gets ``#`` tokens and then EOS, so its answer fails.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fakes import FakeEngine
from specview.core.engine import EngineSettings, VocabInfo
from specview.core.inprocess import InProcessBackend
from specview.core.registry import LoadedModel

N = 128
BOS, EOS = 1, 2
WRONG_AT = 1
TIE = 0.01
GARBAGE = ord("#")
VOCAB = VocabInfo(n_vocab=N, vocab_type="spm", bos=BOS, eos=EOS, add_bos=True, add_eos=False, eog=frozenset({EOS}),
                  texts=tuple(chr(i) if 32 <= i < 127 or i == 10 else f"<{i}>" for i in range(N)))


def encode(text: str) -> list[int]:
    """One token a character; anything outside printable ASCII (and newline) is ``?``."""
    return [ord(c) if (32 <= ord(c) < 127 or c == "\n") else ord("?") for c in text]


class Oracle:
    """logits(prefix) put the next token of the registered reply to the prompt ``prefix`` starts with on top."""

    def __init__(self, replies: dict[str, str], *, wrong_at: int | None = None, tie_at: int | None = None):
        self.replies = {tuple([BOS, *encode(p)]): [*encode(a), EOS] for p, a in replies.items()}
        self.wrong_at, self.tie_at = wrong_at, tie_at

    def logits(self, prefix: Sequence[int], T: int = 1) -> np.ndarray:
        prefix = list(prefix)
        row = (np.sin(np.arange(N, dtype=np.float32) * 0.37) * 0.5 - 3.0).astype(np.float32)
        match = max((p for p in self.replies if tuple(prefix[:len(p)]) == p), key=len, default=None)
        if match is None:
            row[EOS] = 5.0
            return row
        reply, got = self.replies[match], prefix[len(match):]
        k = len(got)
        if got == reply[:k] and k < len(reply):
            nxt = reply[k]
            if self.wrong_at == k:
                nxt = GARBAGE if reply[k] != GARBAGE else ord("!")
        else:
            nxt = EOS if k >= len(reply) + 3 else GARBAGE
        row[nxt] = 5.0
        if self.tie_at is not None and k == self.tie_at and got == reply[:k] and k < len(reply):
            other = ord("!") if nxt != ord("!") else ord("~")
            row[other] = 5.0 - TIE + (2 * TIE if T > 1 else 0.0)
        return row


class OracleLoaded(LoadedModel):
    def __init__(self, name: str, replies: dict[str, str]):
        self.path = name
        kind, _, arg = name.partition(":")
        self.model = Oracle(replies, wrong_at=WRONG_AT if kind == "oracle-draft" else None,
                            tie_at=int(arg) if kind == "oracle-tie" else None)

    def facts(self) -> dict[str, Any]:
        return {"path": self.path, "file": self.path, "quantization": "toy", "architecture": "oracle"}

    @property
    def vocab(self) -> VocabInfo:
        return VOCAB

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return [BOS, *encode(text)]

    def new_engine(self, settings: EngineSettings, n_ctx: int) -> "OracleEngine":
        return OracleEngine(self.model, n_ctx=n_ctx, n_batch=settings.n_batch, vocab=VOCAB)


class OracleEngine(FakeEngine):
    backend = "oracle"

    def model_facts(self) -> dict[str, Any]:
        return {"path": "oracle", "file": "oracle", "quantization": "toy", "architecture": "oracle", "n_vocab": N}

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return [BOS, *encode(text)]

    def piece(self, token: int) -> str:
        return VOCAB.texts[token] if 0 <= token < N and (32 <= token < 127 or token == 10) else ""


class OracleBackend(InProcessBackend):
    """Models ``oracle``, ``oracle-draft`` and ``oracle-tie:K``, answering the prompts in ``replies``."""

    name = "oracle"

    def __init__(self) -> None:
        self.replies: dict[str, str] = {}

    def load(self, name: str, settings: EngineSettings) -> OracleLoaded:
        return OracleLoaded(name, self.replies)


# -- registering it, as a plug-in would --------------------------------------------------------------
def reply_for(item: Any) -> str:
    """The reply that passes ``item`` (a built-in item: its answer; a pattern's: the JSON it asks for)."""
    if item.match == "regex":
        return '{"name": "%s"}' % item.prompt.split('"')[-2]
    return item.answer


def register(suite: Any, *, name: str = "oracle", fault: str | None = None, reply: Any = None) -> Any:
    """Register an oracle backend named ``name`` answering ``suite``'s prompts with ``reply(item)`` (default
    :func:`reply_for`), with ``fault`` planted in the target's rollbacks (a :class:`fakes.FaultyBackend` over
    it); returns the backend."""
    from fakes import FaultyBackend
    from specview.core.quality.score import prompt_for
    from specview.core.registry import register_backend

    base = OracleBackend()
    base.replies.update({prompt_for(it, True): (reply or reply_for)(it) for it in suite.items})
    be: Any = base
    if fault is not None:
        be = FaultyBackend(base, name=name)
        be.faults = {"oracle": fault}
    register_backend(name, lambda: be)
    return be


def config(backend: str, *, target: str = "oracle", max_tokens: int = 48, **kw: Any) -> Any:
    from specview.core.config import RunConfig

    return RunConfig(backend=backend, target=target, draft="oracle-draft", prompt="-", max_tokens=max_tokens, **kw)
