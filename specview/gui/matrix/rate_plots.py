"""The Rates panel's plots: each setting's rate with its interval, and the selected row's gaps and fork positions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QFontMetrics, QPalette
from PySide6.QtWidgets import QWidget

from ...core import verdicts
from ..panes import blend, is_dark
from ..plot_base import TimedPlot, style_plot

#: the verdict colours each severity is drawn in (as the HTML report draws them)
SEVERITY_VERDICT = {"near-tie": "near-tie", "material": "state", "undiagnosed": "diverged"}
NO_GAPS = "These forks were not diagnosed, so they have no gap: run with diagnosis for the gaps."


def severity_colours(palette: QPalette) -> dict[str, tuple[QColor, QColor]]:
    """(fill, outline) per severity: the verdicts' colours, a fill strong enough on light and dark bases."""
    dark = is_dark(palette)
    out = {}
    for sev, verdict in SEVERITY_VERDICT.items():
        light, strong = QColor(verdicts.COLOURS[verdict]), QColor(verdicts.STRONG[verdict])
        fill = light if dark else blend(light, strong, 0.35)
        out[sev] = (fill, strong.lighter(125) if dark else strong.darker(110))
    return out


def bar_pens(heights: Any, pen: Any) -> list | None:
    """One pen per bar, none for an empty bin (a bar of height 0 would draw its outline as a line); None for no
    bars (pyqtgraph's BarGraphItem fails on an empty list of pens)."""
    hs = [] if heights is None else list(heights)
    return [pen if h else pg.mkPen(None) for h in hs] or None


def _short(label: str, limit: int = 40) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


class RatePlot(TimedPlot):
    """The divergence rate of every setting (a dot, in percent) with its 95% Wilson interval (a bar)."""

    sigRowClicked = Signal(int)  # index of the clicked setting in rates()["settings"]

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, hint="The divergence rate of each setting, with its 95% interval, appears here "
                                      "as cells finish.")
        self.setObjectName("rate_plot")
        pi = self.getPlotItem()
        pi.setLabel("bottom", "divergence rate (%), 95% Wilson interval")
        pi.setMouseEnabled(x=False, y=False)
        pi.hideButtons()
        pi.setMenuEnabled(False)
        pi.getAxis("left").setStyle(tickTextWidth=20, autoExpandTextSpace=True)
        self.bars = pg.ErrorBarItem(x=np.zeros(0), y=np.zeros(0), beam=0.18)
        self.points = pg.ScatterPlotItem(size=9, symbol="o")
        self.selected = pg.ScatterPlotItem(size=15, symbol="s")
        pi.addItem(self.bars)
        pi.addItem(self.selected)
        pi.addItem(self.points)
        self.rates: list[float] = []
        self.low: list[float] = []
        self.high: list[float] = []
        self.labels: list[str] = []
        self.index: list[int] = []  # each row's index in rates()["settings"]
        self.y = np.zeros(0)
        self.apply_palette(self.palette())
        self.scene().sigMouseClicked.connect(self._clicked)
        self.show_empty(True)

    def apply_palette(self, palette: QPalette) -> None:
        style_plot(self, palette)
        text = palette.color(QPalette.ColorRole.Text)
        strong = QColor(verdicts.STRONG["diverged"])
        self.bars.setData(pen=pg.mkPen(strong.lighter(120) if is_dark(palette) else strong, width=3))
        self.points.setPen(pg.mkPen(text, width=1))
        self.points.setBrush(pg.mkBrush(text))
        hl = palette.color(QPalette.ColorRole.Highlight)
        self.selected.setPen(pg.mkPen(hl, width=2))
        self.selected.setBrush(pg.mkBrush(None))

    def set_settings(self, settings: list[dict[str, Any]], names: list[str] | None = None) -> None:
        """One row per setting that has a finished cell (named ``names``, default their labels); the first on top."""
        names = names or [g["label"] for g in settings]
        rows = [g for g in settings if g["n"]]
        self.labels = [names[settings.index(g)] for g in rows]
        self.rates = [100 * g["rate"] for g in rows]
        self.low = [100 * g["low"] for g in rows]
        self.high = [100 * g["high"] for g in rows]
        self.index = [settings.index(g) for g in rows]
        # a row per setting needs little height: the tree above gets the rest
        self.setMaximumHeight(max(170, 90 + 48 * len(rows)))
        self.show_empty(not rows)
        n = len(rows)
        y = np.arange(n, dtype=float)[::-1]  # the first setting at the top
        r, lo, hi = (np.array(a, dtype=float) for a in (self.rates, self.low, self.high))
        self.y = y
        self.points.setData(x=r, y=y)
        self.bars.setData(x=r, y=y, left=r - lo, right=hi - r)
        left = self.getPlotItem().getAxis("left")
        ticks = [(float(y[i]), _short(lab)) for i, lab in enumerate(self.labels)]
        left.setTicks([ticks])
        fm = QFontMetrics(left.style.get("tickFont") or self.font())
        left.setWidth(max([40] + [fm.horizontalAdvance(t) + 16 for _y, t in ticks]))  # every label fits
        vb = self.getPlotItem().getViewBox()
        if n:
            vb.setRange(xRange=(0, 100), yRange=(-0.6, n - 0.4), padding=0.02)

    def mark(self, index: int | None) -> None:
        """Ring the setting at ``index`` of rates()["settings"] (None: none)."""
        if index is None or index not in self.index:
            self.selected.setData(x=[], y=[])
            return
        i = self.index.index(index)
        self.selected.setData(x=[self.rates[i]], y=[self.y[i]])

    def _clicked(self, ev) -> None:
        if ev.button() != Qt.MouseButton.LeftButton or not self.labels:
            return
        vb = self.getPlotItem().getViewBox()
        if not vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        yv = vb.mapSceneToView(ev.scenePos()).y()
        i = int(np.argmin(np.abs(self.y - yv)))
        if abs(self.y[i] - yv) <= 0.5:
            self.sigRowClicked.emit(self.index[i])


