"""The Rates panel of the Matrix tab: divergence rates with their intervals, where forks fall, how large the gaps are.

Everything shown is read from one :func:`specview.core.matrix.rates` result
(``set_rates``): per setting (every axis but the prompt) and per prompt
category, forks of n, the rate, its 95% Wilson interval, the fork positions'
median and quartiles and the near-tie / material / undiagnosed counts, in a
tree with the categories as children.  Beside it three plots, created once and
updated with ``setData``/``setOpts``:

* the rate of every setting with its Wilson interval as an error bar (one row
  per setting, so overlapping intervals are seen at a glance);
* the severity histogram of the selected row: near-tie and material forks
  stacked per gap bin (``gap_bin_labels()``, in logits);
* the fork-position histogram of the selected row, its median and quartiles
  marked.

With one prompt per setting a rate means little: the panel then shrinks to one
line that says so (``compact``).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFontMetrics, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHeaderView,
    QLabel,
    QSizePolicy,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QTreeWidgetItemIterator,
    QVBoxLayout,
    QWidget,
)

from ...core import verdicts
from ...core.matrix.evidence import group_prediction_text
from ...core.matrix.rates import pct, positions_text, rate_text, severity_text
from ...core.matrix.spec import engine_axes
from ...core.matrix.summary import ALL_AXES, axis_part
from ..panes import blend, is_dark
from ..plots import TimedPlot, style_plot

#: the verdict colours each severity is drawn in (as the HTML report draws them)
SEVERITY_VERDICT = {"near-tie": "near-tie", "material": "state", "undiagnosed": "diverged"}
#: the tree's columns
COLUMNS = ("setting · category", "forks / n", "rate", "95% CI", "fork at: median\n(quartiles)", "near-tie",
           "material", "undiagnosed", "kernel map")
COL_FORKS, COL_RATE, COL_CI, COL_POS, COL_NEAR, COL_MATERIAL, COL_UNDIAG, COL_KERNELS = range(1, 9)
SEVERITY_COLS = {"near-tie": COL_NEAR, "material": COL_MATERIAL, "undiagnosed": COL_UNDIAG}
KEY_ROLE = Qt.ItemDataRole.UserRole + 2

NEED_PROMPTS = ("Rates need more prompts: every setting here ran on one prompt. Run the prompt suite "
                "(Run ▸ Run matrix…, Prompt suite) for divergence rates with their intervals, fork positions and "
                "gap histograms.")
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


def _num(x: Any) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:g}"


def setting_key(g: dict[str, Any]) -> str:
    """What identifies a setting's row across updates: its axes (labels may repeat for two same-quant files)."""
    return json.dumps(g.get("params"), sort_keys=True, default=str)


def position_cell(g: dict[str, Any]) -> str:
    p = g["positions"]
    if p["median"] is None:
        return "–"
    return f"{_num(p['median'])} ({_num(p['q1'])}–{_num(p['q3'])})"


def ci_cell(g: dict[str, Any]) -> str:
    return "–" if not g["n"] else f"{pct(g['low'])}–{pct(g['high'])}"


def kernel_cell(g: dict[str, Any]) -> str:
    """What a cited kernel map predicted for a setting's cells ("" where the matrix cites none)."""
    return group_prediction_text(g["kernel_map"]) if isinstance(g.get("kernel_map"), dict) else ""


def row_texts(g: dict[str, Any]) -> list[str]:
    """The tree's texts for a setting or category group of :func:`rates` (after its name)."""
    sev = g["severity"]
    return [f"{g['forks']} / {g['n']}", pct(g["rate"]), ci_cell(g), position_cell(g),
            str(sev["near-tie"]), str(sev["material"]), str(sev["undiagnosed"]), kernel_cell(g)]


def setting_names(settings: list[dict[str, Any]]) -> tuple[list[str], str]:
    """Short names of the settings (only the axes that differ between them) and what they all share.

    One setting keeps its whole label; the rows' tool tips always give it.
    """
    if len(settings) < 2:
        return [g["label"] for g in settings], ""
    axes = [a for a in ALL_AXES if a != "prompt"]
    params = [g.get("params") or {} for g in settings]
    varying = [a for a in axes if len({repr(p.get(a)) for p in params}) > 1]
    if not varying:
        return [g["label"] for g in settings], ""
    names = [" ".join(axis_part(a, p.get(a)) for a in varying if p.get(a) is not None) or g["label"]
             for p, g in zip(params, settings)]
    shared = [axis_part(a, params[0].get(a)) for a in axes if a not in varying and params[0].get(a) is not None
              and a not in engine_axes()]
    return names, " ".join(shared)


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


