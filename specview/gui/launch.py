"""Start the desktop app: the window on the remembered settings, a file opened, or a run started."""

from __future__ import annotations

import sys

from PySide6.QtCore import QTimer

from .app import application
from .settings import default_settings_path
from .window import MainWindow


def run_app(*, path: str | None = None, theme: str | None = None, run: bool = False, preload: bool = True,
            fresh: bool = False) -> int:
    """Open the window and run the event loop until it closes; the exit status."""
    app = application(argv=sys.argv[:1])
    settings_path = default_settings_path()
    if fresh and settings_path.exists():
        settings_path = settings_path.with_name("gui.fresh.json")
        settings_path.unlink(missing_ok=True)
    win = MainWindow(settings_path=settings_path, preload=preload and not path)

    def report(exc_type, exc, tb):  # an unexpected error becomes a message, never a crash
        import traceback

        win.show_error(f"{exc_type.__name__}: {exc}", "".join(traceback.format_exception(exc_type, exc, tb)))

    sys.excepthook = report
    if theme:
        win.apply_theme(theme)
    win.show()
    if path:
        win.open_trace(path)
    elif run:
        QTimer.singleShot(0, win.run)
    return int(app.exec() or 0)