class _CountPlot(TimedPlot):
    """A fixed plot of fork counts (no panning, no menu), named for tests and styles."""

    def __init__(self, parent: QWidget | None, *, name: str, bottom: str, hint: str):
        super().__init__(parent, hint=hint)
        self.setObjectName(name)
        pi = self.getPlotItem()
        pi.setLabel("bottom", bottom)
        pi.setLabel("left", "forks")
        pi.setMouseEnabled(x=False, y=False)
        pi.hideButtons()
        pi.setMenuEnabled(False)


class SeverityPlot(_CountPlot):
    """Near-tie and material forks stacked per gap bin of the selected setting or category."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, name="severity_plot", bottom="top-1/top-2 gap at the fork (logits)",
                         hint="Select a setting: the gaps at its forks appear here.")
        pi = self.getPlotItem()
        self.legend = pi.addLegend(offset=(-6, 4), labelTextSize="8pt")
        self.near = pg.BarGraphItem(x=[], height=[], width=0.7, name="near-tie")
        self.material = pg.BarGraphItem(x=[], height=[], y0=[], width=0.7, name="material")
        pi.addItem(self.near)
        pi.addItem(self.material)
        self.near_counts: list[int] = []
        self.material_counts: list[int] = []
        self.labels: list[str] = []
        self.totals: list[pg.TextItem] = []  # each bin's count above its bar (made once per bin)
        self.apply_palette(self.palette())
        self.show_empty(True)

    def apply_palette(self, palette: QPalette) -> None:
        style_plot(self, palette)
        cols = severity_colours(palette)
        self._pens = {}
        for item, sev in ((self.near, "near-tie"), (self.material, "material")):
            fill, line = cols[sev]
            self._pens[sev] = pg.mkPen(line, width=1.5)
            item.setOpts(brush=pg.mkBrush(fill), pen=self._pens[sev],
                         pens=bar_pens(item.opts.get("height"), self._pens[sev]))
        text = palette.color(QPalette.ColorRole.Text).name()
        for _sample, label in self.legend.items:
            label.setAttr("color", text)
            label.setText(label.text)
        for t in self.totals:
            t.setColor(text)

    def _total_labels(self, x: np.ndarray, total: np.ndarray) -> None:
        while len(self.totals) < len(x):
            t = pg.TextItem(anchor=(0.5, 1.0), color=self.getPlotItem().getAxis("left").textPen().color())
            self.getPlotItem().addItem(t, ignoreBounds=True)
            self.totals.append(t)
        for i, t in enumerate(self.totals):
            shown = i < len(x) and total[i] > 0
            t.setVisible(bool(shown))
            if shown:
                t.setText(f"{int(total[i])}")
                t.setPos(float(x[i]), float(total[i]))

    def set_group(self, g: dict[str, Any] | None, labels: list[str]) -> None:
        """Show ``g``'s gap histogram (a setting or category of rates()); the bins labelled ``labels``."""
        self.labels = list(labels)
        bins = g["gaps"] if g else []
        self.near_counts = [int(b["near-tie"]) for b in bins]
        self.material_counts = [int(b["material"]) for b in bins]
        x = np.arange(len(bins), dtype=float)
        near = np.array(self.near_counts, dtype=float)
        mat = np.array(self.material_counts, dtype=float)
        self.near.setOpts(x=x, height=near, y0=np.zeros_like(near), pens=bar_pens(near, self._pens["near-tie"]))
        self.material.setOpts(x=x, height=mat, y0=near, pens=bar_pens(mat, self._pens["material"]))
        total = near + mat
        self._total_labels(x, total)
        if g is None:
            self.set_hint(None)
        elif not g["forks"]:
            self.set_hint("No fork here: no gap to show.")
        elif not total.sum():
            self.set_hint(NO_GAPS)
        self.show_empty(g is None or not total.sum())
        self.getPlotItem().getAxis("bottom").setTicks([[(float(i), lab) for i, lab in enumerate(labels)]])
        if total.sum():
            top = float(total.max())
            left = self.getPlotItem().getAxis("left")
            if top <= 10:
                left.setTickSpacing(1, 1)  # whole forks
            else:
                left.setTickSpacing()
            self.getPlotItem().getViewBox().setRange(xRange=(-0.6, len(bins) - 0.4), yRange=(0, top * 1.35),
                                                     padding=0)
        undiag = g["severity"]["undiagnosed"] if g else 0
        title = "gaps at the forks" + (f" ({undiag} not diagnosed: no gap)" if undiag and total.sum() else "")
        self.setTitle(title, size="9pt")


