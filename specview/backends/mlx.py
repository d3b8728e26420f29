"""The MLX engine, over mlx-lm (Apple silicon; ``mlx[cpu]`` on Linux).

* A model is an MLX model folder (``config.json``, ``model*.safetensors``,
  tokenizer files) as ``mlx_lm.convert`` writes it, or a Hugging Face id such as
  ``mlx-community/SmolLM2-135M-Instruct-8bit``, fetched when the user is online,
  or a ``demo:QUANT`` name: the bundled SmolLM2-135M-Instruct GGUF converted to
  MLX on first use (:func:`demo_folder`), so the demo runs without a network.
* Weights are loaded once per folder (:class:`MLXModel`); every arm, drafter and
  replay gets its own KV cache (:class:`MLXEngine`) on the same weights.
* ``eval`` runs ONE forward pass over the new tokens with the engine's prompt
  cache and converts only the logits rows asked for to float32 numpy.  Where
  the model's logits are exactly ``head(inner(x))`` (checked once per model),
  the output head runs only on those rows, so a prefill chunk does not compute
  (chunk x n_vocab) logits only to drop them.
  ``truncate`` trims the cache exactly (``trim_prompt_cache``), and refuses,
  clearly, for models whose cache cannot be rolled back (recurrent layers,
  a full rotating window): such a model cannot verify drafts.
* Quantization flipping: :func:`list_variants` lists the sibling folders of the
  same model (bf16, 8-bit, 4-bit ...) and :func:`derive_quantized` writes a
  quantized copy of a bf16/fp16/fp32 folder with mlx-lm's own converter into
  the user cache folder, atomically.

MLX is imported lazily: importing this module never needs mlx, and
``MLXBackend()`` raises :class:`BackendUnavailable` with the reason when mlx or
mlx-lm cannot be used here.

Threading: MLX streams are per thread.  Each engine owns one
``mx.new_thread_local_stream`` (the same mechanism as mlx-lm's
``generation_stream``) and runs every forward pass inside ``mx.stream(...)``
on it, so an engine works on whichever single thread drives it (the CLI's main
thread, or the GUI's model worker thread) without relying on that thread's
default stream.  On an mlx without thread-local streams the engine makes a plain
stream per calling thread instead.  Results are evaluated (``mx.eval``) before
``eval`` returns; the only work left in flight between calls is the one greedy
step an engine may run ahead (see :class:`MLXEngine`), on the same thread's
stream, so an engine must stay on the thread that uses it, as every engine must.

llama.cpp settings without an MLX meaning (``gpu_layers``, ``threads``,
``flash_attn``, ``n_ubatch``) are ignored.  ``kv_type`` ``f16``/``bf16``/``f32``
keep the KV cache in the model's dtype; ``q8_0``, ``q5_*`` and ``q4_*`` use
mlx-lm's quantized KV cache with 8, 5 or 4 bits from the first token on.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import platform
import re
import shutil
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..core.engine import (
    BackendUnavailable,
    Engine,
    EngineSettings,
    EvalError,
    ModelFileError,
    SpecviewError,
    VocabInfo,
)
from ..core.engine import WrappedModel
from ..core.session import InProcessBackend

__all__ = [
    "MLXBackend",
    "MLXEngine",
    "MLXLoaded",
    "MLXModel",
    "MLXVariant",
    "MLXDerivable",
    "derivable_variants",
    "derive_quantized",
    "list_variants",
    "folder_quantization",
    "display_name",
    "demo_folder",
    "gguf_to_mlx",
    "write_random_model",
]

INSTALL_HINT = "pip install 'specview[mlx]'"
_KV_BITS = {"f16": None, "bf16": None, "f32": None, "q8_0": 8, "q5_0": 5, "q5_1": 5, "q4_0": 4, "q4_1": 4}
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# -- availability -----------------------------------------------------------------
def _platform_problem() -> str | None:
    """Why MLX cannot run on this platform at all, or None."""
    if sys.platform == "darwin" and platform.machine() not in ("arm64", "aarch64"):
        return "MLX runs only on Apple silicon Macs (this Mac has an Intel CPU); use the llama.cpp engine"
    if sys.platform.startswith("win"):
        return "MLX does not run on Windows; use the llama.cpp engine"
    return None


def _mx():
    """Import mlx.core and mlx_lm, or say plainly why they cannot be used."""
    problem = _platform_problem()
    if problem:
        raise BackendUnavailable(problem)
    try:
        import mlx.core as mx
    except Exception as exc:  # ImportError, or a broken native library
        hint = INSTALL_HINT if sys.platform == "darwin" else f"{INSTALL_HINT} (installs mlx[cpu] on Linux)"
        raise BackendUnavailable(
            f"MLX is not usable here ({type(exc).__name__}: {exc}). Install it with `{hint}`."
        ) from exc
    try:
        import mlx_lm  # noqa: F401
    except Exception as exc:
        raise BackendUnavailable(
            f"mlx-lm is not usable here ({type(exc).__name__}: {exc}). Install it with `{INSTALL_HINT}`."
        ) from exc
    return mx


def mlx_environment() -> dict[str, Any]:
    mx = _mx()
    env: dict[str, Any] = {"mlx": getattr(mx, "__version__", None)}
    try:
        import mlx_lm

        env["mlx_lm"] = getattr(mlx_lm, "__version__", None)
    except Exception:  # pragma: no cover
        pass
    try:
        env["mlx_device"] = str(mx.default_device())
    except Exception:  # pragma: no cover
        pass
    try:
        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        env["mlx_device_info"] = {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in info.items()}
    except Exception:
        pass
    return env


# -- folders ------------------------------------------------------------------------
def _read_config(folder: Path) -> dict[str, Any]:
    cfg_path = folder / "config.json"
    try:
        with cfg_path.open(encoding="utf-8") as fh:
            cfg = json.load(fh)
    except FileNotFoundError:
        raise ModelFileError(
            f"{folder}: not an MLX model folder (no config.json). Give a folder written by mlx_lm.convert, "
            "or a Hugging Face id such as mlx-community/SmolLM2-135M-Instruct-8bit."
        ) from None
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{cfg_path}: cannot be read as JSON ({exc})") from exc
    if not isinstance(cfg, dict):
        raise ModelFileError(f"{cfg_path}: expected a JSON object")
    return cfg


def _text_cfg(cfg: dict[str, Any], key: str) -> Any:
    if key in cfg:
        return cfg[key]
    tc = cfg.get("text_config")
    return tc.get(key) if isinstance(tc, dict) else None


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("model*.safetensors"))


def check_model_folder(folder: Path) -> None:
    """Fail early, with a specific message, on a path that cannot be an MLX model folder."""
    if not folder.exists():
        raise ModelFileError(f"{folder}: no such folder. Give an MLX model folder or a Hugging Face id.")
    if not folder.is_dir():
        if folder.suffix == ".gguf":
            raise ModelFileError(f"{folder}: is a GGUF file; open it with the llama.cpp engine (--engine llama.cpp)")
        raise ModelFileError(f"{folder}: is a file; give the MLX model folder that holds config.json")
    _read_config(folder)
    if not _weight_files(folder):
        raise ModelFileError(
            f"{folder}: has config.json but no model*.safetensors weights; the download or conversion is incomplete"
        )


def _safetensors_dtypes(path: Path) -> dict[str, int]:
    """Element count per dtype in one safetensors file, from its JSON header only."""
    counts: dict[str, int] = {}
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > 100_000_000:
            raise ValueError("header too large")
        header = json.loads(fh.read(n))
    for name, meta in header.items():
        if name == "__metadata__" or not isinstance(meta, dict):
            continue
        size = 1
        for d in meta.get("shape", []):
            size *= int(d)
        counts[meta.get("dtype", "?")] = counts.get(meta.get("dtype", "?"), 0) + size
    return counts


_DTYPE_NAMES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "bfloat16": "bf16", "float16": "fp16",
                "float32": "fp32", "F64": "fp64"}


def folder_dtype(folder: Path, cfg: dict[str, Any] | None = None) -> str | None:
    """The floating dtype most weights are stored in (bf16, fp16, fp32), from the safetensors headers."""
    counts: dict[str, int] = {}
    for wf in _weight_files(folder):
        try:
            for k, v in _safetensors_dtypes(wf).items():
                counts[k] = counts.get(k, 0) + v
        except (OSError, ValueError, struct.error):
            continue
    floats = {k: v for k, v in counts.items() if k in ("BF16", "F16", "F32", "F64")}
    if floats:
        return _DTYPE_NAMES[max(floats, key=floats.__getitem__)]
    cfg = cfg if cfg is not None else {}
    d = _text_cfg(cfg, "torch_dtype") or _text_cfg(cfg, "dtype")
    return _DTYPE_NAMES.get(str(d)) if d else None


def folder_quantization(folder: str | os.PathLike[str], cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    """bits / group size / mode from config.json's ``quantization`` block, or the weights' dtype.

    Returns ``{"label": "4bit" | "8bit" | "bf16" ..., "bits", "group_size", "mode", "dtype"}``.
    """
    folder = Path(folder)
    cfg = cfg if cfg is not None else _read_config(folder)
    q = cfg.get("quantization") or cfg.get("quantization_config")
    dtype = folder_dtype(folder, cfg)
    if isinstance(q, dict) and "bits" in q:
        mode = q.get("mode", "affine")
        bits = int(q["bits"])
        label = f"{bits}bit" if mode == "affine" else str(mode)
        return {"label": label, "bits": bits, "group_size": q.get("group_size"), "mode": mode, "dtype": dtype}
    return {"label": dtype or "unknown", "bits": None, "group_size": None, "mode": None, "dtype": dtype}


def folder_size(folder: Path) -> int:
    total = 0
    for p in folder.iterdir():
        try:
            if p.is_file():
                total += p.stat().st_size
        except OSError:
            pass
    return total


# -- tokenizers ------------------------------------------------------------------------
def _tokenizer_kind(folder: Path, tokenizer: Any) -> str:
    """llama.cpp's name for the tokenizer kind: spm, bpe, ugm, wpm; "hf" when unknown."""
    tj = folder / "tokenizer.json"
    if tj.exists():
        try:
            with tj.open(encoding="utf-8") as fh:
                content = json.load(fh)
            model = content.get("model") or {}
            mtype = model.get("type")
            dec = content.get("decoder") or {}
            decs = [dec] + list(dec.get("decoders") or []) if isinstance(dec, dict) else []
            dec_types = {d.get("type") for d in decs if isinstance(d, dict)}
            if mtype == "Unigram":
                return "ugm"
            if mtype == "WordPiece":
                return "wpm"
            if mtype == "BPE":
                if "ByteLevel" in dec_types:
                    return "bpe"
                if model.get("byte_fallback") or "ByteFallback" in dec_types or "Replace" in dec_types:
                    return "spm"
                return "bpe"
            if mtype:
                return f"hf-{str(mtype).lower()}"
        except (OSError, ValueError, AttributeError):
            pass
    if (folder / "tokenizer.model").exists():
        return "spm"
    if any(folder.glob("*.tiktoken")) or (folder / "tiktoken.model").exists():
        return "bpe"
    return "hf"


