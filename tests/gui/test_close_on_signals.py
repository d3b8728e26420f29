"""A signal to the app (``kill``, a logout, Ctrl-C in the terminal that started it) closes the window as its close
button does, instead of ending the process with the settings unsaved and the engine's folder left behind."""

from __future__ import annotations

import json
import os
import signal

from specview.gui.launch import close_on_signals


def test_sigterm_closes_the_window_as_its_close_button_does(make_window, qtbot, tmp_path):
    path = tmp_path / "gui.json"
    w = make_window(settings_path=path, preload=False)
    w.set_controls(n_max=5)
    w.show()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    # both are taken while the window is up (Ctrl-C too; only SIGTERM is sent here, to this test's own process),
    # but for one this process was started with ignored (SIGINT, in a suite a script ran in the background)
    taken = [s for s in before if before[s] != signal.SIG_IGN]
    assert signal.SIGTERM in taken
    received = close_on_signals(w)
    try:
        assert all(signal.getsignal(s) not in (before[s], signal.SIG_DFL) for s in taken)
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in before if s not in taken)
        os.kill(os.getpid(), signal.SIGTERM)
        qtbot.waitUntil(lambda: not w.isVisible(), timeout=10_000)  # Qt's loop woke, and the window closed
        assert all(signal.getsignal(s) == signal.SIG_DFL for s in taken)  # a second signal: the default, at once
    finally:
        received.restore()
    assert received.signum == signal.SIGTERM
    assert json.loads(path.read_text())["run"]["n_max"] == 5  # saved as the close button saves
    assert {s: signal.getsignal(s) for s in before} == before  # and every handler put back


def test_a_signal_ignored_by_whoever_started_the_app_stays_ignored(make_window, qtbot, tmp_path):
    w = make_window(settings_path=tmp_path / "gui.json", preload=False)
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # `specview gui &` from a non-interactive shell
    try:
        received = close_on_signals(w)
        try:
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        finally:
            received.restore()
    finally:
        signal.signal(signal.SIGINT, old)
