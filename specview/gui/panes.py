"""The two text panes: tokens as they stream in, tinted by where they came from.

* accepted draft tokens are tinted, target-produced tokens are plain;
* token boundaries can be shown (alternating shades);
* the first mismatched token and the selected token are marked with extra
  selections, so marking never rewrites the document;
* hovering a token shows its top-k alternatives, margin, round and batch;
* the two panes scroll in sync, aligned by token index.
"""

from __future__ import annotations

import html
import math
import time
from bisect import bisect_right
from collections.abc import Sequence

from PySide6.QtCore import QEvent, QPoint, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QPalette,
    QTextCharFormat,
    QTextCursor,
    QTextFormat,
)
from PySide6.QtWidgets import (
    QLabel,
    QSplitter,
    QTextEdit,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from ..core.trace import Step

DRAFT_HUE = QColor(40, 170, 80)
MISMATCH_HUE = QColor(225, 45, 45)
DIFF_HUE = QColor(230, 150, 30)


class PaintClock:
    """Seconds the GUI thread has spent painting the panes and plots, and the plots alone (for the frame budget)."""

    seconds = 0.0
    plots = 0.0


def blend(a: QColor, b: QColor, t: float) -> QColor:
    """``a`` moved a fraction ``t`` towards ``b``."""
    return QColor(
        round(a.red() + (b.red() - a.red()) * t),
        round(a.green() + (b.green() - a.green()) * t),
        round(a.blue() + (b.blue() - a.blue()) * t),
    )


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Base).lightness() < 128


class Tints:
    """Colours derived from a palette, readable on light and dark bases."""

    def __init__(self, palette: QPalette):
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        dark = is_dark(palette)
        self.base = base
        self.text = text
        self.draft = blend(base, DRAFT_HUE, 0.40 if dark else 0.26)
        self.draft_alt = blend(base, DRAFT_HUE, 0.58 if dark else 0.42)
        self.plain_alt = blend(base, text, 0.13 if dark else 0.09)
        self.mismatch = blend(base, MISMATCH_HUE, 0.65 if dark else 0.50)
        self.diff = blend(base, DIFF_HUE, 0.55 if dark else 0.45)
        self.selected = blend(base, palette.color(QPalette.ColorRole.Highlight), 0.55 if dark else 0.40)


