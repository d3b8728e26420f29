"""The reproducer matrix as a grid: one colour-coded cell per combination, the summary above it, the rates below.

Below the grid, sharing the tab through a splitter, the Rates panel
(:class:`~specview.gui.matrix.rates.RatesPanel`) shows what
:func:`specview.core.matrix.rates` gives for the document on screen: per setting
and prompt category the divergence rate with its 95% Wilson interval, where the
forks fall and the gaps at them; it follows the cells as they stream in, and
shrinks to one line when every setting ran on one prompt.

A standalone widget.  Give it a matrix document (``setMatrix``), stream cells
into it as they finish (``addCell``), or open a saved file (``loadFile``).
Double-clicking a cell (or pressing Enter on it) emits ``sigOpenCell`` with the
cell's :class:`~specview.core.session.RunConfig`, and ``sigOpenTrace`` with the
path of its saved trace when the matrix was run with ``--traces``, so the main
window can open it in the side-by-side view.  ``sigOpenRun`` carries both at once
(the config, and the trace path or ``None``), for a receiver that chooses between them.

Embedding::

    view = MatrixView()
    view.sigOpenCell.connect(window.run_config)        # re-run it (the vanilla arm may be cached)
    view.sigOpenTrace.connect(window.open_trace_file)  # or show the saved trace
    view.loadFile("matrix.json")
    # streaming from a worker: run_matrix(spec, session, on_cell=worker.sigCell.emit, ...)
    # and connect worker.sigCell to view.addCell (a queued connection carries the dict).
"""

from __future__ import annotations

import copy
import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ...core import verdicts
from ...core.config import RunConfig
from ...core.diagnose.words import zero_draft
from ...core.errors import SpecviewError
from ...core.matrix import CellParams, describe, grid, load_matrix, rates, summarize
from ...core.matrix.preset import findings_lines
from ...core.matrix.summary import cell_category, cell_drafted_nothing, cell_label, cell_text
from ...core.matrix.quality import answer_changed, cell_mark, scored
from .rates import RatesPanel

RECORD_ROLE = Qt.ItemDataRole.UserRole + 1


#: what the tab says before it holds a matrix: how to get one
NO_MATRIX = ("No matrix yet: Run ▸ Run matrix… (Ctrl+M) runs one around the Run panel's settings, or Open matrix… "
             "shows a saved matrix.json.")

