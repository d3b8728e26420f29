"""Write a report from a trace or a matrix file: HTML (self-contained) and Markdown with PNG plots beside it.

The text comes from :mod:`specview.core.report` (Qt-free).  The plots are drawn
here with pyqtgraph in the app's colours and grabbed as PNG without a display:
when no QApplication exists one is created on the ``offscreen`` platform.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from .core.engine import SpecviewError
from .core.trace import SCHEMA as TRACE_SCHEMA, Trace, write_atomic

PLOT_SIZE = (1000, 330)

VANILLA_RGB = (40, 110, 220)
SPEC_RGB = (235, 120, 20)
ENVELOPE_RGB = (150, 90, 210)
MISMATCH_RGB = (225, 45, 45)
DRAFT_RGB = (40, 170, 80)


def _app():
    """The running QApplication, or a new one on the offscreen platform (no display needed)."""
    from . import gui  # noqa: F401  (applies the app's PySide6 reference-count guard)
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        app = QApplication(["specview-report"])
    return app


def _png(widget) -> bytes:
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt

    widget.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen)  # laid out and painted, never on screen
    widget.resize(*PLOT_SIZE)
    widget.show()
    _app().processEvents()
    pix = widget.grab()
    widget.close()
    ba = QByteArray()
    buf = QBuffer(ba)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    pix.save(buf, "PNG")
    buf.close()
    return bytes(ba.data())


def _plot_widget(title: str, left: str, bottom: str):
    import pyqtgraph as pg
    from PySide6.QtGui import QColor

    w = pg.PlotWidget(background="w")
    pi = w.getPlotItem()
    pi.setTitle(f"<span style='color:#222;font-size:11pt'>{title}</span>")
    for name in ("left", "bottom"):
        ax = pi.getAxis(name)
        ax.setPen(pg.mkPen(QColor(120, 120, 120)))
        ax.setTextPen(pg.mkPen(QColor(40, 40, 40)))
    pi.setLabel("left", left, color="#333")
    pi.setLabel("bottom", bottom, color="#333")
    pi.showGrid(x=False, y=True, alpha=0.25)
    return w, pi


def _legend(pi):
    import pyqtgraph as pg

    return pi.addLegend(offset=(60, 2), labelTextSize="9pt", labelTextColor=(30, 30, 30), colCount=4,
                        brush=pg.mkBrush(255, 255, 255, 235), pen=pg.mkPen(190, 190, 190))


def _fork_line(x: float, text: str, position: float, label_left: bool):
    import pyqtgraph as pg
    from PySide6.QtCore import Qt

    anchor = (1, 0) if label_left else (0, 0)  # keep the label inside the plot near the right edge
    return pg.InfiniteLine(pos=x, angle=90, movable=False,
                           pen=pg.mkPen(MISMATCH_RGB, width=2, style=Qt.PenStyle.DashLine),
                           label=text, labelOpts={"position": position, "color": MISMATCH_RGB,
                                                  "anchors": [anchor, anchor], "fill": (255, 255, 255, 220)})


def margin_plot_png(trace: Trace, xrange: tuple[int, int] | None = None, title: str | None = None) -> bytes:
    """Top-1/top-2 margin per token, both arms, log scale; fork, envelope and at-risk positions."""
    _app()
    import numpy as np
    import pyqtgraph as pg

    floor = 1e-3

    def arr(steps) -> np.ndarray:
        return np.array([max(floor, s.margin) if s.margin is not None and math.isfinite(s.margin) else np.nan
                         for s in steps], float)

    w, pi = _plot_widget(title or "top-1 minus top-2 logit per token", "margin (logits, log)", "token index")
    pi.setLogMode(x=False, y=True)
    _legend(pi)
    d = trace.diagnosis or {}
    env = (d.get("envelope") or {}).get("series")
    if env:
        ys = np.array([max(floor, x) if x is not None else floor for x in env], float)
        xs = np.arange(len(ys), dtype=float)
        # in log mode the fill level is in view coordinates: log10 of the floor
        pi.addItem(pg.PlotDataItem(xs, ys, pen=pg.mkPen(ENVELOPE_RGB, width=1), fillLevel=math.log10(floor),
                                   brush=pg.mkBrush(*ENVELOPE_RGB, 80), name="replay envelope"))
    v, s = arr(trace.vanilla.steps), arr(trace.speculative.steps)
    dots = {} if xrange is None else {"symbolSize": 4}  # zoomed in: show each token
    pi.addItem(pg.PlotDataItem(np.arange(len(v), dtype=float), v, pen=pg.mkPen(VANILLA_RGB, width=1.5), name="vanilla",
                               **({"symbol": "o", "symbolPen": None, "symbolBrush": pg.mkBrush(*VANILLA_RGB)} if dots else {}),
                               **dots))
    pi.addItem(pg.PlotDataItem(np.arange(len(s), dtype=float), s, pen=pg.mkPen(SPEC_RGB, width=1.2), name="speculative",
                               **({"symbol": "o", "symbolPen": None, "symbolBrush": pg.mkBrush(*SPEC_RGB)} if dots else {}),
                               **dots))
    risk = d.get("at_risk")
    if isinstance(risk, list) and risk:
        xs = np.array([i for i in risk if i < len(v)], float)
        if len(xs):
            th = (d.get("thresholds") or {}).get("at_risk")
            label = f"at risk (margin &lt; {th:.3g})"  # legend labels are rich text if isinstance(th, (int, float)) else "at risk"
            pi.addItem(pg.PlotDataItem(xs, v[xs.astype(int)], pen=None, symbol="x", symbolSize=8,
                                       symbolPen=pg.mkPen(MISMATCH_RGB, width=1.2), symbolBrush=pg.mkBrush(*MISMATCH_RGB),
                                       name=label))
    n = max(len(v), len(s), 1)
    lo, hi = (0, n) if xrange is None else xrange
    fm = trace.comparison.first_mismatch
    if fm is not None:
        pi.addItem(_fork_line(fm.index, f"fork at {fm.index}", 0.06, fm.index > lo + 0.6 * (hi - lo)),
                   ignoreBounds=True)
    pi.setXRange(lo, hi, padding=0.01)
    seen = np.concatenate([v[max(0, lo):hi + 1], s[max(0, lo):hi + 1], [1.0]])
    top = np.nanmax(seen)
    pi.setYRange(math.log10(floor) - 0.1, math.log10(top) + 1.0, padding=0)  # headroom for the legend
    return _png(w)


def acceptance_plot_png(trace: Trace) -> bytes:
    """Drafted and accepted tokens per verify round."""
    _app()
    import numpy as np
    import pyqtgraph as pg

    rounds = [r for r in trace.speculative.rounds if r.index > 0]
    w, pi = _plot_widget("drafted and accepted tokens per verify round", "tokens", "round")
    _legend(pi)
    if rounds:
        x = np.array([r.index for r in rounds], float)
        drafted = np.array([r.drafted for r in rounds], float)
        accepted = np.array([r.accepted for r in rounds], float)
        width = 0.8 if len(rounds) < 400 else 1.0
        pi.addItem(pg.BarGraphItem(x=x, height=drafted, width=width, brush=pg.mkBrush(200, 200, 200),
                                   pen=pg.mkPen(150, 150, 150), name="drafted"))
        pi.addItem(pg.BarGraphItem(x=x, height=accepted, width=width * 0.6, brush=pg.mkBrush(*DRAFT_RGB),
                                   pen=pg.mkPen(25, 120, 55), name="accepted"))
        fm = trace.comparison.first_mismatch
        if fm is not None and fm.index < len(trace.speculative.steps):
            rnd = trace.speculative.steps[fm.index].round
            pi.addItem(_fork_line(rnd, f"fork (round {rnd})", 0.83, rnd > 0.6 * x.max()), ignoreBounds=True)
        pi.setYRange(0, max(1.0, float(drafted.max())) * 1.35, padding=0)  # headroom for the legend
        pi.getAxis("left").setTickSpacing(1, 1)  # whole tokens
        pi.setXRange(0.3, x.max() + 0.7, padding=0)
    return _png(w)


ZOOM_BEFORE, ZOOM_AFTER = 32, 16


def trace_plots(trace: Trace) -> dict[str, bytes]:
    plots = {"margins": margin_plot_png(trace)}
    fm = trace.comparison.first_mismatch
    n = max(len(trace.vanilla.steps), len(trace.speculative.steps))
    if fm is not None and n > 2 * (ZOOM_BEFORE + ZOOM_AFTER):
        lo, hi = max(0, fm.index - ZOOM_BEFORE), min(n - 1, fm.index + ZOOM_AFTER)
        plots["margins_zoom"] = margin_plot_png(trace, (lo, hi), f"the same, tokens {lo} to {hi} around the fork")
    if trace.speculative.n_drafted > 0:  # nothing to show for none, p_min = 1 or an n-gram that never matched
        plots["acceptance"] = acceptance_plot_png(trace)
    return plots


def read_input(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """("trace", Trace) or ("matrix", dict) from a JSON file, refusing anything else clearly."""
    from .core.trace import read_json

    p = Path(path)
    d = read_json(p)
    schema = d.get("schema") if isinstance(d, dict) else None
    if isinstance(schema, str) and schema.startswith("specview.matrix/"):
        from .core.matrix import validate_matrix

        validate_matrix(d, source=str(p))
        return "matrix", d
    if isinstance(schema, str) and schema.startswith("specview.trace/"):
        return "trace", Trace.from_json(d, source=str(p))
    raise SpecviewError(f"{p}: neither a specview trace ({TRACE_SCHEMA}) nor a matrix (specview.matrix/1); "
                        f"schema is {schema!r}")


def _earliest_fork_trace(doc: dict, source: Path | None) -> Trace | None:
    """The saved trace of the matrix's earliest fork (``--traces``), or None when there is none to read."""
    from .core.report import earliest_fork

    cell = earliest_fork(doc)
    if cell is None or not cell.get("trace"):
        return None
    p = Path(cell["trace"])
    if not p.is_absolute() and source is not None:
        p = source.parent / p
    try:
        return Trace.load(p)
    except SpecviewError:
        return None


