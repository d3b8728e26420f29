"""Start the desktop app: the window on the remembered settings, a file opened, or a run started."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

from PySide6.QtCore import QTimer

from .app import application, window_problem
from .qtcompat import MainThreadCollector
from .settings import default_settings_path
from .window import MainWindow


def run_app(*, path: str | None = None, theme: str | None = None, run: bool = False, preload: bool = True,
            fresh: bool = False, smoke: str | None = None, smoke_tokens: int = 16,
            smoke_timeout: float = 1800.0) -> int:
    """Open the window and run the event loop until it closes; the exit status.

    ``smoke`` (a trace path) is the self-test a packager runs on a built bundle:
    the window opens on the demo with fresh settings, runs ``smoke_tokens``
    tokens per arm, writes the trace there and exits 0; an error exits 1, and no
    trace within ``smoke_timeout`` seconds exits 3.
    """
    problem = None if smoke else window_problem()  # the smoke test runs offscreen where there is no display
    if problem:
        from ..core.errors import SpecviewError

        raise SpecviewError(problem)
    app = application(argv=sys.argv[:1])
    collector = MainThreadCollector()  # no Qt object is freed by a worker thread's garbage collection
    try:
        if smoke:
            return _smoke(app, smoke, smoke_tokens, smoke_timeout)
        return _window(app, path=path, theme=theme, run=run, preload=preload, fresh=fresh)
    finally:
        collector.stop()


def _window(app, *, path: str | None, theme: str | None, run: bool, preload: bool, fresh: bool) -> int:
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
    if os.environ.get("SPECVIEW_EXIT_WHEN_SHOWN"):  # start-up benchmarks: the window is up, stop here
        QTimer.singleShot(0, lambda: (print("specview: window shown", flush=True), app.quit()))
    if path:
        win.open_trace(path)
    elif run:
        QTimer.singleShot(0, win.run)
    received = close_on_signals(win)
    try:
        code = int(app.exec() or 0)
    finally:
        received.restore()
    if received.signum is not None:
        print(f"specview: {'terminated' if received.signum == signal.SIGTERM else 'interrupted'}: the window "
              "closed as its close button does (settings saved, the engine's process stopped)", file=sys.stderr)
        return 128 + received.signum
    return code


class Received:
    """The signal that closed the window (None: none), and how to put back what :func:`close_on_signals` set."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.restore: Callable[[], None] = lambda: None


def close_on_signals(win: MainWindow) -> Received:
    """SIGTERM (``kill``, a logout) and SIGINT (Ctrl-C in the terminal that started the app) close the window as
    its close button does: the settings saved, the engine's process stopped and its folder removed. Python's
    default would end the process on the spot (SIGTERM) or raise in whatever slot runs next (SIGINT), and Qt's
    loop runs no Python of its own to notice either: the signal wakes it through a socket. A second signal takes
    the default again, for a close that hangs; a signal the app was started with ignored stays ignored."""
    received = Received()
    if threading.current_thread() is not threading.main_thread():
        return received
    import socket

    from PySide6.QtCore import QSocketNotifier

    # a signal ignored by whoever started the app (SIGINT in a background launch: `specview gui &`) stays ignored
    sigs = [sig for sig in (signal.SIGTERM, signal.SIGINT) if signal.getsignal(sig) != signal.SIG_IGN]
    if not sigs:
        return received
    rsock, wsock = socket.socketpair()
    for sock in (rsock, wsock):
        sock.setblocking(False)
    try:
        old_fd = signal.set_wakeup_fd(wsock.fileno())
        old = {sig: signal.getsignal(sig) for sig in sigs}
    except (ValueError, OSError):  # pragma: no cover - no signals here
        rsock.close()
        wsock.close()
        return received

    def drain() -> None:  # Python runs here, and with it the handler of the signal that woke the loop
        try:
            rsock.recv(64)
        except OSError:
            pass

    notifier = QSocketNotifier(rsock.fileno(), QSocketNotifier.Type.Read)
    notifier.activated.connect(drain)

    def on_signal(signum: int, frame: object) -> None:
        for sig in sigs:
            signal.signal(sig, signal.SIG_DFL)
        received.signum = signum
        QTimer.singleShot(0, win.close)

    for sig in sigs:
        signal.signal(sig, on_signal)

    def restore() -> None:
        notifier.setEnabled(False)
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(old_fd)
        rsock.close()
        wsock.close()

    received.restore = restore
    return received


def _smoke(app, out: str, tokens: int, timeout: float) -> int:
    import tempfile
    from dataclasses import replace
    from pathlib import Path

    # a throwaway settings file: the smoke run neither reads nor changes the user's, and leaves nothing behind
    scratch = tempfile.TemporaryDirectory(prefix="specview-smoke-")
    win = MainWindow(settings_path=Path(scratch.name) / "gui.json", preload=False)
    status = {"code": 3}

    def shown(trace) -> None:
        try:
            trace.save(out)
            print(f"specview: smoke run written to {out}: {len(trace.vanilla.tokens)} vanilla and "
                  f"{len(trace.speculative.tokens)} speculative tokens", file=sys.stderr)
            status["code"] = 0
        except Exception as exc:
            print(f"specview: smoke run could not write {out}: {exc}", file=sys.stderr)
            status["code"] = 1
        win.close()

    def failed(message: str) -> None:
        print(f"specview: smoke run failed: {message}", file=sys.stderr)
        status["code"] = 1
        win.close()

    win.sigTraceShown.connect(shown)
    win.sigError.connect(failed)
    win.show()
    QTimer.singleShot(0, lambda: win.run_config(replace(win.build_config(), max_tokens=tokens)))
    QTimer.singleShot(int(timeout * 1000), win.close)
    try:
        app.exec()
    finally:
        scratch.cleanup()
    return status["code"]
