"""Model discovery off the GUI thread: one scanner thread that runs :func:`specview.core.models.scan`.

The window opens at once with the demo names; the scan of the model stores
(LM Studio, ollama, the Hugging Face cache, llama.cpp's cache, the folders the
user added) runs on its own thread, and its :class:`~specview.core.models.Scan`
comes back to the GUI thread as one signal.  A newer scan supersedes an older
one (only the newest result is shown); stopping cancels a scan at its next
progress report and joins the thread, so closing the window never waits for a
slow disk longer than one folder.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from ...core.models import Problem, Scan, scan


class ScanCancelled(BaseException):
    """Raised from the scan's progress callback when a newer scan or the window's close superseded it (a
    BaseException: the scan's guard against one bad file, ``except Exception``, must not swallow it)."""


@dataclass
class ScanRequest:
    """One scan: its number (a newer one supersedes it) and the scan's arguments (None: the user's stores)."""

    id: int
    roots: Any = None
    cancelled: threading.Event = field(default_factory=threading.Event)


class _ScanWorker(QObject):
    sigScanned = Signal(object, object)  # (ScanRequest, Scan)
    sigProgress = Signal(object, str)  # (ScanRequest, message)

    @Slot(object)
    def scan(self, req: ScanRequest) -> None:
        if req.cancelled.is_set():
            return

        def progress(msg: str) -> None:
            if req.cancelled.is_set():
                raise ScanCancelled
            self.sigProgress.emit(req, msg)

        try:
            found = scan(req.roots, progress=progress)
        except ScanCancelled:
            return
        except Exception as exc:  # noqa: BLE001 - discovery never stops the app: the failure is one problem line
            found = Scan(problems=[Problem("(model scan)", f"the scan stopped: {type(exc).__name__}: {exc}")])
        self.sigScanned.emit(req, found)


class ModelScanner(QObject):
    """Runs model scans on a thread of its own; :attr:`last` is the newest finished scan (None before the first)."""

    sigScanned = Signal(object)  # Scan, in the GUI thread, newest request only
    sigProgress = Signal(str)
    _sigScan = Signal(object)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.last: Scan | None = None
        self.pending: ScanRequest | None = None
        self._n = 0
        self._worker = _ScanWorker()
        self.thread = QThread()
        self.thread.setObjectName("specview-model-scan")
        self._worker.moveToThread(self.thread)
        self._sigScan.connect(self._worker.scan)
        self._worker.sigScanned.connect(self._on_scanned)
        self._worker.sigProgress.connect(self._on_progress)
        self._stopped = False
        self.thread.start()

    @property
    def busy(self) -> bool:
        return self.pending is not None

    def start(self, roots: Any = None) -> ScanRequest | None:
        """Scan again (``roots`` None: the user's stores and added folders); an unfinished scan is cancelled."""
        if self._stopped:
            return None
        if self.pending is not None:
            self.pending.cancelled.set()
        self._n += 1
        self.pending = req = ScanRequest(self._n, roots)
        self._sigScan.emit(req)
        return req

    def _on_scanned(self, req: ScanRequest, found: Scan) -> None:
        if self.pending is None or req.id != self.pending.id:
            return  # superseded
        self.pending = None
        self.last = found
        self.sigScanned.emit(found)

    def _on_progress(self, req: ScanRequest, msg: str) -> None:
        if self.pending is not None and req.id == self.pending.id:
            self.sigProgress.emit(msg)

    def stop(self, timeout_ms: int = 30000) -> bool:
        """Cancel the scan in progress and join the thread."""
        if self._stopped:
            return True
        self._stopped = True
        if self.pending is not None:
            self.pending.cancelled.set()
        self.thread.quit()
        return bool(self.thread.wait(timeout_ms))