def write_report(src: str | os.PathLike[str] | Trace | dict, out_dir: str | os.PathLike[str], *,
                 name: str = "report") -> dict[str, Path]:
    """Write ``report.html``, ``report.md`` and the PNGs the Markdown links to into ``out_dir``.

    In the app, call it on the GUI thread (the plots are Qt widgets); elsewhere it makes its own
    offscreen QApplication.
    """
    from .core import report as R

    if isinstance(src, Trace):
        kind, obj = "trace", src
    elif isinstance(src, dict):
        from .core.matrix import validate_matrix

        validate_matrix(src)
        kind, obj = "matrix", src
    else:
        kind, obj = read_input(src)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecviewError(f"-o {out}: cannot create the folder ({exc})") from None
    written: dict[str, Path] = {}
    if kind == "trace":
        plots = trace_plots(obj)
        files = {}
        for key, png in plots.items():
            fname = f"{name}-{key}.png"
            (out / fname).write_bytes(png)
            written[key] = out / fname
            files[key] = fname
        html_text = R.trace_html(obj, plots)
        md_text = R.trace_markdown(obj, files)
    else:
        fork_trace = _earliest_fork_trace(obj, None if isinstance(src, dict) else Path(src))
        html_text = R.matrix_html(obj, fork_trace)
        md_text = R.matrix_markdown(obj, fork_trace)
    written["html"] = write_atomic(out / f"{name}.html", html_text)
    written["markdown"] = write_atomic(out / f"{name}.md", md_text)
    return written
