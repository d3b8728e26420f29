"""Two views under the Side by side tab's plots: the per-token Δ-margin / KL track, and the acceptance histogram.

* :class:`TrackPlot` lies under the margin plot on the same token axis (its x
  range is linked to it): on the positions both arms saw the same context,
  how far the speculative row moved vanilla's own top-1/top-2 margin (bars)
  and the two rows' KL over the candidates both recorded (points, right axis);
  its title gives the run's near-tie density in the calibrated band.
* :class:`AcceptanceHistogram`: per position in the draft, the rounds that
  drafted that far and those that accepted that far, and their share.

The numbers come from :mod:`specview.core.diagnose.tracks` and
:mod:`specview.core.diagnose.ties`, the same the HTML report draws.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QPalette

from ..core.diagnose.ties import band_label, tie_density
from ..core.diagnose.tracks import acceptance_histogram, pair_tracks
from ..core.trace import Trace
from .panes import DRAFT_HUE, MISMATCH_HUE, blend, is_dark
from .plots import SPEC_HUE, VANILLA_HUE, TimedPlot, style_plot
from .plotdata import track_arrays


class _FollowsPalette(TimedPlot):
    """Restyles itself when the application's palette changes (the theme)."""

    def changeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().changeEvent(ev)
        if ev.type() == QEvent.Type.PaletteChange and self.__dict__.get("_styled"):
            self.apply_palette(self.palette())


class TrackPlot(_FollowsPalette):
    """Δ-margin bars and KL points per token, up to the fork; x linked to the margin plot."""

    sigIndexClicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent, hint="How far the speculative rows moved vanilla's margins (Δ-margin) and their KL "
                                      "appear here for a finished run, up to the fork.")
        self.setObjectName("track_plot")
        pi = self.getPlotItem()
        pi.setLabel("bottom", "token index")
        pi.setLabel("left", "Δ-margin (logits)")
        pi.setMouseEnabled(x=True, y=False)
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.7)
        pi.addItem(self.bars)
        self.zero = pg.InfiniteLine(pos=0, angle=0, movable=False)
        pi.addItem(self.zero, ignoreBounds=True)
        # KL on its own log axis, on the right
        self.kl_view = pg.ViewBox()
        pi.showAxis("right")
        pi.scene().addItem(self.kl_view)
        pi.getAxis("right").linkToView(self.kl_view)
        pi.getAxis("right").setLabel("KL (nats, log10)")
        self.kl_view.setXLink(pi)
        self.kl = pg.ScatterPlotItem(size=4, symbol="o")
        self.kl_view.addItem(self.kl)
        pi.getViewBox().sigResized.connect(self._sync_views)
        self.fork_line = pg.InfiniteLine(angle=90, movable=False)
        self.fork_line.setVisible(False)
        pi.addItem(self.fork_line, ignoreBounds=True)
        self.select_line = pg.InfiniteLine(angle=90, movable=False)
        self.select_line.setVisible(False)
        pi.addItem(self.select_line, ignoreBounds=True)
        self.n = 0
        self.ties: dict | None = None
        self.apply_palette(self.palette())
        self._styled = True
        self.scene().sigMouseClicked.connect(self._clicked)
        self.show_empty(True)

    def _sync_views(self) -> None:
        self.kl_view.setGeometry(self.getPlotItem().getViewBox().sceneBoundingRect())

    def show_empty(self, empty: bool) -> None:
        """Empty: the hint alone, without the KL axis on the right (it would run into the hint)."""
        super().show_empty(empty)
        self.getPlotItem().showAxis("right", not empty)

    def apply_palette(self, palette: QPalette) -> None:
        style_plot(self, palette)
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        ax = self.getPlotItem().getAxis("right")
        ax.setPen(pg.mkPen(blend(base, text, 0.6)))
        ax.setTextPen(pg.mkPen(text))
        self._bar_brush = pg.mkBrush(SPEC_HUE.lighter(115) if is_dark(palette) else SPEC_HUE)
        self.zero.setPen(pg.mkPen(blend(base, text, 0.45), width=1))
        self.kl.setBrush(pg.mkBrush(VANILLA_HUE.lighter(140) if is_dark(palette) else VANILLA_HUE))
        self.kl.setPen(pg.mkPen(None))
        self.fork_line.setPen(pg.mkPen(MISMATCH_HUE, width=2, style=Qt.PenStyle.DashLine))
        self.select_line.setPen(pg.mkPen(palette.color(QPalette.ColorRole.Highlight), width=2))

    def set_trace(self, trace: Trace | None) -> None:
        """Draw the run's tracks (None: empty) and title it with the near-tie density."""
        pi = self.getPlotItem()
        if trace is None:
            self.bars.setOpts(x=[], height=[])
            self.kl.setData([], [])
            self.n, self.ties = 0, None
            pi.setTitle("")
            self.fork_line.setVisible(False)
            self.mark_token(None)  # no mark of the last run's fork or selection over the hint
            self.show_empty(True)
            return
        tr = pair_tracks(trace)
        x, dm, kx, kl = track_arrays(tr["delta_margin"], tr["kl"])
        fm = trace.comparison.first_mismatch
        fork = fm.index if fm is not None else None
        brushes = [pg.mkBrush(MISMATCH_HUE) if fork is not None and int(i) == fork else self._bar_brush for i in x]
        self.bars.setOpts(x=x, height=dm, width=0.7, brushes=brushes, pen=pg.mkPen(None))
        self.kl.setData(kx, np.log10(np.maximum(kl, 1e-12)))
        self.n = max(len(trace.vanilla.steps), len(trace.speculative.steps))
        self.ties = tie_density(trace)
        self.fork_line.setVisible(fork is not None)
        self.fork_line.setValue(fork if fork is not None else 0)
        pi.setTitle(self.title_text(), size="9pt")
        self.show_empty(not len(x) and not len(kx))
        if len(kx):
            lo, hi = float(np.min(np.log10(np.maximum(kl, 1e-12)))), float(np.max(np.log10(np.maximum(kl, 1e-12))))
            self.kl_view.setYRange(lo - 0.5, hi + 0.5, padding=0)
        if len(dm):
            m = float(np.max(np.abs(dm))) or 1.0
            pi.getViewBox().setYRange(-1.1 * m, 1.1 * m, padding=0)
        self._sync_views()

    def title_text(self) -> str:
        t = self.ties
        if not t:
            return ""
        b = next((b for b in t["bands"] if b.get("calibrated")), t["bands"][0])
        return (f"near-tie density: {b['in_band']} of {t['positions']} compared positions in the "
                f"{band_label(b)} band, {b['flipped']} flipped"
                + (f", {b['flipped_outside']} outside" if b["flipped_outside"] else ""))

    def mark_token(self, i: int | None) -> None:
        self.select_line.setVisible(i is not None)
        if i is not None:
            self.select_line.setValue(i)

    def _clicked(self, ev) -> None:
        if ev.button() != Qt.MouseButton.LeftButton or not self.n:
            return
        vb = self.getPlotItem().getViewBox()
        if not vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        i = int(round(vb.mapSceneToView(ev.scenePos()).x()))
        if 0 <= i < self.n:
            self.sigIndexClicked.emit(i)


