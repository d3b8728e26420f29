"""The engine interface every algorithm in specview is written against.

An engine is one evaluation context on one loaded model: llama.cpp, MLX, or a
test double.  The algorithms (vanilla greedy, speculative verify, drafters,
teacher-forced replay) only ever call the methods below, so a backend is a thin
layer and a fault-injecting engine in the tests is a few lines.

The contract, in short:

* ``eval(tokens, rows)`` appends ``tokens`` to the KV state at positions
  ``n_past .. n_past + len(tokens) - 1`` in ONE forward pass and returns a
  ``(len(rows), n_vocab)`` float32 array with the logits of just those rows.
  Memory is O(n_vocab x batch), never O(n_ctx x n_vocab).
* ``truncate(n)`` drops every KV entry at position >= n, exactly.
* A memory that cannot drop positions (a recurrent or hybrid model's state) rolls
  back otherwise: ``rollback_mode(n_drop)`` says how (``seq-rm``, ``snapshots``
  or ``checkpoint``), ``prepare_rollback(n_drop)`` is called before tokens that
  may be dropped again (a checkpoint engine saves its state there), and
  ``truncate`` then reports what it did (a :class:`Rollback`).
* Everything is single-threaded: an engine belongs to the thread that made it.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .config import EngineSettings  # noqa: F401  (the settings a context is opened with)
from .errors import (  # noqa: F401  (re-exported: the engine contract names its errors)
    BackendUnavailable,
    ContextOverflow,
    EvalError,
    IncompatibleVocab,
    ModelFileError,
    SpecviewError,
)

__all__ = [
    "Engine",
    "EngineSettings",
    "Rollback",
    "ROLLBACK_MODES",
    "ROLLBACK_MECHANISMS",
    "VocabInfo",
    "SpecviewError",
    "ModelFileError",
    "BackendUnavailable",
    "IncompatibleVocab",
    "ContextOverflow",
    "EvalError",
    "check_draft_compatible",
    "LoadedModel",
    "WrappedModel",
]


# llama.cpp's common/speculative.cpp: SPEC_VOCAB_MAX_SIZE_DIFFERENCE and
# SPEC_VOCAB_CHECK_START_TOKEN_ID.
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5


@dataclass(frozen=True)
class VocabInfo:
    """Vocabulary facts used for drafting checks and for stopping."""

    n_vocab: int
    vocab_type: str  # "spm", "bpe", ... as llama.cpp names them; "hf" for MLX tokenizers
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool
    eog: frozenset[int] = field(default_factory=frozenset)
    texts: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def fingerprint(self) -> str:
        """A short hash of the token texts, recorded in traces."""
        h = hashlib.sha256()
        for t in self.texts:
            h.update(t.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        return h.hexdigest()[:16]


def check_draft_compatible(target: VocabInfo, draft: VocabInfo, *, draft_name: str = "draft") -> None:
    """Refuse a draft whose vocabulary cannot draft for the target.

    The rules are llama.cpp's ``common_speculative_are_compatible``: same vocab
    type, same add-BOS/add-EOS and the same BOS/EOS ids where they are added,
    sizes within 128 of each other, identical token texts from id 5 on.
    Raises :class:`IncompatibleVocab` saying exactly what differs.
    """
    problems: list[str] = []
    if target.vocab_type != draft.vocab_type:
        problems.append(f"vocabulary type differs: target {target.vocab_type}, draft {draft.vocab_type}")
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos != draft.bos):
        problems.append(
            f"BOS differs: target add_bos={target.add_bos} id={target.bos}, "
            f"draft add_bos={draft.add_bos} id={draft.bos}"
        )
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos != draft.eos):
        problems.append(
            f"EOS differs: target add_eos={target.add_eos} id={target.eos}, "
            f"draft add_eos={draft.add_eos} id={draft.eos}"
        )
    diff = abs(target.n_vocab - draft.n_vocab)
    if diff > VOCAB_MAX_SIZE_DIFFERENCE:
        problems.append(
            f"vocabulary sizes differ by {diff} (target {target.n_vocab}, draft {draft.n_vocab}; "
            f"at most {VOCAB_MAX_SIZE_DIFFERENCE} allowed)"
        )
    elif target.texts and draft.texts:
        n = min(len(target.texts), len(draft.texts))
        for i in range(VOCAB_CHECK_START_TOKEN_ID, n):
            if target.texts[i] != draft.texts[i]:
                problems.append(
                    f"token {i} differs: target {target.texts[i]!r}, draft {draft.texts[i]!r}"
                )
                break
    if problems:
        raise IncompatibleVocab(
            f"the {draft_name} cannot draft for this target: "
            + "; ".join(problems)
            + ". Use a draft model from the same family (same tokenizer), or --spec-type ngram-simple."
        )


#: how a context drops tokens it evaluated (``backends/llama_cpp/memory.py`` says how each is done)
ROLLBACK_MODES = ("seq-rm", "snapshots", "checkpoint")
#: what one rollback did, counted per context by :meth:`Engine.rollbacks`: a plain seq_rm, llama.cpp's n_rs_seq
#: snapshot, a state kept by a copy after a single-token pass and loaded back, a checkpoint loaded back, and the
#: tokens decoded again after a restore
ROLLBACK_MECHANISMS = ("seq-rm", "n_rs_seq", "state-copy", "checkpoint", "replay")


@dataclass(frozen=True)
class Rollback:
    """How one ``truncate`` dropped tokens: its mode, and the tokens it decoded again after restoring a state."""

    mode: str  # "seq-rm", "snapshots", "checkpoint", or "state-copy" (a snapshot context's state kept by a copy)
    replay: int = 0  # the width of the replay pass (0: nothing was decoded again)


class Engine(ABC):
    """One evaluation context on one loaded model."""

    #: short backend name recorded in traces, e.g. "llama.cpp" or "mlx"
    backend: str = "abstract"

    def __init__(self) -> None:
        self.n_past = 0
        #: seconds spent inside forward passes (for the throughput benchmarks)
        self.eval_seconds = 0.0
        #: number of forward passes run
        self.n_evals = 0

    # -- facts ---------------------------------------------------------------
    @property
    @abstractmethod
    def vocab(self) -> VocabInfo: ...

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    #: set by each engine: the context's size and the most tokens one eval may take
    _n_ctx: int = 0
    _n_batch: int = 1

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_batch(self) -> int:
        return self._n_batch

    @abstractmethod
    def model_facts(self) -> dict[str, Any]:
        """path, file size, architecture, quantization, vocabulary size, ..."""

    def environment(self) -> dict[str, Any]:
        """Backend versions and devices, merged into the trace's environment."""
        return {}

    # -- text ----------------------------------------------------------------
    @abstractmethod
    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        """Tokenize a prompt; ``chat`` wraps it as one user turn with the model's chat template."""

    @abstractmethod
    def piece(self, token: int) -> str:
        """The text of one token as it appears in output (special tokens rendered)."""

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(self.piece(t) for t in tokens)

    def is_eog(self, token: int) -> bool:
        return token in self.vocab.eog

    # -- evaluation ------------------------------------------------------------
    @abstractmethod
    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        """Run one forward pass over ``tokens`` at positions ``n_past...``.

        Returns float32 logits of shape ``(len(rows), n_vocab)``; ``rows``
        index into ``tokens`` (negative indices allowed).  Advances ``n_past``.
        """

    @abstractmethod
    def truncate(self, n: int) -> "Rollback | None":
        """Drop every KV entry at position >= n; afterwards ``n_past == n``.

        An engine whose memory rolls back other than by dropping positions returns
        how it did (a :class:`Rollback`); None means a plain drop, or nothing to drop.
        """

    def reset(self) -> None:
        self.truncate(0)

    # -- rolling back a memory that is more than a KV cache ------------------------------------
    def rollback_mode(self, n_drop: int) -> str:
        """How a rollback of up to ``n_drop`` tokens after the next pass will be done (see :data:`ROLLBACK_MODES`).

        ``checkpoint`` means ``truncate`` back to where :meth:`prepare_rollback` was called
        restores a saved state, and tokens dropped beyond it are decoded again.
        """
        return "seq-rm"

    def prepare_rollback(self, n_drop: int) -> str:
        """Called before evaluating tokens of which up to ``n_drop`` may be dropped again; returns
        :meth:`rollback_mode` (a checkpoint engine saves its state here, "" when ``n_drop`` is 0)."""
        return self.rollback_mode(n_drop) if n_drop > 0 else ""

    def plan_rollbacks(self, n_drop: int) -> None:
        """The most tokens one rollback may drop in the run about to start (a context that keeps snapshots
        keeps that many); it may clear the context, so call it before the prefill."""

    def rollbacks(self) -> dict[str, int]:
        """How many rollbacks of each of :data:`ROLLBACK_MECHANISMS` this context has done since it was opened
        (empty: the engine does not say)."""
        return {}

    def snapshots_by_checkpoint(self) -> bool:
        """From now on roll back what n_rs_seq snapshots would by a checkpoint and a replay of the kept tokens
        instead (the diagnosis' snapshot check); False where this engine keeps no snapshots."""
        return False

    def sibling(self) -> "Engine":
        """A fresh context on the same loaded weights (weights are never loaded twice)."""
        raise NotImplementedError(f"{type(self).__name__} cannot open a second context")

    def close(self) -> None:
        """Free the context (never the shared weights)."""

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ModelEngine(Engine):
    """An engine over one loaded model object (``self.model``) that knows its text, and the guards of ``eval``.

    The llama.cpp and MLX engines each wrap their own model object; its
    tokenizer, pieces and facts are the model's, and every forward pass is
    refused the same way before it reaches the backend (where a bad token id or
    an over-long batch would abort the process instead of raising).
    """

    model: Any
    _n_vocab: int = 0  # the model's logits width, set by the engine when it opens its context

    @property
    def vocab(self) -> VocabInfo:
        return self.model.vocab

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    def model_facts(self) -> dict[str, Any]:
        return self.model.facts()

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return self.model.tokenize(text, chat=chat)

    def piece(self, token: int) -> str:
        return self.model.piece(token)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.model.detokenize(tokens)

    def checked(self, tokens: Sequence[int], rows: Sequence[int], *, batch_limit: bool = True
                ) -> tuple[list[int], list[int]]:
        """``(tokens, rows)`` as ints, negative rows resolved, after every check an eval makes first.

        Raises ValueError for a caller's mistake (no token, more tokens than
        ``n_batch`` when ``batch_limit``, a row outside the tokens) and
        :class:`EvalError` for what the input asks of the model (a full
        context, a token id outside the vocabulary).
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("eval needs at least one token")
        if batch_limit and n > self._n_batch:
            # a caller's bug, never llama.cpp's GGML_ASSERT(n_tokens_all <= n_batch) abort
            raise ValueError(f"{n} tokens exceed n_batch={self._n_batch} of this context; chunk them")
        if self.n_past + n > self._n_ctx:
            raise EvalError(f"the context is full ({self.n_past} + {n} > n_ctx {self._n_ctx}); raise --n-ctx")
        toks = [int(t) for t in tokens]
        for t in toks:
            if not 0 <= t < self._n_vocab:
                raise EvalError(f"token id {t} is outside the vocabulary (0..{self._n_vocab - 1})")
        out = [int(r) + n if r < 0 else int(r) for r in rows]
        if any(not 0 <= r < n for r in out):
            raise ValueError(f"rows {list(rows)} are outside the {n} tokens evaluated")
        return toks, out


# -- loaded models ---------------------------------------------------------------------
class LoadedModel(ABC):
    """Weights loaded once; every arm, drafter and replay opens its own engine on them."""

    path: str

    @abstractmethod
    def facts(self) -> dict[str, Any]: ...

    @property
    @abstractmethod
    def vocab(self) -> VocabInfo: ...

    @abstractmethod
    def tokenize(self, text: str, *, chat: bool = False) -> list[int]: ...

    @abstractmethod
    def new_engine(self, settings: EngineSettings, n_ctx: int) -> Engine:
        """A context on these weights; ``settings`` are decided (:class:`specview.core.resolve.DecidedSettings`)."""

    def draft_settings(self, settings: EngineSettings) -> tuple[EngineSettings, str]:
        """``(settings, why)`` for this model's context when it drafts for a target run on ``settings``: the same
        settings, and no reason, unless the engine opens a draft context otherwise (llama.cpp: as llama-server)."""
        return settings, ""

    @property
    def n_ctx_train(self) -> int | None:
        return None

    #: one line saying how ``tokenize(chat=True)`` treated a model without a chat template, else None
    chat_note: str | None = None

    def close(self) -> None:
        pass


class WrappedModel(LoadedModel):
    """A :class:`LoadedModel` over a backend's own model object.

    The object provides ``path``, ``facts()``, ``vocab``, ``n_ctx_train``,
    ``tokenize(text, chat=)`` and ``close()``; a backend subclasses this and
    adds only :meth:`new_engine`.
    """

    def __init__(self, model: Any):
        self.model = model
        self.path = str(model.path)

    def facts(self) -> dict[str, Any]:
        return self.model.facts()

    @property
    def vocab(self) -> VocabInfo:
        return self.model.vocab

    @property
    def n_ctx_train(self) -> int | None:
        return self.model.n_ctx_train

    @property
    def chat_note(self) -> str | None:  # type: ignore[override]
        return getattr(self.model, "chat_note", None)

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return self.model.tokenize(text, chat=chat)

    def close(self) -> None:
        self.model.close()
