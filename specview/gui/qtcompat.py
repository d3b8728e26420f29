"""A guard against a PySide6 reference-count bug seen with PySide6 6.12.0 on CPython 3.11.

In that combination every call of a wrapped C++ method that returns nothing
drops one reference to ``None``, and every ``SignalInstance.emit()`` drops one
reference to ``True``.  CPython 3.12 and later make those singletons immortal,
so the bug is harmless there; on 3.11 the interpreter aborts ("deallocating
None") after a few thousand calls, which a streaming GUI reaches in seconds.

:func:`guard` detects the bug with a probe and, only if it is present, gives
``None``, ``True`` and ``False`` a reference count so large that it cannot
reach zero, which is what CPython 3.12's immortal objects do.
"""

from __future__ import annotations

import ctypes
import sys

_BOOST = 1 << 40
_applied: bool | None = None


def _leaks() -> bool:
    from PySide6.QtCore import QObject, Signal

    class _Probe(QObject):
        sig = Signal()

    probe = _Probe()
    n = 64
    none0, true0 = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(n):
        probe.setObjectName("probe")
        probe.sig.emit()
    lost = max(none0 - sys.getrefcount(None), true0 - sys.getrefcount(True))
    return lost >= n // 2


def guard() -> bool:
    """Apply the guard if this PySide6 build needs it; True if it was applied."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    try:
        if not _leaks():
            return False
    except Exception:  # no PySide6, or a probe that cannot run: nothing to guard
        return False
    for obj in (None, True, False):
        ctypes.c_ssize_t.from_address(id(obj)).value += _BOOST
    _applied = True
    return True
