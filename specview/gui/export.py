"""Report plots drawn by the app's own plot widgets, as PNG images.

:func:`trace_plots` renders a trace's margin plot (whole run, and zoomed around
the fork) and its acceptance plot with :class:`~specview.gui.plots.MarginPlot`
and :class:`~specview.gui.plots.AcceptancePlot` in the light theme, through
pyqtgraph's image exporter, so a report looks like the app.  Nothing is shown
on screen: without a running application one is made on the ``offscreen``
platform.  The Qt-free report writer takes :func:`trace_plots` as its plot
renderer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .app import application

PLOT_SIZE = (1000, 330)
ZOOM_BEFORE, ZOOM_AFTER = 32, 16
#: the plots of a trace's report, by the names the report writer files them under
MARGINS, MARGINS_ZOOM, ACCEPTANCE, LOCATE = "margins", "margins_zoom", "acceptance", "locate"


def _png(plot: Any) -> bytes:
    """The plot as PNG bytes, laid out at :data:`PLOT_SIZE` without appearing on screen."""
    return png_bytes(render_image(plot, *PLOT_SIZE))


def render_image(plot: Any, width: int, height: int) -> Any:
    """The plot as a QImage ``width`` pixels wide, laid out at ``width`` x ``height`` without appearing on screen;
    the plot is closed after.

    The plot's legend lays its entries out in a layout of its own: until its layout requests have been handled,
    an entry added last still sits at the legend's corner, drawn over the first.
    """
    import pyqtgraph.exporters as exporters
    from PySide6.QtCore import QCoreApplication, QEvent, Qt

    plot.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen)
    plot.resize(width, height)
    plot.show()  # delivers the resize now: the scene takes the widget's size
    for _ in range(3):  # nested layouts (the plot, its legend) ask to be laid out in turn
        QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)
    plot.getPlotItem().layout.activate()
    try:
        exp = exporters.ImageExporter(plot.getPlotItem())
        exp.parameters()["width"] = width
        return exp.export(toBytes=True)
    finally:
        plot.close()


def png_bytes(image: Any) -> bytes:
    """A QImage as PNG bytes, in memory."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice

    ba = QByteArray()
    buf = QBuffer(ba)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buf, "PNG")
    buf.close()
    return bytes(ba.data())


def _palette():
    from .theme import light_palette

    return light_palette()


def margin_plot(trace: Any, xrange: tuple[int, int] | None = None, title: str | None = None) -> Any:
    """The app's margin plot of ``trace``, optionally zoomed to token indices ``xrange``."""
    from .plots import MarginPlot

    plot = MarginPlot()
    plot.apply_palette(_palette())
    v, s = trace.vanilla.steps, trace.speculative.steps
    plot.set_steps(v, s)
    fm = trace.comparison.first_mismatch
    fork = fm.index if fm is not None else None
    plot.mark_fork(fork, v[fork].margin if fork is not None and fork < len(v) else None)
    plot.set_diagnosis(trace.diagnosis, v)
    plot.set_title(title or "top-1 minus top-2 logit per token", size="10pt")
    if xrange is not None:
        lo, hi = xrange
        for item in (plot.vanilla, plot.speculative):  # zoomed in: show each token
            item.setSymbol("o")
            item.setSymbolSize(4)
            item.setSymbolPen(None)
            item.setSymbolBrush(item.opts["pen"].color())
        plot.show_range(lo, hi)
        if fork is not None:
            plot.fork_line.label.anchors = [(1, 0), (1, 0)] if fork > lo + 0.6 * (hi - lo) else [(0, 0), (0, 0)]
    return plot


def acceptance_plot(trace: Any) -> Any:
    """The app's acceptance plot of ``trace``."""
    from .plots import AcceptancePlot

    plot = AcceptancePlot()
    plot.apply_palette(_palette())
    s = trace.speculative
    plot.set_rounds(s.rounds, rate=s.acceptance_rate, mean=s.mean_accepted)
    fm = trace.comparison.first_mismatch
    plot.mark_fork(fm.index if fm is not None else None)
    return plot


