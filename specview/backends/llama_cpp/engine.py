"""One llama.cpp context on shared weights: the :class:`~specview.core.engine.Engine` for GGUF files.

Every size specview uses comes from the context llama.cpp actually made, read
back with ``llama_n_ctx``, ``llama_n_batch`` and ``llama_n_ubatch``: llama.cpp
clamps ``n_batch`` to ``n_ctx`` (``-c 16`` gives ``n_batch`` 16 whatever ``-b``
says), pads ``n_ctx`` to a multiple of 256 and clamps ``n_ubatch`` to
``n_batch``.  Logits are requested only for the rows asked for, so memory is
O(n_vocab x n_batch), never O(n_ctx x n_vocab).

A context rolls back as its decided settings say (``settings.rollback``, which
:meth:`.backend.LlamaBackend.decide` sets to what llama-server does): a KV cache by
``llama_memory_seq_rm``, a recurrent or hybrid memory by n_rs_seq snapshots or
by a checkpoint and a replay (:class:`.memory.ContextMemory`).
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, Sequence

import numpy as np

from ...core import activity
from ...core.config import EngineSettings
from ...core.engine import ModelEngine, Rollback
from ...core.errors import ConfigError, EvalError, SpecviewError
from ...core.resolve import DecidedSettings, require_decided
from .lib import clear_log, llama_environment, recent_log, resolve_threads
from .memory import (SEQ_RM, ATTENTION, AUTO, HYBRID, RECURRENT, SNAPSHOTS, ContextMemory, MemoryStats, allowed_modes,
                     check_mode, snapshots_refused)
from .model import LlamaModel

_KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20,
             "bf16": 30}
_FLASH = {"auto": -1, "off": 0, "on": 1}
DEFAULT_N_CTX = 4096
#: the most bytes of logits one pass returns through the engine's own buffer (see LlamaEngine._rows_out)
_SMALL_COPY = 1 << 16
#: recurrent states a snapshot context keeps until a run plans more (llama.cpp's default draft n_max)
DEFAULT_RS_DEPTH = 3


def model_memory(model: LlamaModel) -> tuple[str, str]:
    """``(architecture, memory kind)`` of a loaded model, as llama.cpp itself classifies its memory."""
    ll = model._ll
    arch = model.meta("general.architecture") or ""
    if ll.llama_model_is_recurrent(model.ptr):
        return arch, RECURRENT
    if ll.llama_model_is_hybrid(model.ptr):
        return arch, HYBRID
    return arch, ATTENTION


class LlamaEngine(ModelEngine):
    """One llama.cpp context on a shared :class:`LlamaModel`."""

    backend = "llama.cpp"

    def __init__(self, model: LlamaModel, settings: DecidedSettings, *, n_ctx: int | None = None):
        super().__init__()
        settings = require_decided(settings, "a llama.cpp context")
        if getattr(model, "vocab_only", False):
            raise SpecviewError(f"{model.path.name} was read for its vocabulary only; it cannot evaluate tokens")
        ll = model._ll
        self._ll = ll
        self.model = model
        self.settings = settings
        n_ctx = int(n_ctx or settings.n_ctx or DEFAULT_N_CTX)
        if settings.flash_attn not in _FLASH:
            raise ConfigError(f"flash attention must be one of auto, on, off (got {settings.flash_attn!r})",
                              setting="flash_attn")
        kv_name = str(settings.kv_type).lower()
        if kv_name not in _KV_TYPES:
            raise ConfigError(f"KV cache type {settings.kv_type!r} is not one of {', '.join(_KV_TYPES)}",
                              setting="kv_type")
        for name, value in (("n_ctx", n_ctx), ("n_batch", settings.n_batch), ("n_ubatch", settings.n_ubatch)):
            if not 1 <= int(value) <= 2**31 - 1:
                raise ConfigError(f"{name} must be between 1 and {2**31 - 1} (got {value})", setting=name)
        cp = ll.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = settings.n_batch
        cp.n_ubatch = min(settings.n_ubatch, settings.n_batch)
        cp.n_seq_max = 1
        threads = resolve_threads(settings.threads)
        self.threads = threads  # what the run really used: the thread count can move the logits
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.flash_attn_type = _FLASH[settings.flash_attn]
        kv = _KV_TYPES[kv_name]
        cp.type_k = kv
        cp.type_v = kv
        cp.no_perf = True
        cp.op_offload = not settings.no_op_offload  # False: a -ngl 0 context computes every op on the CPU
        self._context_params(cp)
        self._cp = cp
        self.architecture, self.memory_kind = model_memory(model)
        if settings.rollback == AUTO and self.memory_kind != ATTENTION:  # LlamaBackend.decide reads the header
            raise ConfigError(f"no rollback was decided for this {self.architecture or 'model'}: its header gave "
                              "no architecture when the run was resolved; pass --rollback "
                              f"{' or '.join(allowed_modes(self.architecture, self.memory_kind))}",
                              setting="rollback")
        check_mode(settings.rollback, self.architecture, self.memory_kind)
        #: how this context rolls back: decided for the run (LlamaBackend.decide), or the draft model's own; a
        #: KV cache alone has one way, seq_rm, which no decision chooses
        self.rollback = SEQ_RM if settings.rollback == AUTO else settings.rollback
        self._rs_depth = DEFAULT_RS_DEPTH if self.rollback == SNAPSHOTS else 0
        #: what this context's rollbacks did, across every reopen (:meth:`plan_rollbacks`)
        self.stats = MemoryStats()
        self._by_checkpoint = False
        #: what was asked for; the sizes below are what llama.cpp made of it
        self.n_ctx_requested = n_ctx
        self.ctx = None
        self._open()
        self._batch = ll.llama_batch_init(self._n_batch, 0, 1)
        b = self._batch
        for i in range(self._n_batch):  # every token is of sequence 0: set once, not per pass
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
        self._n_vocab = model.n_vocab
        self._row_bytes = model.n_vocab * 4
        self._small_rows = _SMALL_COPY // self._row_bytes  # logits rows _rows_out's buffer holds (0: none)
        self._small: tuple[Any, int, np.ndarray] | None = None  # that buffer: (ctypes array, address, view)
        model.contexts += 1

    def _open(self) -> None:
        """Create the llama.cpp context (again, with another snapshot depth: :meth:`plan_rollbacks`)."""
        ll, model, cp = self._ll, self.model, self._cp
        cp.n_rs_seq = self._rs_depth
        clear_log()
        ctx = ll.llama_init_from_model(model.ptr, cp)
        if not ctx:
            raise SpecviewError(
                f"llama.cpp could not create a context of {self.n_ctx_requested} tokens for {model.path.name} "
                f"(out of memory, or settings this build does not support).\nllama.cpp said:\n{recent_log(6)}"
            )
        depth = int(ll.llama_n_rs_seq(ctx))
        if self.rollback == SNAPSHOTS and depth < self._rs_depth:  # llama.cpp clamped the request
            ll.llama_free(ctx)
            raise snapshots_refused(self.architecture, self.memory_kind)
        self.ctx = ctx
        self.mem = ll.llama_get_memory(ctx)
        self._n_ctx = int(ll.llama_n_ctx(ctx))
        self._n_batch = int(ll.llama_n_batch(ctx))
        self._n_ubatch = int(ll.llama_n_ubatch(ctx))
        self.memory = ContextMemory(ll, ctx, self.rollback, depth, self._decode_again, stats=self.stats,
                                    by_checkpoint=self._by_checkpoint)
        self.n_past = 0

    def _context_params(self, cp: Any) -> None:
        """Last word on the ``llama_context_params`` before the context is made (an observer sets ``cb_eval``)."""

    # -- facts -----------------------------------------------------------------
    @property
    def n_ubatch(self) -> int:
        """The micro-batch llama.cpp splits each forward pass into (at most ``n_batch``)."""
        return self._n_ubatch

    def sizes(self) -> dict[str, int]:
        """The context's real sizes and threads, as llama.cpp made them."""
        return {"n_ctx": self._n_ctx, "n_batch": self._n_batch, "n_ubatch": self._n_ubatch,
                "threads": self.threads}

    def environment(self) -> dict[str, Any]:
        return llama_environment()

    # -- evaluation ------------------------------------------------------------
    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        n = len(tokens)
        t = tokens[0] if n == 1 else None
        if (type(t) is int and 0 <= t < self._n_vocab and len(rows) == 1 and rows[0] in (0, -1)
                and self.n_past < self._n_ctx):
            tokens, rows = (t,), (0,)  # one token, one row: what checked() gives it, without its lists
        else:
            tokens, rows = self.checked(tokens, rows)
        ll = self._ll
        b = self._batch
        pos0 = self.n_past
        btok, bpos, blog = b.token, b.pos, b.logits
        for i, t in enumerate(tokens):
            btok[i] = t
            bpos[i] = pos0 + i
            blog[i] = 0
        for r in rows:
            blog[r] = 1
        b.n_tokens = n
        memory = self.memory
        memory.before_decode(n)
        if activity.active:
            activity.doing(f"a {n}-token pass at position {pos0} of {self.model.path.name}")
        t0 = time.perf_counter()
        rc = ll.llama_decode(self.ctx, b)
        if rc != 0:
            self.eval_seconds += time.perf_counter() - t0
            raise EvalError(f"llama_decode failed with status {rc} at position {pos0} ({n} tokens)")
        memory.decoded(tokens)
        out = self._rows_out(rows)
        self.eval_seconds += time.perf_counter() - t0
        self.n_evals += 1
        self.n_past = pos0 + n
        return out

    def _rows_out(self, rows: Sequence[int]) -> np.ndarray:
        """The logits of ``rows`` of the last pass, as a new ``(len(rows), n_vocab)`` array.

        Rows that fit in :data:`_SMALL_COPY` bytes (a small vocabulary's) go through a buffer whose address is
        known once, then are copied out of it: there an array's ``.ctypes.data`` would cost more than the copy.
        Larger ones go straight into the new array."""
        k = len(rows)
        size, ctx, get, move = self._row_bytes, self.ctx, self._ll.llama_get_logits_ith, ctypes.memmove
        if not 0 < k <= self._small_rows:
            out = np.empty((k, self._n_vocab), dtype=np.float32)
            base = out.ctypes.data
            for j, r in enumerate(rows):
                move(base + j * size, get(ctx, r), size)
            return out
        if self._small is None:
            buf = (ctypes.c_float * (self._small_rows * self._n_vocab))()
            self._small = (buf, ctypes.addressof(buf), np.frombuffer(buf, dtype=np.float32).reshape(-1, self._n_vocab))
        _, base, view = self._small
        for j, r in enumerate(rows):
            move(base + j * size, get(ctx, r), size)
        return view[:k].copy()

    def truncate(self, n: int) -> Rollback | None:
        if n < 0 or n > self.n_past:
            raise ValueError(f"cannot truncate to {n}: the context holds {self.n_past} tokens")
        how = self.memory.truncate(n) if n < self.n_past else None
        self.n_past = n
        return how

    def _decode_again(self, tokens: Sequence[int]) -> None:
        """A replay: ``tokens`` decoded again where the restored state ends, in passes of at most n_batch."""
        self.n_past = len(self.memory.tokens)
        for start in range(0, len(tokens), self._n_batch):
            chunk = tokens[start:start + self._n_batch]
            self.eval(chunk, rows=[len(chunk) - 1])

    # -- rollback ------------------------------------------------------------------
    def rollback_mode(self, n_drop: int) -> str:
        return self.memory.mode_for(n_drop)

    def prepare_rollback(self, n_drop: int) -> str:
        return self.memory.prepare(n_drop)

    def plan_rollbacks(self, n_drop: int) -> None:
        """A snapshot context keeps at least ``n_drop`` states from now on (it is opened again, empty)."""
        if self.rollback == SNAPSHOTS and n_drop > self._rs_depth:
            self._ll.llama_free(self.ctx)
            self.ctx = None
            self._rs_depth = n_drop
            self._open()

    def rollbacks(self) -> dict[str, int]:
        """How many rollbacks of each mechanism (:data:`.memory.MECHANISMS`) this context has done."""
        return dict(self.stats.used)

    def snapshots_by_checkpoint(self) -> bool:
        """From now on a snapshot context rolls back by a checkpoint and a replay, never by an n_rs_seq snapshot
        (the diagnosis' snapshot check); False where this context keeps no snapshots."""
        if self.rollback != SNAPSHOTS:
            return False
        self._by_checkpoint = self.memory.by_checkpoint = True
        return True

    @property
    def rollback_depth(self) -> int:
        """n_rs_seq as llama.cpp made it: the recurrent states each decode keeps (0 unless snapshots)."""
        return self.memory.depth

    def sibling(self, *, n_ctx: int | None = None) -> "LlamaEngine":
        return LlamaEngine(self.model, self.settings, n_ctx=n_ctx or self.n_ctx_requested)

    def close(self) -> None:
        if getattr(self, "ctx", None):
            self._ll.llama_batch_free(self._batch)
            self._ll.llama_free(self.ctx)
            self.ctx = None
            self.model.contexts -= 1

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
