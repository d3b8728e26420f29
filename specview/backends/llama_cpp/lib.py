"""llama-cpp-python itself: importing it, its log, threads, and what the build reports.

llama.cpp's log goes into a ring buffer; when a load fails its last lines
explain why, in the error message.
"""

from __future__ import annotations

import collections
import ctypes
import importlib.util
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

from ...core.config import THREADS_VARIABLE, default_threads, resolve_threads, usable_cores  # noqa: F401
from ...core.errors import BackendUnavailable
from .plant import repacked_buffer_line

_lock = threading.Lock()
_initialised = False
_log_lines: collections.deque[str] = collections.deque(maxlen=2000)  # a model load logs a line per layer
_log_cb = None  # keep the ctypes callback alive
_vk_lines: list[str] = []  # what ggml-vulkan said of its devices when it started (printed once per process)
_repack_lines: list[str] = []  # "CPU_REPACK model buffer" lines of loads not yet checked (kept past clear_log())
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
                    line = text.decode("utf-8", "replace")
                    _log_lines.append(line)
                    if line.startswith("ggml_vulkan: "):  # the device lines, kept past clear_log()
                        _vk_lines.append(line)
                    elif repacked_buffer_line(line):
                        _repack_lines.append(line.strip())
                except Exception:
                    pass

            _log_cb = _cb
            ll.llama_log_set(_log_cb, ctypes.c_void_p(0))
            ll.llama_backend_init()
            _initialised = True
    return ll


def take_repack_lines() -> list[str]:
    """The repacked-buffer lines llama.cpp logged since the last call (every load in this process, whoever made
    it), and forget them: a model loaded with repacked weights leaves one here."""
    out = list(_repack_lines)
    del _repack_lines[: len(out)]
    return out


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


#: llama-cpp-python's switch to load another build's libllama (and so its libggml) from a folder
LIB_PATH_VARIABLE = "LLAMA_CPP_LIB_PATH"


def lib_dir() -> Path:
    """The folder of the libllama this process runs: the one llama-cpp-python loaded
    (``$LLAMA_CPP_LIB_PATH`` when set, else its own ``llama_cpp/lib``).

    Its libggml is the one that holds the backends and devices of that build;
    the copy inside the package may be another build (a CPU one).
    """
    ll = _lib()
    loaded = getattr(getattr(getattr(ll, "llama_cpp", None), "_lib", None), "_name", None)
    if loaded and os.path.isabs(loaded) and os.path.exists(loaded):
        return Path(loaded).resolve().parent
    return Path(ll.__file__).parent / "lib"


