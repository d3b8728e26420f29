"""The one QApplication of the process, on screen or offscreen.

The desktop app, the report plots (``specview report`` draws them with the
app's own plot widgets) and the tests all get their application here.  Without
a display (no ``DISPLAY`` / ``WAYLAND_DISPLAY`` on Linux) or when asked for it,
the application runs on Qt's ``offscreen`` platform: widgets are laid out and
painted into images, never shown.
"""

from __future__ import annotations

import os
import sys

from .qtcompat import guard

APP_NAME = "specview"
DESKTOP_ID = "io.github.specview.specview"


def _no_display() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def application(*, offscreen: bool = False, argv: list[str] | None = None):
    """The running QApplication, or a new one (offscreen when asked for, or when there is no display)."""
    guard()
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is not None:
        return app
    if (offscreen or _no_display()) and not os.environ.get("QT_QPA_PLATFORM"):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    app = QApplication(list(argv) if argv else [APP_NAME])
    app.setApplicationName(APP_NAME)
    app.setOrganizationName(APP_NAME)
    app.setDesktopFileName(DESKTOP_ID)
    return app