def trace_plots(trace: Any) -> dict[str, bytes]:
    """PNG bytes of a trace's report plots: the margins, the margins around the fork (a long run with a fork),
    the acceptance per round (when anything was drafted) and the |Δ| along the graph of its diagnosis' departure
    (a near-tie located with its nodes)."""
    application(offscreen=True)
    plots = {MARGINS: _png(margin_plot(trace))}
    fm = trace.comparison.first_mismatch
    n = max(len(trace.vanilla.steps), len(trace.speculative.steps))
    if fm is not None and n > 2 * (ZOOM_BEFORE + ZOOM_AFTER):
        lo, hi = max(0, fm.index - ZOOM_BEFORE), min(n - 1, fm.index + ZOOM_AFTER)
        plots[MARGINS_ZOOM] = _png(margin_plot(trace, (lo, hi), f"the same, tokens {lo} to {hi} around the fork"))
    if trace.speculative.n_drafted > 0 and trace.speculative.rounds:  # a server run reports only totals
        plots[ACCEPTANCE] = _png(acceptance_plot(trace))
    from .locate import departure_of

    dep = departure_of(trace)  # a near-tie diagnosis' departure, where it kept its nodes
    png = locate_plot_png(dep) if dep is not None else None
    if png:
        plots[LOCATE] = png
    return plots


def locate_plot_png(src: Any) -> bytes | None:
    """PNG bytes of the |Δ|-along-the-graph plot of a Located or a departure record (None without its nodes)."""
    from ..core.locate.plot import series_of
    from .locate import LocatePlot

    s = series_of(src)
    if s is None:
        return None
    application(offscreen=True)
    plot = LocatePlot()
    plot.apply_palette(_palette())
    plot.set_series(s)
    return _png(plot)


def report_plots(obj: Any) -> dict[str, bytes]:
    """The plots of whatever a report is made of: a locate's |Δ| plot, or a trace's plots (:func:`trace_plots`)."""
    from ..core.locate.find import Located

    if isinstance(obj, Located):
        png = locate_plot_png(obj)
        return {LOCATE: png} if png else {}
    return trace_plots(obj)


def write_trace_report(trace: Any, folder: str | os.PathLike[str], *, kernel_map: Any = None) -> dict[str, Path]:
    """Write the HTML and Markdown report of ``trace`` into ``folder``, with the plots drawn here.

    ``kernel_map`` (a map file or a KernelMap) adds the map's prediction for the run.
    """
    from ..core.report.write import write_report

    return write_report(trace, folder, plots=trace_plots, kernel_map=kernel_map)



# -- File > Export Report: the report of the tab in front -------------------------------------------
def report_source(w: Any) -> tuple[str, Any] | None:
    """What the main window ``w`` would report: ("run", trace), ("matrix", doc), ("kernel map", map),
    ("locate", Located) or ("quality run", QualityResult) of the tab in front, or None when that tab shows nothing yet (a departure on the Locate tab
    is the run's: its report is the run's)."""
    tab = w.tabs.currentWidget()
    if tab is getattr(w, "locate_tab", None) and tab.located is not None:
        return "locate", tab.located
    if tab is w.matrix_tab:
        return ("matrix", w.matrix_tab.doc) if w.matrix_tab.doc.get("cells") else None
    if tab is w.kernels_tab:
        return ("kernel map", w.kernels_tab.kmap) if w.kernels_tab.kmap is not None else None
    if tab is getattr(w, "quality_tab", None):
        return ("quality run", tab.result) if tab.result is not None and tab.result.items else None
    return ("run", w.trace) if w.trace is not None else None


def export_tab_report(w: Any, folder: str | os.PathLike[str]) -> dict[str, Path] | None:
    """Write the report of what ``w``'s tab in front shows into ``folder``: the run on screen (plots drawn here,
    on the GUI thread, by the app's own plot widgets, and the kernel map of its tab when it covers the run),
    the matrix, or the kernel map.  Errors are shown in the window; returns what was written, or None."""
    from ..core.errors import SpecviewError
    from ..core.report.write import write_report

    src = report_source(w)
    if src is None:
        what = {w.matrix_tab: "no matrix to report yet: run or open one first",
                w.kernels_tab: "no kernel map to report yet: run or open one first"}
        w.show_error(what.get(w.tabs.currentWidget(), "no trace to report yet: run both arms or open a saved trace first"))
        return None
    kind, obj = src
    w.show_status(f"writing the {kind} report into {folder}…")
    try:
        if kind == "run":  # the kernel map in its tab joins the report when it covers this run
            written = write_trace_report(obj, folder, kernel_map=w.kernels_tab.map_for_report(obj))
        elif kind == "locate":
            written = write_report(obj, folder, plots=report_plots)
        else:
            written = write_report(obj, folder)
    except (SpecviewError, OSError) as exc:
        w.show_file_error(f"Could not write the report into {folder}", str(exc))
        return None
    w.show_status(f"{kind} report written: {written['html']} and {written['markdown']}")
    w.sigReportWritten.emit(written)
    return written