def fmt_logit(x: float | None) -> str:
    """A logit or margin to 4 decimals; "n/a" where the engine reported none (llama-server)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.4f}"


def _na(x: object) -> str:
    return "n/a" if x is None else str(x)


def piece_label(piece: str | None) -> str:
    if piece is None:
        return "(none)"
    return repr(piece)


class TokenPane(QTextEdit):
    """One arm's text, one character-format run per token."""

    sigTokenClicked = Signal(int)

    def __init__(self, arm: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.arm = arm
        self.setReadOnly(True)
        self.setUndoRedoEnabled(False)
        self.setLineWrapMode(QTextEdit.LineWrapMode.WidgetWidth)
        self.setAcceptRichText(False)
        self.setObjectName(f"pane_{arm}")
        self.steps: list[Step] = []
        self.starts: list[int] = []  # document position where each token starts
        self._end = 0  # document position after the last token
        self.show_boundaries = False
        self.mismatch_index: int | None = None
        self.selected_index: int | None = None
        self.diff_indices: list[int] = []  # later positions where the arms differ
        self.other: TokenPane | None = None  # the opposite pane, for tooltips
        self.tints = Tints(self.palette())
        self.follow = True  # keep the end in view while streaming
        font = QFont(self.font())
        font.setPointSizeF(max(font.pointSizeF(), 10.5))
        self.setFont(font)

    # -- content ------------------------------------------------------------------
    def clear_tokens(self) -> None:
        self.steps = []
        self.starts = []
        self._end = 0
        self.mismatch_index = None
        self.selected_index = None
        self.diff_indices = []
        self.clear()
        self.setExtraSelections([])
        self.follow = True

    def _format(self, i: int, step: Step) -> QTextCharFormat:
        f = QTextCharFormat()
        alt = self.show_boundaries and (i % 2 == 1)
        if step.from_draft:
            f.setBackground(self.tints.draft_alt if alt else self.tints.draft)
        elif alt:
            f.setBackground(self.tints.plain_alt)
        return f

    def append_steps(self, steps: Sequence[Step]) -> bool:
        """Append tokens at the end (the streaming path); True if the view followed the end."""
        if not steps:
            return False
        bar = self.verticalScrollBar()
        at_end = self.follow and bar.value() >= bar.maximum() - 4
        cur = QTextCursor(self.document())
        cur.movePosition(QTextCursor.MoveOperation.End)
        cur.beginEditBlock()
        n0 = len(self.steps)
        for j, s in enumerate(steps):
            self.starts.append(cur.position())
            cur.insertText(s.piece, self._format(n0 + j, s))
        cur.endEditBlock()
        self._end = cur.position()
        self.steps.extend(steps)
        if at_end:
            bar.setValue(bar.maximum())
        return at_end

    def set_steps(self, steps: Sequence[Step]) -> None:
        """Show exactly ``steps``: append if the pane holds a prefix of them, else re-render."""
        n = len(self.steps)
        if n <= len(steps) and all(a.token == b.token for a, b in zip(self.steps, steps[:n])):
            # same tokens so far: keep the document, adopt the final Step objects
            self.steps[:n] = steps[:n]
            self.append_steps(steps[n:])
            return
        keep = (self.mismatch_index, self.selected_index)
        self.clear_tokens()
        self.append_steps(steps)
        self.mismatch_index, self.selected_index = keep
        self._update_marks()

    def rerender(self) -> None:
        """Re-apply formats (after a palette change or toggling boundaries)."""
        steps = list(self.steps)
        marks = (self.mismatch_index, self.selected_index, list(self.diff_indices))
        value = self.verticalScrollBar().value()
        self.clear_tokens()
        self.append_steps(steps)
        self.mismatch_index, self.selected_index, self.diff_indices = marks
        self._update_marks()
        self.verticalScrollBar().setValue(value)

    def set_boundaries(self, on: bool) -> None:
        if on != self.show_boundaries:
            self.show_boundaries = on
            self.rerender()

    def text(self) -> str:
        return self.toPlainText()

    # -- marks ----------------------------------------------------------------------
    def token_range(self, i: int) -> tuple[int, int]:
        start = self.starts[i]
        end = self.starts[i + 1] if i + 1 < len(self.starts) else self._end
        return start, end

    def _selection(self, i: int, color: QColor, *, bold: bool = False, underline: bool = False):
        start, end = self.token_range(i)
        sel = QTextEdit.ExtraSelection()
        cur = QTextCursor(self.document())
        cur.setPosition(start)
        cur.setPosition(max(end, start + 1) if end > start else start, QTextCursor.MoveMode.KeepAnchor)
        sel.cursor = cur
        f = QTextCharFormat()
        f.setBackground(color)
        if bold:
            f.setForeground(self.tints.text)
            f.setFontWeight(QFont.Weight.Bold)
        if underline:
            f.setUnderlineStyle(QTextCharFormat.UnderlineStyle.SingleUnderline)
            f.setUnderlineColor(self.tints.text)
        f.setProperty(QTextFormat.Property.FullWidthSelection, False)
        sel.format = f
        return sel

    def _update_marks(self) -> None:
        sels = []
        n = len(self.steps)
        for i in self.diff_indices:
            if 0 <= i < n and i != self.mismatch_index:
                sels.append(self._selection(i, self.tints.diff))
        if self.mismatch_index is not None and 0 <= self.mismatch_index < n:
            sels.append(self._selection(self.mismatch_index, self.tints.mismatch, bold=True))
        if self.selected_index is not None and 0 <= self.selected_index < n:
            # the fork keeps its red; a selected ordinary token gets the selection colour
            color = self.tints.mismatch if self.selected_index == self.mismatch_index else self.tints.selected
            sels.append(self._selection(self.selected_index, color, bold=self.selected_index == self.mismatch_index,
                                        underline=True))
        self.setExtraSelections(sels)

    def set_mismatch(self, i: int | None, diffs: Sequence[int] = ()) -> None:
        self.mismatch_index = i
        self.diff_indices = list(diffs)
        self._update_marks()

    def select_token(self, i: int | None) -> None:
        self.selected_index = i
        self._update_marks()

    # -- geometry -------------------------------------------------------------------
    def token_rect(self, i: int):
        cur = QTextCursor(self.document())
        cur.setPosition(self.starts[i])
        return self.cursorRect(cur)

    def ensure_token_visible(self, i: int, *, center: bool = True) -> None:
        if not 0 <= i < len(self.steps):
            return
        rect = self.token_rect(i)
        bar = self.verticalScrollBar()
        if center:
            bar.setValue(bar.value() + rect.top() - self.viewport().height() // 2)
        elif rect.top() < 0 or rect.bottom() > self.viewport().height():
            bar.setValue(bar.value() + rect.top() - 8)

    def index_at(self, p: QPoint) -> int | None:
        """Token under a viewport point, or None."""
        if not self.steps:
            return None
        cur = self.cursorForPosition(p)
        pos = cur.position()
        r = self.cursorRect(cur)
        if r.x() > p.x() and pos > 0:
            pos -= 1
        if pos >= self._end:
            return None
        if abs(r.center().y() - p.y()) > r.height():
            return None
        i = bisect_right(self.starts, pos) - 1
        return i if 0 <= i < len(self.steps) else None

    def top_token(self) -> int | None:
        if not self.steps:
            return None
        cur = self.cursorForPosition(QPoint(2, 2))
        i = bisect_right(self.starts, cur.position()) - 1
        return max(0, min(i, len(self.steps) - 1))

    # -- interaction ------------------------------------------------------------------
    def tooltip_html(self, i: int) -> str:
        s = self.steps[i]
        rows = []
        for tid, logit in zip(s.top_ids, s.top_logits):
            mark = " &#9664;" if tid == s.token else ""
            rows.append(f"<tr><td align=right>{tid}</td><td>{html.escape(self._piece_of(tid))}</td>"
                        f"<td align=right>{fmt_logit(logit)}</td><td>{mark}</td></tr>")
        batch = f"batch T={_na(s.batch_size)} (row {_na(s.batch_index)})"
        if self.arm == "speculative":
            origin = ("origin n/a" if s.from_draft is None
                      else "accepted draft token" if s.from_draft else "target's own token")
            where = f"round {_na(s.round)}, {batch} &middot; {origin}"
        else:
            where = batch
        other = ""
        if self.other is not None and i < len(self.other.steps):
            o = self.other.steps[i]
            if o.token != s.token:
                other = (f"<br><b>{self.other.arm} has {html.escape(repr(o.piece))} ({o.token}) here</b>, "
                         f"margin {fmt_logit(o.margin)}")
        return (
            f"<b>{self.arm} token {i}</b>: {html.escape(repr(s.piece))} (id {s.token}, position {s.pos})<br>"
            f"margin top-1 &minus; top-2: <b>{fmt_logit(s.margin)}</b><br>{where}{other}"
            f"<table cellspacing=0 cellpadding=2><tr><th>id</th><th>token</th><th>logit</th><th></th></tr>"
            + "".join(rows) + "</table>"
        )

    def _piece_of(self, tid: int) -> str:
        for pane in (self, self.other):
            if pane is None:
                continue
            for st in pane.steps:
                if st.token == tid:
                    return repr(st.piece)
        return ""

    def paintEvent(self, ev) -> None:  # noqa: N802 - Qt name
        t0 = time.perf_counter()
        super().paintEvent(ev)
        PaintClock.seconds += time.perf_counter() - t0

    def viewportEvent(self, ev: QEvent) -> bool:  # noqa: N802 - Qt name
        if ev.type() == QEvent.Type.ToolTip:
            i = self.index_at(ev.pos())
            if i is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(ev.globalPos(), self.tooltip_html(i), self.viewport())
            return True
        return super().viewportEvent(ev)

    def mouseReleaseEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().mouseReleaseEvent(ev)
        if ev.button() == Qt.MouseButton.LeftButton and not self.textCursor().hasSelection():
            i = self.index_at(ev.position().toPoint())
            if i is not None:
                self.sigTokenClicked.emit(i)

    def changeEvent(self, ev: QEvent) -> None:  # noqa: N802 - Qt name
        super().changeEvent(ev)
        if ev.type() == QEvent.Type.PaletteChange:
            self.tints = Tints(self.palette())
            if self.steps:
                self.rerender()


class PanePair(QWidget):
    """Vanilla and speculative panes side by side, scrolled in sync by token index."""

    sigTokenSelected = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.vanilla = TokenPane("vanilla")
        self.speculative = TokenPane("speculative")
        self.vanilla.other = self.speculative
        self.speculative.other = self.vanilla
        self.vanilla_label = QLabel("<b>Vanilla greedy</b> (one token per forward pass)")
        self.speculative_label = QLabel("<b>Speculative</b> (tinted: accepted draft tokens)")
        split = QSplitter(Qt.Orientation.Horizontal)
        for label, pane in ((self.vanilla_label, self.vanilla), (self.speculative_label, self.speculative)):
            box = QWidget()
            lay = QVBoxLayout(box)
            lay.setContentsMargins(0, 0, 0, 0)
            lay.setSpacing(2)
            label.setTextFormat(Qt.TextFormat.RichText)
            lay.addWidget(label)
            lay.addWidget(pane)
            split.addWidget(box)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(split)
        self._syncing = False
        self.sync = True
        for a, b in ((self.vanilla, self.speculative), (self.speculative, self.vanilla)):
            a.verticalScrollBar().valueChanged.connect(lambda _v, a=a, b=b: self._sync_from(a, b))
            a.sigTokenClicked.connect(self.select)
        self.selected: int | None = None

    @property
    def panes(self) -> tuple[TokenPane, TokenPane]:
        return self.vanilla, self.speculative

    def pane(self, arm: str) -> TokenPane:
        return self.vanilla if arm == "vanilla" else self.speculative

    def clear(self) -> None:
        self.selected = None
        for p in self.panes:
            p.clear_tokens()

    def _sync_from(self, a: TokenPane, b: TokenPane) -> None:
        if self._syncing or not self.sync:
            return
        i = a.top_token()
        if i is None:
            return
        self._syncing = True
        try:
            if i < len(b.steps):
                offset = a.token_rect(i).top()
                bar = b.verticalScrollBar()
                bar.setValue(bar.value() + b.token_rect(i).top() - offset)
            else:
                abar, bbar = a.verticalScrollBar(), b.verticalScrollBar()
                if abar.maximum() > 0:
                    bbar.setValue(round(bbar.maximum() * abar.value() / abar.maximum()))
        finally:
            self._syncing = False

    def align_on(self, a: TokenPane, b: TokenPane, i: int) -> None:
        """Scroll ``b`` so its token ``i`` sits at the height where ``a`` shows token ``i``."""
        if not (0 <= i < len(a.steps) and i < len(b.steps)) or not self.sync:
            return
        self._syncing = True
        try:
            bar = b.verticalScrollBar()
            bar.setValue(bar.value() + b.token_rect(i).top() - a.token_rect(i).top())
        finally:
            self._syncing = False

    def set_boundaries(self, on: bool) -> None:
        for p in self.panes:
            p.set_boundaries(on)

    def set_mismatch(self, i: int | None, diffs: Sequence[int] = ()) -> None:
        for p in self.panes:
            p.set_mismatch(i, diffs)

    def select(self, i: int | None, *, emit: bool = True, scroll: bool = False) -> None:
        self.selected = i
        for p in self.panes:
            p.select_token(i)
        if scroll and i is not None:
            self.jump_to(i)
        if emit and i is not None:
            self.sigTokenSelected.emit(i)

    def jump_to(self, i: int) -> None:
        self._syncing = True
        try:
            for p in self.panes:
                p.follow = False
                p.ensure_token_visible(i, center=True)
        finally:
            self._syncing = False
