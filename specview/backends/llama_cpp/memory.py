"""Rollback for every memory a llama.cpp context can have, chosen the way llama-server chooses.

A speculative loop drops the rejected draft tokens after each verify pass.  How
depends on the context's memory (llama.cpp 0.3.36, vendored in llama-cpp-python):

* ``seq-rm``: an attention-only memory (a KV cache) drops positions with
  ``llama_memory_seq_rm``; nothing is recomputed (``common_context_can_seq_rm``
  says PART).
* ``snapshots``: a recurrent or hybrid memory opened with
  ``llama_context_params.n_rs_seq = N`` keeps the recurrent state of the last N
  positions of each decode, and ``llama_memory_seq_rm`` of up to N tokens picks
  a kept state (RS).  Only the architectures of ``llm_arch_supports_rs_rollback``;
  llama.cpp clamps the request to 0 for any other.  llama-server asks for
  ``n_rs_seq = n_max`` only with draft-mtp, draft-eagle3, draft-dflash and
  draft-dspark (``common_params_speculative::need_n_rs_seq``).
* ``checkpoint``: otherwise (FULL).  Before the verify pass the sequence state is
  saved with ``llama_state_seq_get_data_ext(..., LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)``
  (the part ``seq_rm`` cannot drop: the recurrent state); on partial acceptance
  it is restored and the accepted tokens are decoded again (llama-server's
  ``spec_ckpt`` and ``spec_is_replay``).  The state after a replay comes from a
  pass of another width than the one that verified those tokens.

:func:`choose_rollback` is the choice, a pure function of the target's
architecture, its memory kind, the spec type and n_max; :class:`ContextMemory`
does it for one context.  A rollback that the context's snapshots cannot cover
(more tokens than N, several passes back, or a second rollback before the next
decode) falls back as llama-server's does: to the checkpoint when there is one,
and otherwise to a replay of the context's own forward passes, with their own
widths, from an empty state.  A single-token pass of a context that may roll
back keeps its state as a copy (a serial verify, a drafter's tokens), since
llama.cpp keeps snapshots only within one decode.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...core.engine import Rollback
from ...core.errors import ConfigError, EvalError

AUTO = "auto"
SEQ_RM, SNAPSHOTS, CHECKPOINT = "seq-rm", "snapshots", "checkpoint"
MODES = (SEQ_RM, SNAPSHOTS, CHECKPOINT)

#: llm_arch_supports_rs_rollback (src/llama-arch.cpp): n_rs_seq snapshots work on these
RS_ROLLBACK_ARCHS = frozenset({"kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
                               "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3"})
#: llm_arch_is_recurrent: a recurrent state and no KV cache
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
#: llm_arch_is_hybrid: a recurrent state beside a KV cache
HYBRID_ARCHS = frozenset({"jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
                          "nemotron_h_moe", "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next",
                          "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "minimax-01"})
#: the spec types llama-server opens its target with n_rs_seq = n_max for (need_n_rs_seq)
RS_SEQ_SPEC_TYPES = ("draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark")

ATTENTION, HYBRID, RECURRENT = "attention", "hybrid", "recurrent"

_PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


def memory_kind(architecture: str | None) -> str:
    """``attention``, ``hybrid`` or ``recurrent``: what llama.cpp's architecture tables say of its memory."""
    arch = (architecture or "").lower()
    if arch in RECURRENT_ARCHS:
        return RECURRENT
    if arch in HYBRID_ARCHS:
        return HYBRID
    return ATTENTION


def allowed_modes(architecture: str | None, kind: str | None = None) -> tuple[str, ...]:
    """The rollback modes llama.cpp can run on this architecture's memory."""
    kind = kind or memory_kind(architecture)
    if kind == ATTENTION:
        return (SEQ_RM, CHECKPOINT)  # a checkpoint of a KV cache saves nothing; the restore is a seq_rm
    if (architecture or "").lower() in RS_ROLLBACK_ARCHS:
        return (SNAPSHOTS, CHECKPOINT)
    return (CHECKPOINT,)


def choose_rollback(architecture: str | None, kind: str | None, spec_type: str, n_max: int) -> tuple[str, str]:
    """``(mode, why)``: the rollback llama-server uses for a target of this architecture and this spec type."""
    arch = architecture or "this architecture"
    kind = kind or memory_kind(architecture)
    if kind == ATTENTION:
        return SEQ_RM, (f"{arch} keeps only a KV cache: llama_memory_seq_rm drops the rejected tokens "
                        "(llama-server's partial sequence removal)")
    what = "a recurrent state" if kind == RECURRENT else "a recurrent state beside its KV cache"
    if spec_type in RS_SEQ_SPEC_TYPES and n_max > 0 and SNAPSHOTS in allowed_modes(architecture, kind):
        return SNAPSHOTS, (f"{arch} keeps {what}; for {spec_type} llama-server opens it with n_rs_seq = n_max "
                           f"= {n_max}, which keeps the state of the last {n_max} positions")
    return CHECKPOINT, (f"{arch} keeps {what}, which llama_memory_seq_rm cannot cut; for {spec_type} llama-server "
                        "saves it before each verify pass and, on partial acceptance, restores it and decodes the "
                        "accepted tokens again (checkpoint and replay)")


