"""MLX model folders on disk: config.json, safetensors headers, precision, size and name.

Everything here reads files only (config.json, the JSON headers of the
safetensors files): no weights are loaded and mlx is not needed.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from ...core.errors import ModelFileError, SpecviewError


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


def _memory_quantization(cfg: dict[str, Any]) -> dict[str, Any]:
    q = cfg.get("quantization")
    if isinstance(q, dict) and "bits" in q:
        mode = q.get("mode", "affine")
        return {"label": f"{q['bits']}bit" if mode == "affine" else mode, "bits": q["bits"],
                "group_size": q.get("group_size"), "mode": mode, "dtype": None}
    d = _DTYPE_NAMES.get(str(cfg.get("torch_dtype") or cfg.get("dtype")))
    return {"label": d or "unknown", "bits": None, "group_size": None, "mode": None, "dtype": d}


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


def kv_group_size(cfg: dict[str, Any], *, name: str = "the model") -> int:
    """The group size of a quantized KV cache for this model: 64, or 32 where the head size needs it."""
    hd = _text_cfg(cfg, "head_dim")
    if not hd:
        hidden, heads = _text_cfg(cfg, "hidden_size"), _text_cfg(cfg, "num_attention_heads")
        hd = hidden // heads if hidden and heads else 64
    for g in (64, 32):
        if int(hd) % g == 0:
            return g
    raise SpecviewError(
        f"{name}: a quantized KV cache needs a head size divisible by 32 (it is {hd}); use --kv-type f16"
    )
