"""The MLX model (weights and tokenizer, loaded once) and the engine (one KV cache on it).

* Weights are loaded once per folder (:class:`MLXModel`); every arm, drafter and
  replay gets its own KV cache (:class:`MLXEngine`) on the same weights.
* ``eval`` runs ONE forward pass over the new tokens with the engine's prompt
  cache and converts only the logits rows asked for to float32 numpy.  Where
  the model's logits are exactly ``head(inner(x))`` (checked once per model),
  the output head runs only on those rows.
* ``truncate`` trims the cache exactly (``trim_prompt_cache``).  Hybrid and
  recurrent models, whose ``ArraysCache`` entries mlx-lm cannot trim (and on
  which mlx-lm refuses to speculate), are rolled back by checkpoint, restore and
  replay (:mod:`.rollback`); a cache that allows neither is refused, clearly.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...core import activity
from ...core.config import EngineSettings
from ...core.engine import ModelEngine, VocabInfo
from ...core.errors import EvalError, ModelFileError, SpecviewError
from .folders import (
    _memory_quantization,
    _read_config,
    _text_cfg,
    check_model_folder,
    display_name,
    folder_quantization,
    folder_size,
    kv_group_size,
)
from .lib import _kind_of, _mx, _Pieces, _tokenizer_kind, _wire_memory, mlx_environment
from .rollback import CheckpointRollback, MLXRollback, describe, stuck

_KV_BITS = {"f16": None, "bf16": None, "f32": None, "q8_0": 8, "q5_0": 5, "q5_1": 5, "q4_0": 4, "q4_1": 4}


# -- the model -------------------------------------------------------------------------
class MLXModel:
    """One MLX model folder's weights and tokenizer, loaded once.

    ``MLXModel(path)`` loads a folder with mlx-lm.  Tests and tools that build a
    model in memory use :meth:`from_parts` with an ``nn.Module`` and an mlx-lm
    ``TokenizerWrapper``.
    """

    def __init__(self, path: str | os.PathLike[str], *, lazy: bool = False):
        _mx()
        folder = Path(path).expanduser().resolve()
        check_model_folder(folder)
        from mlx_lm.utils import load_model, load_tokenizer

        cfg = _read_config(folder)
        t0 = time.perf_counter()
        try:
            model, config = load_model(folder, lazy=lazy)
        except ValueError as exc:
            arch = _text_cfg(cfg, "model_type")
            raise ModelFileError(
                f"{folder}: mlx-lm cannot build this model (architecture {arch!r}): {exc}. "
                "Upgrade mlx-lm (`pip install -U mlx-lm`) or convert the model again with mlx_lm.convert."
            ) from exc
        except Exception as exc:
            raise ModelFileError(f"{folder}: the MLX weights could not be loaded ({type(exc).__name__}: {exc})") from exc
        try:
            tokenizer = load_tokenizer(folder, eos_token_ids=config.get("eos_token_id", None))
        except Exception as exc:
            raise ModelFileError(
                f"{folder}: the tokenizer could not be loaded ({type(exc).__name__}: {exc}); "
                "the folder needs tokenizer.json or tokenizer.model with tokenizer_config.json"
            ) from exc
        self._setup(model, tokenizer, config, folder, time.perf_counter() - t0)
        _wire_memory()

    @classmethod
    def from_parts(cls, model: Any, tokenizer: Any, config: dict[str, Any], *,
                   path: str | os.PathLike[str] = "<memory>") -> "MLXModel":
        """Wrap an already built ``nn.Module`` and ``TokenizerWrapper`` (no files needed).

        ``config`` is the model's config dict (``model_type``, ``vocab_size``,
        optionally ``quantization``); ``path`` only names the model in facts.
        """
        _mx()
        if not hasattr(tokenizer, "detokenizer"):
            from mlx_lm.tokenizer_utils import TokenizerWrapper

            tokenizer = TokenizerWrapper(tokenizer)
        self = cls.__new__(cls)
        self._setup(model, tokenizer, dict(config), Path(path), 0.0)
        return self

    def _setup(self, model: Any, tokenizer: Any, config: dict[str, Any], folder: Path, load_seconds: float) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.path = folder
        self.load_seconds = load_seconds
        self.n_ctx_train = _text_cfg(config, "max_position_embeddings")
        nv = _text_cfg(config, "vocab_size")
        self.n_vocab = int(nv) if nv else self._probe_vocab()
        self.kind = _tokenizer_kind(folder, tokenizer) if folder.is_dir() else _kind_of(tokenizer)
        self._pieces = _Pieces(tokenizer, self.kind, self.n_vocab)
        self._vocab: VocabInfo | None = None
        self._facts: dict[str, Any] | None = None
        self._split: tuple[Any, ...] | None = None
        self.engines = 0

    @property
    def split_head(self) -> tuple[Any, Any] | None:
        """(inner model, output head) when logits == head(inner(x)) exactly for this model, else None.

        With it, ``eval`` runs the output head only on the rows asked for, so a
        prefill chunk never computes (chunk x n_vocab) logits it throws away.  It
        is checked once, on a short probe, against the model's own ``__call__``:
        an architecture that does anything more (logit soft-capping, scaling)
        fails the check and keeps the plain full call.
        """
        if self._split is None:
            self._split = self._find_split_head() or ()
        return self._split or None

    def _find_split_head(self) -> tuple[Any, Any] | None:
        mx = _mx()
        from mlx_lm.models.cache import make_prompt_cache

        m = self.model
        inner = getattr(m, "model", None)
        if inner is None or not callable(inner):
            return None
        head = getattr(m, "lm_head", None)
        if head is None:  # models that wrap a text model (qwen3_5) keep its head there
            head = getattr(getattr(m, "language_model", None), "lm_head", None)
        if head is None:
            emb = getattr(inner, "embed_tokens", None)
            head = getattr(emb, "as_linear", None)
        if head is None:
            return None
        try:
            ids = [i % self.n_vocab for i in (1, 2, 3, 5, 8)]
            x = mx.array(ids, dtype=mx.uint32)[None]
            full = m(x, cache=make_prompt_cache(m))
            split = head(inner(x, cache=make_prompt_cache(m)))
            mx.eval(full, split)
            if full.shape == split.shape and bool(mx.array_equal(full, split).item()):
                return inner, head
        except Exception:
            return None
        return None

    def rollback_facts(self) -> dict[str, Any]:
        """How a context on this model rolls back: ``rollback`` (seq-rm, checkpoint or none) and, where
        mlx-lm itself refuses to speculate on the model, ``rollback_note``: one line saying so."""
        from mlx_lm.models.cache import make_prompt_cache

        mode, note = describe(make_prompt_cache(self.model))
        return {"rollback": mode, **({"rollback_note": note} if note else {})}

    def _probe_vocab(self) -> int:
        mx = _mx()
        from mlx_lm.models.cache import make_prompt_cache

        out = self.model(mx.array([[0]], dtype=mx.uint32), cache=make_prompt_cache(self.model))
        return int(out.shape[-1])

    # -- facts ---------------------------------------------------------------------
    @property
    def vocab(self) -> VocabInfo:
        if self._vocab is None:
            tok = self.tokenizer
            bos = getattr(tok, "bos_token_id", None)
            eos = getattr(tok, "eos_token_id", None)
            try:
                probe = list(tok.encode("a"))
            except Exception:
                probe = []
            add_bos = bool(bos is not None and probe[:1] == [bos])
            add_eos = bool(eos is not None and len(probe) > 1 and probe[-1] == eos)
            eog = {int(t) for t in (getattr(tok, "eos_token_ids", None) or ())}
            if eos is not None:
                eog.add(int(eos))
            self._vocab = VocabInfo(
                n_vocab=self.n_vocab,
                vocab_type=self.kind,
                bos=None if bos is None else int(bos),
                eos=None if eos is None else int(eos),
                add_bos=add_bos,
                add_eos=add_eos,
                eog=frozenset(t for t in eog if 0 <= t < self.n_vocab),
                texts=self._pieces.raw,
            )
        return self._vocab

    def facts(self) -> dict[str, Any]:
        if self._facts is None:
            folder = self.path
            on_disk = folder.is_dir()
            q = folder_quantization(folder, self.config) if on_disk else _memory_quantization(self.config)
            try:
                from mlx_lm.utils import get_total_parameters

                n_params = int(get_total_parameters(self.model))
            except Exception:
                n_params = None
            name = display_name(folder)
            self._facts = {
                "path": str(folder),
                "file": name,
                "file_size": folder_size(folder) if on_disk else None,
                "backend": "mlx",
                "architecture": _text_cfg(self.config, "model_type"),
                "name": name,
                "description": f"{_text_cfg(self.config, 'model_type')} {q['label']}",
                "quantization": q["label"],
                "quant_bits": q["bits"],
                "quant_group_size": q["group_size"],
                "quant_mode": q["mode"],
                "dtype": q["dtype"],
                "n_params": n_params,
                "n_vocab": self.n_vocab,
                "vocab_type": self.vocab.vocab_type,
                "vocab_fingerprint": self.vocab.fingerprint(),
                "n_ctx_train": self.n_ctx_train,
                "load_seconds": round(self.load_seconds, 3),
            }
            self._facts.update(self.rollback_facts())
        return dict(self._facts)

    # -- text ----------------------------------------------------------------------
    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        tok = self.tokenizer
        if chat:
            if not getattr(tok, "has_chat_template", False):
                raise SpecviewError(
                    f"{self.path.name} has no chat template; run without --chat to feed the prompt as plain text"
                )
            try:
                ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True)
            except Exception as exc:
                raise SpecviewError(
                    f"{self.path.name}: its chat template failed ({type(exc).__name__}: {exc}); "
                    "run without --chat, or pass the already formatted prompt"
                ) from exc
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        return [int(t) for t in tok.encode(text)]

    def piece_bytes(self, token: int) -> bytes:
        return self._pieces.bytes_of(int(token))

    def piece(self, token: int) -> str:
        return self.piece_bytes(token).decode("utf-8", "replace")

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece_bytes(t) for t in tokens).decode("utf-8", "replace")

    def close(self) -> None:
        """Weights are freed when the last engine and this object are gone."""


# -- the engine ------------------------------------------------------------------------
class MLXEngine(CheckpointRollback, ModelEngine):
    """One KV cache (``mlx_lm.models.cache.make_prompt_cache``) on a shared :class:`MLXModel`.

    Greedy run-ahead: mlx-lm's ``generate_step`` overlaps building the next
    step's graph with computing the current one (``mx.async_eval``).  The engine
    does the same once a caller has fed back the argmax of the previous row
    ``PREFETCH_AFTER`` times in a row (the vanilla arm's steady state; a
    draft-simple drafter with n_max <= 3 gets there only when its draft of a
    round follows its own argmax from a single-token sync): before waiting on a
    single-token pass it queues the T = 1 pass of that row's argmax.  If the
    next ``eval`` is exactly that token, its logits are those of the queued pass
    (the same shape, so the same numbers); anything else (another token, a
    batch, ``truncate``) first trims the queued position off the cache.  While
    a pass is queued the cache holds ``n_past + 1`` positions; ``n_past`` and
    every result are as if it never ran.  Only plain and quantized KV caches,
    whose trim always works, run ahead.

    Rollback (:mod:`.rollback`): ``rollback_mode()`` is ``"seq-rm"`` where
    every cache entry can be trimmed (mlx-lm's own way) and ``"checkpoint"``
    where some cannot (the recurrent ``ArraysCache`` entries of a hybrid
    model): ``prepare_rollback`` keeps a checkpoint, ``truncate`` restores it.
    After each ``truncate`` that moved ``n_past``, ``last_rollback`` says how it
    was done (:class:`~.rollback.MLXRollback`: the mode, the checkpoint
    restored, the width of every pass fed again); a checkpoint ``truncate``
    returns it too.  ``restores``, ``replay_passes`` and ``replayed_tokens``
    count the restores and what the engine fed again; :meth:`rollbacks` counts
    every rollback by mechanism.
    """

    backend = "mlx"
    #: consecutive argmax-following single-token evals before the engine runs ahead
    PREFETCH_AFTER = 3

    def __init__(self, model: MLXModel, settings: EngineSettings = EngineSettings(), *, n_ctx: int | None = None):
        super().__init__()
        self._mxm = _mx()
        self.model = model
        self.settings = settings
        kv = settings.kv_type.lower()
        if kv not in _KV_BITS:
            raise SpecviewError(f"KV cache type {settings.kv_type!r} is not one of {', '.join(_KV_BITS)}")
        self._kv_bits = _KV_BITS[kv]
        self._n_ctx = int(n_ctx or settings.n_ctx or 4096)
        self._n_batch = int(settings.n_batch)
        self._n_vocab = model.n_vocab
        mx = self._mxm
        if hasattr(mx, "new_thread_local_stream"):
            self._tls_stream = mx.new_thread_local_stream(mx.default_device())
        else:  # pragma: no cover - older mlx
            self._tls_stream = None
        self._streams: dict[int, Any] = {}
        self.cache = self._new_cache()
        #: how the last truncate that moved n_past was done (None before any, and after a no-op truncate)
        self.last_rollback: MLXRollback | None = None
        self.restores = 0  # checkpoint restores
        self._used: dict[str, int] = {}  # rollbacks by mechanism (Engine.rollbacks)
        self.replay_passes = 0
        self.replayed_tokens = 0
        # greedy run-ahead (see the class docstring)
        self._pending: tuple[Any, Any] | None = None
        self._next_greedy: int | None = None
        self._streak = 0
        self.prefetched = 0
        self.prefetch_hits = 0
        model.engines += 1
        self._closed = False

    def _new_cache(self) -> list[Any]:
        from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

        cache = make_prompt_cache(self.model.model)
        if self._kv_bits is not None:
            group = self._kv_group_size()
            cache = [QuantizedKVCache(group_size=group, bits=self._kv_bits) if type(c) is KVCache else c
                     for c in cache]
        return cache

    def _kv_group_size(self) -> int:
        return kv_group_size(self.model.config, name=self.model.path.name)

    def _stream(self) -> Any:
        if self._tls_stream is not None:
            return self._tls_stream
        tid = threading.get_ident()  # pragma: no cover - older mlx
        s = self._streams.get(tid)
        if s is None:
            s = self._mxm.new_stream(self._mxm.default_device())
            self._streams[tid] = s
        return s

    # -- facts ---------------------------------------------------------------------
    def environment(self) -> dict[str, Any]:
        return mlx_environment()

    @property
    def can_truncate(self) -> bool:
        """Whether the cache can be rolled back now (trimmed, or restored from a checkpoint)."""
        from mlx_lm.models.cache import can_trim_prompt_cache

        if self._checkpointing:
            return not stuck(self.cache)
        return bool(can_trim_prompt_cache(self.cache))

    # -- evaluation ----------------------------------------------------------------
    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        toks, rows = self.checked(tokens, rows, batch_limit=False)  # MLX takes any batch in one pass
        n = len(toks)
        n_vocab = self._n_vocab
        if not rows:  # extend the cache only
            self.eval(toks, [n - 1])
            return np.empty((0, n_vocab), dtype=np.float32)
        mx = self._mxm
        pos0 = self.n_past
        if activity.active:
            activity.doing(f"a {n}-token pass at position {pos0} of {self.model.path.name}")
        follows = n == 1 and toks[0] == self._next_greedy
        self._streak = self._streak + 1 if follows else 0
        self._next_greedy = None
        t0 = time.perf_counter()
        try:
            with mx.stream(self._stream()):
                sel = None
                queued_tok = None
                pending, self._pending = self._pending, None
                if pending is not None:
                    if follows and rows == [0]:
                        # the queued pass fed the argmax of the row we returned last time, which is
                        # this token (checked against the device's own argmax below)
                        queued_tok, sel = pending
                    else:
                        self._drop_prefetch()
                if sel is None:
                    if self._history is not None:
                        self._history.before_pass(pos0, n)
                    sel = self._forward(mx, toks, rows)
                    mx.async_eval(sel)
                launched = self._maybe_run_ahead(mx, sel, n, rows, pos0)
                if queued_tok is not None:
                    if int(queued_tok.item()) == toks[0]:
                        self.prefetch_hits += 1
                    else:  # the device broke a tie differently from numpy: undo both queued passes
                        if launched:
                            self._drop_prefetch()
                        self._drop_prefetch()
                        sel = self._forward(mx, toks, rows)
                mx.eval(sel, *self._states())
            out = np.array(sel, dtype=np.float32, copy=True)
        except Exception as exc:
            self.eval_seconds += time.perf_counter() - t0
            self._pending = None
            raise EvalError(f"the MLX forward pass failed at position {pos0} ({n} tokens): "
                            f"{type(exc).__name__}: {exc}") from exc
        self.eval_seconds += time.perf_counter() - t0
        self.n_evals += 1
        self.n_past = pos0 + n
        if self._history is not None:
            self._history.after_pass(pos0, toks)
        if out.shape != (len(rows), n_vocab):  # pragma: no cover - a model whose head differs from config
            raise EvalError(f"the model returned logits of shape {out.shape}, expected {(len(rows), n_vocab)}")
        if rows[-1] == n - 1:
            self._next_greedy = int(np.argmax(out[-1]))
        return out

    def _forward(self, mx: Any, toks: list[int], rows: list[int]) -> Any:
        """The lazy float32 logits rows of one forward pass over ``toks`` (appends to the cache)."""
        n = len(toks)
        x = mx.array(toks, dtype=mx.uint32)[None]
        split = self.model.split_head if len(rows) < n else None
        if split is not None:
            inner, head = split
            sel = head(_take_rows(mx, inner(x, cache=self.cache)[0], rows))
        else:
            sel = _take_rows(mx, self.model.model(x, cache=self.cache)[0], rows)
        return sel.astype(mx.float32)

    def _maybe_run_ahead(self, mx: Any, sel: Any, n: int, rows: list[int], pos0: int) -> bool:
        """Queue the T = 1 pass of the last row's argmax, once the caller has shown it follows argmax."""
        if (self._streak < self.PREFETCH_AFTER or rows[-1] != n - 1
                or pos0 + n + 1 > self._n_ctx or not self._prefetchable()):
            return False
        nxt_tok = mx.argmax(sel[-1], axis=-1).astype(mx.uint32)
        nxt = self.model.model(nxt_tok.reshape(1, 1), cache=self.cache)[0][0:1].astype(mx.float32)
        mx.async_eval(nxt_tok, nxt)
        self._pending = (nxt_tok, nxt)
        self.prefetched += 1
        return True

    def _prefetchable(self) -> bool:
        """Only caches whose trim(1) always works may run ahead."""
        return all(type(c).__name__ in ("KVCache", "QuantizedKVCache") for c in self.cache)

    def _drop_prefetch(self) -> None:
        """Forget the greedy token run ahead at position n_past (its pass may still be running)."""
        from mlx_lm.models.cache import trim_prompt_cache

        self._pending = None
        if trim_prompt_cache(self.cache, 1) != 1:  # pragma: no cover - guarded by _prefetchable
            raise EvalError(f"{self.model.path.name}: could not drop a prefetched position from the MLX cache")

    def truncate(self, n: int) -> MLXRollback | None:
        if n < 0 or n > self.n_past:
            raise ValueError(f"cannot truncate to {n}: the context holds {self.n_past} tokens")
        self.last_rollback = None
        if self._history is not None:
            self._history.fresh = True  # the next pass starts a checkpoint, wherever this one leaves the cache
        if n == self.n_past:
            return
        self._streak = 0
        self._next_greedy = None
        n_from = self.n_past
        if n == 0:
            self._pending = None
            self.cache = self._new_cache()
            self.n_past = 0
            return None
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        if self._pending is not None:
            self._drop_prefetch()
        if self._checkpointing:
            return self._roll_back(n)
        if not can_trim_prompt_cache(self.cache):
            self._refuse(sorted({type(c).__name__ for c in self.cache if not c.is_trimmable()}))
        want = self.n_past - n
        got = trim_prompt_cache(self.cache, want)
        self._check_offsets(n, f"the MLX cache trimmed {got} of {want} positions" if got != want else "")
        self.n_past = n
        self.last_rollback = MLXRollback("seq-rm", n_from=n_from, n_to=n)
        self._used["seq-rm"] = self._used.get("seq-rm", 0) + 1
        return None

    def rollbacks(self) -> dict[str, int]:
        """How many rollbacks this context has done, by mechanism: a trim (``seq-rm``), a checkpoint restore, and
        the restores that fed tokens again (``replay``)."""
        return dict(self._used)

    def sibling(self, *, n_ctx: int | None = None) -> "MLXEngine":
        return MLXEngine(self.model, self.settings, n_ctx=n_ctx or self._n_ctx)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pending = None
            self.cache = []
            self.model.engines -= 1


def _take_rows(mx: Any, a: Any, rows: list[int]) -> Any:
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return a[rows[0]:rows[0] + len(rows)]
    return mx.take(a, mx.array(rows, dtype=mx.int32), axis=0)
