"""The kernel map as a heat grid (target x verify width), its legend, and one target's per-width detail.

A standalone widget: give it a :class:`~specview.core.kernels.map.KernelMap`
(``setMap``) and it shows one row per target (under its engine settings) and
one column per width.  The metric shown is selectable; a bit-identical cell is
always ``=`` on the verdicts' "identical" green, whatever the metric, and the
other cells are tinted from light to strong by how far the metric says that
width is from single-token passes.  The row labels say what the row proves
("proven lossless up to n_max 2", "nothing proven", "not deterministic").
Selecting a cell shows that target's per-width table and, in plain words, what
it proves (:func:`specview.core.kernels.text.verdict_line`).

The colours and texts come from pure functions (:mod:`.words`: :func:`~.words.cell_look`,
:func:`~.words.row_claim`), so they can be checked against the map's own figures.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPainter, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ...core.kernels.text import ranges, verdict_line
from .words import (BINS, CONTROL_FAILED, DETAIL_COLUMNS, DETAIL_TIPS, IDENTICAL, INK, METRIC_NAMES, METRICS, RAMP,
                    cell_details, cell_look, environment_text, first_difference, fmt, row_claim)


class _HeatDelegate(QStyledItemDelegate):
    """Keeps a selected cell's tint (the heat is the information) and frames it instead."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
              ) -> None:
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        opt = QStyleOptionViewItem(option)
        opt.state &= ~QStyle.StateFlag.State_Selected
        opt.state &= ~QStyle.StateFlag.State_HasFocus
        super().paint(painter, opt, index)
        if selected:
            painter.save()
            pen = QPen(option.palette.color(option.palette.ColorRole.Highlight), 3)
            pen.setJoinStyle(Qt.PenJoinStyle.MiterJoin)
            painter.setPen(pen)
            painter.drawRect(opt.rect.adjusted(1, 1, -2, -2))
            painter.restore()


def _swatch(text: str, colour: str | None, tip: str = "") -> QLabel:
    lab = QLabel(text)
    lab.setTextFormat(Qt.TextFormat.PlainText)
    if colour:
        lab.setStyleSheet(f"background:{colour};color:{INK};padding:2px 6px;border-radius:3px")
    else:  # no style sheet: the text follows the theme's palette when it changes
        lab.setMargin(2)
    lab.setToolTip(tip)
    return lab


def _bold_label(text: str, name: str) -> QLabel:
    lab = QLabel(text)
    lab.setObjectName(name)
    lab.setTextFormat(Qt.TextFormat.PlainText)
    f = lab.font()
    f.setBold(True)
    lab.setFont(f)
    return lab


