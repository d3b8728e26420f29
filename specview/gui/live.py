"""A run as it streams: buffer the worker's batches, draw them at a frame rate the machine can afford.

The worker sends tokens in batches (:class:`~specview.gui.messages.StepsEvent`);
this controller appends them to its buffers and marks the view dirty.  A frame
timer draws what is new: the panes' text, both plots, the fork mark.  Drawing
is throttled by a frame budget: one frame's updates plus the painting since the
last frame may take at most ``DRAW_SHARE`` of the wall time, so on a small
machine the GUI thread draws less often instead of taking time from the
model's threads (on 2 cores every millisecond the GUI thread spends is taken
from llama.cpp).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QTimer, Signal

from ..core.trace import Round, Step
from .panes import PaintClock, PanePair
from .plotdata import Series
from .plots import AcceptancePlot, MarginPlot
from .messages import ArmStarted, RunRequest, StepsEvent

FRAME_MS = 33  # streaming redraws: about 30 a second when drawing is cheap
DRAW_SHARE = 0.02  # at most this share of wall time goes to drawing while a run streams
PLOT_SHARE = 0.01  # of which the plots (a few new tokens barely move a long run's curves) at most this share
MAX_FRAME_MS = 1000
ARMS = ("vanilla", "speculative")


def _margin(step: Step) -> float:
    m = step.margin
    return m if m is not None and math.isfinite(m) else math.nan


@dataclass
class Live:
    """What a streaming run has produced so far (GUI thread only)."""

    request: RunRequest | None = None
    steps: dict[str, list[Step]] = field(default_factory=lambda: {a: [] for a in ARMS})
    pending: dict[str, list[Step]] = field(default_factory=lambda: {a: [] for a in ARMS})
    margins: dict[str, Series] = field(default_factory=lambda: {a: Series() for a in ARMS})
    rounds: list[Round] = field(default_factory=list)
    first_diff: int | None = None
    dirty: bool = False
    started: float = 0.0

    def counts(self) -> tuple[int, int]:
        return len(self.steps["vanilla"]), len(self.steps["speculative"])


class LiveView(QObject):
    """Streams a run into the panes and plots, one frame at a time."""

    sigFrame = Signal(object)  # Live, after each drawn frame (the window shows progress from it)

    def __init__(self, panes: PanePair, margin_plot: MarginPlot, acceptance: AcceptancePlot,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.panes, self.margin_plot, self.acceptance = panes, margin_plot, acceptance
        self.live = Live()
        self.frames = 0  # frames drawn while streaming (the benchmark reports the rate)
        self.plot_frames = 0  # of which the plots were drawn in
        self.frame_ms: list[float] = []  # GUI-thread cost of each frame, painting included
        self._paint_mark = 0.0
        self._plots_due = 0.0  # when the plots may be drawn again
        self._plot_mark = 0.0
        self.timer = QTimer(self)
        self.timer.setInterval(FRAME_MS)
        self.timer.timeout.connect(self.flush)

    # -- a run's life ----------------------------------------------------------------
    def begin(self, req: RunRequest | None) -> Live:
        self.live = Live(request=req, started=time.perf_counter())
        return self.live

    def current(self, rid: int) -> bool:
        return self.live.request is not None and self.live.request.id == rid

    def start_frames(self) -> None:
        self._paint_mark, self._plot_mark, self._plots_due = PaintClock.seconds, PaintClock.plots, 0.0
        self.timer.setInterval(FRAME_MS)
        self.timer.start()

    def stop(self) -> None:
        """Stop the frames and draw what is still pending."""
        self.timer.stop()
        self._plots_due = 0.0
        self.live.dirty = True  # the plots may be a frame or two behind the text
        self.flush()

    def on_arm_started(self, ev: ArmStarted) -> None:
        if not self.current(ev.request_id):
            return
        live, arm = self.live, ev.arm
        live.steps[arm], live.pending[arm], live.margins[arm] = [], [], Series()
        if arm == "speculative":
            live.rounds = []
        live.first_diff = None
        self.panes.pane(arm).clear_tokens()
        self.margin_plot.restart(arm)
        if arm == "vanilla":  # a fresh run: forget the old trace's marks everywhere
            self.panes.clear()
            for plot in (self.margin_plot, self.acceptance):
                plot.mark_fork(None)
                plot.mark_token(None)
            self.margin_plot.set_diagnosis(None, [])
            self.acceptance.set_rounds([])
            self.acceptance.set_hint(None)
        live.dirty = True

    def on_steps(self, ev: StepsEvent) -> None:
        if not self.current(ev.request_id):
            return
        live = self.live
        steps = live.steps[ev.arm]
        n0 = len(steps)
        steps.extend(ev.steps)
        live.pending[ev.arm].extend(ev.steps)
        live.margins[ev.arm].extend([_margin(s) for s in ev.steps])
        live.rounds.extend(ev.rounds)
        if ev.arm == "speculative" and live.first_diff is None:
            v = live.steps["vanilla"]
            for i in range(n0, len(steps)):
                if i >= len(v) or v[i].token != steps[i].token:
                    live.first_diff = i
                    break
        live.dirty = True

    # -- drawing ----------------------------------------------------------------------------
    def flush(self) -> None:
        """Draw what streamed in since the last frame."""
        live = self.live
        if not live.dirty:
            return
        live.dirty = False
        t0 = time.perf_counter()
        try:
            self._render(live)
        finally:
            painted = PaintClock.seconds - self._paint_mark
            self._paint_mark = PaintClock.seconds
            cost_ms = (time.perf_counter() - t0 + painted) * 1000.0
            self.frame_ms.append(cost_ms)
            self.timer.setInterval(int(min(MAX_FRAME_MS, max(FRAME_MS, cost_ms / DRAW_SHARE))))
            self.frames += 1

    def _render(self, live: Live) -> None:
        for arm in ARMS:
            if live.pending[arm]:
                followed = self.panes.pane(arm).append_steps(live.pending[arm])
                live.pending[arm] = []
                if arm == "speculative" and followed:
                    # while the second arm streams at the end, show the first at the same place in the text;
                    # once the user scrolls either pane, they scroll together from where the user put them
                    self.panes.align_on(self.panes.speculative, self.panes.vanilla, len(live.steps[arm]) - 1)
        now = time.perf_counter()
        if now >= self._plots_due:
            # the plots have a budget of their own: with a long run loaded they cost more than the text
            # and change less, so they are drawn less often than the panes when they are expensive
            painted = PaintClock.plots - self._plot_mark  # the plots' painting since their last update
            self._plot_mark = PaintClock.plots
            x_max = live.request.cfg.max_tokens if live.request is not None else None
            self.margin_plot.set_arrays(live.margins["vanilla"].view(), live.margins["speculative"].view(),
                                        x_max=x_max)
            self.acceptance.set_rounds(live.rounds, streaming=True)
            fork = live.first_diff
            if fork is not None and (not self.margin_plot.fork_line.isVisible()
                                     or self.margin_plot.fork_line.value() != fork):
                self.margin_plot.mark_fork(fork)
            self.plot_frames += 1
            cost = time.perf_counter() - now + painted
            self._plots_due = now + max(FRAME_MS / 1000.0, cost / PLOT_SHARE)
        self.sigFrame.emit(live)