class PositionPlot(_CountPlot):
    """Where the forks of the selected setting or category fall: a histogram over the run, median and quartiles."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, name="position_plot", bottom="token index of the fork",
                         hint="Select a setting: where its forks fall appears here.")
        pi = self.getPlotItem()
        self.bars = pg.BarGraphItem(x0=[], height=[], width=1)
        pi.addItem(self.bars)
        self.median = pg.InfiniteLine(angle=90, movable=False, label="median",
                                      labelOpts={"position": 0.92, "anchors": [(0, 0), (0, 0)]})
        self.quartiles = [pg.InfiniteLine(angle=90, movable=False) for _ in range(2)]
        for ln in (self.median, *self.quartiles):
            ln.setVisible(False)
            pi.addItem(ln, ignoreBounds=True)
        self.counts: list[int] = []
        self.bin_width = 1
        self.apply_palette(self.palette())
        self.show_empty(True)

    def apply_palette(self, palette: QPalette) -> None:
        style_plot(self, palette)
        fill, line = severity_colours(palette)["undiagnosed"]  # the colour of a fork (diverged)
        self._pen = pg.mkPen(line, width=1)
        self.bars.setOpts(brush=pg.mkBrush(fill), pen=self._pen, pens=bar_pens(getattr(self, "counts", []), self._pen))
        text = palette.color(QPalette.ColorRole.Text)
        self.median.setPen(pg.mkPen(text, width=1.5, style=Qt.PenStyle.DashLine))
        self.median.label.setColor(text)
        for q in self.quartiles:
            q.setPen(pg.mkPen(text, width=1, style=Qt.PenStyle.DotLine))

    def set_group(self, g: dict[str, Any] | None) -> None:
        p = g["positions"] if g else None
        self.counts = [int(n) for n in p["histogram"]] if p else []
        self.bin_width = int(p["bin_width"]) if p else 1
        w = self.bin_width
        counts = np.array(self.counts, dtype=float)
        self.bars.setOpts(x0=np.arange(len(counts), dtype=float) * w, height=counts, width=w,
                          pens=bar_pens(counts, self._pen))
        has = bool(p and p["median"] is not None)
        if g is not None and not has:
            self.set_hint("No fork here: no position to show.")
        else:
            self.set_hint(None)
        self.show_empty(not has)
        for ln, v in ((self.median, p["median"] if p else None), (self.quartiles[0], p["q1"] if p else None),
                      (self.quartiles[1], p["q3"] if p else None)):
            ln.setVisible(v is not None)
            if v is not None:
                ln.setValue(float(v))
        if has:
            self.median.label.setFormat(f"median {p['median']:g}")
            top = float(counts.max())
            left = self.getPlotItem().getAxis("left")
            if top <= 10:
                left.setTickSpacing(1, 1)
            else:
                left.setTickSpacing()
            self.getPlotItem().getViewBox().setRange(xRange=(0, w * len(counts)), yRange=(0, top * 1.3), padding=0.02)
            self.setTitle(f"fork positions: first {p['min']}, last {p['max']} (dotted: quartiles)", size="9pt")
        else:
            self.setTitle("fork positions", size="9pt")

