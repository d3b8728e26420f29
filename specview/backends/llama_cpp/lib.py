"""llama-cpp-python itself: importing it, its log, threads, and what the build reports.

llama.cpp's log goes into a ring buffer; when a load fails its last lines
explain why, in the error message.
"""

from __future__ import annotations

import collections
import ctypes
import os
import threading
from pathlib import Path
from typing import Any

from ...core.errors import BackendUnavailable, ConfigError

THREADS_VARIABLE = "SPECVIEW_THREADS"

_lock = threading.Lock()
_initialised = False
_log_lines: collections.deque[str] = collections.deque(maxlen=200)
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


def default_threads() -> int:
    """Threads when --threads is 0: ``$SPECVIEW_THREADS`` if set to a positive number, else every usable core.

    llama.cpp's worker threads spin at barriers, so on a busy machine fewer
    threads than cores can be much faster; the variable lets a user (or a
    shared build machine) say so once.  ``0`` (or unset) means every core; any
    other value that is not a whole number is refused rather than ignored, since
    the thread count can move the logits.
    """
    env = os.environ.get(THREADS_VARIABLE, "").strip()
    if env:
        if not env.isdigit():
            raise ConfigError(
                f"${THREADS_VARIABLE}={env!r} is not a whole number of threads; set it to a number "
                "such as 2 (0 means every core), or unset it", setting="threads")
        if int(env) > 0:
            return int(env)
    return usable_cores()


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, else every core)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int) -> int:
    """The thread count a context really gets for the ``threads`` setting (0: :func:`default_threads`)."""
    return int(threads) if threads and threads > 0 else default_threads()


def ggml_devices() -> list[dict[str, str]]:
    """The ggml backend devices this llama.cpp build sees (CPU, Vulkan0, ROCm0, Metal, CUDA0...)."""
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
        return []
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        d = lib.ggml_backend_dev_get(i)
        out.append({
            "name": (lib.ggml_backend_dev_name(d) or b"").decode("utf-8", "replace"),
            "description": (lib.ggml_backend_dev_description(d) or b"").decode("utf-8", "replace"),
        })
    return out


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
        except Exception:
            devices = []
        _ENV = {
            "llama_cpp_python": getattr(ll, "__version__", None),
            "llama_cpp_system_info": sysinfo,
            "ggml_devices": devices,
            "gpu_offload": bool(ll.llama_supports_gpu_offload()),
        }
    return dict(_ENV)