def decide_rollback(target_arch: str | None, draft_arch: str | None, spec_type: str, n_max: int) -> tuple[str, str]:
    """``(value, why)`` of the rollback setting for a run: the target's choice. The draft model's context (when there
    is one) is opened the way llama-server opens it, whatever the target's memory takes
    (:meth:`~specview.backends.llama_cpp.backend.LlamaLoaded.draft_settings`); the reason says so where the two
    differ."""
    mode, why = choose_rollback(target_arch, None, spec_type, n_max)
    if draft_arch is None:
        return mode, why
    d_mode, d_why = draft_rollback(draft_arch, None)
    if d_mode == mode:
        return mode, why if draft_arch == target_arch else f"{why}; the draft model, {draft_arch}, rolls back alike"
    return mode, f"{why}; the draft model's context: {d_mode} ({d_why})"


def draft_rollback(architecture: str | None, kind: str | None) -> tuple[str, str]:
    """``(mode, why)`` of a draft model's context: llama-server opens it with ``n_rs_seq = 0`` (common/common.cpp),
    so it never keeps snapshots: seq_rm for a KV cache, checkpoint and replay for a recurrent state."""
    return choose_rollback(architecture, kind, "draft-simple", 0)


def file_architecture(path: str | os.PathLike[str]) -> str | None:
    """``general.architecture`` from a GGUF file's header (no weights, no tokenizer arrays); None when unreadable."""
    from .tiny_drafters.dflash import scan_header

    try:
        kv, _ = scan_header(path)
    except Exception:  # a damaged header (any way it breaks): the load says what is wrong with the file
        return None
    arch = kv.get("general.architecture")
    return arch if isinstance(arch, str) else None


def check_mode(mode: str, architecture: str | None, kind: str | None = None) -> None:
    """Refuse a rollback mode this architecture's memory cannot run, naming the ones it can."""
    if mode == AUTO:
        return
    if mode not in MODES:
        raise ConfigError(f"rollback must be one of auto, {', '.join(MODES)} (got {mode!r})", setting="rollback")
    kind = kind or memory_kind(architecture)
    ok = allowed_modes(architecture, kind)
    if mode in ok:
        return
    if mode == SNAPSHOTS:
        raise snapshots_refused(architecture, kind)
    raise ConfigError(f"the seq-rm rollback cannot run on {architecture or 'this model'}: its {kind} memory keeps a "
                      f"recurrent state that llama_memory_seq_rm cannot cut; it allows {', '.join(ok)} (or auto)",
                      setting="rollback")


def snapshots_refused(architecture: str | None, kind: str | None = None) -> ConfigError:
    """The refusal of snapshots where llama.cpp clamps n_rs_seq to 0, naming the modes the architecture allows."""
    ok = allowed_modes(architecture, kind)
    what = "a KV cache only" if (kind or memory_kind(architecture)) == ATTENTION else "a recurrent state"
    return ConfigError(f"the snapshots rollback cannot run on {architecture or 'this model'} ({what}): llama.cpp keeps "
                       "recurrent-state snapshots (n_rs_seq) only for " + ", ".join(sorted(RS_ROLLBACK_ARCHS))
                       + f" and clamps the request to 0 for any other; it allows {', '.join(ok)} (or auto)",
                       setting="rollback")


#: the ways a context drops tokens, counted per context (``ContextMemory.stats.used``) and per arm in the trace:
#: a plain ``llama_memory_seq_rm``; llama.cpp's n_rs_seq snapshot selected by ``seq_rm``; a state kept by a copy
#: after a single-token pass, loaded back; a checkpoint loaded back; the tokens decoded again after a restore
MECHANISMS = ("seq-rm", "n_rs_seq", "state-copy", "checkpoint", "replay")
STATE_COPY = "state-copy"


@dataclass
class MemoryStats:
    """What the rollbacks of one context did and cost, for the trace and the benchmarks (it outlives a reopen)."""

    used: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MECHANISMS, 0))  # rollbacks per mechanism
    checkpoints: int = 0
    checkpoint_bytes: int = 0  # the last checkpoint's size
    checkpoint_seconds: float = 0.0
    restore_seconds: float = 0.0
    kept_states: int = 0  # single-token passes whose state was copied
    kept_seconds: float = 0.0
    replayed_tokens: int = 0

    def count(self, mechanism: str, n: int = 1) -> None:
        self.used[mechanism] += n

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["used"] = dict(self.used)
        for k in ("checkpoint_seconds", "restore_seconds", "kept_seconds"):
            d[k] = round(d[k], 6)
        return d


