"""The Rates panel of the Matrix tab: divergence rates with their intervals, where forks fall, how large the gaps are.

Everything shown is read from one :func:`specview.core.matrix.rates` result
(``set_rates``): per setting (every axis but the prompt) and per prompt
category, forks of n, the rate, its 95% Wilson interval, the fork positions'
median and quartiles and the near-tie / material / undiagnosed counts, in a
tree with the categories as children.  Beside it three plots
(:mod:`specview.gui.matrix.rate_plots`), created once and updated with
``setData``/``setOpts``:

* the rate of every setting with its Wilson interval as an error bar (one row
  per setting, so overlapping intervals are seen at a glance);
* the severity histogram of the selected row: near-tie and material forks
  stacked per gap bin (``gap_bin_labels()``, in logits);
* the fork-position histogram of the selected row, its median and quartiles
  marked.

With one prompt per setting a rate means little: the panel then shrinks to one
line that says so (``compact``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHeaderView,
    QLabel,
    QSizePolicy,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QTreeWidgetItemIterator,
    QVBoxLayout,
    QWidget,
)

from ...core import verdicts
from ...core.matrix.evidence import group_prediction_text
from ...core.matrix.quality import answers_text
from ...core.matrix.rates import pct, positions_text, rate_text, severity_text, ties_lines, ties_summary
from ...core.matrix.settings import engine_axes
from ...core.matrix.summary import ALL_AXES, axis_part
from .rate_plots import SEVERITY_VERDICT, PositionPlot, RatePlot, SeverityPlot

#: the tree's columns
COLUMNS = ("setting · category", "forks / n", "rate", "95% CI", "fork at: median\n(quartiles)", "near-tie",
           "material", "undiagnosed", "kernel map", "answers\n(McNemar p)")
COL_FORKS, COL_RATE, COL_CI, COL_POS, COL_NEAR, COL_MATERIAL, COL_UNDIAG, COL_KERNELS, COL_ANSWERS = range(1, 10)
SEVERITY_COLS = {"near-tie": COL_NEAR, "material": COL_MATERIAL, "undiagnosed": COL_UNDIAG}
KEY_ROLE = Qt.ItemDataRole.UserRole + 2

NEED_PROMPTS = ("Rates need more prompts: every setting here ran on one prompt. Run the prompt suite "
                "(Run ▸ Run matrix…, Prompt suite) for divergence rates with their intervals, fork positions and "
                "gap histograms.")


def _num(x: Any) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:g}"


def setting_key(g: dict[str, Any]) -> str:
    """What identifies a setting's row across updates: its axes (labels may repeat for two same-quant files)."""
    return json.dumps(g.get("params"), sort_keys=True, default=str)


def position_cell(g: dict[str, Any]) -> str:
    p = g["positions"]
    if p["median"] is None:
        return "–"
    return f"{_num(p['median'])} ({_num(p['q1'])}–{_num(p['q3'])})"


def ci_cell(g: dict[str, Any]) -> str:
    return "–" if not g["n"] else f"{pct(g['low'])}–{pct(g['high'])}"


def kernel_cell(g: dict[str, Any]) -> str:
    """What a cited kernel map predicted for a setting's cells ("" where the matrix cites none)."""
    return group_prediction_text(g["kernel_map"]) if isinstance(g.get("kernel_map"), dict) else ""


def row_texts(g: dict[str, Any]) -> list[str]:
    """The tree's texts for a setting or category group of :func:`rates` (after its name)."""
    sev = g["severity"]
    return [f"{g['forks']} / {g['n']}", pct(g["rate"]), ci_cell(g), position_cell(g),
            str(sev["near-tie"]), str(sev["material"]), str(sev["undiagnosed"]), kernel_cell(g),
            answers_text(g.get("answers")).removeprefix("answers: ")]


def setting_names(settings: list[dict[str, Any]]) -> tuple[list[str], str]:
    """Short names of the settings (only the axes that differ between them) and what they all share.

    One setting keeps its whole label; the rows' tool tips always give it.
    """
    if len(settings) < 2:
        return [g["label"] for g in settings], ""
    axes = [a for a in ALL_AXES if a != "prompt"]
    params = [g.get("params") or {} for g in settings]
    varying = [a for a in axes if len({repr(p.get(a)) for p in params}) > 1]
    if not varying:
        return [g["label"] for g in settings], ""
    names = [" ".join(axis_part(a, p.get(a)) for a in varying if p.get(a) is not None) or g["label"]
             for p, g in zip(params, settings)]
    shared = [axis_part(a, params[0].get(a)) for a in axes if a not in varying and params[0].get(a) is not None
              and a not in engine_axes()]
    return names, " ".join(shared)


