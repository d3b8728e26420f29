"""What every specview plot shares: a PlotWidget that times its paints, shows a hint while empty, and fits its
title and its y range to the room it has (:class:`TimedPlot`), and the palette's colours for plots and legends.
"""

from __future__ import annotations

import html
import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPalette
from PySide6.QtWidgets import QGraphicsItem, QLabel

from .panes import PaintClock, blend

VANILLA_HUE = QColor(40, 110, 220)
SPEC_HUE = QColor(235, 120, 20)
TITLE_SIZE = "9pt"
TITLE_MARGIN = 8  # pixels kept free on each side of a title
MAX_HEADROOM = 3.0  # the y range's top is at most this many times the data's: the data keep a third of the height


def fit_text(text: str, metrics: QFontMetricsF, room: float) -> str:
    """``text`` in ``room`` pixels: whole, or its first " · " parts and "…", or its first part cut short."""
    if metrics.horizontalAdvance(text) <= room:
        return text
    parts = text.split(" · ")
    for k in range(len(parts) - 1, 0, -1):
        shorter = " · ".join(parts[:k]) + " · …"
        if metrics.horizontalAdvance(shorter) <= room:
            return shorter
    return metrics.elidedText(parts[0], Qt.TextElideMode.ElideRight, room)


def style_plot(w: pg.PlotWidget, palette: QPalette) -> None:
    """Background and axes from the palette, so light and dark themes both read well."""
    base = palette.color(QPalette.ColorRole.Base)
    text = palette.color(QPalette.ColorRole.Text)
    w.setBackground(base)
    style_legend(w, palette)
    for name in ("left", "bottom"):
        ax = w.getPlotItem().getAxis(name)
        ax.setPen(pg.mkPen(blend(base, text, 0.6)))
        ax.setTextPen(pg.mkPen(text))
    w.getPlotItem().titleLabel.setAttr("color", text.name())
    w.getPlotItem().titleLabel.setText(w.getPlotItem().titleLabel.text)
    hint = getattr(w, "hint", None)
    if hint is not None:
        hint.setStyleSheet(f"color: {blend(base, text, 0.6).name()}; background: transparent")


def style_legend(w: pg.PlotWidget, palette: QPalette) -> None:
    legend = w.getPlotItem().legend
    if legend is not None:
        base = palette.color(QPalette.ColorRole.Base)
        fill = QColor(base)
        fill.setAlpha(215)
        legend.setBrush(pg.mkBrush(fill))
        legend.setPen(pg.mkPen(blend(base, palette.color(QPalette.ColorRole.Text), 0.3)))


