"""Help ▸ About this setup: what specview will run on, as ``specview doctor`` says it, with a Copy button.

The facts are gathered on a worker thread (``deep=False``: no model is loaded),
so the dialog opens at once and fills in when they arrive.
"""

from __future__ import annotations

import threading
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout

from ..core.doctor import format_facts, gather

WAITING = "looking at this setup…"


class _Relay(QObject):
    done = Signal(str)


def setup_text(settings: Any = None) -> str:
    """The doctor's report for ``settings`` (engine settings), or why it could not be made."""
    try:
        return format_facts(gather(settings, deep=False))
    except Exception as exc:  # the dialog shows what went wrong instead of failing to open
        return f"specview could not look at this setup: {type(exc).__name__}: {exc}"


class AboutSetupDialog(QDialog):
    """The setup facts in a read-only text box; Copy puts them on the clipboard."""

    sigReady = Signal(str)

    def __init__(self, parent: Any = None, settings: Any = None, *, gather_now: bool = True):
        super().__init__(parent)
        self.setObjectName("about_setup")
        self.setWindowTitle("About this setup")
        self.resize(860, 560)
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("What specview will run on here (the same as <code>specview doctor</code>; "
                             "every trace records it in its environment block):"))
        self.text = QPlainTextEdit(WAITING)
        self.text.setReadOnly(True)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        lay.addWidget(self.text)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.copy_button = QPushButton("&Copy")
        self.copy_button.setEnabled(False)
        self.copy_button.clicked.connect(self.copy)
        buttons.addButton(self.copy_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self._relay = _Relay()
        self._relay.done.connect(self._show, Qt.ConnectionType.QueuedConnection)
        self.thread: threading.Thread | None = None
        if gather_now:
            self.start(settings)

    def start(self, settings: Any = None) -> None:
        """Gather the facts off the GUI thread; they replace the placeholder when they arrive."""
        relay = self._relay
        self.thread = threading.Thread(target=lambda: relay.done.emit(setup_text(settings)),
                                       name="specview-about-setup", daemon=True)
        self.thread.start()

    def _show(self, text: str) -> None:
        self.text.setPlainText(text)
        self.copy_button.setEnabled(True)
        self.sigReady.emit(text)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text.toPlainText())


def show_about_setup(window: Any) -> AboutSetupDialog:
    """Help ▸ About this setup, for the engine settings the window's controls hold (the defaults if they are
    not valid right now)."""
    from ..core.errors import SpecviewError

    try:
        settings = window.build_config().engine
    except SpecviewError:
        settings = None
    dlg = AboutSetupDialog(window, settings)
    dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    window.about_setup = dlg
    dlg.show()
    return dlg
