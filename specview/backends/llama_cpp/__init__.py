"""The llama.cpp engine, over llama-cpp-python's low-level C API.

* :mod:`.lib` -- importing llama-cpp-python, its log, threads, the build's devices.
* :mod:`.model` -- one GGUF file's weights (or only its vocabulary), loaded once
  and shared (:class:`LlamaModel`, :class:`ModelStore`).
* :mod:`.engine` -- one context per arm, drafter and replay (:class:`LlamaEngine`),
  sized by what llama.cpp actually made.
* :mod:`.quantize`, :mod:`.demo` -- llama.cpp's quantizer and the demo model's
  GGUF quantizations derived with it.
* :mod:`.backend` -- :class:`LlamaBackend`, registered as ``llama.cpp``.

Importing this package does not import llama-cpp-python; using it does.
"""

from __future__ import annotations

from .backend import LlamaBackend, LlamaLoaded
from .engine import LlamaEngine
from .lib import _init, default_threads, ggml_devices, llama_environment, recent_log, resolve_threads
from .model import GGUF_MAGIC, QUANT_FTYPES, LlamaModel, ModelStore, check_gguf_file, quant_name, vocab_model
from .quantize import quantize

__all__ = [
    "LlamaBackend",
    "LlamaLoaded",
    "LlamaEngine",
    "LlamaModel",
    "ModelStore",
    "vocab_model",
    "check_gguf_file",
    "quant_name",
    "QUANT_FTYPES",
    "GGUF_MAGIC",
    "quantize",
    "default_threads",
    "resolve_threads",
    "ggml_devices",
    "llama_environment",
    "recent_log",
    "_init",
]
