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
from PySide6.QtGui import QFontMetricsF, QPalette

from ..core.diagnose.ties import band_label, tie_density
from ..core.diagnose.tracks import acceptance_histogram, pair_tracks
from ..core.trace import Trace
from .panes import DRAFT_HUE, MISMATCH_HUE, blend, is_dark
from .plot_base import SPEC_HUE, VANILLA_HUE, TimedPlot, style_plot
from .plotdata import track_arrays

#: the histogram's x axis label, with the key to its bars' colours
BARS_KEY = ("position in the draft: <span style='color:{drafted}'>■</span> drafted · "
            "<span style='color:{accepted}'>■</span> accepted that far")
#: the steps between labelled positions where not every position has room for a label
ROUND_STEPS = [m * 10 ** e for e in range(5) for m in (1, 2, 5)]
#: up to this many accepted lengths (0, 1, ...) the histogram's title gives each one's count of rounds
LISTED_LENGTHS = 6
#: what the histogram's mean counts, next to the acceptance plot's (see plots.MEAN_TOKENS_NOTE)
MEAN_DRAFTS_NOTE = ("mean drafts accepted/round: the drafts a verify round accepted; the acceptance plot's mean "
                    "tokens/round adds the token of the target's own each round emits (and a replay's)")


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
        self.getPlotItem().showAxis("right", not empty)  # first: the title's room is between the axes
        super().show_empty(empty)

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
            self.set_title("")
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
        self.set_title(self.title_text())
        self.show_empty(not len(x) and not len(kx))
        if len(kx):
            lo, hi = float(np.min(np.log10(np.maximum(kl, 1e-12)))), float(np.max(np.log10(np.maximum(kl, 1e-12))))
            self.kl_view.setYRange(lo - 0.5, hi + 0.5, padding=0)
        if len(dm):
            m = float(np.max(np.abs(dm))) or 1.0
            pi.getViewBox().setYRange(-1.1 * m, 1.1 * m, padding=0)
        self._sync_views()

    def title_text(self) -> str:
        """The near-tie density in the calibrated band ("" for a run with no position to compare)."""
        t = self.ties
        if not t or not t.get("positions"):
            return ""
        b = next((b for b in t["bands"] if b.get("calibrated")), t["bands"][0])
        return (f"near-tie density: {b['in_band']} of {t['positions']} compared positions in the "
                f"{band_label(b)} band · {b['flipped']} flipped"
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


def spaced_positions(n: int, need: float) -> list[int]:
    """Which of positions 1..``n`` get a label when labels need ``need`` positions of room each: every one, or the
    multiples of a round step (1, 2, 5, 10, 20 ...) that gives them that room, and 1 when it has room too."""
    step = next((s for s in ROUND_STEPS if s >= need), ROUND_STEPS[-1])
    keep = list(range(step, n + 1, step))
    if step == 1:
        return keep
    return ([1] if step - 1 >= need else []) + keep


class AcceptanceHistogram(_FollowsPalette):
    """Per position in the draft: rounds that drafted that far (grey) and accepted that far (green)."""

    def __init__(self, parent=None):
        super().__init__(parent, hint="How far the drafts survive, position by position, appears here for a run "
                                      "with verify rounds.")
        self.setObjectName("acceptance_histogram")
        pi = self.getPlotItem()
        pi.setLabel("left", "rounds")
        pi.setMouseEnabled(x=False, y=False)
        # the bars' key is the x axis' label (apply_palette): under the bars, never over them or their labels
        self.drafted = pg.BarGraphItem(x=[], height=[], width=0.38)
        self.accepted = pg.BarGraphItem(x=[], height=[], width=0.38)
        pi.addItem(self.drafted)
        pi.addItem(self.accepted)
        self.labels: list[pg.TextItem] = []  # the share accepted over each position's green bar
        self.hist: dict | None = None
        self._top = 0  # the most rounds at a position
        self.apply_palette(self.palette())
        self._styled = True
        pi.getViewBox().sigResized.connect(self._fit)
        self.show_empty(True)

    def apply_palette(self, palette: QPalette) -> None:
        style_plot(self, palette)
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        self._text = text
        drafted, accepted = blend(base, text, 0.3), blend(base, DRAFT_HUE, 0.75 if is_dark(palette) else 0.6)
        self.drafted.setOpts(brush=pg.mkBrush(drafted), pen=pg.mkPen(blend(base, text, 0.55)))
        self.accepted.setOpts(brush=pg.mkBrush(accepted), pen=pg.mkPen(DRAFT_HUE.darker(130)))
        # on the axis itself: the plot's setLabel would show the axis of an empty plot too
        self.getPlotItem().getAxis("bottom").setLabel(BARS_KEY.format(drafted=drafted.name(),
                                                                      accepted=accepted.name()))
        for lab in self.labels:
            lab.setColor(text)

    def set_arm(self, arm: object | None) -> None:
        """Draw how far ``arm``'s drafts survived (None: empty)."""
        pi = self.getPlotItem()
        for lab in self.labels:
            pi.removeItem(lab)
        self.labels = []
        self.hist = acceptance_histogram(arm) if arm is not None else None
        pos = (self.hist or {}).get("positions") or []
        if not pos:
            self._show_nothing()
            return
        k = np.array([p["position"] for p in pos], float)
        self.drafted.setOpts(x=k - 0.2, height=[p["drafted"] for p in pos])
        self.accepted.setOpts(x=k + 0.2, height=[p["accepted"] for p in pos])
        self._top = max(p["drafted"] for p in pos)
        for p in pos:
            if p["rate"] is None:
                continue
            lab = pg.TextItem(f"{100 * p['rate']:.0f}%", color=self._text, anchor=(0.5, 1.0))
            lab.setPos(p["position"] + 0.2, p["accepted"] + 0.02 * self._top)
            lab.position = p["position"]
            pi.addItem(lab)
            self.labels.append(lab)
        self.set_title(self.title_text(), note=MEAN_DRAFTS_NOTE)
        self.set_hint(None)
        self.show_empty(False)
        self._fit()

    def _show_nothing(self) -> None:
        """Empty: the plain hint, or why a run's verify rounds give no position (they drafted nothing)."""
        self.drafted.setOpts(x=[], height=[])
        self.accepted.setOpts(x=[], height=[])
        self._top = 0
        self.set_title("")
        n = (self.hist or {}).get("rounds") or 0
        self.set_hint(f"This run's {n} verify round{'s' if n != 1 else ''} drafted nothing: there is no position "
                      f"in a draft to show." if n else None)
        self.show_empty(True)

    def title_text(self) -> str:
        """The rounds, the mean drafts they accepted, and how many accepted each length while those are few."""
        h = self.hist or {}
        by, rounds = h.get("by_length") or [0], h.get("rounds") or 0
        mean = sum(a * n for a, n in enumerate(by)) / max(1, rounds)
        most = max((a for a, n in enumerate(by) if n), default=0)
        out = f"{rounds} rounds · mean {mean:.2f} drafts accepted/round"
        if most < LISTED_LENGTHS:
            lengths = "0" if most == 0 else f"0–{most}"
            out += f" · accepting {lengths}: " + "/".join(str(n) for n in by[:most + 1])
        else:
            out += f" · up to {most} in a round"
        return out

    def _fit(self) -> None:
        """Lay the positions out for the plot's size: tick and percentage labels on the positions where they
        have room, and a y range with room for the labels over the bars."""
        if not self._top:
            return
        pi = self.getPlotItem()
        vb = pi.getViewBox()
        pos = self.hist["positions"]
        n = len(pos)
        fm = QFontMetricsF(self.labels[0].textItem.font() if self.labels else self.font())
        per = max(vb.width(), 1.0) / (n + 0.2)  # pixels per position
        ticks = spaced_positions(n, (fm.horizontalAdvance(str(n)) + 10) / per)
        pi.getAxis("bottom").setTicks([[(p, str(p)) for p in ticks]])
        label_w = fm.horizontalAdvance("100%") + 4
        room = set(spaced_positions(n, label_w / per))
        shown = []
        for lab in self.labels:
            # where not every position has room for one, a position none accepted at shows none (its bar is 0)
            fits = lab.position in room and (len(room) == n or pos[lab.position - 1]["accepted"] > 0)
            lab.setVisible(fits)
            if fits:
                shown.append(lab.position)
        # the x range: every position, and room for the first one's label left of its bar
        vb.setXRange(min(0.4, 1.2 - (label_w / 2 + 2) / per), n + 0.6, padding=0)
        k = np.array([p["position"] for p in pos], float)
        x = np.concatenate([k - 0.2, k + 0.2, np.array(shown, float) + 0.2])
        y = np.concatenate([[p["drafted"] for p in pos], [p["accepted"] for p in pos],
                            [pos[i - 1]["accepted"] for i in shown]])
        extra = np.concatenate([np.zeros(2 * n), np.full(len(shown), fm.height() + 2)])
        vb.setYRange(0, self.fit_top(x, y, extra=extra, least=1.15), padding=0)


__all__ = ["AcceptanceHistogram", "TrackPlot"]