_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class _Pieces:
    """Per-token output bytes, so that joining pieces gives the detokenized text."""

    def __init__(self, tokenizer: Any, kind: str, n_vocab: int):
        self.tok = tokenizer
        self.kind = kind
        self.n_vocab = n_vocab
        self.raw = self._raw_texts(tokenizer, n_vocab)
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self.added = {int(i) for i in added}
        self.added |= {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or [])}
        self._cache: dict[int, bytes] = {}
        if kind == "bpe":
            from mlx_lm.tokenizer_utils import _byte_decoder

            self.byte_decoder = _byte_decoder()
        else:
            self.byte_decoder = {}

    @staticmethod
    def _raw_texts(tokenizer: Any, n_vocab: int) -> tuple[str, ...]:
        n_tok = len(tokenizer)
        ids = list(range(min(n_tok, n_vocab)))
        try:
            toks = tokenizer.convert_ids_to_tokens(ids)
        except Exception:
            toks = [None] * len(ids)
        out = [t if isinstance(t, str) else "" for t in toks]
        out.extend([""] * (n_vocab - len(out)))
        return tuple(out)

    def bytes_of(self, token: int) -> bytes:
        b = self._cache.get(token)
        if b is None:
            b = self._compute(token)
            self._cache[token] = b
        return b

    def _compute(self, token: int) -> bytes:
        text = self.raw[token] if 0 <= token < len(self.raw) else ""
        if not text:
            try:
                return self.tok.decode([token]).encode("utf-8")
            except Exception:
                return b""
        if token in self.added:
            return text.encode("utf-8")
        if self.kind == "bpe":
            bd = self.byte_decoder
            if all(c in bd for c in text):
                return bytes(bd[c] for c in text)
            return text.encode("utf-8")
        if self.kind == "spm":
            m = _BYTE_TOKEN.match(text)
            if m:
                return bytes([int(m.group(1), 16)])
            return text.replace("\u2581", " ").encode("utf-8")
        try:
            return self.tok.decode([token]).encode("utf-8")
        except Exception:
            return text.encode("utf-8")


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