class AcceptanceHistogram(_FollowsPalette):
    """Per position in the draft: rounds that drafted that far (grey) and accepted that far (green)."""

    def __init__(self, parent=None):
        super().__init__(parent, hint="How far the drafts survive, position by position, appears here for a run "
                                      "with verify rounds.")
        self.setObjectName("acceptance_histogram")
        pi = self.getPlotItem()
        pi.setLabel("bottom", "position in the draft")
        pi.setLabel("left", "rounds")
        pi.setMouseEnabled(x=False, y=False)
        self.legend = pi.addLegend(offset=(-8, 4), labelTextSize="8pt", colCount=2)  # one row, over the headroom
        self.drafted = pg.BarGraphItem(x=[], height=[], width=0.38, name="drafted that far")
        self.accepted = pg.BarGraphItem(x=[], height=[], width=0.38, name="accepted that far")
        pi.addItem(self.drafted)
        pi.addItem(self.accepted)
        self.labels: list[pg.TextItem] = []
        self.hist: dict | None = None
        self.apply_palette(self.palette())
        self._styled = True
        self.show_empty(True)

    def apply_palette(self, palette: QPalette) -> None:
        style_plot(self, palette)
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        self._text = text
        self.drafted.setOpts(brush=pg.mkBrush(blend(base, text, 0.3)), pen=pg.mkPen(blend(base, text, 0.55)))
        self.accepted.setOpts(brush=pg.mkBrush(blend(base, DRAFT_HUE, 0.75 if is_dark(palette) else 0.6)),
                              pen=pg.mkPen(DRAFT_HUE.darker(130)))
        for item in self.legend.items:
            item[1].setAttr("color", text.name())
            item[1].setText(item[1].text)

    def set_arm(self, arm: object | None) -> None:
        pi = self.getPlotItem()
        for lab in self.labels:
            pi.removeItem(lab)
        self.labels = []
        self.hist = acceptance_histogram(arm) if arm is not None else None
        pos = (self.hist or {}).get("positions") or []
        if not pos:
            self.drafted.setOpts(x=[], height=[])
            self.accepted.setOpts(x=[], height=[])
            pi.setTitle("")
            self.show_empty(True)
            return
        k = np.array([p["position"] for p in pos], float)
        self.drafted.setOpts(x=k - 0.2, height=[p["drafted"] for p in pos])
        self.accepted.setOpts(x=k + 0.2, height=[p["accepted"] for p in pos])
        top = max(p["drafted"] for p in pos)
        for p in pos:
            if p["rate"] is None:
                continue
            lab = pg.TextItem(f"{100 * p['rate']:.0f}%", color=self._text, anchor=(0.5, 1.0))
            lab.setPos(p["position"] + 0.2, p["accepted"] + 0.02 * top)
            pi.addItem(lab)
            self.labels.append(lab)
        by = self.hist["by_length"]
        mean = sum(a * n for a, n in enumerate(by)) / max(1, self.hist["rounds"])
        pi.setTitle(f"{self.hist['rounds']} rounds accepting 0–{len(by) - 1} drafts: "
                    + " / ".join(str(n) for n in by) + f" (mean {mean:.2f})", size="9pt")
        pi.getAxis("bottom").setTicks([[(p["position"], str(p["position"])) for p in pos]])
        pi.getViewBox().setXRange(0.4, len(pos) + 0.6, padding=0)
        pi.getViewBox().setYRange(0, top * 1.5, padding=0)  # room above the bars for the legend
        self.show_empty(False)


__all__ = ["AcceptanceHistogram", "TrackPlot"]