class RatesPanel(QWidget):
    """Rates per setting and category (a tree), the rate plot, and the selected row's histograms."""

    sigCompact = Signal(bool)  # True: one line (one prompt per setting); False: the whole panel

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("rates_panel")
        self.rates: dict[str, Any] = {"settings": [], "gap_bins": []}
        self.compact: bool | None = None
        self.names: list[str] = []  # the settings' short names in the tree and the rate plot
        self.shared = ""  # what every setting shares, said once
        self._selected: tuple[str, str | None] | None = None  # (setting key, category or None)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        self.hint = QLabel()
        self.hint.setObjectName("rates_hint")
        self.hint.setWordWrap(True)
        self.hint.setTextFormat(Qt.TextFormat.PlainText)
        lay.addWidget(self.hint)
        self.body = QSplitter(Qt.Orientation.Horizontal)
        self.body.setObjectName("rates_body")
        self.body.setChildrenCollapsible(False)
        self.tree = QTreeWidget()
        self.tree.setObjectName("rates_tree")
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(list(COLUMNS))
        self.tree.setRootIsDecorated(True)
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tree.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        head = self.tree.header()
        head.setStretchLastSection(False)
        head.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in range(1, len(COLUMNS)):
            head.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
            self.tree.headerItem().setTextAlignment(c, Qt.AlignmentFlag.AlignCenter)
        self.tree.headerItem().setToolTip(COL_CI, "95% Wilson score interval of the rate")
        self.tree.headerItem().setToolTip(COL_POS, "token index of the fork: median (first quartile–third quartile)")
        self.tree.headerItem().setToolTip(COL_NEAR, "forks whose gap is within what batched-versus-single numerics "
                                                    "can flip (the diagnosis' far threshold)")
        self.tree.headerItem().setToolTip(COL_MATERIAL, "forks whose gap is above that threshold")
        self.tree.headerItem().setToolTip(COL_UNDIAG, "forks not diagnosed: no gap")
        self.tree.headerItem().setToolTip(COL_KERNELS, "what the kernel map the matrix cites predicts for the "
                                                       "setting's cells, and how many of them contradict it")
        self.tree.setColumnHidden(COL_KERNELS, True)
        self.tree.currentItemChanged.connect(self._current_changed)
        # left: the settings (the tree, and their rates side by side); right: the selected row's histograms
        left = QSplitter(Qt.Orientation.Vertical)
        left.setChildrenCollapsible(False)
        left.addWidget(self.tree)
        self.rate_plot = RatePlot()
        self.rate_plot.sigRowClicked.connect(self.select_setting)
        left.addWidget(self.rate_plot)
        left.setStretchFactor(0, 3)
        left.setStretchFactor(1, 1)
        self.body.addWidget(left)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(2)
        self.selection = QLabel()
        self.selection.setObjectName("rates_selection")
        self.selection.setTextFormat(Qt.TextFormat.PlainText)
        self.selection.setWordWrap(True)
        rl.addWidget(self.selection)
        self.severity_plot = SeverityPlot()
        self.position_plot = PositionPlot()
        rl.addWidget(self.severity_plot, 1)
        rl.addWidget(self.position_plot, 1)
        self.body.addWidget(right)
        self.body.setStretchFactor(0, 2)
        self.body.setStretchFactor(1, 1)
        self.body.setSizes([660, 330])
        lay.addWidget(self.body, 1)
        self._items: dict[str, QTreeWidgetItem] = {}
        self._set_compact(True)
        self.hint.setText("No matrix.")

    # -- data ------------------------------------------------------------------
    def set_rates(self, r: dict[str, Any], *, prompts: int) -> None:
        """Show ``r`` (a :func:`specview.core.matrix.rates` result) of a matrix over ``prompts`` prompts."""
        self.rates = r
        settings = r["settings"]
        self.names, self.shared = setting_names(settings)
        most = max((g["n"] for g in settings), default=0)
        self._set_compact(max(prompts, most) < 2)
        if self.compact:
            self.hint.setText(NEED_PROMPTS if settings or prompts else "No matrix.")
            self._fit_compact()
            self._fill_tree(settings)
            return
        done = sum(g["n"] + g["errors"] for g in settings)
        if not settings:
            self.hint.setText("Divergence rates over the prompts appear here as cells finish.")
        else:
            forks = sum(g["forks"] for g in settings)
            shared = f" (every setting: {self.shared})" if self.shared else ""
            self.hint.setText(f"Divergence rates over the prompts: {forks} forks in {done} finished cells of "
                              f"{len(settings)} setting{'s' if len(settings) != 1 else ''}{shared}. Select a row "
                              "for its gap and fork-position histograms.")
        self._fill_tree(settings)
        self.rate_plot.set_settings(settings, self.names)
        self._show_selected()

    def group(self, key: str, category: str | None = None) -> dict[str, Any] | None:
        """The rates() group of a setting (by :func:`setting_key`) or of one of its categories."""
        for g in self.rates["settings"]:
            if setting_key(g) == key:
                if category is None:
                    return g
                return next((c for c in g["categories"] if c["category"] == category), None)
        return None

    def selected_group(self) -> dict[str, Any] | None:
        return None if self._selected is None else self.group(*self._selected)

    def select_setting(self, index: int, category: str | None = None) -> None:
        """Select the setting at ``index`` of rates()["settings"] (or one of its categories)."""
        key = setting_key(self.rates["settings"][index])
        item = self._items.get(key)
        if item is None:
            return
        if category is not None:
            item = next((item.child(i) for i in range(item.childCount())
                         if item.child(i).data(0, KEY_ROLE) == (key, category)), item)
        self.tree.setCurrentItem(item)

    # -- the tree ----------------------------------------------------------------
    def _fill_tree(self, settings: list[dict[str, Any]]) -> None:
        """Update the rows in place (selection, expansion and scrolling stay), adding rows for new settings."""
        keys = [setting_key(g) for g in settings]
        self.tree.setColumnHidden(COL_KERNELS, not any(isinstance(g.get("kernel_map"), dict) for g in settings))
        if list(self._items) != keys[: len(self._items)]:  # a setting went away or moved: lay the tree out again
            self.tree.clear()
            self._items = {}
        self.tree.blockSignals(True)
        try:
            names = self.names if len(self.names) == len(settings) else [g["label"] for g in settings]
            for key, g, name in zip(keys, settings, names):
                item = self._items.get(key)
                if item is None:
                    item = QTreeWidgetItem(self.tree)
                    item.setData(0, KEY_ROLE, (key, None))
                    self._items[key] = item
                self._fill_row(item, name, g, full=g["label"])
                cats = [c["category"] for c in g["categories"]]
                have = [item.child(i).data(0, KEY_ROLE)[1] for i in range(item.childCount())]
                if have != cats[: len(have)]:
                    item.takeChildren()
                    have = []
                for c in g["categories"][len(have):]:
                    child = QTreeWidgetItem(item)
                    child.setData(0, KEY_ROLE, (key, c["category"]))
                for i, c in enumerate(g["categories"]):
                    self._fill_row(item.child(i), c["category"], c, full=f"{g['label']} · {c['category']}")
                if not have and item.childCount():
                    item.setExpanded(True)  # new categories show; a setting the user folded stays folded
        finally:
            self.tree.blockSignals(False)
        self._fit_tree()
        if self.tree.currentItem() is None and self._items:
            self.tree.setCurrentItem(next(iter(self._items.values())))

    def _fit_tree(self) -> None:
        """The tree is never squeezed below its columns' contents (the plots take the rest)."""
        fm = self.tree.fontMetrics()
        names = [self.tree.headerItem().text(0)]
        it = QTreeWidgetItemIterator(self.tree)
        while it.value() is not None:
            names.append(it.value().text(0))
            it += 1
        first = max(fm.horizontalAdvance(n) for n in names) + 2 * self.tree.indentation() + 12
        rest = sum(max(self.tree.header().sectionSizeHint(c), self.tree.sizeHintForColumn(c))
                   for c in range(1, len(COLUMNS)))
        self.tree.setMinimumWidth(min(first + rest + 8, 760))

    def _fill_row(self, item: QTreeWidgetItem, name: str, g: dict[str, Any], *, full: str | None = None) -> None:
        item.setText(0, name)
        for col, text in enumerate(row_texts(g), start=1):
            item.setText(col, text)
            side = Qt.AlignmentFlag.AlignLeft if col == COL_KERNELS else Qt.AlignmentFlag.AlignRight
            item.setTextAlignment(col, side | Qt.AlignmentFlag.AlignVCenter)
        kp = g.get("kernel_map") if isinstance(g.get("kernel_map"), dict) else None
        if kp is not None and kp.get("contradictions"):  # the map said lossless, yet a cell forked (or the reverse)
            item.setBackground(COL_KERNELS, QBrush(QColor(verdicts.COLOURS["state"])))
            item.setForeground(COL_KERNELS, QBrush(QColor(17, 17, 17)))
        else:
            item.setBackground(COL_KERNELS, QBrush())
            item.setForeground(COL_KERNELS, QBrush())
        for sev, col in SEVERITY_COLS.items():
            if g["severity"][sev]:
                item.setBackground(col, QBrush(QColor(verdicts.COLOURS[SEVERITY_VERDICT[sev]])))
                item.setForeground(col, QBrush(QColor(17, 17, 17)))  # the tints are light in every theme
            else:
                item.setBackground(col, QBrush())
                item.setForeground(col, QBrush())
        tip = [f"{full or name}: {rate_text(g)}"]
        if g["forks"]:
            tip += [positions_text(g), "gaps: " + severity_text(g)]
        if kernel_cell(g):
            tip.append("kernel map: " + kernel_cell(g))
        if g["errors"]:
            tip.append(f"{g['errors']} cell{'s' if g['errors'] != 1 else ''} failed (not counted)")
        for col in range(len(COLUMNS)):
            item.setToolTip(col, "\n".join(tip))

    def _current_changed(self, item: QTreeWidgetItem | None, _prev: QTreeWidgetItem | None = None) -> None:
        self._selected = None if item is None else tuple(item.data(0, KEY_ROLE))
        self._show_selected()

    def _show_selected(self) -> None:
        item = self.tree.currentItem()
        self._selected = None if item is None else tuple(item.data(0, KEY_ROLE))
        g = self.selected_group()
        if g is None:
            self.selection.setText("")
            self.rate_plot.mark(None)
        else:
            key, cat = self._selected
            setting = self.group(key)
            name = setting["label"] + (f" · {cat}" if cat else "")
            self.selection.setText(f"{name}: {rate_text(g)}")
            self.rate_plot.mark(self.rates["settings"].index(setting))
        self.severity_plot.set_group(g, self.rates.get("gap_bins") or [])
        self.position_plot.set_group(g)

    # -- layout and theme ----------------------------------------------------------
    def _set_compact(self, compact: bool) -> None:
        if compact == self.compact:
            return
        self.compact = compact
        self.body.setVisible(not compact)
        if compact:
            self._fit_compact()
            self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        else:
            self.setMaximumHeight(16_777_215)
            self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        self.sigCompact.emit(compact)

    def _fit_compact(self) -> None:
        """One panel no taller than its line of words (wrapped to the panel's width)."""
        m = self.layout().contentsMargins()
        width = max(200, self.width() - m.left() - m.right())
        self.setMaximumHeight(self.hint.heightForWidth(width) + m.top() + m.bottom() + 2)

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().resizeEvent(ev)
        if self.compact:
            self._fit_compact()

    def apply_palette(self, palette: QPalette) -> None:
        for p in (self.rate_plot, self.severity_plot, self.position_plot):
            p.apply_palette(palette)

    def changeEvent(self, ev: QEvent) -> None:  # noqa: N802 - Qt name
        super().changeEvent(ev)
        if ev.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            app = QApplication.instance()
            self.apply_palette(app.palette() if isinstance(app, QApplication) else self.palette())
