"""llama.cpp's own quantizer: GGUF to GGUF, requantizing allowed, written atomically."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from ...core.errors import SpecviewError
from .lib import _init, clear_log, default_threads, recent_log
from .model import QUANT_FTYPES, check_gguf_file


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], quant: str, *, threads: int = 0) -> Path:
    """Write ``dst`` as ``quant`` from ``src`` with llama.cpp's own quantizer (requantizing allowed).

    The file appears atomically: a reader sees no file or the whole file.
    """
    ll = _init()
    q = quant.upper()
    if q not in QUANT_FTYPES:
        raise SpecviewError(f"unknown quantization {quant!r}; known: {', '.join(sorted(QUANT_FTYPES))}")
    src_p = Path(src)
    check_gguf_file(src_p)
    dst_p = Path(dst)
    tmp = dst_p.with_name(f".{dst_p.name}.{os.getpid()}.partial")
    params = ll.llama_model_quantize_default_params()
    params.nthread = threads or default_threads()
    params.ftype = QUANT_FTYPES[q]
    params.allow_requantize = True
    clear_log()
    try:
        rc = ll.llama_model_quantize(str(src_p).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise SpecviewError(f"llama.cpp could not quantize {src_p.name} to {q} (status {rc}):\n{recent_log(6)}")
        os.replace(tmp, dst_p)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst_p
