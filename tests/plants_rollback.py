"""Rollback faults planted in a real run on a hybrid target: the state a rollback leaves is one token off.

:class:`RollbackFaultEngine` wraps any engine (a real llama.cpp context on a
tiny hybrid model, with its own snapshots or checkpoints) and plants one fault
at the first rollback of each run that can carry it:

* ``checkpoint-late``: the checkpoint is restored one token late (the state
  already holds the first token fed after it, which the replay then feeds again);
* ``snapshot-off-by-one``: the snapshot kept one token after the right one is
  picked (the state holds the first rejected draft token);
* ``replay-skipped``: the replay after a checkpoint restore never reaches the
  state (its rows are computed, its tokens are then dropped again);
* ``replay-keeps-rejected``: the replay feeds the first rejected draft token
  again, before the target's own token.

llama.cpp needs a sequence's positions to stay consecutive, so, like
``fakes.FaultyEngine``, the wrapper shifts every later token by the tokens the
fault added or dropped: callers see ``n_past`` as they expect, the model sees a
context one token off (or a replay's worth short).  Every fault lives below the
loop, in the rollback itself, so the serial-verify control (the same loop with
single-token passes) carries it too.  ``truncate(0)`` re-arms it; ``faults``
counts how often it fired.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fakes import WrappedEngine
from specview.core.engine import Engine, Rollback

ROLLBACK_FAULTS = ("checkpoint-late", "snapshot-off-by-one", "replay-skipped", "replay-keeps-rejected")
#: the rollback mode each fault needs
NEEDS = {"checkpoint-late": "checkpoint", "snapshot-off-by-one": "snapshots", "replay-skipped": "checkpoint",
         "replay-keeps-rejected": "checkpoint"}
#: the context positions a fault can add on top of the run's
MARGIN = 2


class RollbackFaultEngine(WrappedEngine):
    MARGIN = MARGIN

    def __init__(self, inner: Engine, fault: str):
        if fault not in ROLLBACK_FAULTS:
            raise ValueError(f"unknown rollback fault {fault!r}; one of {ROLLBACK_FAULTS}")
        super().__init__(inner)
        self.fault = fault
        self.shift = 0  # inner position = outer position + shift
        self.armed = True
        self.faults = 0
        self.seen: list[int] = []  # what the caller fed at each of its positions
        self.restored_at: int | None = None  # the caller's position of the last checkpoint restore

    # -- facts, delegated ----------------------------------------------------------------------------
    @property
    def n_batch(self) -> int:
        return self.inner.n_batch - 1

    @property
    def rollback(self) -> Any:
        return getattr(self.inner, "rollback", None)

    # -- the faults ----------------------------------------------------------------------------------
    def _fire(self, fault: str) -> bool:
        if self.armed and self.fault == fault:
            self.armed = False
            self.faults += 1
            return True
        return False

    def _skip_replay(self) -> None:
        """replay-skipped: the state goes back to the checkpoint, without what the replay fed."""
        c = self.restored_at
        if c is not None and self.n_past > c and self._fire("replay-skipped"):
            self.inner.truncate(c + self.shift)
            self.shift -= self.n_past - c

    def prepare_rollback(self, n_drop: int) -> str:
        self._skip_replay()
        self.restored_at = None
        return self.inner.prepare_rollback(n_drop)

    def _inner_eval(self, tokens: list[int], rows: list[int]) -> np.ndarray:
        e0 = self.inner.eval_seconds
        out = self.inner.eval(tokens, rows)
        self.eval_seconds += self.inner.eval_seconds - e0
        return out

    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        tokens = [int(t) for t in tokens]
        n = len(tokens)
        rows = [r + n if r < 0 else int(r) for r in rows]
        start = self.n_past
        wrong = next((i for i, t in enumerate(tokens) if self.restored_at is not None
                      and start + i < len(self.seen) and self.seen[start + i] != t), None)
        if wrong is not None and self.fault == "replay-keeps-rejected" and self._fire("replay-keeps-rejected"):
            rejected = self.seen[start + wrong]
            if n == 1:  # a serial replay: the rejected token as a pass of its own, then the token
                self._inner_eval([rejected], [0])
                out = self._inner_eval(tokens, rows)
            else:
                fed = tokens[:wrong] + [rejected] + tokens[wrong:]
                out = self._inner_eval(fed, [r if r < wrong else r + 1 for r in rows])
            self.shift += 1
        else:
            out = self._inner_eval(tokens, rows)
        self.seen[start:start + n] = tokens  # what lies past them stays: a replay is compared with its verify pass
        self.n_past = start + n
        self.n_evals += 1
        return out

    def truncate(self, n: int) -> Rollback | None:
        if n == 0:
            self.shift, self.armed, self.restored_at = 0, True, None
            self.seen.clear()
            self.n_past = 0
            return self.inner.truncate(0)
        drop = self.n_past - n
        if drop > 0 and self.inner.rollback_mode(drop) == "snapshots" and self._fire("snapshot-off-by-one"):
            how = self.inner.truncate(n + 1 + self.shift)  # the state kept one token after the right one
            self.shift += 1
        else:
            how = self.inner.truncate(n + self.shift)
        if how is not None and how.mode == "checkpoint" and how.replay == 0 and drop > 0:
            self.restored_at = n
            if n < len(self.seen) and self._fire("checkpoint-late"):
                self._inner_eval([self.seen[n]], [0])  # the state one token past the checkpoint
                self.shift += 1
        self.n_past = n
        return how


# -- faults inside the real rollback (backends/llama_cpp/memory.py), each on one path only ------------------------
#: faults planted in ContextMemory itself, with the path each lives on
MEMORY_FAULTS = {
    # the n_rs_seq snapshot one position further back is selected, and the first rejected draft token decoded
    # where the last kept token was: positions stay consecutive, the state holds a token the target rejected
    "snapshot-one-back": "n_rs_seq",
}


def plant_in_memory(monkeypatch, fault: str) -> list[int]:
    """Plant ``fault`` in every llama.cpp context's rollback; returns a list that grows by one per firing."""
    from specview.backends.llama_cpp import memory

    if fault not in MEMORY_FAULTS:
        raise ValueError(f"unknown memory fault {fault!r}; one of {', '.join(MEMORY_FAULTS)}")
    fired: list[int] = []
    real = memory.ContextMemory.truncate

    def truncate(self, n: int):
        drop = len(self.tokens) - n
        if (0 < drop and self.mode == memory.SNAPSHOTS and not self.by_checkpoint and not self._pending
                and drop + 1 <= self.depth and self.passes and drop + 1 < self.passes[-1] and n >= 2):
            rejected = self.tokens[n]
            how = real(self, n - 1)  # the real snapshot rollback, one position too far
            assert how is not None and how.mode == memory.SNAPSHOTS, how
            self.decode([rejected])
            fired.append(n)
            return how
        return real(self, n)

    monkeypatch.setattr(memory.ContextMemory, "truncate", truncate)
    return fired
