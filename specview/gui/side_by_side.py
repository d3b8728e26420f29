"""The "Side by side" tab: both arms' panes above the acceptance and margin plots, one token selected in all.

It shows a finished or opened trace (the fork marked in the panes and both
plots, the view on it), keeps one token selected everywhere (a click in a pane
or a plot selects it in the others), and steps through the positions where the
arms differ.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QSplitter, QWidget

from ..core.trace import Step, Trace
from .panes import PanePair
from .plots import AcceptancePlot, MarginPlot
from .track_plots import AcceptanceHistogram, TrackPlot
from .verdict_bar import fmt_margin


def mismatch_positions(a: list[int], b: list[int]) -> list[int]:
    """Indices where the arms' tokens differ, aligned by index; a length difference counts once, at its start."""
    n = min(len(a), len(b))
    out = [i for i in range(n) if a[i] != b[i]]
    if len(a) != len(b):
        out.append(n)
    return out


class SideBySide(QSplitter):
    """The panes over the plots."""

    sigStatus = Signal(str)  # a line for the status bar (the selected token, "no further mismatch" ...)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(Qt.Orientation.Vertical, parent)
        self.panes = PanePair()
        self.acceptance = AcceptancePlot()
        self.margin_plot = MarginPlot()
        self.track_plot = TrackPlot()  # under the margins, on their token axis
        self.track_plot.setXLink(self.margin_plot)
        self.histogram = AcceptanceHistogram()  # under the rounds: how far drafts survive, by draft position
        plots = QSplitter(Qt.Orientation.Horizontal)
        for top, under in ((self.acceptance, self.histogram), (self.margin_plot, self.track_plot)):
            column = QSplitter(Qt.Orientation.Vertical)
            column.addWidget(top)
            column.addWidget(under)
            column.setStretchFactor(0, 3)
            column.setStretchFactor(1, 2)
            plots.addWidget(column)
        plots.setStretchFactor(0, 2)
        plots.setStretchFactor(1, 3)
        self.addWidget(self.panes)
        self.addWidget(plots)
        self.setStretchFactor(0, 3)
        self.setStretchFactor(1, 2)
        self.trace: Trace | None = None
        self.diffs: list[int] = []
        self.streamed: dict[str, list[Step]] | None = None  # a streaming run's steps (set by the window)
        self.panes.sigTokenSelected.connect(lambda i: self.select_token(i, from_pane=True))
        self.margin_plot.sigIndexClicked.connect(lambda i: self.select_token(i, scroll=True))
        self.acceptance.sigIndexClicked.connect(lambda i: self.select_token(i, scroll=True))
        self.track_plot.sigIndexClicked.connect(lambda i: self.select_token(i, scroll=True))

    def clear_trace(self) -> None:
        """A new run starts: no trace is shown any more (the streamed tokens take its place)."""
        self.trace = None
        self.diffs = []
        self.track_plot.set_trace(None)
        self.histogram.set_arm(None)

    def show_empty(self) -> None:
        """Nothing to show (a window whose first run failed): empty panes, empty plots."""
        self.clear_trace()
        self.panes.clear()
        self.margin_plot.set_steps([], [])
        self.acceptance.set_rounds([])

    def show_trace(self, trace: Trace) -> str:
        """Show ``trace`` in the panes and plots, the fork marked and in view; return the diagnosis drawn, in words."""
        self.trace = trace
        v, s = trace.vanilla, trace.speculative
        self.panes.vanilla.set_steps(v.steps)
        self.panes.speculative.set_steps(s.steps)
        self.margin_plot.set_steps(v.steps, s.steps)
        self.acceptance.set_rounds(s.rounds, rate=s.acceptance_rate, mean=s.mean_accepted)
        self.acceptance.set_hint(None if s.rounds else "This run recorded no verify rounds, only the totals above.")
        self.track_plot.set_trace(trace)
        self.histogram.set_arm(s)
        fm = trace.comparison.first_mismatch
        self.diffs = mismatch_positions(v.tokens, s.tokens)
        fork = fm.index if fm is not None else None
        self.panes.set_mismatch(fork)
        vm = v.steps[fork].margin if fork is not None and fork < len(v.steps) else None
        self.margin_plot.mark_fork(fork, vm)
        self.acceptance.mark_fork(fork)
        note = self.margin_plot.set_diagnosis(trace.diagnosis, v.steps)
        if fork is not None:
            self.select_token(fork, scroll=True)
            # the verdict bar may have grown and shrunk the panes: centre the fork again once laid out
            QTimer.singleShot(0, lambda t=trace, i=fork: self._recentre(t, i))
        return note

    def _recentre(self, trace: Trace, i: int) -> None:
        if self.trace is trace and self.panes.selected == i:
            self.panes.jump_to(i)

    # -- selection ----------------------------------------------------------------------
    def select_token(self, i: int | None, *, scroll: bool = False, from_pane: bool = False) -> None:
        if not from_pane:
            self.panes.select(i, emit=False, scroll=scroll)
        self.margin_plot.mark_token(i)
        self.track_plot.mark_token(i)
        self.acceptance.mark_token(i)
        if i is not None:
            bits = [f"token {i}"]
            for p in self.panes.panes:
                if i < len(p.steps):
                    bits.append(f"{p.arm} {p.steps[i].piece!r} margin {fmt_margin(p.steps[i].margin)}")
            self.sigStatus.emit(" · ".join(bits))

    def mismatches(self) -> list[int]:
        if self.trace is not None or self.streamed is None:
            return list(self.diffs)
        return mismatch_positions([s.token for s in self.streamed["vanilla"]],
                                  [s.token for s in self.streamed["speculative"]])

    def next_mismatch(self) -> int | None:
        cur = self.panes.selected
        for i in self.mismatches():
            if cur is None or i > cur:
                self.select_token(i, scroll=True)
                return i
        self.sigStatus.emit("no further mismatch")
        return None

    def previous_mismatch(self) -> int | None:
        cur = self.panes.selected
        for i in reversed(self.mismatches()):
            if cur is None or i < cur:
                self.select_token(i, scroll=True)
                return i
        self.sigStatus.emit("no earlier mismatch")
        return None

    def jump_to_fork(self) -> None:
        if self.trace is not None and self.trace.comparison.first_mismatch is not None:
            self.select_token(self.trace.comparison.first_mismatch.index, scroll=True)
