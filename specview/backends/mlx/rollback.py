"""Rolling an MLX prompt cache back to an earlier position, for hybrid and recurrent models too.

mlx-lm rolls a cache back only by trimming it (``trim_prompt_cache``), and
``mlx_lm.generate`` refuses speculative decoding on any model with a cache entry
that cannot be trimmed ("Speculative decoding requires a trimmable prompt
cache").  Hybrid and recurrent models (``lfm2``, ``qwen3_5``, ``qwen3_next``,
``mamba2``, ``nemotron_h``, ``falcon_h1``, ``granitemoehybrid`` ...) keep an
``ArraysCache`` per recurrent layer: the convolution window and the recurrent
state after the last token, which has no positions to drop.

The engine rolls those back the way llama-server rolls back a hybrid target for
draft-simple: checkpoint and replay (its ``rollback_mode`` is ``checkpoint``,
the engine interface's word for it; a model whose every entry trims is
``seq-rm``, as mlx-lm's trim is llama.cpp's ``llama_memory_seq_rm``):

* **Checkpoints.**  A checkpoint is the position and the arrays of every
  ``ArraysCache`` entry.  MLX arrays are immutable and these caches replace
  their entries instead of writing into them (``cache[0] = ...``), so a
  checkpoint holds references, not copies: it costs no copy and no compute.
  One is kept where the caller asks (``prepare_rollback``: before a verify pass,
  before a drafter drafts), and, so that any ``truncate`` works whoever calls
  it, at the start of every pass except a single-token pass that continues a
  run of single-token passes with no rollback in between (every prefill chunk,
  every batched pass, the first pass after a rollback).  The fresh cache
  (position 0) is always a checkpoint; at most :data:`KEEP` others are kept.
* **Rollback to n.**  The latest checkpoint at or before n is restored (its
  arrays put back; the trimmable entries, KV caches, trimmed to its position).
  The speculative loop truncates to exactly its checkpoint and replays the
  accepted tokens itself (``specview.core.arms.generate.replay_verify``).  A
  rollback beyond the checkpoint (a drafter keeping its accepted drafts, a
  teacher-forced replay) has the engine feed the tokens between the checkpoint
  and n again, in the passes that first fed them, each cut at n: after a batch
  of which k tokens are kept, one pass of k tokens (a pass of another width);
  after single-token passes (the serial-verify control), single-token passes,
  so every position is still computed exactly as vanilla computes it.
* **Refusal.**  An entry that is neither an ``ArraysCache`` nor trimmable now (a
  sliding window that is full, a cache class specview does not know) cannot be
  rolled back: the engine says so and names the classes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from ...core.engine import Rollback
from ...core.errors import EvalError

#: checkpoints kept besides the fresh cache at position 0 (a speculative loop only ever needs the latest)
KEEP = 4


@dataclass(frozen=True)
class MLXRollback(Rollback):
    """How one ``truncate`` was done: what ``MLXEngine.last_rollback`` holds after it.

    ``mode`` is ``"seq-rm"`` (positions trimmed off every entry, mlx-lm's own
    way) or ``"checkpoint"`` (the checkpoint at ``restored_at`` restored, then
    ``widths``: the width of each pass the engine fed again, in order; empty when
    the checkpoint was at n).  ``replay`` (the interface's field) is the width
    of the replay pass: the widest of them, 0 when nothing was fed again.
    """

    n_from: int = 0
    n_to: int = 0
    restored_at: int | None = None
    widths: tuple[int, ...] = ()
    seconds: float = 0.0

    @property
    def replayed(self) -> int:
        """Tokens fed again."""
        return sum(self.widths)


# -- what a cache is made of -------------------------------------------------------------
def leaves(cache: Sequence[Any]) -> list[Any]:
    """The entries of a prompt cache, with every ``CacheList`` opened into its parts."""
    out: list[Any] = []
    for c in cache:
        inner = getattr(c, "caches", None)
        if inner is not None and type(c).__name__ == "CacheList":
            out.extend(leaves(inner))
        else:
            out.append(c)
    return out


def is_snapshot(entry: Any) -> bool:
    """An entry rolled back by checkpoint and restore (``ArraysCache`` and its subclasses)."""
    from mlx_lm.models.cache import ArraysCache

    return isinstance(entry, ArraysCache)


def is_trimmable(entry: Any) -> bool:
    try:
        return bool(entry.is_trimmable()) and hasattr(entry, "trim")
    except Exception:
        return False


def needs_checkpoints(cache: Sequence[Any]) -> bool:
    """Whether this cache has entries only a checkpoint can roll back."""
    return any(is_snapshot(c) for c in leaves(cache))


def stuck(cache: Sequence[Any]) -> list[str]:
    """Class names of the entries that can be neither trimmed nor restored, now."""
    return sorted({type(c).__name__ for c in leaves(cache) if not is_snapshot(c) and not is_trimmable(c)})


def untrimmable(cache: Sequence[Any]) -> list[str]:
    """Class names of the entries mlx-lm cannot trim (why ``mlx_lm.generate`` refuses to speculate)."""
    return sorted({type(c).__name__ for c in cache if not is_trimmable(c)})


def describe(cache: Sequence[Any]) -> tuple[str, str | None]:
    """(rollback mode, one line for the user or None) for a fresh cache of a model.

    The mode is ``"seq-rm"`` (mlx-lm's own trim), ``"checkpoint"`` (mlx-lm
    refuses to speculate here; specview restores and replays) or ``"none"`` (no
    rollback is possible: a speculative arm stops at the first rejected draft).
    """
    refused = untrimmable(cache)
    if not refused:
        return "seq-rm", None
    why = (f"mlx-lm itself refuses speculative decoding on this model (its cache has {', '.join(refused)} "
           "entries, which cannot be trimmed)")
    bad = stuck(cache)
    if bad:
        return "none", (f"{why}, and specview cannot roll back {', '.join(bad)} entries either: "
                        "a speculative arm stops at the first rejected draft")
    return "checkpoint", (f"{why}; the speculative arm is specview's own loop, which restores a checkpoint "
                          "of the recurrent entries and replays the accepted tokens")


# -- checkpoints -------------------------------------------------------------------------
@dataclass
class Checkpoint:
    pos: int
    arrays: list[tuple[list[Any], Any, Any]]  # per snapshot entry: its arrays, left_padding, lengths


def snapshot(entries: Sequence[Any], pos: int) -> Checkpoint:
    return Checkpoint(pos, [(list(e.cache), e.left_padding, e.lengths) for e in entries])


def put_back(entries: Sequence[Any], cp: Checkpoint) -> None:
    for e, (arrays, left, lengths) in zip(entries, cp.arrays):
        e.cache = list(arrays)
        e.left_padding, e.lengths = left, lengths


@dataclass
class History:
    """Checkpoints and the passes that fed the cache since position 0, kept consistent with it."""

    entries: list[Any]  # the cache's snapshot entries, in order
    checkpoints: list[Checkpoint] = field(default_factory=list)
    passes: list[tuple[int, list[int]]] = field(default_factory=list)  # (first position, tokens) of every pass
    fresh: bool = True  # the next pass starts a checkpoint whatever its width

    def before_pass(self, pos: int, n: int) -> None:
        """Keep a checkpoint at ``pos`` unless this pass continues a run of single-token passes."""
        if self.fresh or n > 1:
            self.keep(pos)

    def keep(self, pos: int) -> None:
        """A checkpoint of the entries as they are, at ``pos`` (the cache's position now)."""
        if self.checkpoints and self.checkpoints[-1].pos == pos:
            return  # the state at pos is the one already kept: nothing has been fed since
        self.checkpoints.append(snapshot(self.entries, pos))
        if len(self.checkpoints) > KEEP + 1:  # the fresh cache at 0 stays, the oldest other goes
            del self.checkpoints[1 if self.checkpoints[0].pos == 0 else 0]

    def after_pass(self, pos: int, tokens: list[int]) -> None:
        self.passes.append((pos, list(tokens)))
        self.fresh = len(tokens) > 1

    def at_or_before(self, n: int) -> Checkpoint | None:
        return next((cp for cp in reversed(self.checkpoints) if cp.pos <= n), None)

    def replay_plan(self, start: int, end: int) -> list[list[int]]:
        """The tokens of positions ``start..end-1``, in the passes that first fed them, each cut at ``end``."""
        plan = []
        for pos, toks in self.passes:
            if pos + len(toks) <= start or pos >= end:
                continue
            if pos < start:  # pragma: no cover - checkpoints are only ever taken at the start of a pass
                raise RuntimeError(f"no pass starts at checkpoint {start}")
            plan.append(toks[: end - pos])
        return plan

    def cut(self, n: int) -> None:
        """Forget everything at positions >= n (after a rollback to n)."""
        self.passes = [(p, t[: n - p]) for p, t in self.passes if p < n]
        self.checkpoints = [cp for cp in self.checkpoints if cp.pos <= n]
        self.fresh = True


# -- the engine's half -------------------------------------------------------------------
class CheckpointRollback:
    """The rollback methods of :class:`~specview.backends.mlx.engine.MLXEngine` (it inherits them).

    They use the engine's ``model``, ``n_past``, ``_mxm``, ``_stream()`` and
    ``_forward()``; ``truncate`` (in the engine) calls :meth:`_roll_back` when
    the cache needs checkpoints.
    """

    _history: History | None

    @property
    def cache(self) -> list[Any]:
        """The prompt cache (``make_prompt_cache``); setting it starts its rollback history afresh."""
        return self._cache

    @cache.setter
    def cache(self, value: list[Any]) -> None:
        self._cache = value
        # checkpoints and the passes that fed the cache, for the entries only a checkpoint rolls back
        self._history = History([c for c in leaves(value) if is_snapshot(c)]) if needs_checkpoints(value) else None

    def rollback_mode(self, n_drop: int = 1) -> str:
        """``"checkpoint"`` for a cache with entries only a checkpoint rolls back, else ``"seq-rm"`` (a trim)."""
        return "checkpoint" if self._checkpointing else "seq-rm"

    def prepare_rollback(self, n_drop: int) -> str:
        """Keep a checkpoint here when up to ``n_drop`` tokens fed next may be dropped again."""
        if n_drop > 0 and self._checkpointing:
            self._history.keep(self.n_past)
        return super().prepare_rollback(n_drop)

    @property
    def _checkpointing(self) -> bool:
        return self._history is not None

    def _refuse(self, kinds: list[str]) -> None:
        raise EvalError(
            f"{self.model.path.name}: its MLX cache ({', '.join(kinds)}) cannot be rolled back (neither trimmed "
            "nor restored from a checkpoint), so rejected draft tokens cannot be removed; this model cannot be "
            "the target or draft of speculative decoding. Use --spec-type none, or another model."
        )

    def _check_offsets(self, n: int, problem: str = "") -> None:
        offsets = {int(c.offset) for c in leaves(self.cache) if not is_snapshot(c) and hasattr(c, "offset")}
        if problem or (offsets and offsets != {n}):
            raise EvalError(f"{self.model.path.name}: {problem or 'the MLX cache did not end where it should'} "
                            f"(layer offsets {sorted(offsets)}); it cannot roll back to position {n}")

    # -- checkpoint, restore and replay (hybrid and recurrent models; see .rollback) --------
    def _roll_back(self, n: int) -> MLXRollback:
        """Restore the latest checkpoint at or before ``n``, then replay the tokens up to ``n``."""
        if (bad := stuck(self.cache)):
            self._refuse(bad)
        t0 = time.perf_counter()
        n_from = self.n_past
        cp = self._history.at_or_before(n)
        if cp is None:  # a cache put in from outside (LayerEngine.take_state) has none before its next pass
            raise EvalError(f"{self.model.path.name}: no checkpoint of the MLX cache at or before position {n} "
                            "to roll back to")
        self._restore(cp.pos, cp)
        widths = self._replay(cp.pos, n)
        return self._rolled_back(n, MLXRollback("checkpoint", max(widths, default=0), n_from=n_from, n_to=n,
                                                restored_at=cp.pos, widths=tuple(widths),
                                                seconds=time.perf_counter() - t0))

    def _restore(self, pos: int, cp: Any) -> None:
        """Put the checkpoint's recurrent arrays back and trim every trimmable entry to ``pos``."""
        put_back(self._history.entries, cp)
        want = self.n_past - pos
        for c in leaves(self.cache):
            if not is_snapshot(c) and want and (not is_trimmable(c) or c.trim(want) != want):
                self._check_offsets(pos, f"a {type(c).__name__} entry did not trim {want} positions")

    def _replay(self, start: int, end: int) -> list[int]:
        """Feed positions ``start..end-1`` again, in the passes that first fed them (cut at ``end``)."""
        mx = self._mxm
        widths = []
        for toks in self._history.replay_plan(start, end):
            t0 = time.perf_counter()
            try:
                with mx.stream(self._stream()):
                    mx.eval(self._forward(mx, toks, [len(toks) - 1]), *self._states())
            except Exception as exc:
                raise EvalError(f"the MLX replay pass at position {start + sum(widths)} ({len(toks)} tokens) "
                                f"failed: {type(exc).__name__}: {exc}") from exc
            finally:
                self.eval_seconds += time.perf_counter() - t0
            self.n_evals += 1
            widths.append(len(toks))
        self.replay_passes += len(widths)
        self.replayed_tokens += sum(widths)
        return widths

    def _rolled_back(self, n: int, rb: MLXRollback) -> MLXRollback:
        self._check_offsets(n)
        self._history.cut(n)
        self.n_past = n
        self.restores += 1
        self._used["checkpoint"] = self._used.get("checkpoint", 0) + 1
        if rb.widths:
            self._used["replay"] = self._used.get("replay", 0) + 1
        self.last_rollback = rb
        return rb

    def _states(self) -> list[Any]:
        """The recurrent entries' arrays (evaluated with every pass, so a checkpoint holds computed arrays)."""
        if self._history is None:
            return []
        return [a for e in self._history.entries for a in e.cache if a is not None]
