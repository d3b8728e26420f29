"""Quantization flipping: the precisions of a model the user has, and quantized copies derived from them.

:func:`list_variants` lists the sibling folders of the same model (bf16,
8-bit, 4-bit ...) and :func:`derive_quantized` writes a quantized copy of a
bf16/fp16/fp32 folder with mlx-lm's own converter into the user cache folder,
atomically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from ...core.errors import ModelFileError, SpecviewError
from ...core.paths import cache_dir as specview_cache
from .folders import (
    _hf_repo_dir,
    _read_config,
    _text_cfg,
    _weight_files,
    check_model_folder,
    display_name,
    folder_quantization,
    folder_size,
)
from .lib import _mx


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
    return specview_cache() / "mlx"


def _variant(folder: Path, cfg: dict[str, Any], derived: bool) -> MLXVariant:
    q = folder_quantization(folder, cfg)
    return MLXVariant(path=folder, label=q["label"], bits=q["bits"], group_size=q["group_size"],
                      dtype=q["dtype"], size=folder_size(folder), derived=derived)


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
