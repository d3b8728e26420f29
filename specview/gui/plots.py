"""The two pyqtgraph plots: draft acceptance per round, and the top-1/top-2 margin per step.

Both are created once and updated with ``setData``; the window throttles the
updates while a run streams.  Clicking a point emits the token index it stands
for; :meth:`mark_token` draws the selection.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QGraphicsItem, QLabel

from ..core.trace import Round, Step
from .panes import DRAFT_HUE, MISMATCH_HUE, PaintClock, blend, is_dark
from .plotdata import Series, _finite, at_risk_positions, envelope_series

VANILLA_HUE = QColor(40, 110, 220)
SPEC_HUE = QColor(235, 120, 20)
ENVELOPE_HUE = QColor(150, 90, 210)
#: what the acceptance plot reads of each round (``first``: its first step; ``replay``: its replay pass's width)
COLUMNS = ("index", "first", "drafted", "accepted", "replay")
MAX_BARS = 600  # above this many rounds the acceptance bars show means of bins of rounds
WIDE_POINTS = 2000  # up to this many tokens the speculative margins are drawn with a wider stroke


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

    def paintEvent(self, ev) -> None:  # noqa: N802 - Qt name
        t0 = time.perf_counter()
        super().paintEvent(ev)
        dt = time.perf_counter() - t0
        PaintClock.seconds += dt
        PaintClock.plots += dt


class AcceptancePlot(TimedPlot):
    """Drafted vs accepted tokens per speculative round (bars), with the totals in the title."""

    sigIndexClicked = Signal(int)  # first token index of the clicked round

    def __init__(self, parent=None):
        super().__init__(parent, hint="Drafted and accepted tokens of each verify round appear here while the "
                                      "speculative arm runs.")
        self.setObjectName("acceptance_plot")
        pi = self.getPlotItem()
        pi.setMenuEnabled(True)
        pi.setLabel("bottom", "round")
        pi.setLabel("left", "tokens")
        pi.setMouseEnabled(x=True, y=False)
        pi.getViewBox().enableAutoRange(axis="y", enable=False)
        self.legend = pi.addLegend(offset=(-8, 6), labelTextSize="8pt")
        self.legend.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.drafted = pg.PlotDataItem(stepMode="center", fillLevel=0, name="drafted")
        self.accepted = pg.PlotDataItem(stepMode="center", fillLevel=0, name="accepted")
        pi.addItem(self.drafted)
        pi.addItem(self.accepted)
        self.select_line = pg.InfiniteLine(angle=90, movable=False)
        self.select_line.setVisible(False)
        pi.addItem(self.select_line, ignoreBounds=True)
        self.fork_line = pg.InfiniteLine(angle=90, movable=False)
        self.fork_line.setVisible(False)
        pi.addItem(self.fork_line, ignoreBounds=True)
        # a round whose rejection was rolled back by a checkpoint restore and a replay pass (a hybrid target's
        # recurrent memory): a mark above its bar, in the legend only while a run has one
        self.replays = pg.ScatterPlotItem(symbol="t", size=7)  # named in the legend only while shown
        self.replays.setObjectName("replays")
        pi.addItem(self.replays)
        self._replay_legend = False
        self.n_replayed = 0
        self.rounds: list[Round] = []
        self._cols: dict[str, Series] = {c: Series() for c in COLUMNS}
        self._last: Round | None = None
        self.bin = 1
        self._x_span = 0
        self._y_top = 0.0
        self._title = None
        self.summary = ""
        self.apply_palette(self.palette())
        self.scene().sigMouseClicked.connect(self._clicked)
        self.set_rounds([])

    def apply_palette(self, palette: QPalette) -> None:
        style_plot(self, palette)
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        dark = is_dark(palette)
        self.drafted.setPen(pg.mkPen(blend(base, text, 0.6 if dark else 0.55), width=1))
        self.drafted.setBrush(pg.mkBrush(blend(base, text, 0.34 if dark else 0.18)))
        self.accepted.setPen(pg.mkPen(DRAFT_HUE.darker(130) if not is_dark(palette) else DRAFT_HUE.lighter(120), width=1))
        self.accepted.setBrush(pg.mkBrush(blend(base, DRAFT_HUE, 0.75 if is_dark(palette) else 0.6)))
        self.select_line.setPen(pg.mkPen(palette.color(QPalette.ColorRole.Highlight), width=2))
        self.fork_line.setPen(pg.mkPen(MISMATCH_HUE, width=2, style=Qt.PenStyle.DashLine))
        self.replays.setPen(pg.mkPen(text, width=1))
        self.replays.setBrush(pg.mkBrush(blend(base, text, 0.7)))
        for item in self.legend.items:
            item[1].setAttr("color", text.name())
            item[1].setText(item[1].text)

    def set_rounds(self, rounds: Sequence[Round], *, rate: float | None = None, mean: float | None = None,
                   streaming: bool = False) -> None:
        """Show the rounds.  While ``streaming`` the rounds only grow: the new ones are appended to the plot's
        arrays, the x range grows in steps instead of every frame, and the title waits for the end."""
        if streaming and rounds and len(rounds) == len(self.rounds) and rounds[-1] is self._last:
            return  # nothing new: leave the plot as it is drawn
        vb = self.getPlotItem().getViewBox()
        if streaming:
            vb.enableAutoRange(axis="x", enable=False)
            if rounds and len(rounds) + 1 > self._x_span:
                self._x_span = max(16, int(len(rounds) * 1.6))
                vb.setXRange(-0.5, self._x_span, padding=0.02)
        else:
            self._x_span = 0
            vb.enableAutoRange(axis="x", enable=True)
        self._set_rounds(rounds, rate=rate, mean=mean, streaming=streaming)

    def _take(self, rounds: Sequence[Round], streaming: bool) -> None:
        """The rounds' numbers as arrays: only the new rounds are read while a run streams."""
        k = self._cols["index"].n
        if not (streaming and 0 < k <= len(rounds) and rounds[k - 1] is self._last):
            self._cols = {c: Series(max(64, len(rounds))) for c in COLUMNS}
            k = 0
        tail = rounds[k:]
        for c in self._cols:
            self._cols[c].extend([getattr(r, "first_step" if c == "first" else c) for r in tail])
        self._last = rounds[-1] if rounds else None
        self.rounds = list(rounds)

    def _set_rounds(self, rounds: Sequence[Round], *, rate: float | None, mean: float | None,
                    streaming: bool = False) -> None:
        self._take(rounds, streaming)
        n = len(self.rounds)
        self.bin = 1
        d_all, a_all = self._cols["drafted"].view(), self._cols["accepted"].view()
        if n:
            d, a = d_all, a_all
            x0 = self.rounds[0].index - 0.5
            cap = MAX_BARS
            if self.isVisible():  # no more bars than can be seen: one per two pixels at most
                cap = min(MAX_BARS, max(50, int(self.getPlotItem().getViewBox().width()) // 2))
            if n > cap:
                # long runs: one bar per bin of rounds, its height the bin's mean
                b = self.bin = -(-n // cap)
                m = -(-n // b)
                counts = np.full(m, b, float)
                counts[-1] = n - b * (m - 1)
                d = np.add.reduceat(d, np.arange(0, n, b)) / counts
                a = np.add.reduceat(a, np.arange(0, n, b)) / counts
                x = x0 + np.minimum(np.arange(m + 1, dtype=float) * b, n)
            else:
                x = x0 + np.arange(n + 1, dtype=float)
            self.show_empty(False)
            self.drafted.setData(x, d)
            self.accepted.setData(x, a)
            self._show_replays(d_all)
            top = max(1.0, float(d.max()), float(a.max())) * 1.45
            if top != self._y_top:
                self._y_top = top
                self.getPlotItem().getViewBox().setYRange(0, top, padding=0)
                left = self.getPlotItem().getAxis("left")
                if top <= 12 and self.bin == 1:
                    left.setTickSpacing(1, 1)  # whole tokens
                else:
                    left.setTickSpacing()
        else:
            self.drafted.setData([], [])
            self.accepted.setData([], [])
            self._show_replays(d_all)
            self._y_top = 0.0
            self._x_span = 0
            self.show_empty(True)
        drafted, accepted = int(d_all.sum()), int(a_all.sum())
        if rate is None and drafted:
            rate = accepted / drafted
        verify = self._cols["index"].view() > 0  # round 0 is the prefill
        if mean is None:
            mean = float(a_all[verify].mean()) + 1 if verify.any() else None
        if n:
            self.summary = (f"acceptance {rate * 100:.1f}% ({accepted}/{drafted})" if rate is not None
                            else "nothing drafted")
            if mean is not None:
                self.summary += f" · mean length {mean:.2f}"
            self.summary += f" · {int(np.count_nonzero(verify))} verify rounds"  # the prefill's is no verify
            if self.n_replayed:
                self.summary += f" · {self.n_replayed} replayed"
            if self.bin > 1:
                self.summary += f" (bars: means of {self.bin})"
        else:
            self.summary = "draft acceptance per round"
        title = "draft acceptance per round" if streaming else self.summary  # a title that changes every
        if title != self._title:  # frame lays the plot out again every frame
            self._title = title
            self.setTitle(title, size="9pt")

    def _show_replays(self, drafted: np.ndarray) -> None:
        """Mark the rounds that replayed (one mark per round; none while the bars are means of bins)."""
        replay = self._cols["replay"].view()
        self.n_replayed = int(np.count_nonzero(replay))
        if self.n_replayed and self.bin == 1:
            idx = np.flatnonzero(replay)
            self.replays.setData(self._cols["index"].view()[idx].astype(float), drafted[idx] + 0.35)
        else:
            self.replays.setData([], [])
        want = self.n_replayed > 0
        if want != self._replay_legend:
            if want:
                self.legend.addItem(self.replays, "replayed")
                label = self.legend.items[-1][1]  # in the legend's text colour, as apply_palette gives the others
                label.setAttr("color", self.palette().color(QPalette.ColorRole.Text).name())
                label.setText(label.text)
            else:
                self.legend.removeItem(self.replays)
            self._replay_legend = want

    def round_of_token(self, i: int) -> Round | None:
        """The round that made token ``i`` (the last round starting at or before it)."""
        k = int(np.searchsorted(self._cols["first"].view(), i, side="right")) - 1
        return self.rounds[k] if 0 <= k < len(self.rounds) else None

    def mark_token(self, i: int | None) -> None:
        r = self.round_of_token(i) if i is not None else None
        self.select_line.setVisible(r is not None)
        if r is not None:
            self.select_line.setValue(r.index)

    def mark_fork(self, i: int | None) -> None:
        r = self.round_of_token(i) if i is not None else None
        self.fork_line.setVisible(r is not None)
        self.fork_line.setValue(r.index if r is not None else 0)  # no fork: no stale position of the last one

    def _clicked(self, ev) -> None:
        if ev.button() != Qt.MouseButton.LeftButton or not self.rounds:
            return
        vb = self.getPlotItem().getViewBox()
        if not vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        x = vb.mapSceneToView(ev.scenePos()).x()
        idx = int(round(x)) - self.rounds[0].index
        if 0 <= idx < len(self.rounds):
            self.sigIndexClicked.emit(self.rounds[idx].first_step)


class MarginPlot(TimedPlot):
    """Top-1 minus top-2 logit per generated token, both arms; fork, envelope and at-risk positions."""

    sigIndexClicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent, hint="The top-1 minus top-2 logit margin of every token appears here when a run "
                                      "starts; the fork is marked on it.")
        self.setObjectName("margin_plot")
        pi = self.getPlotItem()
        pi.setLabel("bottom", "token index")
        pi.setLabel("left", "margin (logits)")
        pi.setClipToView(True)
        pi.setDownsampling(auto=True, mode="peak")
        pi.getViewBox().enableAutoRange(axis="y", enable=False)  # y is set with headroom for the legend
        self.legend = pi.addLegend(offset=(-8, 4), labelTextSize="8pt", colCount=2)
        self.envelope_base = pg.PlotDataItem()
        self.envelope = pg.PlotDataItem(name="replay envelope")
        self.envelope_fill = pg.FillBetweenItem(self.envelope_base, self.envelope)
        pi.addItem(self.envelope_base)
        pi.addItem(self.envelope)
        pi.addItem(self.envelope_fill)
        self.envelope_base.setVisible(False)
        # peak downsampling to about one point per pixel keeps every spike and keeps long runs cheap
        self.vanilla = pg.PlotDataItem(name="vanilla", autoDownsampleFactor=1.0)
        self.speculative = pg.PlotDataItem(name="speculative", autoDownsampleFactor=1.0)
        # vanilla (the reference) on top of a wider speculative stroke: where they agree both show
        pi.addItem(self.speculative)
        pi.addItem(self.vanilla)
        self.at_risk = pg.ScatterPlotItem(name="at risk", symbol="x", size=9)
        pi.addItem(self.at_risk)
        self.fork_line = pg.InfiniteLine(angle=90, movable=False, label="fork",
                                         labelOpts={"position": 0.55, "anchors": [(0, 0), (0, 0)]})
        self.fork_line.setVisible(False)
        pi.addItem(self.fork_line, ignoreBounds=True)
        self.select_line = pg.InfiniteLine(angle=90, movable=False)
        self.select_line.setVisible(False)
        pi.addItem(self.select_line, ignoreBounds=True)
        self.select_line.setZValue(self.fork_line.zValue() - 1)  # the fork line stays visible on top
        self.gap_lines: list[pg.InfiniteLine] = []
        self._x_max: int | None = None
        self._y_top = 0.0
        self.n_vanilla = 0
        self.n_speculative = 0
        self.diagnosis: dict | None = None
        self.apply_palette(self.palette())
        self.scene().sigMouseClicked.connect(self._clicked)
        self._legend_entries()
        self.show_empty(True)

    def apply_palette(self, palette: QPalette) -> None:
        style_plot(self, palette)
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        dark = is_dark(palette)
        self._text_colour = text.name()
        self._palette = QPalette(palette)
        self.vanilla.setPen(pg.mkPen(VANILLA_HUE.lighter(140) if dark else VANILLA_HUE, width=1))
        self._spec_colour = SPEC_HUE.lighter(115) if dark else SPEC_HUE
        self._wide = None
        self._spec_pen(max(self.n_vanilla, self.n_speculative, 0))
        self.envelope.setPen(pg.mkPen(ENVELOPE_HUE, width=1))
        self.envelope_fill.setBrush(pg.mkBrush(blend(base, ENVELOPE_HUE, 0.35)))
        self.at_risk.setPen(pg.mkPen(MISMATCH_HUE, width=1.5))
        self.at_risk.setBrush(pg.mkBrush(MISMATCH_HUE))
        self.fork_line.setPen(pg.mkPen(MISMATCH_HUE, width=2, style=Qt.PenStyle.DashLine))
        self.fork_line.label.setColor(MISMATCH_HUE.lighter(130) if dark else MISMATCH_HUE.darker(120))
        fill = QColor(base)
        fill.setAlpha(225)
        self.fork_line.label.fill = pg.mkBrush(fill)  # readable over the curves
        self.select_line.setPen(pg.mkPen(palette.color(QPalette.ColorRole.Highlight), width=2))
        for ln in self.gap_lines:
            ln.setPen(pg.mkPen(ENVELOPE_HUE, width=1, style=Qt.PenStyle.DotLine))
        for item in self.legend.items:
            item[1].setAttr("color", text.name())
            item[1].setText(item[1].text)

    def _legend_entries(self, envelope: str | None = None, at_risk: bool = False) -> None:
        """The legend names the arms, then the envelope and the at-risk marks when they are drawn.

        A new legend each time: pyqtgraph's legend leaves holes in its grid where entries were removed.
        """
        pi = self.getPlotItem()
        old = pi.legend
        if old is not None:
            old.clear()
            if old.scene() is not None:
                old.scene().removeItem(old)
        pi.legend = None
        self.legend = pi.addLegend(offset=(-8, 4), labelTextSize="8pt", colCount=2)
        self.legend.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        style_legend(self, self._palette)
        self.legend.setVisible(not self.empty)
        entries = [(self.vanilla, "vanilla"), (self.speculative, "speculative")]
        if envelope is not None:
            entries.append((self.envelope, envelope))
        if at_risk:
            entries.append((self.at_risk, "at risk"))
        for item, name in entries:
            self.legend.addItem(item, name)
            self.legend.items[-1][1].setAttr("color", self._text_colour)
            self.legend.items[-1][1].setText(name)

    @staticmethod
    def margins(steps: Sequence[Step]) -> np.ndarray:
        return np.fromiter((_finite(s.margin) for s in steps), float, len(steps))

    def set_steps(self, vanilla: Sequence[Step], speculative: Sequence[Step]) -> None:
        self.set_arrays(self.margins(vanilla), self.margins(speculative))

    def restart(self, arm: str) -> None:
        """An arm starts again: its next margins replace the curve even if they are as many as before."""
        if arm == "vanilla":
            self.n_vanilla = -1
        else:
            self.n_speculative = -1
        self._x_max = None  # the next frame sets the run's x range again, whatever the last run left

    def _spec_pen(self, n: int) -> None:
        """The speculative arm's wider stroke (both arms show where they agree) while the points are few
        enough to see; a long run's curves are drawn thin: a thick stroke costs twice the paint."""
        wide = n <= WIDE_POINTS
        if wide != self._wide:
            self._wide = wide
            self.speculative.setPen(pg.mkPen(self._spec_colour, width=2.5 if wide else 1))

    def set_arrays(self, v: np.ndarray, s: np.ndarray, *, x_max: int | None = None) -> None:
        """Set both arms' margins.

        While a run streams, ``x_max`` (the run's max tokens) fixes the x range,
        the y range only ever grows (so the axes are not laid out again every
        frame), and an arm whose margins did not grow is left as it is.
        """
        grew = (len(v) != self.n_vanilla, len(s) != self.n_speculative)
        streaming = x_max is not None
        if streaming and not any(grew) and self._x_max == x_max:
            return  # nothing new: leave the plot as it is drawn
        self.n_vanilla, self.n_speculative = len(v), len(s)
        self.show_empty(not (len(v) or len(s)))
        if self.empty:
            self.vanilla.setData([], [])
            self.speculative.setData([], [])
            self._x_max, self._y_top = None, 0.0
            return
        self._spec_pen(max(len(v), len(s)))
        if grew[0] or not streaming:
            self.vanilla.setData(np.arange(len(v), dtype=float), v)
        if grew[1] or not streaming:
            self.speculative.setData(np.arange(len(s), dtype=float), s)
        top = 1.0
        for a in (v, s):
            if len(a) and np.isfinite(a).any():
                top = max(top, float(np.nanmax(a)))
        vb = self.getPlotItem().getViewBox()
        if x_max is None:
            # fitted now, not at the next paint: until then a resize of the linked track plot, or anything
            # else that turns the auto-range off, would keep the streamed run's range (and clip the curves)
            vb.enableAutoRange(axis="x", enable=True)
            vb.updateAutoRange()
            self._y_top = top * 1.32  # a free band at the top for the legend and the fork label
            vb.setYRange(0, self._y_top, padding=0.02)
            return
        if self._x_max != x_max:
            self._x_max = x_max
            vb.setXRange(0, max(1, x_max - 1), padding=0.02)
        if top * 1.15 > self._y_top or not self.n_vanilla:
            self._y_top = top * 1.5
            vb.setYRange(0, self._y_top, padding=0.02)

    def mark_fork(self, i: int | None, margin: float | None = None) -> None:
        self.fork_line.setVisible(i is not None)
        if i is None:
            self.fork_line.setValue(0)  # no fork: no stale position of the last one
        if i is not None:
            self.fork_line.setValue(i)
            n = max(self.n_vanilla, self.n_speculative, 1)
            right = i > 0.6 * n  # near the right edge the label goes on the left of the line
            self.fork_line.label.anchors = [(1, 0), (1, 0)] if right else [(0, 0), (0, 0)]
            self.fork_line.label.setFormat(f"fork @ {i}" + (f" (margin {margin:.4f})" if margin is not None
                                                            and math.isfinite(margin) else ""))

    def mark_token(self, i: int | None) -> None:
        self.select_line.setVisible(i is not None)
        if i is not None:
            self.select_line.setValue(i)

    def set_diagnosis(self, diagnosis: dict | None, vanilla: Sequence[Step]) -> str:
        """Draw the replay envelope and at-risk positions; return a short note of what was drawn."""
        self.diagnosis = diagnosis if isinstance(diagnosis, dict) else None
        pi = self.getPlotItem()
        for ln in self.gap_lines:
            pi.removeItem(ln)
        self.gap_lines = []
        self.envelope.setData([], [])
        self.envelope_base.setData([], [])
        self.at_risk.setData([], [])
        self._legend_entries()  # the legend names only what is drawn
        if self.diagnosis is None:
            return ""
        envelope_name = None
        notes = []
        x, y = envelope_series(self.diagnosis.get("envelope"))
        if len(x):
            self.envelope.setData(x, y)
            self.envelope_base.setData(x, np.zeros_like(y))
            notes.append("envelope")
            envelope_name = "replay envelope"
        env = self.diagnosis.get("envelope")
        if isinstance(env, dict):
            figures = []
            for key in ("max", "p95"):
                v = _finite(env.get(key)) if not isinstance(env.get(key), (list, dict)) else math.nan
                if math.isfinite(v):
                    ln = pg.InfiniteLine(pos=v, angle=0, movable=False)
                    ln.setPen(pg.mkPen(ENVELOPE_HUE, width=1, style=Qt.PenStyle.DotLine))
                    pi.addItem(ln, ignoreBounds=True)
                    self.gap_lines.append(ln)
                    figures.append(f"{key} {v:.3f}")
            if figures:
                envelope_name = "replay envelope (" + ", ".join(figures) + ")"
        risk = at_risk_positions(self.diagnosis.get("at_risk"))
        if risk:
            m = self.margins(vanilla)
            xs = [p for p in risk if 0 <= p < len(m)]
            self.at_risk.setData(np.array(xs, float), np.array([m[p] for p in xs], float))
            notes.append(f"{len(risk)} at-risk position{'s' if len(risk) != 1 else ''}")
        self._legend_entries(envelope_name, bool(risk))
        return ", ".join(notes)

    def _clicked(self, ev) -> None:
        if ev.button() != Qt.MouseButton.LeftButton:
            return
        vb = self.getPlotItem().getViewBox()
        if not vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        n = max(self.n_vanilla, self.n_speculative)
        if n == 0:
            return
        i = int(round(vb.mapSceneToView(ev.scenePos()).x()))
        if 0 <= i < n:
            self.sigIndexClicked.emit(i)
