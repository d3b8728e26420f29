"""The two pyqtgraph plots: draft acceptance per round, and the top-1/top-2 margin per step.

Both are created once and updated with ``setData``; the window throttles the
updates while a run streams.  Clicking a point emits the token index it stands
for; :meth:`mark_token` draws the selection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QPainterPath, QPalette
from PySide6.QtWidgets import QGraphicsItem

from ..core.trace import Round, Step
from .panes import DRAFT_HUE, MISMATCH_HUE, blend, is_dark
from .plot_base import SPEC_HUE, VANILLA_HUE, TimedPlot, style_legend, style_plot
from .plotdata import Series, _finite, at_risk_positions, envelope_series

ENVELOPE_HUE = QColor(150, 90, 210)
#: what the acceptance plot reads of each round (``first``: its first step; ``replay``: its replay pass's width)
COLUMNS = ("index", "first", "drafted", "accepted", "replay")
#: what the acceptance plot's mean counts, next to the histogram's (see track_plots.MEAN_DRAFTS_NOTE)
MEAN_TOKENS_NOTE = ("mean tokens/round: the tokens a verify round emits, its accepted drafts and one token of the "
                    "target's own (one more after a replay), so one more than the histogram's mean drafts "
                    "accepted/round")
MAX_BARS = 600  # above this many rounds the acceptance bars show means of bins of rounds
WIDE_POINTS = 2000  # up to this many tokens the speculative margins are drawn with a wider stroke


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
        # one row (drafted, accepted, and replayed while shown): the least height taken from the bars
        self.legend = pi.addLegend(offset=(-8, 6), labelTextSize="8pt", colCount=3)
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
        self._data_top = 0.0  # the highest bar
        self._title = None
        self.summary = ""
        self.has_totals = False  # the run shown reported an acceptance (from its rounds or an engine's totals)
        self.apply_palette(self.palette())
        self.scene().sigMouseClicked.connect(self._clicked)
        self._streaming = False
        pi.getViewBox().sigResized.connect(lambda: self._fit_y(self._streaming))
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
            d, a, x = self._bars(d_all, a_all)
            self.show_empty(False)
            self.drafted.setData(x, d)
            self.accepted.setData(x, a)
            self._show_replays(d_all)
            self._data_top = max(1.0, float(d.max()), float(a.max()))
            self._streaming = streaming
            self._fit_y(streaming)
        else:
            self.drafted.setData([], [])
            self.accepted.setData([], [])
            self._show_replays(d_all)
            self._y_top = self._data_top = 0.0
            self._x_span = 0
            self.show_empty(True)
        drafted, accepted = int(d_all.sum()), int(a_all.sum())
        if rate is None and drafted:
            rate = accepted / drafted
        if not streaming:
            self.has_totals = rate is not None
        verify = self._cols["index"].view() > 0  # round 0 is the prefill
        if mean is None:
            mean = float(a_all[verify].mean()) + 1 if verify.any() else None
        self.summary = self._summary(rate, accepted, drafted, mean, int(np.count_nonzero(verify))) if n else \
            "draft acceptance per round"
        title = "draft acceptance per round" if streaming else self.summary  # a title that changes every
        if title != self._title:  # frame lays the plot out again every frame
            self._title = title
            self.set_title(title, note=MEAN_TOKENS_NOTE if n and mean is not None and not streaming else "")

    def _bars(self, d: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Drafted and accepted bar heights and their edges: one bar per round, or per bin of rounds (the bin's
        mean) when there are more rounds than bars fit."""
        n = len(d)
        x0 = self.rounds[0].index - 0.5
        cap = MAX_BARS
        if self.isVisible():  # no more bars than can be seen: one per two pixels at most
            cap = min(MAX_BARS, max(50, int(self.getPlotItem().getViewBox().width()) // 2))
        if n <= cap:
            return d, a, x0 + np.arange(n + 1, dtype=float)
        b = self.bin = -(-n // cap)
        m = -(-n // b)
        counts = np.full(m, b, float)
        counts[-1] = n - b * (m - 1)
        starts = np.arange(0, n, b)
        x = x0 + np.minimum(np.arange(m + 1, dtype=float) * b, n)
        return np.add.reduceat(d, starts) / counts, np.add.reduceat(a, starts) / counts, x

    def _fit_y(self, streaming: bool = False) -> None:
        """The y range: the bars clear of the legend, whatever the plot's height.  While a run streams, as if a
        bar stood under the legend (the range then changes only with the highest bar: a range that changes
        every frame lays the axes out every frame)."""
        d, a = self.drafted.yData, self.accepted.yData
        if not self._data_top or d is None or not len(d):
            return
        edges = self.drafted.xData
        x = np.full(1, np.inf) if streaming else edges[1:]  # each bar's right edge
        # a token at least: a run that drafted nothing still gets a unit y axis
        y = np.array([self._data_top]) if streaming else np.fmax(np.maximum(d, a), 1.0)
        top = self.fit_top(x, y, least=1.2)
        if abs(top - self._y_top) > 1e-9 * top:
            self._y_top = top
            self.getPlotItem().getViewBox().setYRange(0, top, padding=0)
            left = self.getPlotItem().getAxis("left")
            if top <= 12 and self.bin == 1:
                left.setTickSpacing(1, 1)  # whole tokens
            else:
                left.setTickSpacing()

    def _summary(self, rate: float | None, accepted: int, drafted: int, mean: float | None, verify: int) -> str:
        """The title of a run's rounds: acceptance, verify rounds, the mean tokens a verify round emitted."""
        out = f"acceptance {rate * 100:.1f}% ({accepted}/{drafted})" if rate is not None else "nothing drafted"
        out += f" · {verify} verify rounds"  # the prefill's is no verify
        if mean is not None:
            out += f" · mean {mean:.2f} tokens/round"
        if self.n_replayed:
            out += f" · {self.n_replayed} replayed"
        if self.bin > 1:
            out += f" (bars: means of {self.bin})"
        return out

    def set_hint(self, text: str | None) -> None:
        """Words for a finished run without rounds.  They are shown only when the run reported an acceptance
        (an engine's own totals): a run with no rounds and no totals, such as one cancelled before its first
        token, shows the plain hint."""
        super().set_hint(text if self.has_totals else None)

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
        self.envelope_fill.setVisible(False)  # shown with a diagnosis' envelope only
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
        self._y_set: tuple[float, float] | None = None  # the y range fitted last (the user may zoom away from it)
        self.n_vanilla = 0
        self.n_speculative = 0
        self.diagnosis: dict | None = None
        self.apply_palette(self.palette())
        self.scene().sigMouseClicked.connect(self._clicked)
        pi.getViewBox().sigResized.connect(self._refit_y)
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
        self.clear_diagnosis()  # the margins a diagnosis was drawn over are being replaced

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
        if not streaming or not (len(v) or len(s)):
            self.clear_diagnosis()  # new margins, or none: the last diagnosis' marks belong to other margins
        self.show_empty(not (len(v) or len(s)))
        if self.empty:
            self.vanilla.setData([], [])
            self.speculative.setData([], [])
            self.mark_fork(None)  # nothing of the last run over the hint
            self.mark_token(None)
            self._x_max, self._y_top, self._y_set = None, 0.0, None
            return
        self._spec_pen(max(len(v), len(s)))
        if grew[0] or not streaming:
            self.vanilla.setData(np.arange(len(v), dtype=float), v)
        if grew[1] or not streaming:
            self.speculative.setData(np.arange(len(s), dtype=float), s)
        vb = self.getPlotItem().getViewBox()
        if x_max is None:
            # the whole run in view now, not at the next paint: until then a resize of the linked track plot, or
            # anything else that turns the auto-range off, would keep the last range (and clip the curves); and
            # auto-ranging now would find only the points the last range clipped the curves to
            vb.setXRange(0, max(1, len(v) - 1, len(s) - 1), padding=0.02)
            vb.enableAutoRange(axis="x", enable=True)
            self.fit_y()
            return
        self._y_set = None  # while a run streams, y only grows (below), resizes leave it
        top = max([1.0] + [float(np.nanmax(a)) for a in (v, s) if len(a) and np.isfinite(a).any()])
        if self._x_max != x_max:
            self._x_max = x_max
            vb.setXRange(0, max(1, x_max - 1), padding=0.02)
        if top * 1.15 > self._y_top or not self.n_vanilla:
            self._y_top = top * 1.5
            vb.setYRange(0, self._y_top, padding=0.02)

    def fit_y(self) -> None:
        """The y range for the margins in view: the curves clear of the legend, whatever the plot's height."""
        vb = self.getPlotItem().getViewBox()
        x0, x1 = vb.viewRange()[0]
        lo, hi = max(0, math.floor(x0)), max(0, math.ceil(x1) + 1)
        parts = [item.yData[lo:hi] for item in (self.vanilla, self.speculative) if item.yData is not None]
        n = max((len(p) for p in parts), default=0)
        y = np.full(n, 1.0)  # a range of 1 logit at least: a run of near-ties is not drawn as a speck
        for p in parts:
            y[:len(p)] = np.fmax(y[:len(p)], p)
        self._y_top = self.fit_top(lo + np.arange(n, dtype=float), y, least=1.2, unsized=1.32)
        vb.setYRange(0, self._y_top, padding=0.02)
        self._y_set = tuple(vb.viewRange()[1])

    def show_range(self, lo: int, hi: int) -> None:
        """Zoom on tokens ``lo`` to ``hi``, the y range fitted to the margins there."""
        vb = self.getPlotItem().getViewBox()
        vb.enableAutoRange(axis="x", enable=False)
        vb.setXRange(lo, hi, padding=0.02)
        self.fit_y()

    def _refit_y(self) -> None:
        """The plot was resized: a finished run's y range fitted again to the new height, unless the user
        zoomed away from it."""
        vb = self.getPlotItem().getViewBox()
        if self._y_set is not None and np.allclose(vb.viewRange()[1], self._y_set):
            self.fit_y()

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

    def clear_diagnosis(self) -> None:
        """No envelope, envelope figures or at-risk marks drawn, and none named in the legend."""
        had = self.diagnosis is not None or bool(self.gap_lines) or self.envelope_fill.isVisible()
        self.diagnosis = None
        pi = self.getPlotItem()
        for ln in self.gap_lines:
            pi.removeItem(ln)
        self.gap_lines = []
        self.envelope.setData([], [])
        self.envelope_base.setData([], [])
        # an emptied curve keeps its last path (pyqtgraph only hides it), and the fill is drawn from the paths
        self.envelope_fill.setVisible(False)
        self.envelope_fill.setPath(QPainterPath())
        self.at_risk.setData([], [])
        if had:
            self._legend_entries()  # the legend names only what is drawn
            self._refit_y()

    def set_diagnosis(self, diagnosis: dict | None, vanilla: Sequence[Step]) -> str:
        """Draw the replay envelope and at-risk positions; return a short note of what was drawn."""
        self.clear_diagnosis()
        self.diagnosis = diagnosis if isinstance(diagnosis, dict) else None
        if self.diagnosis is None:
            return ""
        envelope_name, notes = self._draw_envelope(self.diagnosis.get("envelope"))
        risk = at_risk_positions(self.diagnosis.get("at_risk"))
        if risk:
            m = self.margins(vanilla)
            xs = [p for p in risk if 0 <= p < len(m)]
            self.at_risk.setData(np.array(xs, float), np.array([m[p] for p in xs], float))
            notes.append(f"{len(risk)} at-risk position{'s' if len(risk) != 1 else ''}")
        self._legend_entries(envelope_name, bool(risk))
        self._refit_y()  # the legend may have grown a row
        return ", ".join(notes)

    def _draw_envelope(self, env: object) -> tuple[str | None, list[str]]:
        """Draw a diagnosis' envelope (its series filled down to 0, its max and p95 as dotted lines); return its
        name for the legend (None: nothing drawn) and the notes of what was drawn."""
        name, notes = None, []
        x, y = envelope_series(env)
        if len(x):
            self.envelope.setData(x, y)
            self.envelope_base.setData(x, np.zeros_like(y))
            self.envelope_fill.setVisible(True)
            notes.append("envelope")
            name = "replay envelope"
        if isinstance(env, dict):
            figures = []
            for key in ("max", "p95"):
                v = _finite(env.get(key)) if not isinstance(env.get(key), (list, dict)) else math.nan
                if math.isfinite(v):
                    ln = pg.InfiniteLine(pos=v, angle=0, movable=False)
                    ln.setPen(pg.mkPen(ENVELOPE_HUE, width=1, style=Qt.PenStyle.DotLine))
                    self.getPlotItem().addItem(ln, ignoreBounds=True)
                    self.gap_lines.append(ln)
                    figures.append(f"{key} {v:.3f}")
            if figures:
                name = "replay envelope (" + ", ".join(figures) + ")"
        return name, notes

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
