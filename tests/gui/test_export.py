"""Report plots are drawn by the app's own plot widgets, offscreen, as PNG images."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QApplication

from specview.gui import export
from specview.gui.panes import MISMATCH_HUE
from specview.gui.plots import SPEC_HUE, VANILLA_HUE
from specview.gui.theme import light_palette


def pixels(png: bytes) -> np.ndarray:
    img = QImage.fromData(png, "PNG").convertToFormat(QImage.Format.Format_RGB888)
    assert not img.isNull()
    w, h = img.width(), img.height()
    arr = np.frombuffer(img.constBits(), np.uint8, img.bytesPerLine() * h).reshape(h, img.bytesPerLine())
    return arr[:, : 3 * w].reshape(h, w, 3).copy()  # the image owns the memory


def has_colour(px: np.ndarray, c: QColor, tol: int = 12) -> int:
    return int((np.abs(px.astype(int) - [c.red(), c.green(), c.blue()]).max(axis=2) <= tol).sum())


def test_a_forked_run_gets_three_plots_in_the_apps_colours(synth, qapp):
    diag = {"verdict": "near-tie", "gap": 0.012, "envelope": {"max": 0.4, "series": [0.2] * 70}, "at_risk": [3, 9]}
    trace = synth(120, fork=70, diagnosis=diag)
    shown_before = {id(w) for w in QApplication.topLevelWidgets() if w.isVisible()}
    plots = export.trace_plots(trace)
    assert set(plots) == {export.MARGINS, export.MARGINS_ZOOM, export.ACCEPTANCE}
    for name, png in plots.items():
        assert png.startswith(b"\x89PNG\r\n\x1a\n"), name
        px = pixels(png)
        assert px.shape[:2] == (export.PLOT_SIZE[1], export.PLOT_SIZE[0]), name
        base = light_palette().color(light_palette().ColorRole.Base)
        assert has_colour(px[:4, :4], base) == 16, name  # the light theme's background
        assert has_colour(px, MISMATCH_HUE) > 50, name  # the fork line, dashed, top to bottom
    for name in (export.MARGINS, export.MARGINS_ZOOM):
        px = pixels(plots[name])
        assert has_colour(px, VANILLA_HUE) > 100 and has_colour(px, SPEC_HUE) > 100, name
    # nothing appeared on screen
    assert {id(w) for w in QApplication.topLevelWidgets() if w.isVisible()} <= shown_before


def test_the_zoom_shows_the_tokens_around_the_fork(synth, qapp):
    trace = synth(120, fork=70)
    plot = export.margin_plot(trace, (38, 86))
    (x0, x1), (y0, y1) = plot.getPlotItem().getViewBox().viewRange()
    assert x0 < 38 < 86 < x1 < 90 and x0 > 35
    visible = [s.margin for s in trace.vanilla.steps[38:87]]
    assert y0 <= 0 and max(visible) < y1
    assert plot.fork_line.isVisible() and plot.fork_line.value() == 70
    plot.close()


def test_what_a_run_has_decides_the_plots(synth, qapp):
    short = synth(40, fork=25)
    assert set(export.trace_plots(short)) == {export.MARGINS, export.ACCEPTANCE}  # too short to zoom
    same = synth(120, fork=None)
    assert export.MARGINS_ZOOM not in export.trace_plots(same)
    nothing_drafted = synth(30, fork=None)
    for r in nothing_drafted.speculative.rounds:
        r.accepted = r.drafted = 0
    for st in nothing_drafted.speculative.steps:
        st.from_draft = False
    assert export.ACCEPTANCE not in export.trace_plots(nothing_drafted)


def test_plots_without_a_running_app_or_a_display(synth, tmp_path):
    """`specview report` has no window: the plots are drawn on an offscreen application made for them."""
    path = synth(120, fork=70).save(tmp_path / "t.json")
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")}
    code = ("import sys; from specview.core.trace import Trace; from specview.gui.export import trace_plots; "
            "p = trace_plots(Trace.load(sys.argv[1])); "
            "[open(sys.argv[2] + '/' + k + '.png', 'wb').write(v) for k, v in p.items()]")
    res = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in Path(tmp_path).glob("*.png")) == ["acceptance.png", "margins.png",
                                                                   "margins_zoom.png"]