class RatesPanel(QWidget):
    """Rates per setting and category (a tree), the rate plot, and the selected row's histograms."""

    sigCompact = Signal(bool)  # True: one line (one prompt per setting); False: the whole panel

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("rates_panel")
        self.rates: dict[str, Any] = {"settings": [], "gap_bins": []}
        self.compact: bool | None = None
        self.names: list[str] = []  # the settings' short names in the tree and the rate plot
        self.shared = ""  # what every setting shares, said once
        self._selected: tuple[str, str | None] | None = None  # (setting key, category or None)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        self.hint = QLabel()
        self.hint.setObjectName("rates_hint")
        self.hint.setWordWrap(True)
        self.hint.setTextFormat(Qt.TextFormat.PlainText)
        lay.addWidget(self.hint)
        self.body = QSplitter(Qt.Orientation.Horizontal)
        self.body.setObjectName("rates_body")
        self.body.setChildrenCollapsible(False)
        self.tree = QTreeWidget()
        self.tree.setObjectName("rates_tree")
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(list(COLUMNS))
        self.tree.setRootIsDecorated(True)
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tree.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        head = self.tree.header()
        head.setStretchLastSection(False)
        head.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in range(1, len(COLUMNS)):
            head.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
            self.tree.headerItem().setTextAlignment(c, Qt.AlignmentFlag.AlignCenter)
        self.tree.headerItem().setToolTip(COL_CI, "95% Wilson score interval of the rate")
        self.tree.headerItem().setToolTip(COL_POS, "token index of the fork: median (first quartile–third quartile)")
        self.tree.headerItem().setToolTip(COL_NEAR, "forks whose gap is within what batched-versus-single numerics "
                                                    "can flip (the diagnosis' far threshold)")
        self.tree.headerItem().setToolTip(COL_MATERIAL, "forks whose gap is above that threshold")
        self.tree.headerItem().setToolTip(COL_UNDIAG, "forks not diagnosed: no gap")
        self.tree.headerItem().setToolTip(COL_KERNELS, "what the kernel map the matrix cites predicts for the "
                                                       "setting's cells, and how many of them contradict it")
        self.tree.setColumnHidden(COL_KERNELS, True)
        self.tree.currentItemChanged.connect(self._current_changed)
        # left: the settings (the tree, and their rates side by side); right: the selected row's histograms
        left = QSplitter(Qt.Orientation.Vertical)
        left.setChildrenCollapsible(False)
        left.addWidget(self.tree)
        self.rate_plot = RatePlot()
        self.rate_plot.sigRowClicked.connect(self.select_setting)
        left.addWidget(self.rate_plot)
        left.setStretchFactor(0, 3)
        left.setStretchFactor(1, 1)
        self.body.addWidget(left)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(2)
        self.selection = QLabel()
        self.selection.setObjectName("rates_selection")
        self.selection.setTextFormat(Qt.TextFormat.PlainText)
        self.selection.setWordWrap(True)
        rl.addWidget(self.selection)
        self.severity_plot = SeverityPlot()
        self.position_plot = PositionPlot()
        rl.addWidget(self.severity_plot, 1)
        rl.addWidget(self.position_plot, 1)
        self.body.addWidget(right)
        self.body.setStretchFactor(0, 2)
        self.body.setStretchFactor(1, 1)
        self.body.setSizes([660, 330])
        lay.addWidget(self.body, 1)
        self._items: dict[str, QTreeWidgetItem] = {}
        self._set_compact(True)
        self.hint.setText("")

    # -- data ------------------------------------------------------------------
    def set_rates(self, r: dict[str, Any], *, prompts: int) -> None:
        """Show ``r`` (a :func:`specview.core.matrix.rates` result) of a matrix over ``prompts`` prompts."""
        self.rates = r
        settings = r["settings"]
        self.names, self.shared = setting_names(settings)
        most = max((g["n"] for g in settings), default=0)
        self._set_compact(max(prompts, most) < 2)
        if self.compact:
            self.hint.setText(NEED_PROMPTS if settings or prompts else "")
            self._fit_compact()
            self._fill_tree(settings)
            return
        done = sum(g["n"] + g["errors"] for g in settings)
        if not settings:
            self.hint.setText("Divergence rates over the prompts appear here as cells finish.")
        else:
            forks = sum(g["forks"] for g in settings)
            shared = f" (every setting: {self.shared})" if self.shared else ""
            self.hint.setText(f"Divergence rates over the prompts: {forks} forks in {done} finished cells of "
                              f"{len(settings)} setting{'s' if len(settings) != 1 else ''}{shared}. Select a row "
                              "for its gap and fork-position histograms.")
        self._fill_tree(settings)
        self.rate_plot.set_settings(settings, self.names)
        self._show_selected()

    def group(self, key: str, category: str | None = None) -> dict[str, Any] | None:
        """The rates() group of a setting (by :func:`setting_key`) or of one of its categories."""
        for g in self.rates["settings"]:
            if setting_key(g) == key:
                if category is None:
                    return g
                return next((c for c in g["categories"] if c["category"] == category), None)
        return None

    def selected_group(self) -> dict[str, Any] | None:
        return None if self._selected is None else self.group(*self._selected)

    def select_setting(self, index: int, category: str | None = None) -> None:
        """Select the setting at ``index`` of rates()["settings"] (or one of its categories)."""
        key = setting_key(self.rates["settings"][index])
        item = self._items.get(key)
        if item is None:
            return
        if category is not None:
            item = next((item.child(i) for i in range(item.childCount())
                         if item.child(i).data(0, KEY_ROLE) == (key, category)), item)
        self.tree.setCurrentItem(item)

    # -- the tree ----------------------------------------------------------------
    def _fill_tree(self, settings: list[dict[str, Any]]) -> None:
        """Update the rows in place (selection, expansion and scrolling stay), adding rows for new settings."""
        keys = [setting_key(g) for g in settings]
        self.tree.setColumnHidden(COL_KERNELS, not any(isinstance(g.get("kernel_map"), dict) for g in settings))
        self.tree.setColumnHidden(COL_ANSWERS, not any(g.get("answers") for g in settings))  # a task suite's
        if list(self._items) != keys[: len(self._items)]:  # a setting went away or moved: lay the tree out again
            self.tree.clear()
            self._items = {}
        self.tree.blockSignals(True)
        try:
            names = self.names if len(self.names) == len(settings) else [g["label"] for g in settings]
            for key, g, name in zip(keys, settings, names):
                item = self._items.get(key)
                if item is None:
                    item = QTreeWidgetItem(self.tree)
                    item.setData(0, KEY_ROLE, (key, None))
                    self._items[key] = item
                self._fill_row(item, name, g, full=g["label"])
                cats = [c["category"] for c in g["categories"]]
                have = [item.child(i).data(0, KEY_ROLE)[1] for i in range(item.childCount())]
                if have != cats[: len(have)]:
                    item.takeChildren()
                    have = []
                for c in g["categories"][len(have):]:
                    child = QTreeWidgetItem(item)
                    child.setData(0, KEY_ROLE, (key, c["category"]))
                for i, c in enumerate(g["categories"]):
                    self._fill_row(item.child(i), c["category"], c, full=f"{g['label']} · {c['category']}")
                if not have and item.childCount():
                    item.setExpanded(True)  # new categories show; a setting the user folded stays folded
        finally:
            self.tree.blockSignals(False)
        self._fit_tree()
        if self.tree.currentItem() is None and self._items:
            self.tree.setCurrentItem(next(iter(self._items.values())))

    def _fit_tree(self) -> None:
        """The tree is never squeezed below its columns' contents (the plots take the rest)."""
        fm = self.tree.fontMetrics()
        names = [self.tree.headerItem().text(0)]
        it = QTreeWidgetItemIterator(self.tree)
        while it.value() is not None:
            names.append(it.value().text(0))
            it += 1
        first = max(fm.horizontalAdvance(n) for n in names) + 2 * self.tree.indentation() + 12
        rest = sum(max(self.tree.header().sectionSizeHint(c), self.tree.sizeHintForColumn(c))
                   for c in range(1, len(COLUMNS)))
        self.tree.setMinimumWidth(min(first + rest + 8, 760))

    def _fill_row(self, item: QTreeWidgetItem, name: str, g: dict[str, Any], *, full: str | None = None) -> None:
        item.setText(0, name)
        for col, text in enumerate(row_texts(g), start=1):
            item.setText(col, text)
            side = Qt.AlignmentFlag.AlignLeft if col in (COL_KERNELS, COL_ANSWERS) else Qt.AlignmentFlag.AlignRight
            item.setTextAlignment(col, side | Qt.AlignmentFlag.AlignVCenter)
        kp = g.get("kernel_map") if isinstance(g.get("kernel_map"), dict) else None
        if kp is not None and kp.get("contradictions"):  # the map said lossless, yet a cell forked (or the reverse)
            item.setBackground(COL_KERNELS, QBrush(QColor(verdicts.COLOURS["state"])))
            item.setForeground(COL_KERNELS, QBrush(QColor(17, 17, 17)))
        else:
            item.setBackground(COL_KERNELS, QBrush())
            item.setForeground(COL_KERNELS, QBrush())
        a = g.get("answers")
        if a and a["changed"]:  # some answer changed: tinted, and as a state bug where one came with a state fork
            item.setBackground(COL_ANSWERS, QBrush(QColor(verdicts.COLOURS["state" if a["changed_state"] else
                                                                           "diverged"])))
            item.setForeground(COL_ANSWERS, QBrush(QColor(17, 17, 17)))
        else:
            item.setBackground(COL_ANSWERS, QBrush())
            item.setForeground(COL_ANSWERS, QBrush())
        for sev, col in SEVERITY_COLS.items():
            if g["severity"][sev]:
                item.setBackground(col, QBrush(QColor(verdicts.COLOURS[SEVERITY_VERDICT[sev]])))
                item.setForeground(col, QBrush(QColor(17, 17, 17)))  # the tints are light in every theme
            else:
                item.setBackground(col, QBrush())
                item.setForeground(col, QBrush())
        tip = [f"{full or name}: {rate_text(g)}"]
        if g["forks"]:
            tip += [positions_text(g), "gaps: " + severity_text(g)]
        tip += [ln.strip() for ln in ties_lines(g.get("ties"))]
        if kernel_cell(g):
            tip.append("kernel map: " + kernel_cell(g))
        if a:
            tip.append(answers_text(a))
        if g["errors"]:
            tip.append(f"{g['errors']} cell{'s' if g['errors'] != 1 else ''} failed (not counted)")
        for col in range(len(COLUMNS)):
            item.setToolTip(col, "\n".join(tip))

    def _current_changed(self, item: QTreeWidgetItem | None, _prev: QTreeWidgetItem | None = None) -> None:
        self._selected = None if item is None else tuple(item.data(0, KEY_ROLE))
        self._show_selected()

    def _show_selected(self) -> None:
        item = self.tree.currentItem()
        self._selected = None if item is None else tuple(item.data(0, KEY_ROLE))
        g = self.selected_group()
        if g is None:
            self.selection.setText("")
            self.rate_plot.mark(None)
        else:
            key, cat = self._selected
            setting = self.group(key)
            name = setting["label"] + (f" · {cat}" if cat else "")
            self.selection.setText(f"{name}: {rate_text(g)}{ties_summary(g.get('ties'))}")
            self.rate_plot.mark(self.rates["settings"].index(setting))
        self.severity_plot.set_group(g, self.rates.get("gap_bins") or [])
        self.position_plot.set_group(g)

    # -- layout and theme ----------------------------------------------------------
    def _set_compact(self, compact: bool) -> None:
        if compact == self.compact:
            return
        self.compact = compact
        self.body.setVisible(not compact)
        if compact:
            self._fit_compact()
            self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        else:
            self.setMaximumHeight(16_777_215)
            self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        self.sigCompact.emit(compact)

    def _fit_compact(self) -> None:
        """One panel no taller than its line of words (wrapped to the panel's width)."""
        m = self.layout().contentsMargins()
        width = max(200, self.width() - m.left() - m.right())
        height = self.hint.heightForWidth(width) + m.top() + m.bottom() + 2
        if height != self.maximumHeight():
            self.setMaximumHeight(height)
            if self.compact:  # the splitter gives the line what it now needs (new words, a new width)
                self.sigCompact.emit(True)

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().resizeEvent(ev)
        if self.compact:
            self._fit_compact()

    def apply_palette(self, palette: QPalette) -> None:
        for p in (self.rate_plot, self.severity_plot, self.position_plot):
            p.apply_palette(palette)

    def changeEvent(self, ev: QEvent) -> None:  # noqa: N802 - Qt name
        super().changeEvent(ev)
        if ev.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            app = QApplication.instance()
            self.apply_palette(app.palette() if isinstance(app, QApplication) else self.palette())
