"""Fixtures for the desktop app's tests: offscreen Qt, garbage collected on the GUI thread only (as in the app),
windows whose worker threads are joined at teardown, and synthetic traces built from the real dataclasses."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

import specview.gui  # noqa: E402,F401  (applies the PySide6 refcount guard before any test emits)
from synthetic import synthetic_trace  # noqa: E402  (tests/, on the path through tests/conftest.py)


@pytest.fixture(scope="session", autouse=True)
def _gc_on_the_gui_thread(qapp):
    """From a lane's first app test on, garbage is collected as the app collects it
    (:class:`specview.gui.qtcompat.MainThreadCollector`): on the GUI thread, never in the model worker's or the
    scan's thread, where a collected widget is freed off the GUI thread.  Between its timer's ticks the lane's later
    tests, app tests or not, collect what is due at each teardown (``tests/conftest.py``)."""
    from specview.gui.qtcompat import MainThreadCollector

    collector = MainThreadCollector()
    yield collector
    collector.stop()


@pytest.fixture
def synth():
    """The synthetic trace builder."""
    return synthetic_trace


@pytest.fixture
def make_window(qtbot):
    """Make MainWindows; at teardown every worker thread is stopped and joined."""
    from specview.gui.window import MainWindow

    made = []

    def make(**kw):
        w = MainWindow(**kw)
        qtbot.addWidget(w)
        w.auto_run.setChecked(False)
        made.append(w)
        return w

    yield make
    for w in made:
        assert w.shutdown(), "the model worker thread did not stop"
        assert w.host.thread.isFinished()


@pytest.fixture
def shown(qtbot):
    """``shown(widget, width, height)``: the widget at that size on screen (exposed), closed at teardown."""

    def show(widget, width: int, height: int, *, exposed: bool = True):
        qtbot.addWidget(widget)
        widget.resize(width, height)
        widget.show()
        if exposed:
            qtbot.waitExposed(widget)
        return widget

    return show
