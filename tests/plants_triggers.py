"""Faults planted where the probe's triggers live, so that its table must read ``state`` for them.

* :class:`StaleAfterZeroDraft` (in-process, a wrapper around the memory restore): after a round whose drafts
  were all accepted, the next zero-draft round reads a stale state: the context's memory is rolled back by its
  own restore (the checkpoint, snapshot, replay or ``seq_rm`` of its rollback mode) to the state before that
  verify pass, as vLLM #52942 read the recurrent state from before the accepted drafts.  llama.cpp sees a
  consistent sequence that lacks the accepted tokens; the serial-verify control carries the same plant.
* :class:`PlantedBackend` opens every context of its base backend with such a plant.
* :class:`LeakyProxy` (llama-server, an HTTP-level proxy: a real server cannot be made to leak from outside):
  while a neighbour request is in flight, the prompt of my request carries the neighbour's first prompt token,
  as a cross-sequence leak would put a neighbour's token into my context (llama.cpp #28019).  Installed with
  ``monkeypatch.setattr(neighbours, "endpoint", LeakyProxy)``; ``leaks`` counts what it changed.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from fakes import FaultyBackend, WrappedEngine, _FaultyLoaded

from specview.core.engine import Engine, EngineSettings


class StaleAfterZeroDraft(WrappedEngine):
    """One llama.cpp context whose zero-draft round after accepted drafts reads a stale state (module docstring).

    The restore is the context's own ``truncate`` back to where the accepted verify pass began (its memory's
    checkpoint restore, snapshot, replay or ``seq_rm``, whatever its rollback mode does there); llama.cpp needs
    a sequence's positions to stay consecutive, so, like ``plants_rollback.RollbackFaultEngine``, every later
    token goes that many positions lower in the context while the loop sees ``n_past`` as it expects.
    ``truncate(0)`` re-arms it; ``fired`` counts the stale reads.
    """

    MARGIN = 0

    def __init__(self, inner: Engine):
        super().__init__(inner)
        self.shift = 0  # inner position = outer position + shift
        self.fired = 0
        self._saved: int | None = None  # where the last verify pass with drafts began (outer position)

    @property
    def n_batch(self) -> int:
        return self.inner.n_batch

    def __getattr__(self, name: str) -> Any:  # rollback, rollback_depth, memory ...: the context's own
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def rollbacks(self) -> dict[str, int]:
        return self.inner.rollbacks()

    def snapshots_by_checkpoint(self) -> bool:
        return self.inner.snapshots_by_checkpoint()

    def prepare_rollback(self, n_drop: int) -> str:
        if n_drop > 0:
            self._saved = self.n_past
        elif self._saved is not None and self.n_past > self._saved:
            # every draft was accepted (nothing rolled back since): the state from before them is read
            self.inner.truncate(self._saved + self.shift)
            self.shift -= self.n_past - self._saved
            self._saved = None
            self.fired += 1
        return self.inner.prepare_rollback(n_drop)

    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        e0 = self.inner.eval_seconds
        out = self.inner.eval(tokens, rows)
        self.eval_seconds += self.inner.eval_seconds - e0
        self.n_past += len(tokens)
        self.n_evals += 1
        return out

    def truncate(self, n: int) -> Any:
        if n == 0:
            self.shift, self._saved, self.n_past = 0, None, 0
            return self.inner.truncate(0)
        if n < self.n_past:
            self._saved = None  # a rollback: not the accepted-drafts case
        how = self.inner.truncate(n + self.shift) if n + self.shift < self.inner.n_past else None
        self.n_past = n
        return how


class _PlantedLoaded(_FaultyLoaded):
    def new_engine(self, settings: EngineSettings, n_ctx: int) -> Engine:
        eng = StaleAfterZeroDraft(self.inner.new_engine(settings, n_ctx))
        self.owner.engines.append(eng)
        return eng


class PlantedBackend(FaultyBackend):
    """``base`` (the llama.cpp backend) with :class:`StaleAfterZeroDraft` planted on every context it opens;
    ``engines`` holds the plants (each with its ``fired`` count)."""

    def load(self, name: str, settings: EngineSettings) -> Any:
        return _PlantedLoaded(self.base.load(name, settings), self)


class LeakyProxy:
    """A llama-server as the probe's requests see it, leaking a neighbour's token into my prompt (docstring)."""

    def __init__(self, server: Any):
        self.server = server
        self.name = getattr(server, "name", "llama-server")
        self.leaks = 0
        self._lock = threading.Lock()
        self._neighbours: list[list[int]] = []
        LeakyProxy.made.append(self)

    made: list["LeakyProxy"] = []

    def post(self, path: str, body: dict[str, Any], **kw: Any) -> Any:
        with self._lock:
            theirs = list(self._neighbours)
        if theirs and path == "/completion":
            body = dict(body, prompt=[theirs[0][0], *body["prompt"]])
            self.leaks += 1
        return self.server.post(path, body, **kw)

    def stream(self, path: str, body: dict[str, Any], **kw: Any) -> Any:
        prompt = list(body.get("prompt") or [0])
        with self._lock:
            self._neighbours.append(prompt)
        try:
            yield from self.server.stream(path, body, **kw)
        finally:
            with self._lock:
                self._neighbours.remove(prompt)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)
