"""Opening and saving traces in the main window, and the message a file that cannot be written gets: what
File ▸ Open, File ▸ Save, the crash bar's Save and a failed export do with the window ``w``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QFileDialog, QMessageBox

from ..core.errors import SpecviewError
from ..core.trace import Trace
from .kernels import is_kernel_map_file
from .locate import is_locate_file
from .matrix import is_matrix_file


def open_trace(w: Any, path: str | os.PathLike[str]) -> Trace | None:
    """Open a saved trace and show it as a live one (no model needed); a matrix or kernel map file opens in
    its tab."""
    if is_matrix_file(path):
        w.open_matrix(path)
        return None
    if is_kernel_map_file(path):
        w.open_kernel_map(path)
        return None
    if is_locate_file(path):
        w.locate_tab.open(path)
        return None
    try:
        trace = Trace.load(path)
    except SpecviewError as exc:
        w.show_error(str(exc))
        return None
    if w.busy and not w.long_job():  # a running matrix or map goes on
        w.cancel()
        w.set_busy(False, "")  # the cancelled run's events are stale from here on
    w.request = None
    w.live.timer.stop()
    w.side.streamed = w.live.begin(None).steps
    w.panes.clear()
    problem = w.set_controls_from_trace(trace)
    w.setWindowTitle(f"specview — {Path(path).name}")
    w.counters.setText("")
    w.show_trace(trace)
    if problem:
        w.show_status(problem)
    return trace


def save_trace(w: Any, path: str | os.PathLike[str]) -> Path | None:
    """Write the trace on screen to ``path``; None (the reason shown) when there is none or it cannot be written."""
    if w.trace is None:
        w.show_error("nothing to save yet: run both arms first")
        return None
    try:
        p = w.trace.save(path)
    except (SpecviewError, OSError) as exc:
        w.show_file_error("Could not save the trace", str(exc))
        return None
    w.show_status(f"saved {p}")
    return p


def save_crash_trace(w: Any, path: str | os.PathLike[str] | None = None) -> str | None:
    """Write the run the engine computed before it crashed (asks where when ``path`` is None)."""
    ev = w.crashed
    if ev is None or ev.trace is None:
        return None
    if path is None:
        path, _ = QFileDialog.getSaveFileName(w, "Save the crashed run", "crash-trace.json", "Traces (*.json)")
        if not path:
            return None
    return str(ev.trace.save(path))


def show_file_error(w: Any, what: str, why: str) -> None:
    """A file that could not be written (a save, an export): said in a message box over the window, the
    verdict bar keeping the run's verdict, which a failed save does not change."""
    w.last_error = f"{what}: {why}"
    box = w.file_error_box = QMessageBox(QMessageBox.Icon.Warning, "specview", what, parent=w)
    box.setInformativeText(why[3:] if why.startswith("-o ") else why)  # the CLI's flag means nothing here
    box.open()  # window-modal, without blocking the event loop
    w.show_status(what.lower())
    w.sigError.emit(w.last_error)