class TimedPlot(pg.PlotWidget):
    """A PlotWidget that adds its paint time to :class:`PaintClock`, and says what it will show while empty.

    An empty plot shows a short hint instead of axes (pyqtgraph's default range
    for no data is meaningless: an axis labelled "x0.001" from -400 to 400).
    """

    def __init__(self, parent=None, *, hint: str = ""):
        super().__init__(parent)
        pi = self.getPlotItem()
        for name in ("left", "bottom"):
            pi.getAxis(name).enableAutoSIPrefix(False)  # a token index or a logit has no SI unit
            # axes (and the grid they draw) are painted from a cached image unless their range changed:
            # repainting their text every frame was most of a streaming frame's cost
            pi.getAxis(name).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.default_hint = hint
        self.hint = QLabel(hint, self)
        self.hint.setObjectName("plot_hint")
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.hint.setWordWrap(True)
        self.hint.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.empty: bool | None = None  # the subclass shows the plot empty once it has its items and labels
        self.title = ""  # the whole title; the plot shows it cut short with "…" where it is too narrow
        self._title_size, self._title_note, self._shown_title = TITLE_SIZE, "", None
        pi.getViewBox().sigResized.connect(self._fit_title)  # the axes' widths follow their tick labels

    def set_title(self, text: str, *, size: str = TITLE_SIZE, note: str = "") -> None:
        """Title the plot.  Where the plot is narrower than the title, its last " · " parts give way to "…" (the
        first part itself is cut short if need be); the title's tool tip then gives it whole, and ``note``
        (what its figures mean).

        A title wider than the plot would widen the plot's layout past the widget and push its right edge, the
        legend and the last bars with it, out of sight.
        """
        self.title, self._title_size, self._title_note = text, size, note
        self._fit_title()

    def _fit_title(self) -> None:
        pi = self.getPlotItem()
        if pi is None:  # closed
            return
        font = QFont(self.font())
        font.setPointSizeF(float(self._title_size.removesuffix("pt")))
        # the title lies over the view's column of the plot's layout, between the axes
        axes = sum(pi.getAxis(name).width() for name in ("left", "right") if pi.getAxis(name).isVisible())
        shown = fit_text(self.title, QFontMetricsF(font), max(60, self.width() - axes - 2 * TITLE_MARGIN))
        if shown != self._shown_title:
            self._shown_title = shown
            pi.setTitle(html.escape(shown, quote=False), size=self._title_size)
        whole = self.title if shown != self.title else ""
        pi.titleLabel.setToolTip("\n\n".join(t for t in (whole, self._title_note) if t))

    def fit_top(self, xs: np.ndarray, ys: np.ndarray, *, extra: float | np.ndarray = 0.0, least: float = 1.1,
                unsized: float = 1.45) -> float:
        """The top of a y range from 0 that keeps the points (``xs``, ``ys``) clear of the legend.

        A point under the legend (the legend lies over the right of the view) stays below it, any other below
        the top; ``extra`` pixels (a label over a bar) go above a point.  The top is at least ``least`` times
        the highest point and at most :data:`MAX_HEADROOM` times (the data keep a third of a plot too small for
        its legend), ``unsized`` times before the plot has a size.
        """
        xs, ys = np.asarray(xs, float), np.nan_to_num(np.asarray(ys, float), nan=0.0, posinf=0.0, neginf=0.0)
        extra = np.broadcast_to(np.asarray(extra, float), ys.shape)
        high = max(float(ys.max()) if len(ys) else 0.0, 1e-9)
        vb = self.getPlotItem().getViewBox()
        h = vb.height()
        if h <= 1 or not len(ys):
            return high * unsized
        free = 1 - (extra + 4) / h
        left = self._legend_left()
        if left is not None:
            free = np.where(xs >= left, free - self.legend_reserve() / h, free)
        need = np.max(np.maximum(ys, 0) / np.maximum(free, 1 / MAX_HEADROOM))
        return max(high * least, float(need))

    def legend_reserve(self) -> float:
        """Pixels from the top of the view to just under the legend (0 without one)."""
        legend = self.getPlotItem().legend
        if legend is None or not legend.items or not legend.isVisible():
            return 0.0
        return float(legend.opts["offset"][1]) + legend.geometry().height() + 4

    def _legend_left(self) -> float | None:
        """The x (in data) where the legend, in the view's top right corner, begins; None without one."""
        vb = self.getPlotItem().getViewBox()
        w = vb.width()
        if not self.legend_reserve() or w <= 1:
            return None
        legend = self.getPlotItem().legend
        px = w - abs(float(legend.opts["offset"][0])) - legend.geometry().width() - 4
        x0, x1 = vb.viewRange()[0]
        return x0 + (x1 - x0) * px / w

    def show_empty(self, empty: bool) -> None:
        """Empty: the hint instead of axes and grid; otherwise the plot as usual."""
        if empty == self.empty:
            return
        self.empty = empty
        pi = self.getPlotItem()
        for name in ("left", "bottom"):
            pi.showAxis(name, not empty)
        pi.showGrid(x=False, y=not empty, alpha=0.25)
        self.hint.setVisible(empty)
        if pi.legend is not None:
            pi.legend.setVisible(not empty)
        self._fit_title()  # the axes shown or hidden change the title's room
        if empty:
            # an axis linked to another plot's is that plot's to set: a unit range pushed through the link
            # would take the other plot's auto-range away and leave it showing two tokens of a whole run
            vb = pi.getViewBox()
            ranges = {key: (0, 1) for axis, key in ((vb.XAxis, "xRange"), (vb.YAxis, "yRange"))
                      if vb.linkedView(axis) is None}
            if ranges:
                vb.setRange(**ranges, padding=0)

    def set_hint(self, text: str | None) -> None:
        """The words shown while the plot is empty (None: the plot's own)."""
        self.hint.setText(text or self.default_hint)

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().resizeEvent(ev)
        hint = self.__dict__.get("hint")  # pyqtgraph resizes the view before __init__ has made the hint
        if hint is not None:
            hint.setGeometry(self.rect().adjusted(16, 28, -16, -8))
            self._fit_title()

    def paintEvent(self, ev) -> None:  # noqa: N802 - Qt name
        t0 = time.perf_counter()
        super().paintEvent(ev)
        dt = time.perf_counter() - t0
        PaintClock.seconds += dt
        PaintClock.plots += dt
