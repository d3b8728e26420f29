"""The Models menu and the model scan's place in the window: add or forget a models folder, rescan, and the
scan's problems (each thing it skipped, with why).

:func:`attach_discovery` gives the window its :class:`~specview.gui.models.scan.ModelScanner`
(``w.model_scan``) and starts the first scan once the window is up, so the
window opens at once on the demo names and lists the found models when the
scan ends.  :func:`build_models_menu` adds the menu; its actions are stored on
the window (``w.act_add_folder``, ``w.act_rescan``, ``w.act_scan_problems``).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFileDialog, QLabel, QMenu, QPlainTextEdit, QVBoxLayout

from ...core.errors import SpecviewError
from ...core.models import Scan, add_folder, remove_folder, user_folders
from .scan import ModelScanner


def attach_discovery(w: Any) -> None:
    """The window's scanner; its first scan starts when the event loop runs (the window is shown first)."""
    w.model_scan = ModelScanner(w)
    w.model_scan.sigScanned.connect(lambda scan: scanned(w, scan))
    w.model_scan.sigProgress.connect(lambda msg: w.busy or w.show_status(f"looking for models: {msg}"))
    w.controls.offers.sigRefused.connect(w.show_error)
    QTimer.singleShot(0, w.model_scan.start)


def scanned(w: Any, scan: Scan) -> None:
    """A scan ended: the pickers list what it found, the menu counts what it skipped."""
    w.controls.offers.set_scan(scan)
    n = len(scan.problems)
    w.act_scan_problems.setText(f"Scan &problems ({n})…")
    w.act_scan_problems.setEnabled(n > 0)
    if not w.busy:
        w.show_status(f"found {len(scan.models)} models" + (f", skipped {n} (Models ▸ Scan problems)" if n else ""))


def build_models_menu(w: Any, menubar: Any) -> QMenu:
    """Models ▸ Add a models folder…, Forget a models folder, Rescan models, Scan problems (n)…"""
    m = menubar.addMenu("&Models")
    m.setToolTipsVisible(True)
    w.act_add_folder = QAction("&Add a models folder…", w, triggered=lambda: add_folder_dialog(w))
    w.act_add_folder.setToolTip("look for GGUF files and model folders in a folder of your own, from now on")
    w.m_forget = QMenu("&Forget a models folder", w)
    w.m_forget.aboutToShow.connect(lambda: _fill_forget(w))
    w.act_rescan = QAction("&Rescan models", w, triggered=lambda: w.model_scan.start())
    w.act_rescan.setToolTip("look again in LM Studio, ollama, the Hugging Face cache, llama.cpp's cache and your "
                            "folders")
    w.act_scan_problems = QAction("Scan &problems (0)…", w, triggered=lambda: show_scan_problems(w))
    w.act_scan_problems.setToolTip("what the last scan skipped (corrupt files, missing blobs, unreadable folders) "
                                   "and why")
    w.act_scan_problems.setEnabled(False)
    m.addAction(w.act_add_folder)
    m.addMenu(w.m_forget)
    m.addAction(w.act_rescan)
    m.addSeparator()
    m.addAction(w.act_scan_problems)
    return m


def _change_folders(w: Any, change: Any, folder: str, said: str) -> bool:
    """Add or forget a models folder (``change``), then scan again; a refusal goes to the error bar."""
    try:
        change(folder)
    except SpecviewError as exc:
        w.show_error(str(exc))
        return False
    w.show_status(f"{said} {folder}; looking for models…")
    w.model_scan.start()
    return True


def add_models_folder(w: Any, folder: str) -> bool:
    """Remember ``folder`` for every scan and scan again."""
    return _change_folders(w, add_folder, folder, "added")


def forget_models_folder(w: Any, folder: str) -> bool:
    """Leave ``folder`` out of every scan from now on and scan again."""
    return _change_folders(w, remove_folder, folder, "forgot")


def add_folder_dialog(w: Any) -> None:
    folder = QFileDialog.getExistingDirectory(w, "A folder with models (GGUF files or model folders)", str(Path.home()))
    if folder:
        add_models_folder(w, folder)


def _fill_forget(w: Any) -> None:
    w.m_forget.clear()
    try:
        folders = user_folders()
    except SpecviewError as exc:
        w.m_forget.addAction(str(exc)).setEnabled(False)
        return
    if not folders:
        w.m_forget.addAction("(no folders added)").setEnabled(False)
    for f in folders:
        w.m_forget.addAction(f, lambda f=f: forget_models_folder(w, f))


def problems_text(scan: Scan | None) -> str:
    """One line per thing the scan skipped: the path, then why."""
    if scan is None:
        return "No scan has finished yet."
    if not scan.problems:
        return "The last scan skipped nothing."
    return "\n".join(f"{p.path}\n    {p.why}" for p in scan.problems)


def show_scan_problems(w: Any) -> QDialog:
    """A dialog listing what the last scan skipped (kept on ``w.problems_dialog``; not modal)."""
    scan = w.model_scan.last
    dlg = QDialog(w)
    dlg.setWindowTitle("Model scan problems")
    lay = QVBoxLayout(dlg)
    n = len(scan.problems) if scan else 0
    said = (f"The last scan skipped {n} thing{'s' if n != 1 else ''}; everything else it found is listed in the "
            "pickers.  <i>Models ▸ Rescan models</i> looks again.") if scan else html.escape(problems_text(None))
    head = QLabel(said)
    head.setWordWrap(True)
    text = QPlainTextEdit(problems_text(scan))
    text.setObjectName("scan_problems")
    text.setReadOnly(True)
    text.setMinimumSize(640, 260)
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
    buttons.rejected.connect(dlg.reject)
    lay.addWidget(head)
    lay.addWidget(text, 1)
    lay.addWidget(buttons)
    w.problems_dialog = dlg
    dlg.show()
    return dlg
