"""llama-cpp-python itself: importing it, its log, threads, and what the build reports.

llama.cpp's log goes into a ring buffer; when a load fails its last lines
explain why, in the error message.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from pathlib import Path
from typing import Any

from ...core.config import THREADS_VARIABLE, default_threads, resolve_threads, usable_cores  # noqa: F401
from ...core.errors import BackendUnavailable

_lock = threading.Lock()
_initialised = False
_log_lines: collections.deque[str] = collections.deque(maxlen=2000)  # a model load logs a line per layer
_log_cb = None  # keep the ctypes callback alive
_ENV: dict[str, Any] | None = None


def _lib() -> Any:
    """Import llama_cpp, or say plainly why it cannot be used."""
    try:
        import llama_cpp
    except Exception as exc:  # ImportError, OSError from a broken shared library, ...
        raise BackendUnavailable(
            f"llama-cpp-python is not usable here ({type(exc).__name__}: {exc}). "
            "Install it with `pip install llama-cpp-python` (see the README for GPU builds)."
        ) from exc
    return llama_cpp


def _init() -> Any:
    """llama_cpp, with its log captured and the backend initialised (once per process)."""
    global _initialised, _log_cb
    ll = _lib()
    with _lock:
        if not _initialised:
            @ll.llama_log_callback
            def _cb(level, text, user_data):  # pragma: no cover - called from C
                try:
                    _log_lines.append(text.decode("utf-8", "replace"))
                except Exception:
                    pass

            _log_cb = _cb
            ll.llama_log_set(_log_cb, ctypes.c_void_p(0))
            ll.llama_backend_init()
            _initialised = True
    return ll


def clear_log() -> None:
    _log_lines.clear()


def recent_log(n: int = 8) -> str:
    lines = "".join(_log_lines).strip().splitlines()
    return "\n".join(lines[-n:])


def log_lines() -> list[str]:
    """llama.cpp's log since the last :func:`clear_log`, as whole lines."""
    return "".join(_log_lines).splitlines()


#: ggml's enum ggml_backend_dev_type
DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}


def _ggml() -> Any:
    """libggml of this llama-cpp-python, with the device registry's signatures set; None if not found."""
    ll = _init()
    libdir = Path(ll.__file__).parent / "lib"
    # the device registry lives in libggml; dlsym on it also finds libggml-base's functions
    names = ["libggml.so", "libggml.dylib", "ggml.dll", "libggml-base.so", "libggml-base.dylib"]
    lib = None
    for name in names:
        p = libdir / name
        if p.exists():
            try:
                lib = ctypes.CDLL(str(p))
                break
            except OSError:
                continue
    if lib is None or not hasattr(lib, "ggml_backend_dev_count"):
        return None
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    return lib


def ggml_devices() -> list[dict[str, str]]:
    """The ggml backend devices this llama.cpp build sees (CPU, Vulkan0, ROCm0, Metal, CUDA0...), with their type."""
    lib = _ggml()
    if lib is None:
        return []
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        d = lib.ggml_backend_dev_get(i)
        out.append({
            "name": (lib.ggml_backend_dev_name(d) or b"").decode("utf-8", "replace"),
            "description": (lib.ggml_backend_dev_description(d) or b"").decode("utf-8", "replace"),
            "type": DEVICE_TYPES.get(int(lib.ggml_backend_dev_type(d)), "other"),
        })
    return out


def ggml_backends() -> list[str]:
    """The ggml backends this build was compiled with (CPU, Vulkan, ROCm, Metal, CUDA ...), seen or not."""
    lib = _ggml()
    if lib is None:
        return []
    return [(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)) or b"").decode("utf-8", "replace")
            for i in range(lib.ggml_backend_reg_count())]


def llama_environment() -> dict[str, Any]:
    """Versions and devices of this llama.cpp build, merged into every trace's ``environment``."""
    global _ENV
    if _ENV is None:
        ll = _init()
        try:
            sysinfo = ll.llama_print_system_info().decode("utf-8", "replace").strip()
        except Exception:
            sysinfo = None
        try:
            devices = ggml_devices()
            backends = ggml_backends()
        except Exception:
            devices, backends = [], []
        _ENV = {
            "ggml_backends": backends,
            "llama_cpp_python": getattr(ll, "__version__", None),
            "llama_cpp_system_info": sysinfo,
            "ggml_devices": devices,
            "gpu_offload": bool(ll.llama_supports_gpu_offload()),
        }
    return dict(_ENV)