_wired = False


def _wire_memory() -> None:
    """Keep model memory wired on Apple GPUs, as mlx-lm's generate does (a no-op elsewhere).

    mlx-lm raises the wired limit to the device's recommended working set while
    it generates; specview's app keeps models loaded between runs, so it does so
    once, when the first model is loaded.
    """
    global _wired
    if _wired:
        return
    _wired = True
    try:
        from mlx_lm.utils import maybe_set_recommended_wired_limit

        maybe_set_recommended_wired_limit()
    except Exception:  # older mlx without device_info, or no Metal
        pass


def _kind_of(tokenizer: Any) -> str:
    """Tokenizer kind for an in-memory tokenizer (no folder to read)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        inner = getattr(tokenizer, "_tokenizer", None)
        backend = getattr(inner, "backend_tokenizer", None)
    if backend is not None:
        try:
            content = json.loads(backend.to_str())
            mtype = (content.get("model") or {}).get("type")
            dec = content.get("decoder") or {}
            dec_types = {dec.get("type")} | {d.get("type") for d in dec.get("decoders") or []}
            if mtype == "BPE":
                return "bpe" if "ByteLevel" in dec_types else "spm"
            return {"Unigram": "ugm", "WordPiece": "wpm"}.get(mtype, "hf")
        except Exception:
            pass
    return "hf"


def _memory_quantization(cfg: dict[str, Any]) -> dict[str, Any]:
    q = cfg.get("quantization")
    if isinstance(q, dict) and "bits" in q:
        mode = q.get("mode", "affine")
        return {"label": f"{q['bits']}bit" if mode == "affine" else mode, "bits": q["bits"],
                "group_size": q.get("group_size"), "mode": mode, "dtype": None}
    d = _DTYPE_NAMES.get(str(cfg.get("torch_dtype") or cfg.get("dtype")))
    return {"label": d or "unknown", "bits": None, "group_size": None, "mode": None, "dtype": d}


# -- the engine ------------------------------------------------------------------------
class MLXEngine(Engine):
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
        cfg = self.model.config
        hd = _text_cfg(cfg, "head_dim")
        if not hd:
            hidden, heads = _text_cfg(cfg, "hidden_size"), _text_cfg(cfg, "num_attention_heads")
            hd = hidden // heads if hidden and heads else 64
        for g in (64, 32):
            if int(hd) % g == 0:
                return g
        raise SpecviewError(
            f"{self.model.path.name}: a quantized KV cache needs a head size divisible by 32 (it is {hd}); "
            "use --kv-type f16"
        )

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
    @property
    def vocab(self) -> VocabInfo:
        return self.model.vocab

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    def model_facts(self) -> dict[str, Any]:
        return self.model.facts()

    def environment(self) -> dict[str, Any]:
        return mlx_environment()

    @property
    def can_truncate(self) -> bool:
        from mlx_lm.models.cache import can_trim_prompt_cache

        return bool(can_trim_prompt_cache(self.cache))

    # -- text ----------------------------------------------------------------------
    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return self.model.tokenize(text, chat=chat)

    def piece(self, token: int) -> str:
        return self.model.piece(token)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.model.detokenize(tokens)

    # -- evaluation ----------------------------------------------------------------
    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        n = len(tokens)
        if n == 0:
            raise ValueError("eval needs at least one token")
        if self.n_past + n > self._n_ctx:
            raise EvalError(f"the context is full ({self.n_past} + {n} > n_ctx {self._n_ctx}); raise --n-ctx")
        n_vocab = self._n_vocab
        toks = [int(t) for t in tokens]
        for t in toks:
            if not 0 <= t < n_vocab:
                raise EvalError(f"token id {t} is outside the vocabulary (0..{n_vocab - 1})")
        rows = [r + n if r < 0 else int(r) for r in rows]
        for r in rows:
            if not 0 <= r < n:
                raise ValueError(f"row {r} is outside the {n} tokens evaluated")
        if not rows:  # extend the cache only
            self.eval(toks, [n - 1])
            return np.empty((0, n_vocab), dtype=np.float32)
        mx = self._mxm
        pos0 = self.n_past
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
                mx.eval(sel)
            out = np.array(sel, dtype=np.float32, copy=True)
        except Exception as exc:
            self.eval_seconds += time.perf_counter() - t0
            self._pending = None
            raise EvalError(f"the MLX forward pass failed at position {pos0} ({n} tokens): "
                            f"{type(exc).__name__}: {exc}") from exc
        self.eval_seconds += time.perf_counter() - t0
        self.n_evals += 1
        self.n_past = pos0 + n
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

    def truncate(self, n: int) -> None:
        if n < 0 or n > self.n_past:
            raise ValueError(f"cannot truncate to {n}: the context holds {self.n_past} tokens")
        if n == self.n_past:
            return
        self._streak = 0
        self._next_greedy = None
        if n == 0:
            self._pending = None
            self.cache = self._new_cache()
            self.n_past = 0
            return
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        if self._pending is not None:
            self._drop_prefetch()
        if not can_trim_prompt_cache(self.cache):
            kinds = sorted({type(c).__name__ for c in self.cache if not c.is_trimmable()})
            raise EvalError(
                f"{self.model.path.name}: its MLX cache ({', '.join(kinds)}) cannot be rolled back, so rejected "
                "draft tokens cannot be removed; this model cannot be the target or draft of speculative decoding. "
                "Use --spec-type none, or another model."
            )
        want = self.n_past - n
        got = trim_prompt_cache(self.cache, want)
        offsets = {int(getattr(c, "offset", n)) for c in self.cache if hasattr(c, "offset")}
        if got != want or (offsets and offsets != {n}):
            raise EvalError(
                f"{self.model.path.name}: the MLX cache trimmed {got} of {want} positions "
                f"(layer offsets {sorted(offsets)}); it cannot roll back to position {n}"
            )
        self.n_past = n

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


# -- registry glue -----------------------------------------------------------------------
class MLXLoaded(WrappedModel):
    def new_engine(self, settings: EngineSettings, n_ctx: int) -> MLXEngine:
        return MLXEngine(self.model, settings, n_ctx=n_ctx)


class MLXBackend(InProcessBackend):
    """MLX model folders (or Hugging Face ids, online) through mlx-lm."""

    name = "mlx"

    def __init__(self) -> None:
        _mx()  # fail now, clearly, if mlx or mlx-lm is missing

    def resolve(self, name: str, *, progress: Callable[[str], None] | None = None) -> str:
        p = Path(name).expanduser()
        if p.exists():
            p = p.resolve()
            if p.is_file() and (p.name == "config.json" or p.suffix == ".safetensors"):
                p = p.parent
            return str(p)
        if name.startswith("demo:"):
            return str(demo_folder(name.split(":", 1)[1], progress=progress))
        if name.startswith(("/", ".", "~")) or "\\" in name or not _HF_ID.match(name):
            raise ModelFileError(
                f"{name}: no such MLX model folder. Give the folder written by mlx_lm.convert, "
                "or a Hugging Face id such as mlx-community/SmolLM2-135M-Instruct-8bit."
            )
        if progress:
            progress(f"fetching {name} from Hugging Face")
        try:
            from mlx_lm.utils import _download

            return str(Path(_download(name)).resolve())
        except Exception as exc:
            raise ModelFileError(
                f"{name}: not a local folder, and fetching it from Hugging Face failed "
                f"({type(exc).__name__}: {exc}). Check the id and your connection, or give a local MLX folder."
            ) from exc

    def model_key(self, name: str, settings: EngineSettings) -> tuple:
        return (str(Path(name).expanduser().resolve()),)

    def load(self, name: str, settings: EngineSettings) -> MLXLoaded:
        return MLXLoaded(MLXModel(name))

    def environment(self) -> dict[str, Any]:
        return mlx_environment()


# -- quantization variants -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MLXVariant:
    """One folder holding the same model at some precision."""

    path: Path
    label: str  # "bf16", "fp16", "8bit", "4bit", "mxfp4", ...
    bits: int | None
    group_size: int | None
    dtype: str | None
    size: int
    derived: bool = False  # written by derive_quantized into the cache

    @property
    def sort_key(self) -> tuple:
        prec = {"fp64": 64, "fp32": 32, "bf16": 16.5, "fp16": 16}.get(self.dtype or "", 0)
        return (0 if self.bits is None else 1, -(self.bits or 0), -prec, str(self.path))


_SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size",
               "num_attention_heads")
SOURCE_FILE = "specview-source.json"


def _shape(cfg: dict[str, Any]) -> tuple:
    return tuple(_text_cfg(cfg, k) for k in _SHAPE_KEYS)


_QUANT_SUFFIX = re.compile(
    r"(?i)[-_.](\d+-?bits?|bf16|fp16|f16|fp32|f32|float16|bfloat16|float32|mlx|q\d(_k(_[sml])?|_\d)?|"
    r"dwq|mxfp4|mxfp8|nvfp4|awq|gptq|g\d+)$"
)


def base_name(folder_name: str) -> str:
    """A folder name without precision suffixes: ``SmolLM2-135M-Instruct-4bit`` -> ``SmolLM2-135M-Instruct``."""
    name = folder_name
    while True:
        stripped = _QUANT_SUFFIX.sub("", name)
        if stripped == name or not stripped:
            return name.lower()
        name = stripped


def mlx_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where derived quantizations live: ``user_cache_dir("specview")/mlx`` (``$SPECVIEW_CACHE/mlx``)."""
    if cache_dir is not None:
        return Path(cache_dir)
    from ..core.demo import cache_dir as specview_cache

    return specview_cache() / "mlx"