def _package_lib_dir() -> Path | None:
    """``llama_cpp/lib`` of the installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent / "lib"


def builds_backend(name: str) -> bool:
    """Whether the llama.cpp build this process would load has the ggml backend ``name`` ("vulkan", "cuda" ...),
    from its files alone (nothing is imported or loaded, so it is cheap for the app's controls)."""
    if "llama_cpp" in sys.modules and _ENV is not None:
        return name.lower() in {b.lower() for b in _ENV.get("ggml_backends") or []}
    override = os.environ.get(LIB_PATH_VARIABLE)
    folder = Path(override) if override else _package_lib_dir()
    if folder is None or not folder.is_dir():
        return False
    return any(folder.glob(f"*ggml-{name.lower()}*"))


def apply_environment(env: dict[str, str]) -> list[str]:
    """Put ``env`` (ggml's start-up knobs, ``GGML_VK_*``) into this process's environment before llama.cpp loads.

    Returns the variables that could not take effect: llama.cpp is already loaded
    here with another value (ggml reads them once); the engine's own process
    (the worker) applies them before loading instead.
    """
    late = []
    for k, v in env.items():
        if os.environ.get(k) == v:
            continue
        if _initialised:
            late.append(k)
        else:
            os.environ[k] = v
    return late


def ggml_environment() -> dict[str, str]:
    """The ``GGML_*`` variables in this process's environment (ggml reads them at start-up; traces record them)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("GGML_VK_") or k == LIB_PATH_VARIABLE}


def _ggml() -> Any:
    """libggml of the llama.cpp build this process runs, with the device registry's signatures set; None if not found."""
    _init()
    libdir = lib_dir()
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
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
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
    vk = vulkan_device_lines()
    for i in range(lib.ggml_backend_dev_count()):
        d = lib.ggml_backend_dev_get(i)
        dev: dict[str, Any] = {
            "name": (lib.ggml_backend_dev_name(d) or b"").decode("utf-8", "replace"),
            "description": (lib.ggml_backend_dev_description(d) or b"").decode("utf-8", "replace"),
            "type": DEVICE_TYPES.get(int(lib.ggml_backend_dev_type(d)), "other"),
        }
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        try:
            lib.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
            if total.value:
                dev["memory_mib"] = int(total.value // (1 << 20))
        except Exception:
            pass
        m = re.fullmatch(r"Vulkan(\d+)", dev["name"])
        if m and int(m.group(1)) in vk:
            dev.update(vk[int(m.group(1))])
        if software_rasteriser(dev["description"]):
            dev["software"] = True
        out.append(dev)
    return out


#: names of Vulkan drivers that run on the CPU (Mesa's lavapipe reports itself as llvmpipe)
SOFTWARE_DEVICES = ("llvmpipe", "lavapipe", "softpipe", "swiftshader")


def software_rasteriser(description: str) -> bool:
    """Whether a device is a CPU rasteriser posing as a GPU (Mesa's lavapipe, SwiftShader)."""
    d = (description or "").lower()
    return any(s in d for s in SOFTWARE_DEVICES)


def vulkan_device_lines() -> dict[int, dict[str, Any]]:
    """What ggml-vulkan printed of each device when it started (``ggml_vulkan: 0 = llvmpipe ... | fp16: 1 |
    int dot: 0 | matrix cores: none``): the features that decide its kernels, as {index: facts}."""
    out: dict[int, dict[str, Any]] = {}
    for line in "".join(_vk_lines).splitlines():
        m = re.match(r"ggml_vulkan: (\d+) = (.*)$", line.strip())
        if not m:
            continue
        parts = [p.strip() for p in m.group(2).split("|")]
        facts: dict[str, Any] = {"vulkan_line": m.group(2).strip()}
        for p in parts[1:]:
            k, _, v = p.partition(":")
            k, v = k.strip().replace(" ", "_"), v.strip()
            if k:
                facts[f"vk_{k}"] = int(v) if v.isdigit() else v
        out[int(m.group(1))] = facts
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
            "llama_lib_dir": str(lib_dir()),
            "ggml_env": ggml_environment(),
            **build_facts(getattr(ll, "__version__", None)),
        }
    return dict(_ENV)


#: the llama.cpp commit each llama-cpp-python release vendors (its CHANGELOG.md: "update llama.cpp to
#: ggml-org/llama.cpp@..."); a source build without git records no commit of its own
VENDORED_LLAMA_CPP = {"0.3.36": "0c1e57098", "0.3.35": "4df29be4f", "0.3.34": "e3546c794", "0.3.33": "78d2f5246"}


def build_facts(version: str | None) -> dict[str, Any]:
    """What this build says of its own making: ggml's version and commit (``ggml_version``, ``ggml_commit``; a
    build from a source archive says "unknown"), the llama.cpp commit the llama-cpp-python release vendors, and
    the compiler libllama (or libggml-base) was built with (its ELF ``.comment``).  What it cannot read is left
    out."""
    out: dict[str, Any] = {}
    if version in VENDORED_LLAMA_CPP:
        out["llama_cpp_vendored_commit"] = VENDORED_LLAMA_CPP[version]
    for path in sorted(lib_dir().glob("libggml-base*")):
        try:
            lib = ctypes.CDLL(str(path))
            for name in ("ggml_version", "ggml_commit"):
                fn = getattr(lib, name, None)
                if fn is not None:
                    fn.restype, fn.argtypes = ctypes.c_char_p, []
                    out[name] = (fn() or b"").decode("utf-8", "replace")
        except OSError:
            continue
        break
    for path in [*sorted(lib_dir().glob("libllama*")), *sorted(lib_dir().glob("libggml-base*"))]:
        try:
            with open(path, "rb") as fh:
                found = re.search(rb"(GCC: \([^\x00]{1,80}\) [^\x00]{1,40}|clang version [^\x00]{1,60})", fh.read())
        except OSError:
            continue
        if found:
            out["compiler"] = found.group(1).decode("utf-8", "replace")
            break
    return out
