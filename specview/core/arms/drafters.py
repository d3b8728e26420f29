"""Drafters: who proposes the tokens the target verifies.

* :class:`ModelDrafter` -- llama.cpp's ``draft-simple``: a separate (usually
  smaller or more quantized) model drafts greedily.
* :class:`NgramDrafter` -- llama.cpp's ``ngram-simple``: prompt lookup in the
  token history, no model at all.
* :class:`NoDrafter` -- drafts nothing; every round verifies one token.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Sequence

from ..config import SPEC_TYPES_IN_PROCESS
from ..engine import Engine
from .topk import top_softmax

SPEC_TYPES = SPEC_TYPES_IN_PROCESS


class Drafter(ABC):
    #: llama.cpp's --spec-type name
    spec_type: str = "none"

    def __init__(self) -> None:
        self.draft_seconds = 0.0
        self.eval_seconds_start = 0.0

    def begin(self, prompt: Sequence[int]) -> None:
        """Called once before the first round with the prompt tokens."""

    @abstractmethod
    def draft(self, history: Sequence[int], id_last: int, n_max: int) -> list[int]:
        """Propose tokens to follow ``history + [id_last]``, at most ``n_max`` of them.

        ``n_max`` is the run's remaining budget; a drafter applies its own
        limit (``--spec-draft-n-max``, or the n-gram's ``size_m``) on top.

        ``history`` is every token already in the target's KV cache; ``id_last``
        is the newest token, which the verify pass will feed first.
        """

    @property
    def eval_seconds(self) -> float:
        """Seconds spent inside the drafter's own forward passes."""
        return 0.0

    def close(self) -> None:
        pass

    def describe(self) -> dict:
        return {"spec_type": self.spec_type}


class NoDrafter(Drafter):
    spec_type = "none"

    def draft(self, history: Sequence[int], id_last: int, n_max: int) -> list[int]:
        return []


class ModelDrafter(Drafter):
    """draft-simple: greedy drafting with a draft model, as in llama.cpp's common/speculative.cpp.

    Per round: bring the draft context up to ``history + [id_last]`` (reusing the
    longest common prefix it already holds), then repeatedly take the draft's top
    token; stop when its probability -- a softmax over the top 10 logits, as the
    top-k(10) draft sampler computes it -- is below ``p_min`` or when ``n_max``
    tokens are drafted.  A draft shorter than ``n_min`` is dropped.
    """

    spec_type = "draft-simple"

    def __init__(
        self,
        engine: Engine,
        *,
        n_max: int = 3,
        n_min: int = 0,
        p_min: float = 0.0,
        n_batch: int | None = None,
    ):
        super().__init__()
        if n_max < 0 or n_min < 0:
            raise ValueError(f"n_max and n_min must be >= 0 (n_max={n_max}, n_min={n_min})")
        self.engine = engine
        self.n_max = int(n_max)
        self.p_min = float(p_min)
        self.n_min = int(n_min)
        self.n_batch = min(n_batch or engine.n_batch, engine.n_batch)  # at most what the context takes
        self._cached: list[int] = []  # tokens whose KV the draft context holds, in order
        self._known = 0  # leading tokens of _cached known to equal the run's history

    def begin(self, prompt: Sequence[int]) -> None:
        self.engine.plan_rollbacks(self.n_max)  # its drafted tokens are dropped again, up to n_max of them
        self.engine.reset()
        self._cached = []
        self._known = 0

    @property
    def eval_seconds(self) -> float:
        return self.engine.eval_seconds

    def _sync(self, seq: list[int], n_history: int):
        """Make the draft context hold ``seq`` and return the logits row of its last token.

        The run's history only grows between calls, so the first ``_known``
        cached tokens are known to match and only the tail is compared: a round
        costs O(draft length), not O(sequence length).
        """
        eng = self.engine
        cached = self._cached
        n = min(len(cached), len(seq) - 1)  # always re-evaluate at least the last token
        common = min(self._known, n)
        while common < n and cached[common] == seq[common]:
            common += 1
        if eng.n_past != common:
            eng.truncate(common)
        rest = seq[common:]
        row = None
        for start in range(0, len(rest), self.n_batch):
            chunk = rest[start:start + self.n_batch]
            row = eng.eval(chunk, rows=[-1])[0]
        self._cached = seq
        self._known = n_history
        return row

    def draft(self, history: Sequence[int], id_last: int, n_max: int) -> list[int]:
        n_max = min(n_max, self.n_max)
        if n_max <= 0:
            return []
        t0 = time.perf_counter()
        n_history = len(history)
        seq = self._cached[: min(self._known, n_history)]
        seq.extend(history[len(seq):])
        seq.append(id_last)
        row = self._sync(seq, n_history)
        # the tokens drafted next are evaluated here and dropped in a later round: a draft model whose memory
        # cannot drop positions (a hybrid) keeps what that rollback needs (a checkpoint, kept states)
        self.engine.prepare_rollback(n_max - 1)
        out: list[int] = []
        # with no p_min to compare, the draft is the top token alone: the argmax (the lowest id of a tie, as
        # the top-10 picks it), unless the row holds a NaN, which the top-10's own order handles
        argmax = self.p_min <= 0.0
        while True:
            tok = int(row.argmax()) if argmax else -1
            if tok < 0 or row[tok] != row[tok]:
                tok, p = top_softmax(row, 10)
                if p < self.p_min:
                    break
            out.append(tok)
            if len(out) >= n_max:
                break
            row = self.engine.eval([tok], rows=[0])[0]
            self._cached.append(tok)
        if len(out) < self.n_min:
            out = []
        self.draft_seconds += time.perf_counter() - t0
        return out

    def close(self) -> None:
        self.engine.close()

    def describe(self) -> dict:
        return {"spec_type": self.spec_type, "n_max": self.n_max, "n_min": self.n_min, "p_min": self.p_min}


class NgramDrafter(Drafter):
    """ngram-simple: llama.cpp's ``common_ngram_simple_draft``, ported line for line.

    Take the last ``size_n`` tokens (ending with ``id_last``), find their most
    recent earlier occurrence in the history, and draft the up to ``size_m``
    tokens that followed it.  No draft when the history is shorter than
    ``size_n + size_m + 1``, when there is no match, or when fewer than
    ``size_n`` tokens could be copied.
    """

    spec_type = "ngram-simple"

    def __init__(self, *, size_n: int = 12, size_m: int = 48):
        super().__init__()
        if size_n < 1 or size_m < 1:
            raise ValueError(f"ngram sizes must be >= 1 (size_n={size_n}, size_m={size_m})")
        self.size_n = int(size_n)
        self.size_m = int(size_m)

    def draft(self, history: Sequence[int], id_last: int, n_max: int) -> list[int]:
        t0 = time.perf_counter()
        out = self._draft(history, id_last)[: max(0, n_max)]
        self.draft_seconds += time.perf_counter() - t0
        return out

    def _draft(self, tokens: Sequence[int], sampled: int) -> list[int]:
        cur_len = len(tokens)
        n_draft_min, n_draft_max = self.size_n, self.size_m
        if cur_len <= n_draft_min + n_draft_max + 1:
            return []
        pattern = list(tokens[cur_len - n_draft_min + 1:cur_len])
        pattern.append(sampled)
        plen = len(pattern)
        match_pos = 0
        for j in range(cur_len - n_draft_min - 1, 0, -1):
            if tokens[j] == pattern[0] and list(tokens[j:j + plen]) == pattern:
                match_pos = j
                break
        if match_pos == 0:
            return []
        copy_max = min(n_draft_max, cur_len - (match_pos + n_draft_min))
        if copy_max < n_draft_min:
            return []
        start = match_pos + n_draft_min
        return list(tokens[start:start + copy_max])

    def describe(self) -> dict:
        return {"spec_type": self.spec_type, "size_n": self.size_n, "size_m": self.size_m}