def _variant(folder: Path, cfg: dict[str, Any], derived: bool) -> MLXVariant:
    q = folder_quantization(folder, cfg)
    return MLXVariant(path=folder, label=q["label"], bits=q["bits"], group_size=q["group_size"],
                      dtype=q["dtype"], size=folder_size(folder), derived=derived)


def _hf_repo_dir(folder: Path) -> Path | None:
    """The ``models--org--name`` folder when ``folder`` is a snapshot in a Hugging Face cache."""
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent
    return None


def display_name(folder: Path) -> str:
    """A model's name: the folder name, or ``name`` of ``org/name`` for a Hugging Face cache snapshot."""
    repo = _hf_repo_dir(folder)
    if repo is not None:
        return repo.name.split("--", 2)[-1]
    return folder.name


def _hf_cached_snapshots(hub: Path) -> list[Path]:
    """The current snapshot of every model repo in a Hugging Face hub cache folder."""
    out = []
    for repo in hub.iterdir():
        snaps = repo / "snapshots"
        if not repo.name.startswith("models--") or not snaps.is_dir():
            continue
        ref = repo / "refs" / "main"
        try:
            current = snaps / ref.read_text(encoding="utf-8").strip() if ref.exists() else None
        except OSError:
            current = None
        if current is not None and current.is_dir():
            out.append(current)
        else:
            out.extend(sorted(p for p in snaps.iterdir() if p.is_dir()))
    return out


