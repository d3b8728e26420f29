"""The Quality tab's two tables: the paired 2x2 outcome table with its totals, and the items, each opening its trace.

:class:`OutcomeTable` reads a :class:`~specview.core.quality.Table`: vanilla's
outcome by row, the speculative arm's by column, each row and column with its
total and the grand total in the corner (so the figures add up on screen as
they must), the two discordant cells (the answers that changed) tinted.

:class:`ItemsTable` lists every :class:`~specview.core.quality.ItemOutcome`:
its id, each arm's pass or fail, whether the texts were identical, the fork's
token, the text around it and its diagnosis; a changed answer is tinted, one whose fork is a state
bug in the state colour and bold.  Double-click (or Enter) emits
``sigOpenTrace`` with the item's saved trace.

:class:`NearTieTable` shows a result's near-tie density
(:func:`~specview.core.quality.near_ties.summarise`): per tie band, each arm's
near-tie steps with their 95% interval, and how many of the forks (of the changed
answers) fell at a near-tie, in the CLI's and the report's words.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem, QWidget

from ...core import verdicts
from ...core.quality.near_ties import TABLE_HEADERS as TIE_COLUMNS, table_rows as tie_rows
from ...core.report.escape import visible
from .words import fork_token, item_tooltip, passed, verdict_text

#: the 2x2 table's row and column headers
ROWS = ("vanilla passes", "vanilla fails", "total")
COLS = ("speculative passes", "speculative fails", "total")
#: the discordant cells, (row, column): only vanilla passes, only speculative passes
DISCORDANT = ((0, 1), (1, 0))
ITEM_COLUMNS = ("item", "vanilla", "speculative", "identical", "fork token", "around the fork", "verdict")
#: the column that takes the width left over (the text around the fork)
CONTEXT_COL = ITEM_COLUMNS.index("around the fork")
OUTCOME_ROLE = Qt.ItemDataRole.UserRole + 1
DARK_TEXT = QColor(17, 17, 17)  # the tints are light in every theme


def counts(table: Any) -> list[list[int]]:
    """The 3x3 figures of a 2x2 table with its totals: [[both, only vanilla, vanilla passes], [only speculative,
    both fail, vanilla fails], [speculative passes, speculative fails, n]]."""
    a, b, c, d = table.both_pass, table.only_vanilla, table.only_speculative, table.both_fail
    return [[a, b, a + b], [c, d, c + d], [a + c, b + d, a + b + c + d]]


def _cell(text: str, *, tint: str | None = None, bold: bool = False, tip: str = "") -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
    if tint is not None:
        item.setBackground(QBrush(QColor(tint)))
        item.setForeground(QBrush(DARK_TEXT))
    if bold:
        f = item.font()
        f.setBold(True)
        item.setFont(f)
    if tip:
        item.setToolTip(tip)
    return item


class OutcomeTable(QTableWidget):
    """The paired outcomes as a 2x2 table with row and column totals; the discordant cells tinted."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(3, 3, parent)
        self.setObjectName("quality_outcomes")
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setHorizontalHeaderLabels(list(COLS))
        self.setVerticalHeaderLabels(list(ROWS))
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.figures: list[list[int]] = [[0] * 3 for _ in range(3)]
        self.set_table(None)

    def set_table(self, table: Any) -> None:
        """Show ``table`` (a :class:`~specview.core.quality.Table`; None: empty)."""
        self.figures = counts(table) if table is not None else [[0] * 3 for _ in range(3)]
        tips = {(0, 0): "both arms pass", (1, 1): "both arms fail",
                (0, 1): "the answer changed: vanilla passes, speculative fails",
                (1, 0): "the answer changed: speculative passes, vanilla fails"}
        for r in range(3):
            for c in range(3):
                n = self.figures[r][c]
                tint = None if table is None or (r, c) not in DISCORDANT else (
                    verdicts.COLOURS["state"] if n else verdicts.COLOURS["diverged"])
                self.setItem(r, c, _cell(str(n) if table is not None else "–", tint=tint,
                                         bold=(r, c) in DISCORDANT or (r, c) == (2, 2), tip=tips.get((r, c), "total")))
        self.resizeColumnsToContents()
        self.resizeRowsToContents()
        # the headers' size hints, not their widths: a header not yet shown has no width, and the table was cut
        frame = 2 * self.frameWidth()
        self.setFixedSize(self.verticalHeader().sizeHint().width() + sum(self.columnWidth(c) for c in range(3)) + frame,
                          self.horizontalHeader().sizeHint().height() + sum(self.rowHeight(r) for r in range(3))
                          + frame)

    def value(self, row: int, col: int) -> int:
        """The figure shown at (row, col), read back from the widget."""
        return int(self.item(row, col).text())