class KernelMapView(QWidget):
    """The heat grid, its legend and the map's facts; the selected target's per-width table below it."""

    sigTargetSelected = Signal(int)  # the row (target index) whose detail is shown

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("kernel_map_view")
        self.kmap: Any = None
        self.source: Path | None = None
        self.metric = METRICS[0][0]
        self.selected: int | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.setChildrenCollapsible(False)
        lay.addWidget(self.splitter)
        self.splitter.addWidget(self._build_map_panel())
        self.splitter.addWidget(self._build_bottom())
        self.splitter.setStretchFactor(0, 2)
        self.splitter.setStretchFactor(1, 3)
        self._build_legend()
        self._render_legend()

    # -- building --------------------------------------------------------------
    def _build_map_panel(self) -> QWidget:
        """The upper part: the title and the metric menu, the map's facts, the legend's row and the heat grid."""
        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.setSpacing(4)
        tl.addLayout(self._build_head())
        self.facts = QLabel()
        self.facts.setObjectName("kernel_facts")
        self.facts.setTextFormat(Qt.TextFormat.PlainText)
        self.facts.setWordWrap(True)
        self.facts.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        tl.addWidget(self.facts)
        self.legend = QHBoxLayout()
        self.legend.setSpacing(4)
        tl.addLayout(self.legend)
        tl.addWidget(self._build_grid(), 1)
        return top

    def _build_head(self) -> QHBoxLayout:
        """The map's title, and the menu of the metric the cells show."""
        head = QHBoxLayout()
        self.title = _bold_label("No kernel map yet: run one, or open a saved map.", "kernel_title")
        head.addWidget(self.title, 1)
        head.addWidget(QLabel("Show"))
        self.metric_box = QComboBox()
        self.metric_box.setObjectName("kernel_metric")
        for key, name in METRICS:
            self.metric_box.addItem(name, key)
        self.metric_box.setToolTip("the figure each cell shows and is tinted by; a bit-identical width is always '='")
        self.metric_box.setAccessibleName("Heat map metric")
        self.metric_box.currentIndexChanged.connect(lambda _i: self.setMetric(self.metric_box.currentData()))
        head.addWidget(self.metric_box)
        return head

    def _build_grid(self) -> QTableWidget:
        """The heat grid: a row per target, a column per verify width; a selected cell or row shows its detail."""
        self.table = QTableWidget(0, 0)
        self.table.setObjectName("kernel_grid")
        self.table.setAccessibleName("Kernel map: targets by verify width")
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectItems)
        self.table.setItemDelegate(_HeatDelegate(self.table))
        self.table.setWordWrap(False)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        hh.setMinimumSectionSize(self.fontMetrics().horizontalAdvance("0.000 !") + 10)
        vh = self.table.verticalHeader()
        vh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        vh.setMinimumSectionSize(self.fontMetrics().lineSpacing() * 2 + 12)
        vh.sectionClicked.connect(lambda r: self.selectTarget(r))
        self.table.currentCellChanged.connect(lambda r, c, _r0, _c0: self._current_changed(r, c))
        return self.table

    def _build_bottom(self) -> QSplitter:
        """The lower part: the selected target's detail, and room beside it for other panels (the tab puts the
        prescription there)."""
        self.bottom = QSplitter(Qt.Orientation.Horizontal)
        self.bottom.setChildrenCollapsible(False)
        self._split_moved = False  # the user's split is kept; until then the figures get what they need
        self.bottom.splitterMoved.connect(lambda *_a: setattr(self, "_split_moved", True))
        self.bottom.addWidget(self._build_detail_panel())
        return self.bottom

    def _build_detail_panel(self) -> QWidget:
        """The selected target's title, what its row proves, and its figures per width."""
        panel = QWidget()
        panel.setObjectName("kernel_detail_panel")
        bl = QVBoxLayout(panel)
        bl.setContentsMargins(0, 4, 0, 0)
        bl.setSpacing(4)
        self.detail_title = _bold_label("", "kernel_detail_title")
        self.detail_title.setWordWrap(True)
        bl.addWidget(self.detail_title)
        self.claim = QLabel("Select a row (a target) to see its figures per width and what they prove.")
        self.claim.setObjectName("kernel_claim")
        self.claim.setTextFormat(Qt.TextFormat.PlainText)
        self.claim.setWordWrap(True)
        self.claim.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        bl.addWidget(self.claim)
        bl.addWidget(self._build_detail_table(), 1)
        return panel

    def _build_detail_table(self) -> QTableWidget:
        """The per-width table of the selected target, a row per width, each column's meaning in its tooltip."""
        self.detail = QTableWidget(0, len(DETAIL_COLUMNS))
        self.detail.setObjectName("kernel_detail")
        self.detail.setAccessibleName("The selected target's figures per verify width")
        self.detail.setHorizontalHeaderLabels(list(DETAIL_COLUMNS))
        self.detail.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.detail.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.detail.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.detail.verticalHeader().setVisible(False)
        self.detail.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.detail.verticalHeader().setMinimumSectionSize(self.fontMetrics().lineSpacing() + 4)
        dh = self.detail.horizontalHeader()
        dh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        for i, tip in enumerate(DETAIL_TIPS):
            self.detail.horizontalHeaderItem(i).setToolTip(tip)
        self._fit_detail_width()  # before any map: its headers readable, not a sliver beside the prescription
        return self.detail

    def _build_legend(self) -> None:
        """The legend's swatches, made once; the ramp's labels follow the metric shown."""
        self.legend.addWidget(_swatch("=  bit-identical", IDENTICAL,
                                      "every row of this width equals the single-token row, bit for bit"))
        self.legend_metric = QLabel()
        self.legend_metric.setTextFormat(Qt.TextFormat.PlainText)
        self.legend.addWidget(self.legend_metric)
        self.ramp_labels = [_swatch("", colour) for colour in RAMP]
        for lab in self.ramp_labels:
            self.legend.addWidget(lab)
        self.legend.addWidget(_swatch("control failed", CONTROL_FAILED,
                                      "width 1 (the same pass after a rollback) was not bit-identical: "
                                      "the target is not deterministic and the map proves nothing for it"))
        marks = _swatch("!  an argmax flipped    …  stopped at the first difference", None)
        marks.setObjectName("kernel_legend_marks")
        self.legend.addWidget(marks)
        self.legend.addStretch(1)

    # -- data ------------------------------------------------------------------
    def setMap(self, kmap: Any, source: str | Path | None = None) -> None:
        """Show a :class:`~specview.core.kernels.map.KernelMap` (``source``: the file it came from, if any)."""
        self.kmap = kmap
        self.source = Path(source) if source is not None else None
        self.selected = None
        self._render()
        if kmap is not None and kmap.targets:
            self.selectTarget(0)
        else:
            self._show_detail(None)

    def setSource(self, source: str | Path | None) -> None:
        """The file the map on screen is now saved in: the title names it, the selected target stays selected."""
        self.source = Path(source) if source is not None else None
        self._render()
        if self.selected is not None:
            self.selectTarget(self.selected)

    def setMetric(self, metric: str) -> None:
        if metric not in METRIC_NAMES:
            raise ValueError(f"unknown metric {metric!r}; one of {', '.join(METRIC_NAMES)}")
        self.metric = metric
        i = self.metric_box.findData(metric)
        if i != self.metric_box.currentIndex():
            self.metric_box.setCurrentIndex(i)  # comes back here through the signal
            return
        self._render_legend()
        if self.kmap is not None:
            r, c = self.table.currentRow(), self.table.currentColumn()
            self._fill_grid()
            self.selected = None  # the detail's width column takes the new tints too
            if r >= 0:
                self.table.setCurrentCell(r, max(c, 0))

    def selectTarget(self, row: int, width: int | None = None) -> None:
        """Select a target's row (at ``width``'s cell, else the first width that differs) and show its detail."""
        if self.kmap is None or not 0 <= row < len(self.kmap.targets):
            return
        widths = list(self.kmap.widths)
        if width is None:
            t = self.kmap.targets[row]
            width = next((w for w in widths if w in t.widths and not t.widths[w].bit_identical), widths[0])
        self.table.setCurrentCell(row, widths.index(width) if width in widths else 0)
        self._show_detail(row)

    def itemAt(self, row: int, width: int) -> QTableWidgetItem | None:
        if self.kmap is None or width not in self.kmap.widths:
            return None
        return self.table.item(row, list(self.kmap.widths).index(width))

    def _fit_split(self) -> None:
        """Until the user moves it, the split gives the figures what they need and the panel beside them the rest."""
        total = sum(self.bottom.sizes())
        need = self.detail.minimumWidth() + 2
        if self.bottom.count() > 1 and not self._split_moved and total > need:
            self.bottom.setSizes([need, total - need])

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().resizeEvent(ev)
        self._fit_split()

    # -- drawing ---------------------------------------------------------------
    def _render(self) -> None:
        km = self.kmap
        if km is None:
            self.title.setText("No kernel map yet: run one, or open a saved map.")
            self.facts.setText("")
            self.table.clear()
            self.table.setRowCount(0)
            self.table.setColumnCount(0)
            return
        name = self.source.name if self.source is not None else "computed here, not saved yet"
        n = len(km.targets)
        self.title.setText(f"Kernel map ({name}): {n} row{'s' if n != 1 else ''} x widths {ranges(km.widths)}")
        self.facts.setText(environment_text(km))
        self._fill_grid()
        self._render_legend()

    def _fill_grid(self) -> None:
        km = self.kmap
        self.table.clear()
        self.table.setRowCount(len(km.targets))
        self.table.setColumnCount(len(km.widths))
        self.table.setHorizontalHeaderLabels([str(w) for w in km.widths])
        for j, w in enumerate(km.widths):
            hi = self.table.horizontalHeaderItem(j)
            hi.setToolTip(f"verify width {w}: " + ("the rollback control" if w == 1 else
                                                   f"the last token plus {w - 1} draft token{'s' if w > 2 else ''}"))
        for i, t in enumerate(km.targets):
            head = QTableWidgetItem(f"{t.label}\n{row_claim(t)}")
            head.setToolTip(verdict_line(t))
            self.table.setVerticalHeaderItem(i, head)
            for j, w in enumerate(km.widths):
                st = t.widths.get(w)
                look = cell_look(st, self.metric)
                item = QTableWidgetItem(look.text)
                item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                if look.colour is not None:
                    item.setBackground(QBrush(QColor(look.colour)))
                    item.setForeground(QBrush(QColor(INK)))
                lines = cell_details(t, st) if st is not None else [f"{t.label}, width {w}: not measured"]
                item.setToolTip("<p style='white-space:pre-wrap'>" + "<br>".join(
                    [f"<b>{html.escape(lines[0])}</b>"] + [html.escape(x) for x in lines[1:]]) + "</p>")
                item.setData(Qt.ItemDataRole.AccessibleTextRole, f"width {w}: " + (
                    "bit-identical" if look.identical else look.text or "not measured"))
                item.setData(Qt.ItemDataRole.AccessibleDescriptionRole, ". ".join(lines))
                self.table.setItem(i, j, item)
        self.table.resizeRowsToContents()
        rows = sum(self.table.rowHeight(i) for i in range(min(self.table.rowCount(), 8)))
        self.table.setMinimumHeight(self.table.horizontalHeader().height() + rows + 2 * self.table.frameWidth() + 2)

    def _render_legend(self) -> None:
        name = METRIC_NAMES[self.metric]
        self.legend_metric.setText(f"otherwise, by {name}:")
        for lab, text in zip(self.ramp_labels, BINS[self.metric][1]):
            lab.setText(text)
            lab.setToolTip(f"a width that is not bit-identical, {name} {text}")

    def _current_changed(self, row: int, col: int) -> None:
        if row < 0 or self.kmap is None:
            return
        if row != self.selected:
            self._show_detail(row)
        if 0 <= col < len(self.kmap.widths):
            w = self.kmap.widths[col]
            t = self.kmap.targets[row]
            ws = sorted(t.widths)
            if w in ws:
                self.detail.selectRow(ws.index(w))
                self.detail.scrollToItem(self.detail.item(ws.index(w), 0))

    def _show_detail(self, row: int | None) -> None:
        self.selected = row
        self.detail.setRowCount(0)
        if row is None or self.kmap is None:
            self.detail_title.setText("")
            self.claim.setText("Select a row (a target) to see its figures per width and what they prove.")
            return
        t = self.kmap.targets[row]
        q = t.model.get("quantization") or "?"
        threads = f"threads {t.threads_used}" if t.threads_used else "threads n/a"
        pos = t.prompts[0].positions if t.prompts else 0
        self.detail_title.setText(f"{t.label}: {row_claim(t)}  ({q}; {threads}; {len(t.prompts)} prompt"
                                  f"{'s' if len(t.prompts) != 1 else ''} x {pos} positions; {t.seconds:.1f} s)")
        self.claim.setText(verdict_line(t))
        ws = sorted(t.widths)
        self.detail.setRowCount(len(ws))
        for r, w in enumerate(ws):
            st = t.widths[w]
            share = f"{st.identical} ({100.0 * st.identical_share:.1f}%)" + (" …" if st.stopped else "")
            if st.bit_identical:
                mark = " =" if w > 1 else " = control"
            else:
                mark = " control failed" if w == 1 else ""
            same = st.bit_identical
            values = (f"{w}{mark}", str(st.rows), share, "0" if same else fmt(st.max_delta),
                      "0" if same else fmt(st.p95_delta), str(st.flips), str(st.below_shift),
                      first_difference(st, short=True))
            looks = {0: cell_look(st, self.metric), 2: cell_look(st, "identical_share")}  # the heat cell's tint
            tip = "\n".join(cell_details(t, st))
            for c, v in enumerate(values):
                item = QTableWidgetItem(v)
                item.setTextAlignment((Qt.AlignmentFlag.AlignRight if 0 < c < 7 else Qt.AlignmentFlag.AlignLeft)
                                      | Qt.AlignmentFlag.AlignVCenter)
                look = looks.get(c)
                if look is not None and look.colour is not None:
                    item.setBackground(QBrush(QColor(look.colour)))
                    item.setForeground(QBrush(QColor(INK)))
                item.setToolTip(tip)
                self.detail.setItem(r, c, item)
        self._fit_detail_width()
        self._fit_split()
        self.sigTargetSelected.emit(row)

    def _fit_detail_width(self) -> None:
        """The figures stay readable: the per-width table is at least as wide as its columns (its headers' own
        widths while it is empty), up to 760 px; the splitter gives the prescription beside it what is left."""
        dh = self.detail.horizontalHeader()
        need = sum(max(self.detail.columnWidth(c), dh.sectionSizeHint(c)) for c in range(self.detail.columnCount()))
        need += 2 * self.detail.frameWidth() + self.detail.verticalScrollBar().sizeHint().width() + 4
        self.detail.setMinimumWidth(min(need, 760))
