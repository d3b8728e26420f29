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
    received = close_on_signals(w)
    try:
        # both are taken while the window is up (Ctrl-C too; only SIGTERM is sent here, to this test's own process)
        assert all(signal.getsignal(s) not in (before[s], signal.SIG_DFL) for s in before)
        os.kill(os.getpid(), signal.SIGTERM)
        qtbot.waitUntil(lambda: not w.isVisible(), timeout=10_000)  # Qt's loop woke, and the window closed
        assert all(signal.getsignal(s) == signal.SIG_DFL for s in before)  # a second signal: the default, at once
    finally:
        received.restore()
    assert received.signum == signal.SIGTERM
    assert json.loads(path.read_text())["run"]["n_max"] == 5  # saved as the close button saves
    assert {s: signal.getsignal(s) for s in before} == before  # and every handler put back