def list_variants(path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None) -> list[MLXVariant]:
    """The precisions of this model the user has: the folder itself, its sibling folders
    holding the same architecture and shape under the same name apart from a precision
    suffix (``Name-bf16``, ``Name-8bit``, ``Name-4bit``), and copies derived from any of
    them by :func:`derive_quantized`.  For a model fetched by Hugging Face id the
    siblings are the other repos of that name in the Hugging Face cache
    (``mlx-community/Name-4bit`` next to ``mlx-community/Name-8bit``).

    Unquantized folders come first, then by bits, highest first.  Reads only
    config.json files and safetensors headers (no weights, no mlx needed).
    """
    folder = Path(path).expanduser().resolve()
    cfg = _read_config(folder)
    shape = _shape(cfg)
    base = base_name(display_name(folder))
    found: dict[Path, MLXVariant] = {}
    candidates = [folder]
    try:
        if _hf_repo_dir(folder) is not None:
            candidates += [p for p in _hf_cached_snapshots(folder.parent.parent.parent)
                           if p != folder and base_name(display_name(p)) == base]
        else:
            candidates += [p for p in folder.parent.iterdir()
                           if p.is_dir() and p != folder and base_name(p.name) == base]
    except OSError:
        pass
    for cand in candidates:
        try:
            ccfg = _read_config(cand) if cand != folder else cfg
        except ModelFileError:
            continue
        if _shape(ccfg) != shape or not _weight_files(cand):
            continue
        found[cand.resolve()] = _variant(cand.resolve(), ccfg, derived=False)
    sources = {str(p) for p in found}
    cdir = mlx_cache_dir(cache_dir)
    if cdir.is_dir():
        for cand in cdir.iterdir():
            src_file = cand / SOURCE_FILE
            if cand.name.startswith(".") or not src_file.exists():
                continue
            try:
                meta = json.loads(src_file.read_text(encoding="utf-8"))
                ccfg = _read_config(cand)
            except (OSError, ValueError, ModelFileError):
                continue
            if meta.get("source") in sources and _shape(ccfg) == shape:
                found[cand.resolve()] = _variant(cand.resolve(), ccfg, derived=True)
    return sorted(found.values(), key=lambda v: v.sort_key)


