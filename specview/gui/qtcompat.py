"""Two guards for PySide6: against a reference-count bug, and against Qt objects freed off the GUI thread.

The reference-count bug is seen with PySide6 6.12.0 on CPython 3.11.

In that combination every call of a wrapped C++ method that returns nothing
drops one reference to ``None``, and every ``SignalInstance.emit()`` drops one
reference to ``True``.  CPython 3.12 and later make those singletons immortal,
so the bug is harmless there; on 3.11 the interpreter aborts ("deallocating
None") after a few thousand calls, which a streaming GUI reaches in seconds.

:func:`guard` detects the bug with a probe and, only if it is present, gives
``None``, ``True`` and ``False`` a reference count so large that it cannot
reach zero, which is what CPython 3.12's immortal objects do.

Python's cyclic garbage collector runs in whichever thread happens to allocate
when a generation fills up: in the app that is often the model worker's thread
or the model scan's.  A cycle that holds a widget (pyqtgraph's items are full of
them) collected there frees the widget in that thread: a Python subclass of a
widget is destroyed right there, which can crash, and a plain one is queued by
PySide for deletion on the GUI thread at its next call into Python, which can be
inside a layout's ``sizeHint`` and there wait forever on a Qt lock.
:class:`MainThreadCollector` turns automatic collection off while the app runs
and collects on a timer on the GUI thread instead (pyqtgraph's
``GarbageCollector`` does the same), so no Qt object is freed by another thread's
collection.
"""

from __future__ import annotations

import ctypes
import gc
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


def collect_due() -> int:
    """Collect, on the calling thread, the oldest generation whose count has passed its threshold (with the younger
    ones), as the interpreter's automatic collection would; the unreachable objects found (0 when none is due)."""
    threshold, counts = gc.get_threshold(), gc.get_count()
    due = [gen for gen in range(3) if counts[gen] > threshold[gen]]
    return gc.collect(due[-1]) if due else 0


class MainThreadCollector:
    """Python's cyclic garbage collection on the GUI thread only: automatic collection off, and every
    ``interval_ms`` (on the GUI thread's event loop) what the interpreter would have collected by now
    (:func:`collect_due`).  :meth:`stop` collects everything once more, here, and restores automatic
    collection as it was."""

    def __init__(self, interval_ms: int = 1000):
        from PySide6.QtCore import QTimer

        self._was_enabled = gc.isenabled()
        self.timer = QTimer()
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(collect_due)
        gc.disable()
        self.timer.start()

    @property
    def running(self) -> bool:
        return self.timer.isActive()

    def stop(self) -> int:
        """Stop the timer, collect every generation here, and turn automatic collection back on if it was on."""
        self.timer.stop()
        found = gc.collect()
        if self._was_enabled:
            gc.enable()
        return found
