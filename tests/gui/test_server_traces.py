"""Traces from the llama-server engine: no margins at some tokens, no rounds, no batch rows, no draft flags.

The window must show them like any other trace, with "n/a" where a figure is missing.
"""

from __future__ import annotations

import math

import numpy as np
from PySide6.QtCore import QPoint, Qt

from specview.core.trace import Trace


def server_like(trace: Trace) -> Trace:
    """``trace`` as the llama-server engine would record it (see specview/backends/server.py)."""
    for arm in (trace.vanilla, trace.speculative):
        for st in arm.steps:
            st.round = st.batch_size = st.batch_index = st.from_draft = None
        for st in arm.steps[::3]:  # the server gave no probabilities for these tokens
            st.margin = None
            st.top_ids, st.top_logits = [], []
    fork = trace.comparison.first_mismatch.index
    trace.vanilla.steps[fork].margin = None
    trace.speculative.steps[fork].margin = None
    trace.speculative.rounds = []
    trace.speculative.reported_drafted, trace.speculative.reported_accepted = 30, 21
    trace.config["backend"] = "llama-server"
    trace.environment["engine"] = "llama-server"
    return trace


def test_server_trace_opens_and_shows_na(synth, make_window, qtbot, tmp_path):
    path = server_like(synth(40, fork=24)).save(tmp_path / "server.json")
    trace = Trace.load(path)
    assert trace.speculative.steps[24].margin is None and trace.speculative.steps[5].round is None
    w = make_window()
    w.show()
    errors = []
    w.sigError.connect(errors.append)
    with qtbot.waitSignal(w.sigTraceShown, timeout=5000):
        assert w.open_trace(path) is not None
    assert not errors
    verdict = w.verdict.text()
    assert "Forked at token 24" in verdict
    assert "vanilla margin n/a" in verdict and "speculative margin n/a" in verdict
    assert "round n/a, batch T=n/a" in verdict and "None" not in verdict
    # the fork is selected; its status line and both tooltips say n/a, never None
    assert w.panes.selected == 24
    assert "margin n/a" in w.status_label.text() and "None" not in w.status_label.text()
    tip = w.panes.speculative.tooltip_html(24)
    assert "margin top-1 &minus; top-2: <b>n/a</b>" in tip
    assert "round n/a, batch T=n/a (row n/a) &middot; origin n/a" in tip and "None" not in tip
    vtip = w.panes.vanilla.tooltip_html(24)
    assert "batch T=n/a (row n/a)" in vtip and "None" not in vtip
    # a token with a margin still shows it
    assert f"<b>{trace.speculative.steps[25].margin:.4f}</b>" in w.panes.speculative.tooltip_html(25)
    # hovering the fork in the pane shows the tooltip without raising
    pane = w.panes.speculative
    rect = pane.cursorRect(pane.textCursor())
    qtbot.mouseMove(pane.viewport(), QPoint(rect.center().x(), rect.center().y()))
    qtbot.mouseClick(pane.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(rect.center().x(), rect.center().y()))
    # the margin plot skips missing margins (NaN gaps), the others are drawn as recorded
    _, y = w.margin_plot.vanilla.getData()
    want = [math.nan if s.margin is None else s.margin for s in trace.vanilla.steps]
    assert np.isnan(y[24]) and np.isnan(y[0]) and len(y) == 40
    assert np.allclose(y, want, equal_nan=True, atol=1e-5)
    # no rounds: no bars and no fork mark on the acceptance plot; the reported totals are still shown
    assert not w.acceptance.fork_line.isVisible()
    assert "70.0% (21/30)" in w.speed.text()
    # stepping through mismatches keeps working
    assert w.next_mismatch() == 25 and w.status_label.text().startswith("token 25")
    w.select_token(24, scroll=True)
    assert w.panes.selected == 24