class MatrixView(QWidget):
    """The matrix grid, its legend, its plain-words summary and its divergence rates."""

    sigOpenCell = Signal(object)  # RunConfig of the chosen cell
    sigOpenTrace = Signal(str)  # path of the chosen cell's saved trace, when there is one
    sigOpenRun = Signal(object, object)  # (RunConfig or None, saved trace path or None) of the chosen cell

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("matrix_view")
        self.doc: dict[str, Any] = {}
        self.source: Path | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        top = QHBoxLayout()
        self.title = QLabel(NO_MATRIX)
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        self.open_button = QPushButton("Open matrix…")
        self.open_button.clicked.connect(self.choose_file)
        top.addWidget(self.title, 1)
        top.addWidget(self.open_button)
        lay.addLayout(top)
        self.summary = QLabel()
        self.summary.setTextFormat(Qt.TextFormat.PlainText)  # prompt and file names are not markup
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.summary)
        legend = QHBoxLayout()
        self.legend_labels: dict[str, QLabel] = {}
        for key in verdicts.CATEGORIES:
            lab = QLabel(verdicts.cell_label({"status": "error"} if key == "error" else {"verdict": key}
                                             if key != "identical" else {"identical": True}))
            lab.setStyleSheet(f"background:{verdicts.COLOURS[key]};color:#111;padding:2px 6px;border-radius:3px")
            legend.addWidget(lab)
            self.legend_labels[key] = lab
        legend.addStretch(1)
        lay.addLayout(legend)
        self.table = QTableWidget(0, 0)
        self.table.setObjectName("matrix_grid")
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setWordWrap(True)
        # the grid fills the tab, and every row has room for a cell's three lines
        self.table.horizontalHeader().setMinimumSectionSize(130)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.verticalHeader().setMinimumSectionSize(self.table.fontMetrics().lineSpacing() * 3 + 12)
        self.table.cellDoubleClicked.connect(self.openCell)
        self.table.installEventFilter(self)
        # the grid and the rates share the tab; the rates shrink to one line where there is one prompt
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.setObjectName("matrix_splitter")
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(self.table)
        self.rates_panel = RatesPanel()
        self.splitter.addWidget(self.rates_panel)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 0)
        self.rates_panel.sigCompact.connect(self._rates_compact)
        self._rates_compact(bool(self.rates_panel.compact))
        lay.addWidget(self.splitter, 1)

    # -- data ------------------------------------------------------------------
    def setMatrix(self, doc: dict[str, Any], source: str | Path | None = None) -> None:
        """Show a matrix document (a finished, running or interrupted one)."""
        self.doc = copy.deepcopy(doc)
        self.doc.setdefault("cells", [])
        self.source = Path(source) if source is not None else self.source
        self._render()

    def addCell(self, record: dict[str, Any]) -> None:
        """A cell has finished: add (or replace) it and redraw."""
        cells = self.doc.setdefault("cells", [])
        cells[:] = [c for c in cells if c.get("index") != record.get("index")]
        cells.append(record)
        cells.sort(key=lambda c: c.get("index", 0))
        self._render()

    def loadFile(self, path: str | Path) -> None:
        """Open a matrix JSON file; raises SpecviewError with a clear message if it is not one."""
        self.setMatrix(load_matrix(path), source=path)

    def cellAt(self, row: int, col: int) -> dict[str, Any] | None:
        item = self.table.item(row, col)
        return None if item is None else item.data(RECORD_ROLE)

    def configAt(self, row: int, col: int) -> RunConfig | None:
        cell = self.cellAt(row, col)
        if not cell or not cell.get("config"):
            return None
        try:
            return RunConfig.from_dict(cell["config"])
        except (SpecviewError, TypeError, ValueError):
            return None

    # -- interaction -----------------------------------------------------------
    def openCell(self, row: int, col: int) -> None:
        cell = self.cellAt(row, col)
        if cell is None:
            return
        cfg = self.configAt(row, col)
        trace_path = None
        tr = cell.get("trace")
        if tr:
            p = Path(tr)
            if not p.is_absolute() and self.source is not None:
                p = self.source.parent / p
            if p.exists():
                trace_path = str(p)
        if cfg is not None:
            self.sigOpenCell.emit(cfg)
        if trace_path is not None:
            self.sigOpenTrace.emit(trace_path)
        if cfg is not None or trace_path is not None:
            self.sigOpenRun.emit(cfg, trace_path)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if obj is self.table and event.type() == QEvent.Type.KeyPress and event.key() in (
                Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if self.table.currentRow() >= 0 and self.table.currentColumn() >= 0:
                self.openCell(self.table.currentRow(), self.table.currentColumn())
                return True
        return super().eventFilter(obj, event)

    def choose_file(self) -> None:
        """Ask for a matrix file and show it; one that is not a matrix says why in the summary."""
        path, _ = QFileDialog.getOpenFileName(self, "Open a specview matrix", "", "Matrix JSON (*.json)")
        if path:
            try:
                self.loadFile(path)
            except SpecviewError as exc:
                self.summary.setText(str(exc))

    # -- drawing ---------------------------------------------------------------
    def _render(self) -> None:
        doc = self.doc
        cells = doc.get("cells", [])
        n_total = doc.get("n_cells", len(cells))
        status = doc.get("status", "")
        name = self.source.name if self.source is not None else "matrix"
        self.title.setText(f"{name}: {len(cells)} of {n_total} cells ({status})" if doc else NO_MATRIX)
        if cells:
            lines = summarize(doc)
            head = len(findings_lines(doc))  # a preset's findings first, set apart from the general summary
            text = "\n".join(lines[:head]) + ("\n\n" if head and lines[head:] else "") + "\n".join(lines[head:])
        else:
            text = "No cell has finished yet."
        self.summary.setText(text)
        g = grid(doc)
        self.table.clear()
        self.table.setRowCount(len(g.rows))
        self.table.setColumnCount(len(g.cols))
        self.table.setHorizontalHeaderLabels([g.col_label(c) for c in g.cols])
        self.table.setVerticalHeaderLabels([g.row_label(r) for r in g.rows])
        for i, r in enumerate(g.rows):
            for j, c in enumerate(g.cols):
                cell = g.at.get((r, c))
                item = QTableWidgetItem(self._text(cell))
                item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                cat = cell_category(cell)
                if cat is not None:
                    item.setBackground(QBrush(QColor(verdicts.COLOURS[cat])))
                    item.setForeground(QBrush(QColor(17, 17, 17)))  # the tints are light in every theme
                if cell is not None and answer_changed(cell):  # a changed answer stands out in bold
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                item.setData(RECORD_ROLE, cell)
                item.setToolTip(self._tooltip(cell))
                self.table.setItem(i, j, item)
        self.table.resizeColumnsToContents()
        spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
        prompts = spec.get("prompts") if isinstance(spec.get("prompts"), list) else []
        self.rates_panel.set_rates(rates(doc), prompts=len(prompts))

    def _rates_compact(self, compact: bool) -> None:
        """The whole rates panel takes a good share of the tab; a one-line panel only its line."""
        total = max(self.splitter.height(), 400)
        self.splitter.setStretchFactor(1, 0 if compact else 1)
        if compact:
            self.splitter.setSizes([total, self.rates_panel.maximumHeight()])
        else:
            self.splitter.setSizes([round(total * 0.36), total - round(total * 0.36)])

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().resizeEvent(ev)
        if self.rates_panel.compact:  # the grid takes all but the rates' one line
            self._rates_compact(True)

    @staticmethod
    def _text(cell: dict[str, Any] | None) -> str:
        if cell is None:
            return "…"
        head = cell_text(cell, sep="\n")
        if head == "error":
            return head
        if cell_mark(cell):  # over a task suite: whether the answer changed, under the fork
            head += "\n" + cell_mark(cell)
        bits = []
        if cell.get("acceptance_rate") is not None:
            bits.append(f"acc {cell['acceptance_rate']:.0%}")
        if cell.get("speedup") is not None:
            bits.append(f"{cell['speedup']:.2f}x")
        return head + ("\n" + " · ".join(bits) if bits else "")

    @staticmethod
    def _tooltip(cell: dict[str, Any] | None) -> str:
        if cell is None:
            return "not run yet"
        e = html.escape
        lines = [f"<b>{e(describe(CellParams.from_json(cell['params'])))}</b>"]
        if cell.get("status") == "error":
            lines.append(e(str(cell.get("error"))))
        elif cell_drafted_nothing(cell):
            why = zero_draft(cell.get("config") or cell.get("params")).why
            lines.append(f"inconclusive: identical over {e(str(cell.get('n_vanilla')))} tokens, but nothing was "
                         f"drafted ({e(why)}), so nothing speculative was tested")
        elif cell.get("identical"):
            lines.append(f"identical over {e(str(cell.get('n_vanilla')))} tokens")
        else:
            f = cell.get("fork") or {}
            lines.append(f"fork at token {e(str(cell.get('first_mismatch')))}: vanilla "
                         f"{e(repr(f.get('vanilla_piece')))}, speculative {e(repr(f.get('speculative_piece')))}")
            lines.append(f"verdict: {e(cell_label(cell))}"
                         + (f", gap {cell['gap']:.4f}" if isinstance(cell.get("gap"), (int, float)) else ""))
            if cell.get("explanation"):
                lines.append(e(str(cell["explanation"])))
        q = scored(cell)
        if q is not None:
            lines.append(e(f"{cell_mark(cell)}: expected {q.get('expected')!r}; vanilla {q.get('vanilla_got')!r} "
                           f"({'pass' if q['vanilla_pass'] else 'fail'}), speculative {q.get('speculative_got')!r} "
                           f"({'pass' if q['speculative_pass'] else 'fail'})"))
        if cell.get("status") == "ok":
            lines.append(f"drafted {cell.get('n_drafted')}, accepted {cell.get('n_accepted')}")
        lines.append("<i>double-click or Enter: open it side by side</i>")
        return "<p style='white-space:pre-wrap'>" + "<br>".join(lines) + "</p>"
