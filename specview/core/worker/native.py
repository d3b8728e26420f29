"""The native frames of a crash, printed by the dying worker itself (glibc's ``backtrace``).

:mod:`faulthandler` prints the Python frames of a fatal signal, not the C
ones, and the C ones are what names a crash inside llama.cpp or a GPU driver
(``ggml_backend_amx_mul_mat`` in ``libggml-cpu.so``).  On glibc, a handler
installed through ctypes writes ``backtrace_symbols_fd`` to the worker's log,
then the Python frames, then restores the default action and re-sends the
signal, so the process still ends by the same signal and the parent sees
exactly what happened.  Elsewhere (macOS, musl) only faulthandler's account
is written.  This runs in a process that is dying anyway: if the hook itself
fails, the signal's default action still ends the process.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
from typing import Any

MARK = "specview: fatal signal"
_keep: list[Any] = []  # the handlers and buffers must outlive this module's functions


def install_native_backtrace(fd: int) -> bool:
    """Print the native and Python frames to ``fd`` on SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        backtrace = libc.backtrace
        symbols_fd = libc.backtrace_symbols_fd
    except (OSError, AttributeError):
        return False
    backtrace.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    backtrace.restype = ctypes.c_int
    symbols_fd.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
    handler_t = ctypes.CFUNCTYPE(None, ctypes.c_int)
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal.restype = ctypes.c_void_p
    buf = (ctypes.c_void_p * 64)()
    backtrace(buf, 64)  # the first call loads libgcc's unwinder: do it now, not in the handler
    log = os.fdopen(os.dup(fd), "w", buffering=1)

    def on_fatal(signum: int) -> None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        try:
            os.write(fd, f"\n{MARK} {name}; native frames:\n".encode())
            n = backtrace(buf, 64)
            symbols_fd(buf, n, fd)
            os.write(fd, b"Python frames:\n")
            faulthandler.dump_traceback(file=log, all_threads=True)
        finally:
            libc.signal(signum, None)  # SIG_DFL
            os.kill(os.getpid(), signum)

    handler = handler_t(on_fatal)
    _keep.extend([handler, buf, log, libc])
    for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT):
        libc.signal(int(sig), ctypes.cast(handler, ctypes.c_void_p))
    return True
