"""What specview needs from mlx and mlx-lm beyond a model: the import guard, the
environment a trace records, wired memory, and per-token text pieces.

MLX is imported lazily: importing this module never needs mlx, and :func:`_mx`
raises :class:`BackendUnavailable` with the reason when mlx or mlx-lm cannot be
used here.
"""

from __future__ import annotations

import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

from ...core.errors import BackendUnavailable

INSTALL_HINT = "pip install 'specview[mlx]'"


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
        where = "" if sys.platform == "darwin" else " (on Linux it installs mlx[cpu])"
        raise BackendUnavailable(
            f"MLX is not usable here ({type(exc).__name__}: {exc}). Install it with `{INSTALL_HINT}`{where}."
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