def _listing(table: QTableWidget, name: str, columns: tuple[str, ...]) -> None:
    """Make ``table`` a read-only listing named ``name`` with these column headers and no row numbers."""
    table.setObjectName(name)
    table.setHorizontalHeaderLabels(list(columns))
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.verticalHeader().setVisible(False)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)


class NearTieTable(QTableWidget):
    """One row per tie band: each arm's near-tie steps, and the forks at a near-tie; hidden with nothing counted."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(0, len(TIE_COLUMNS), parent)
        _listing(self, "quality_near_ties", TIE_COLUMNS)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.horizontalHeader().setStretchLastSection(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.set_summary(None)

    def set_summary(self, summary: dict[str, Any] | None) -> None:
        """Show a ``near_ties`` summary (None, or one that counted no item: the table is hidden)."""
        rows = tie_rows(summary) if summary and summary.get("items") else []
        self.setRowCount(len(rows))
        for r, (row, band) in enumerate(zip(rows, summary["bands"] if rows else [])):
            tip = (f"{band['name']}: a step is a near-tie when its top-1/top-2 margin is at most {band['width']} "
                   f"{band['unit']} (the band of {band['source']})")
            for c, text in enumerate(row):
                cell = _cell(text, bold=c == 0, tip=tip)
                cell.setTextAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
                self.setItem(r, c, cell)
        self.resizeColumnsToContents()
        self.resizeRowsToContents()
        self.setFixedHeight(self.horizontalHeader().sizeHint().height() + sum(self.rowHeight(r) for r in range(len(rows)))
                            + 2 * self.frameWidth())
        self.setVisible(bool(rows))

    def texts(self) -> list[list[str]]:
        """The cells shown, row by row (read back from the widget)."""
        return [[self.item(r, c).text() for c in range(self.columnCount())] for r in range(self.rowCount())]


class ItemsTable(QTableWidget):
    """One row per item; double-click or Enter opens its trace (``sigOpenTrace``)."""

    sigOpenTrace = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(0, len(ITEM_COLUMNS), parent)
        _listing(self, "quality_items", ITEM_COLUMNS)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.horizontalHeader().setSectionResizeMode(CONTEXT_COL, QHeaderView.ResizeMode.Stretch)
        self.base: Path | None = None
        self.cellDoubleClicked.connect(lambda row, _col: self.open_row(row))
        self.installEventFilter(self)

    def set_items(self, items: list[Any], base: str | Path | None = None) -> None:
        """Show ``items`` (ItemOutcomes); their trace paths are relative to ``base`` (the result file's folder)."""
        self.base = Path(base) if base is not None else None
        self.setRowCount(len(items))
        for r, o in enumerate(items):
            changed = o.discordant
            state = changed and o.verdict == "state"
            tint = verdicts.COLOURS["state"] if state else verdicts.COLOURS["diverged"] if changed else None
            texts = (o.item_id, passed(o.vanilla), passed(o.speculative), "yes" if o.identical else "no",
                     fork_token(o), visible(o.fork_context or ""), verdict_text(o))
            tip = item_tooltip(o)
            for c, text in enumerate(texts):
                cell = _cell(text, tint=tint, bold=state, tip=tip)
                if c in (0, 4, 5, 6):
                    cell.setTextAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
                if c in (1, 2) and tint is None:
                    cell.setForeground(QBrush(QColor(verdicts.STRONG["identical" if text == "pass" else "state"])))
                cell.setData(OUTCOME_ROLE, o)
                self.setItem(r, c, cell)

    def outcome(self, row: int) -> Any:
        item = self.item(row, 0)
        return None if item is None else item.data(OUTCOME_ROLE)

    def trace_path(self, row: int) -> str | None:
        """The saved trace of the item on ``row`` (None when it has none, or it is gone)."""
        o = self.outcome(row)
        if o is None or not o.trace_path:
            return None
        p = Path(o.trace_path)
        if not p.is_absolute() and self.base is not None:
            p = self.base / p
        return str(p) if p.exists() else None

    def open_row(self, row: int) -> None:
        path = self.trace_path(row)
        if path is not None:
            self.sigOpenTrace.emit(path)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt name
        if obj is self and event.type() == QEvent.Type.KeyPress and event.key() in (Qt.Key.Key_Return,
                                                                                    Qt.Key.Key_Enter):
            if self.currentRow() >= 0:
                self.open_row(self.currentRow())
                return True
        return super().eventFilter(obj, event)


__all__ = ["COLS", "CONTEXT_COL", "DISCORDANT", "ITEM_COLUMNS", "ItemsTable", "NearTieTable", "OutcomeTable", "ROWS",
           "TIE_COLUMNS", "counts"]
