"""``specview gui``: open the desktop app (also what ``specview`` with no arguments does)."""

from __future__ import annotations

import argparse
import os
import sys


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "gui",
        help="open the desktop app",
        description="Open the desktop app: both arms side by side as they stream, the fork marked, "
        "acceptance and margin plots, and a verdict. With TRACE, open a saved trace (no model needed).",
    )
    p.add_argument("trace", nargs="?", metavar="TRACE", help="a trace JSON to open (from `specview run --json` or Save)")
    p.add_argument("--theme", choices=["system", "light", "dark"], default=None,
                   help="colour theme (default: the one used last)")
    p.add_argument("--run", action="store_true", help="start a run with the remembered settings as soon as the window opens")
    p.add_argument("--no-preload", action="store_true", help="do not load the models before the first run")
    p.add_argument("--fresh", action="store_true", help="ignore the remembered models and settings (start from the demo)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from ..core.engine import SpecviewError

    try:
        from PySide6.QtCore import QTimer
        from PySide6.QtWidgets import QApplication
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SpecviewError(f"the desktop app needs PySide6 ({exc}); install it with `pip install PySide6-Essentials`") from exc
    if args.trace and not os.path.exists(args.trace):
        raise SpecviewError(f"{args.trace}: no such trace file")

    from ..gui.window import MainWindow, default_settings_path

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("specview")
    app.setOrganizationName("specview")
    app.setDesktopFileName("io.github.specview.specview")
    settings_path = default_settings_path()
    if args.fresh and settings_path.exists():
        settings_path = settings_path.with_name("gui.fresh.json")
        settings_path.unlink(missing_ok=True)
    win = MainWindow(settings_path=settings_path, preload=not args.no_preload and not args.trace)

    def report(exc_type, exc, tb):  # an unexpected error becomes a message, never a crash
        import traceback

        win.show_error(f"{exc_type.__name__}: {exc}", "".join(traceback.format_exception(exc_type, exc, tb)))

    sys.excepthook = report
    if args.theme:
        win.apply_theme(args.theme)
    win.show()
    if args.trace:
        win.open_trace(args.trace)
    elif args.run:
        QTimer.singleShot(0, win.run)
    return int(app.exec() or 0)