@dataclass
class ContextMemory:
    """The rollback of one llama.cpp context (sequence 0): what it holds, its checkpoint, its kept states.

    ``decode(tokens)`` is the engine's own forward pass (it appends to the
    context and calls :meth:`decoded`), used for replays.  With ``by_checkpoint``
    a snapshot context never selects an n_rs_seq snapshot: it saves a checkpoint
    before the tokens a rollback may drop and rolls back by restoring it and
    decoding the kept tokens again (the diagnosis' snapshot check, which must
    give the text of the snapshot rollbacks without walking their path).
    """

    ll: Any
    ctx: Any
    mode: str
    depth: int  # n_rs_seq as llama.cpp made it (0 unless snapshots)
    decode: Callable[[Sequence[int]], None]
    tokens: list[int] = field(default_factory=list)  # what the context holds, in order
    passes: list[int] = field(default_factory=list)  # the width of each forward pass that wrote them
    stats: MemoryStats = field(default_factory=MemoryStats)
    by_checkpoint: bool = False
    _ckpt: tuple[int, Any] | None = None
    _kept: dict[int, Any] = field(default_factory=dict)
    _keeping: bool = False
    _pending: bool = False  # a snapshot rollback llama.cpp applies at the next decode (one at a time)
    _dropped: list[int] | None = None  # what a checkpoint restore dropped: decoding it again is a replay
    _size: int = 0  # the sequence state's size in bytes, once known (a recurrent state's is fixed)
    _spare: Any = None  # the previous checkpoint's buffer, filled again by the next one

    @property
    def mem(self) -> Any:
        return self.ll.llama_get_memory(self.ctx)

    # -- what the engine reports ----------------------------------------------------------------------------
    def mode_for(self, n_drop: int) -> str:
        """How a rollback of up to ``n_drop`` tokens after the next pass will be done."""
        if self.mode == SNAPSHOTS and n_drop > self.depth:
            return CHECKPOINT  # llama-server too: a draft longer than n_rs_seq takes a checkpoint
        return self.mode

    def prepare(self, n_drop: int) -> str:
        """Before tokens of which up to ``n_drop`` may be dropped again: save what that rollback needs."""
        if self._kept:
            self._kept.clear()
        self._keeping = False
        if n_drop <= 0:
            return ""
        mode = self.mode_for(n_drop)
        if mode == CHECKPOINT or (mode == SNAPSHOTS and self.by_checkpoint):
            self.checkpoint()
        elif mode == SNAPSHOTS:
            self._keeping = True  # single-token passes keep a copy; a wider decode keeps llama.cpp's snapshots
        return mode

    # -- state copies ---------------------------------------------------------------------------------------
    def state(self, buf: Any = None) -> Any:
        """The sequence's state (its recurrent part) as a ctypes byte array (``buf`` when it is of the right size)."""
        ll = self.ll
        n = self._size or int(ll.llama_state_seq_get_size_ext(self.ctx, 0, _PARTIAL_ONLY))
        if buf is None or len(buf) != max(n, 1):
            buf = (ctypes.c_ubyte * max(n, 1))()
        got = int(ll.llama_state_seq_get_data_ext(self.ctx, buf, n, 0, _PARTIAL_ONLY))
        if got != n:
            if self._size:  # the size changed (another memory layout): ask again
                self._size = 0
                return self.state()
            raise EvalError(f"llama.cpp wrote {got} bytes of a {n}-byte sequence state")
        self._size = n
        return buf

    def load(self, data: Any, n: int) -> None:
        """Restore a state saved at position ``n`` and drop every KV entry from ``n`` on."""
        ll = self.ll
        if self._size:
            got = int(ll.llama_state_seq_set_data_ext(self.ctx, data, self._size, 0, _PARTIAL_ONLY))
            if got != self._size:
                raise EvalError(f"llama.cpp read {got} bytes of a {self._size}-byte sequence state at position {n}")
        if not ll.llama_memory_seq_rm(self.mem, 0, n, -1):
            raise EvalError(f"llama.cpp refused to remove positions >= {n} after restoring the state there")
        self._pending = False
        self._cut(n)

    def checkpoint(self) -> int:
        """Save the sequence state at the current position; returns its size in bytes."""
        t0 = time.perf_counter()
        buf = self._spare if self._ckpt is None else self._ckpt[1]
        data = self.state(buf)
        self._ckpt, self._spare = (len(self.tokens), data), None
        self.stats.checkpoints += 1
        self.stats.checkpoint_bytes = self._size
        self.stats.checkpoint_seconds += time.perf_counter() - t0
        return self._size

    def before_decode(self, width: int) -> None:
        if self._keeping and width == 1 and len(self.tokens) not in self._kept:
            self._keep()

    def decoded(self, tokens: Sequence[int]) -> None:
        """The engine decoded ``tokens`` in one pass."""
        if self._dropped is not None:
            if self._dropped and self._dropped[0] == tokens[0]:  # the restore's first dropped token, fed again
                self.stats.count("replay")
                self.stats.replayed_tokens += len(tokens)
            self._dropped = None
        self.tokens.extend(tokens)
        self.passes.append(len(tokens))
        self._pending = False
        if self._keeping and len(tokens) == 1:
            self._keep()

    def _keep(self) -> None:
        t0 = time.perf_counter()
        self._kept[len(self.tokens)] = self.state()
        self.stats.kept_states += 1
        self.stats.kept_seconds += time.perf_counter() - t0

    def _cut(self, n: int) -> None:
        """Bookkeeping: the context now holds ``tokens[:n]``."""
        total = len(self.tokens)  # == sum(self.passes)
        del self.tokens[n:]
        passes = self.passes
        while passes and total - passes[-1] >= n:  # the passes wholly at or past n, from the last one back
            total -= passes.pop()
        if passes and total > n:
            passes[-1] -= total - n
        if self._ckpt is not None and self._ckpt[0] > n:
            self._ckpt, self._spare = None, self._ckpt[1]
        if self._kept:
            for p in [p for p in self._kept if p > n]:
                del self._kept[p]

    def copy_from(self, other: "ContextMemory") -> None:
        """Bookkeeping after this context's state became a copy of ``other``'s (no checkpoint, no kept state)."""
        self.tokens[:] = other.tokens
        self.passes[:] = other.passes
        self._ckpt, self._pending, self._keeping, self._dropped = None, False, False, None
        self._kept.clear()

    def clear(self) -> None:
        self.ll.llama_memory_seq_rm(self.mem, 0, 0, -1)
        self._pending = False
        self._ckpt = None
        self._kept.clear()
        self._keeping = False
        self._dropped = None
        self.tokens.clear()
        self.passes.clear()

    # -- the rollback -----------------------------------------------------------------------------------------
    def truncate(self, n: int) -> Rollback | None:
        """Make the context hold exactly ``tokens[:n]``; returns how (None when nothing was dropped)."""
        have = len(self.tokens)
        if n >= have:
            return None
        self._keeping = False  # what prepare() armed is spent
        if n == 0:
            self.clear()
            return Rollback(SEQ_RM)
        if self.mode == SEQ_RM:
            if not self.ll.llama_memory_seq_rm(self.mem, 0, n, -1):
                raise EvalError(f"llama.cpp refused to remove KV positions >= {n} (this model's memory cannot roll "
                                "back by llama_memory_seq_rm; use --rollback checkpoint)")
            self._cut(n)
            self.stats.count("seq-rm")
            return Rollback(SEQ_RM)
        drop = have - n
        if self.mode == SNAPSHOTS and not self.by_checkpoint and not self._pending and drop <= self.depth \
                and self.passes and drop < self.passes[-1]:
            # llama.cpp picks the state kept `drop` tokens back in the last decode
            if not self.ll.llama_memory_seq_rm(self.mem, 0, n, -1):
                raise EvalError(f"llama.cpp refused a snapshot rollback of {drop} tokens (n_rs_seq {self.depth})")
            self._pending = True
            self._cut(n)
            self.stats.count("n_rs_seq")
            return Rollback(SNAPSHOTS)
        if self.mode == SNAPSHOTS and n in self._kept:
            t0 = time.perf_counter()
            self.load(self._kept[n], n)
            self.stats.count(STATE_COPY)
            self.stats.restore_seconds += time.perf_counter() - t0
            return Rollback(STATE_COPY)
        return self.restore(n)

    def restore(self, n: int) -> Rollback:
        """The checkpoint at or before ``n`` restored (or an empty state), then the tokens up to ``n`` replayed."""
        old = list(self.tokens)
        t0 = time.perf_counter()
        if self._ckpt is not None and self._ckpt[0] <= n:
            c, data = self._ckpt
            self.load(data, c)
            self.stats.count("checkpoint")
            self.stats.restore_seconds += time.perf_counter() - t0
            replay = old[c:n]
            self._dropped = old[c:]
            if replay:
                self.decode(replay)  # counted as a replay by decoded()
            return Rollback(CHECKPOINT, replay=len(replay))
        # no checkpoint covers n: the context's own passes again, with their own widths, from an empty state
        widths = list(self.passes)
        self.clear()
        self.stats.count("replay")
        start = 0
        for w in widths:
            if start >= n:
                break
            chunk = old[start:min(start + w, n)]
            self.decode(chunk)
            start += len(chunk)
        self.stats.replayed_tokens += n
        return Rollback(CHECKPOINT, replay=n)
