"""The locate plot: max |Δ| of each compared node along the graph, log scale, the first differing node marked.

Created once; :meth:`LocatePlot.set_series` updates every item with
``setData`` (or moves and hides it).  Bit-identical nodes are drawn on a floor
line a decade below the smallest difference; each layer is a shaded band
(alternate layers only, so neighbours stay apart); hovering a point names the
node, its op, types, buffers and |Δ|.
"""

from __future__ import annotations

import bisect
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QColor, QPalette

from ...core.locate.plot import GraphSeries
from ..panes import MISMATCH_HUE, blend
from ..plot_base import TimedPlot, style_plot

DIFF_HUE = QColor(235, 120, 20)
SAME_HUE = QColor(40, 110, 220)
BAND_HUE = QColor(120, 130, 150)


class LocatePlot(TimedPlot):
    """|Δ| per compared node (x = node index in graph order, y = max |Δ|, log scale)."""

    sigHovered = Signal(str)  # the hover text of the point under the mouse ("" off the points)

    def __init__(self, parent=None):
        super().__init__(parent, hint="Open a locate (File ▸ Open, a specview.locate/1 file from `specview locate "
                                      "--json`) or show a near-tie run: each node's |Δ| between the single-token "
                                      "pass and the batched row appears here.")
        pi = self.getPlotItem()
        pi.setLogMode(y=True)
        pi.setLabel("bottom", "graph node (graph order)")
        pi.setLabel("left", "max |Δ|")
        pi.setMenuEnabled(False)
        pi.showAxis("top")  # the layers, named where they start
        pi.getAxis("top").setStyle(showValues=True)
        self.setMouseTracking(True)
        self.series: GraphSeries | None = None
        self.bands: list[pg.LinearRegionItem] = []
        self.path = pg.PlotDataItem(pen=pg.mkPen(QColor(120, 130, 150, 110), width=1))  # every compared node, identical on the floor
        self.same = pg.ScatterPlotItem(size=4, pen=None, brush=pg.mkBrush(SAME_HUE))
        self.differs = pg.PlotDataItem(pen=None, symbol="o", symbolSize=5, symbolPen=None,
                                       symbolBrush=pg.mkBrush(DIFF_HUE))
        self.first_dot = pg.PlotDataItem(pen=None, symbol="o", symbolSize=11, symbolPen=pg.mkPen(MISMATCH_HUE, width=2),
                                         symbolBrush=None)
        self.first_line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(MISMATCH_HUE, width=1.5,
                                                                               style=Qt.PenStyle.DashLine))
        self.first_label = pg.TextItem("", anchor=(0, 0), color=MISMATCH_HUE)
        self.hover_dot = pg.ScatterPlotItem(size=12, pen=pg.mkPen("k", width=1), brush=None)
        self.hover_text = pg.TextItem("", anchor=(0, 1), border=pg.mkPen(BAND_HUE), fill=pg.mkBrush(255, 255, 255, 230),
                                      color=(20, 22, 25))
        for item in (self.path, self.same, self.differs, self.first_dot, self.first_line, self.first_label,
                     self.hover_dot, self.hover_text):
            pi.addItem(item)
        self.hover_text.setZValue(20)
        self.first_line.setVisible(False)
        self.first_label.setVisible(False)
        self.hover_text.setVisible(False)
        self.hovered: int | None = None
        self._floor = 1e-9
        self.scene().sigMouseMoved.connect(self._mouse_moved)
        self.show_empty(True)

    def show_empty(self, empty: bool) -> None:
        """The base's empty state, and the layer axis on top with it: an empty plot shows no "blk.0" left by the
        last locate and no unit range of its own."""
        super().show_empty(empty)
        pi = self.getPlotItem()
        pi.showAxis("top", not empty)
        if empty:
            pi.getAxis("top").setTicks(None)

    def apply_palette(self, palette: QPalette) -> None:
        style_plot(self, palette)
        base, text = palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Text)
        for band in self.bands:
            band.setBrush(pg.mkBrush(blend(base, text, 0.07)))
        self.hover_text.fill = pg.mkBrush(blend(base, text, 0.05))
        self.hover_text.setColor(text)

    # -- data -------------------------------------------------------------------------------
    def set_series(self, s: GraphSeries | None) -> None:
        """Show ``s`` (None: empty)."""
        self.series = s
        self.hovered = None
        self.hover_text.setVisible(False)
        self.hover_dot.setData([], [])
        if s is None or not s.x:
            for item in (self.path, self.differs, self.first_dot):
                item.setData([], [])
            self.same.setData([], [])
            self.first_line.setVisible(False)
            self.first_label.setVisible(False)
            for b in self.bands:
                b.setVisible(False)
            self.setTitle("")
            self.show_empty(True)
            return
        self.show_empty(False)
        floor = self._floor = s.floor()
        x = np.asarray(s.x, dtype=float)
        y = np.asarray(s.y, dtype=float)
        d = np.asarray(s.differs, dtype=bool)
        finite = y[d & np.isfinite(y)]
        top = float(finite.max()) * 10 if finite.size else 1.0
        shown = np.where(d, np.where(np.isfinite(y), y, top), floor)  # an infinite |Δ| at the top
        shown = np.maximum(shown, floor)
        self.path.setData(x, shown)
        self.same.setData(x[~d], np.log10(shown[~d]))  # a ScatterPlotItem is not log-transformed by the plot
        self.differs.setData(x[d], shown[d])
        f = s.first
        if f is not None:
            self.first_dot.setData([x[f]], [shown[f]])
            self.first_line.setPos(x[f])
            self.first_line.setVisible(True)
            self.first_label.setText(f"first differs: {s.name[f]} ({s.op[f]})")
            right = x[f] < x[0] + 0.6 * (x[-1] - x[0])
            self.first_label.setAnchor((0, 0) if right else (1, 0))
            self.first_label.setVisible(True)
        else:
            self.first_dot.setData([], [])
            self.first_line.setVisible(False)
            self.first_label.setVisible(False)
        self._set_bands(s)
        self.setTitle(s.title + (f"; {s.logits}" if s.logits else "") + " · bit-identical nodes on the bottom line",
                      size="10pt")
        vb = self.getPlotItem().getViewBox()
        vb.enableAutoRange()
        span = max(1.0, x[-1] - x[0])
        y_top = math.log10(max(top if d.any() else floor * 10, floor * 10)) + 0.3
        vb.setRange(xRange=(x[0] - 0.01 * span, x[-1] + 0.01 * span), yRange=(math.log10(floor) - 0.3, y_top),
                    padding=0)
        if f is not None:
            self.first_label.setPos(x[f], y_top - 0.05)

    def _set_bands(self, s: GraphSeries) -> None:
        """A shaded band over every other layer (blk.1, blk.3 ...), so layer boundaries read at a glance."""
        bounds = s.boundaries
        spans = []
        for k, (x0, part) in enumerate(bounds):
            x1 = bounds[k + 1][0] if k + 1 < len(bounds) else s.x[-1] + 1
            if part.startswith("blk.") and part[4:].isdigit() and int(part[4:]) % 2 == 1:
                spans.append((x0 - 0.5, x1 - 0.5))
        pi = self.getPlotItem()
        layers = [(x0 - 0.5, part) for x0, part in bounds if part.startswith("blk.") and part[4:].isdigit()]
        step = max(1, len(layers) // 8)
        pi.getAxis("top").setTicks([[(x, p) for k, (x, p) in enumerate(layers) if k % step == 0]] if layers else None)
        pal = self.palette()
        brush = pg.mkBrush(blend(pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Text), 0.07))
        while len(self.bands) < len(spans):
            band = pg.LinearRegionItem(movable=False, brush=brush, pen=pg.mkPen(None))
            band.setZValue(-10)
            pi.addItem(band)
            self.bands.append(band)
        for i, band in enumerate(self.bands):
            band.setVisible(i < len(spans))
            if i < len(spans):
                band.setRegion(spans[i])

    # -- hover ------------------------------------------------------------------------------
    def nearest(self, x: float) -> int | None:
        """The point of the series nearest node index ``x``."""
        s = self.series
        if s is None or not s.x:
            return None
        k = bisect.bisect_left(s.x, x)
        cands = [i for i in (k - 1, k) if 0 <= i < len(s.x)]
        return min(cands, key=lambda i: abs(s.x[i] - x))

    def hover(self, i: int | None) -> str:
        """Show the hover label of point ``i`` (None hides it); returns its text."""
        s = self.series
        self.hovered = i
        if s is None or i is None:
            self.hover_text.setVisible(False)
            self.hover_dot.setData([], [])
            self.sigHovered.emit("")
            return ""
        text = s.hover(i)
        y = s.y[i] if s.differs[i] and math.isfinite(s.y[i]) else self._floor
        ly = math.log10(max(y, self._floor))
        self.hover_dot.setData([s.x[i]], [ly])
        self.hover_text.setText(text)
        vb = self.getPlotItem().getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        # beside the point, towards the middle of the plot, so the label stays inside it
        self.hover_text.setAnchor((1 if s.x[i] > x0 + 0.6 * (x1 - x0) else 0, 0 if ly > y0 + 0.5 * (y1 - y0) else 1))
        self.hover_text.setPos(s.x[i], ly)
        self.hover_text.setVisible(True)
        self.sigHovered.emit(text)
        return text

    def _mouse_moved(self, pos: QPointF) -> None:
        vb = self.getPlotItem().getViewBox()
        if self.series is None or not vb.sceneBoundingRect().contains(pos):
            if self.hovered is not None:
                self.hover(None)
            return
        p = vb.mapSceneToView(pos)
        i = self.nearest(p.x())
        if i is None:
            return
        px = vb.mapViewToScene(QPointF(self.series.x[i], p.y())).x()
        self.hover(i if abs(px - pos.x()) <= 12 else None)