@dataclasses.dataclass(frozen=True)
class MLXDerivable:
    """A precision the user does not have yet, and the folder :func:`derive_quantized` would make it from."""

    label: str
    bits: int
    group_size: int
    source: Path


def derivable_variants(path: str | os.PathLike[str], *, bits: Sequence[int] = (8, 4), group_size: int = 64,
                       cache_dir: str | os.PathLike[str] | None = None) -> list[MLXDerivable]:
    """The ``bits`` precisions missing from :func:`list_variants`, to derive from its highest-precision
    unquantized folder; empty when the user has no unquantized folder of this model."""
    variants = list_variants(path, cache_dir=cache_dir)
    sources = [v for v in variants if v.bits is None]
    if not sources:
        return []
    have = {v.bits for v in variants}
    return [MLXDerivable(f"{b}bit", int(b), group_size, sources[0].path) for b in bits if b not in have]


_derive_lock = threading.Lock()


def derive_quantized(
    src: str | os.PathLike[str],
    bits: int = 4,
    *,
    group_size: int = 64,
    mode: str = "affine",
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """A ``bits``-bit copy of an unquantized (bf16/fp16/fp32) MLX folder, made by ``mlx_lm.convert``.

    The copy lives in :func:`mlx_cache_dir`, named after the source folder, the
    settings and a hash of the source; a second call returns it without work.
    It appears atomically (written to a hidden temporary folder, then renamed),
    so an interrupted conversion never leaves a half-written model.
    """
    if bits not in (2, 3, 4, 5, 6, 8):
        raise SpecviewError(f"MLX quantizes to 2, 3, 4, 5, 6 or 8 bits (got {bits})")
    src_p = Path(src).expanduser().resolve()
    check_model_folder(src_p)
    cfg = _read_config(src_p)
    q = folder_quantization(src_p, cfg)
    if q["bits"] is not None:
        raise SpecviewError(
            f"{src_p}: is already quantized ({q['label']}); derive quantized copies from the bf16/fp16 folder "
            "of the same model"
        )
    _mx()
    h = hashlib.sha256(str(src_p).encode())
    for f in sorted(src_p.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    tag = f"{bits}bit" if mode == "affine" else mode
    cdir = mlx_cache_dir(cache_dir)
    dst = cdir / f"{src_p.name}-{tag}-g{group_size}-{h.hexdigest()[:10]}"
    if (dst / SOURCE_FILE).exists():
        return dst
    cdir.mkdir(parents=True, exist_ok=True)
    tmp = cdir / f".{dst.name}.{os.getpid()}.{threading.get_ident()}.partial"
    from mlx_lm.convert import convert

    with _derive_lock:
        if (dst / SOURCE_FILE).exists():
            return dst
        if progress:
            progress(f"quantizing {src_p.name} to {tag} (group size {group_size}) with mlx_lm.convert")
        log = io.StringIO()
        try:
            with contextlib.redirect_stdout(log):
                extra = {} if mode == "affine" else {"q_mode": mode}  # older mlx-lm has no q_mode
                convert(str(src_p), str(tmp), quantize=True, q_bits=bits, q_group_size=group_size, **extra)
            (tmp / SOURCE_FILE).write_text(json.dumps({
                "source": str(src_p), "bits": bits, "group_size": group_size, "mode": mode,
            }, indent=2), encoding="utf-8")
            try:
                os.replace(tmp, dst)
            except OSError:
                if not (dst / SOURCE_FILE).exists():
                    raise
        except SpecviewError:
            raise
        except Exception as exc:
            raise SpecviewError(
                f"mlx_lm.convert could not quantize {src_p} to {tag}: {type(exc).__name__}: {exc}\n"
                + log.getvalue().strip()[-600:]
            ) from exc
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return dst


# -- the demo model -----------------------------------------------------------------------------------
_GGUF_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# demo names of the llama.cpp engine -> what the MLX engine uses for them
DEMO_MLX = {
    "Q4_1": (4, 32, "the shipped Q4_1 weights, bit for bit: MLX's affine 4-bit, group 32"),
    "Q4_0": (4, 32, "4-bit, group 32, quantized by mlx_lm.convert from the fp32 copy"),
    "Q4_K_M": (4, 64, "4-bit, group 64, quantized by mlx_lm.convert from the fp32 copy"),
    "Q8_0": (8, 32, "8-bit, group 32, quantized by mlx_lm.convert from the fp32 copy"),
    "F32": (None, None, "fp32, dequantized from the shipped Q4_1"),
    "F16": (None, None, "fp16, cast from the fp32 copy"),
}


def gguf_to_mlx(gguf: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write a llama-architecture GGUF with a GPT-2 style BPE vocabulary as an MLX model folder.

    MLX reads GGUF tensors itself (Q4_0, Q4_1 and Q8_0 stay quantized, as MLX
    affine quantization with group size 32).  GGUF stores the Q and K
    projections in the interleaved RoPE layout llama.cpp uses, so the folder
    asks for ``rope_traditional`` instead of permuting quantized rows.  The
    tokenizer is rebuilt from the GGUF's tokens, merges and special tokens.
    """
    mx = _mx()
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from mlx_lm.utils import save_config

    src = Path(gguf)
    weights, meta = mx.load(str(src), return_metadata=True)

    def m(key: str, default: Any = None) -> Any:
        v = meta.get(key, default)
        return v.item() if hasattr(v, "item") and getattr(v, "size", 2) == 1 else v

    arch = m("general.architecture")
    if arch != "llama" or m("tokenizer.ggml.model") != "gpt2":
        raise SpecviewError(f"{src.name}: only llama models with a GPT-2 style vocabulary can be converted "
                            f"(this is {arch!r} with a {m('tokenizer.ggml.model')!r} vocabulary)")
    out_w: dict[str, Any] = {}
    for name, arr in weights.items():
        stem, _, kind = name.rpartition(".")  # kind: weight, scales, biases
        if stem == "token_embd":
            new = "model.embed_tokens"
        elif stem == "output_norm":
            new = "model.norm"
        elif stem == "output":
            new = "lm_head"
        elif stem.startswith("blk."):
            _, layer, part = stem.split(".", 2)
            if part not in _GGUF_NAMES:
                raise SpecviewError(f"{src.name}: unexpected tensor {name}")
            new = f"model.layers.{layer}.{_GGUF_NAMES[part]}"
        else:
            raise SpecviewError(f"{src.name}: unexpected tensor {name}")
        out_w[f"{new}.{kind}"] = arr
    n_vocab = int(m("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"]))
    cfg: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": int(m("llama.embedding_length")),
        "num_hidden_layers": int(m("llama.block_count")),
        "intermediate_size": int(m("llama.feed_forward_length")),
        "num_attention_heads": int(m("llama.attention.head_count")),
        "num_key_value_heads": int(m("llama.attention.head_count_kv")),
        "rms_norm_eps": float(m("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(m("llama.rope.freq_base", 10000.0)),
        "rope_traditional": True,
        "vocab_size": n_vocab,
        "max_position_embeddings": int(m("llama.context_length")),
        "tie_word_embeddings": "lm_head.weight" not in out_w,
        "bos_token_id": int(m("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(m("tokenizer.ggml.eos_token_id")),
        "torch_dtype": "float32",  # norms are f32 in GGUF; what mlx_lm.convert keeps for derived copies
    }
    # each quantized tensor: packed uint32 rows of in_dims * bits / 32 words, one scale per group
    qparams: dict[str, tuple[int, int]] = {}
    for name, scales in out_w.items():
        if name.endswith(".scales"):
            path = name[: -len(".scales")]
            packed = out_w[f"{path}.weight"]
            for b in (8, 6, 5, 4, 3, 2):  # in_dims = groups * group_size; find the (bits, group) that fit
                words = packed.shape[-1] * 32
                if words % b == 0 and (words // b) % scales.shape[-1] == 0 and (words // b) // scales.shape[-1] in (32, 64, 128):
                    qparams[path] = (b, (words // b) // scales.shape[-1])
                    break
    if qparams:
        # the most common setting is the folder's; the others (llama.cpp keeps token_embd at Q8_0) per layer
        (bits, group), _ = collections.Counter(qparams.values()).most_common(1)[0]
        quant: dict[str, Any] = {"group_size": group, "bits": bits}
        for path, (b, g) in sorted(qparams.items()):
            if (b, g) != (bits, group):
                quant[path] = {"group_size": g, "bits": b}
        cfg["quantization"] = quant
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = meta["tokenizer.ggml.token_type"].tolist()
    merges = [tuple(x.split(" ", 1)) for x in meta["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    pre = m("tokenizer.ggml.pre")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                        if pre == "smollm" else byte_level)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    specials = {k: tokens[int(m(f"tokenizer.ggml.{k}_token_id"))] for k in ("bos", "eos", "padding", "unknown")
                if m(f"tokenizer.ggml.{k}_token_id") is not None}
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=specials.get("bos"), eos_token=specials.get("eos"),
                                   pad_token=specials.get("padding"), unk_token=specials.get("unknown"))
    template = m("tokenizer.chat_template")
    if template:
        fast.chat_template = str(template)
    dst = Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(dst))
    mx.save_safetensors(str(dst / "model.safetensors"), out_w, metadata={"format": "mlx"})
    save_config(cfg, str(dst / "config.json"))
    return dst


def demo_folder(quant: str, *, cache_dir: str | os.PathLike[str] | None = None,
                progress: Callable[[str], None] | None = None) -> Path:
    """The MLX folder that stands for ``demo:QUANT`` (see :data:`DEMO_MLX`), made on first use.

    The shipped Q4_1 GGUF of SmolLM2-135M-Instruct is converted as it is (its
    4-bit groups of 32 are MLX's own format); an fp32 copy is dequantized from
    it, and the other precisions are made from that copy by mlx_lm.convert
    (fp32 scales and norms keep activations in fp32, which MLX's CPU build runs
    far faster than fp16).  Every folder appears atomically in the cache.
    """
    q = quant.upper()
    if q not in DEMO_MLX:
        raise ModelFileError(f"demo:{quant}: the MLX engine has the demo model as "
                             + ", ".join(f"demo:{k}" for k in DEMO_MLX))
    from ..core import demo

    cdir = mlx_cache_dir(cache_dir)
    base = cdir / "demo-SmolLM2-135M-Instruct-Q4_1"
    with _derive_lock:
        if not (base / "config.json").exists():
            shipped = demo.shipped_path()
            if progress:
                progress(f"converting {shipped.name} to an MLX folder")
            _atomic_folder(base, lambda tmp: gguf_to_mlx(shipped, tmp))
        if q == "Q4_1":
            return base
        from mlx_lm.convert import convert

        fp32 = cdir / "demo-SmolLM2-135M-Instruct-fp32"
        if not (fp32 / "config.json").exists():
            if progress:
                progress("dequantizing the demo model to fp32 with mlx_lm.convert")

            def dequantize(tmp: Path) -> None:
                with contextlib.redirect_stdout(io.StringIO()):
                    convert(str(base), str(tmp), dequantize=True, dtype="float32")

            _atomic_folder(fp32, dequantize)
        if q == "F32":
            return fp32
        if q == "F16":
            fp16 = cdir / "demo-SmolLM2-135M-Instruct-fp16"
            if not (fp16 / "config.json").exists():
                def cast(tmp: Path) -> None:
                    with contextlib.redirect_stdout(io.StringIO()):
                        convert(str(fp32), str(tmp), dtype="float16")

                _atomic_folder(fp16, cast)
            return fp16
    bits, group, _ = DEMO_MLX[q]
    return derive_quantized(fp32, bits, group_size=group, cache_dir=cdir, progress=progress)


def _atomic_folder(dst: Path, make: Callable[[Path], Any]) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".{dst.name}.{os.getpid()}.{threading.get_ident()}.partial"
    try:
        make(tmp)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# -- random models, for tests and benchmarks -------------------------------------------------------
def write_random_model(
    folder: str | os.PathLike[str],
    *,
    seed: int = 0,
    vocab_size: int = 320,
    hidden_size: int = 64,
    num_layers: int = 2,
    intermediate_size: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    corpus: Sequence[str] | None = None,
    dtype: str = "float32",
    pad_vocab_to: int | None = None,
    tie_embeddings: bool = False,
) -> Path:
    """Write a llama-architecture MLX model folder with fixed-seed random weights.

    The tokenizer is a byte-level BPE trained on ``corpus`` up to ``vocab_size``
    tokens, with ``<s>`` (BOS, added to plain prompts), ``</s>`` (EOS), ``<pad>``
    and a one-turn chat template.  Two calls with the same corpus give the same
    tokenizer; a different corpus gives a different vocabulary.  Nothing is
    downloaded.  ``pad_vocab_to`` makes the embedding and output head larger than
    the tokenizer (as many real models do), e.g. 49152 rows for a realistic
    output-layer cost in benchmarks.
    """
    mx = _mx()
    from mlx.utils import tree_map
    from mlx_lm.models.llama import Model, ModelArgs
    from mlx_lm.utils import save_config, save_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = list(corpus or [
        "the quick brown fox jumps over the lazy dog. " * 4,
        "speculative decoding drafts a few tokens and the target verifies them in one batch. " * 2,
        "greedy decoding takes the argmax at every position; near ties can flip. ",
    ])
    tk.train_from_iterator(text, trainer)
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    fast.save_pretrained(str(out))
    n_vocab = max(len(fast), pad_vocab_to or 0)

    args = ModelArgs(model_type="llama", hidden_size=hidden_size, num_hidden_layers=num_layers,
                     intermediate_size=intermediate_size, num_attention_heads=heads, num_key_value_heads=kv_heads,
                     rms_norm_eps=1e-5, vocab_size=n_vocab, tie_word_embeddings=tie_embeddings,
                     max_position_embeddings=4096)
    mx.random.seed(seed)
    model = Model(args)
    # default init has a tiny output spread; scale so greedy choices are not all near-ties
    model.update(tree_map(lambda a: a * 4.0 if a.ndim == 2 else a, model.parameters()))
    if dtype != "float32":
        model.update(tree_map(lambda a: a.astype(getattr(mx, dtype)), model.parameters()))
    mx.eval(model.parameters())
    save_model(str(out), model)
    cfg = {k: v for k, v in dataclasses.asdict(args).items() if v is not None and k != "layer_types"}
    cfg["torch_dtype"] = dtype
    cfg["bos_token_id"] = 0
    cfg["eos_token_id"] = 1
    save_config(cfg, str(out / "config.json"))
    return out
