"""A model picker: a demo name, a found model or a path, a browse button, and the model's other quantizations.

What a model is depends on the engine (``Backend.model_kind``): a GGUF file
("gguf") or a model folder ("folder").  The list opens as a table grouped by
model family and vocabulary, each row with its size, quantization and store
(:class:`~specview.gui.models.catalog.Group`); typing filters the names by any
part (a completer that matches inside the name).  For a model with several
quantizations beside it, a second list flips between them; entries marked
"derive" are written from the highest-precision copy on demand.  A line under
the picker (:meth:`ModelPicker.set_note`) says why a list is empty or a choice
is refused.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QModelIndex, QSignalBlocker, QStringListModel, Qt, Signal
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QCompleter,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QStyle,
    QToolButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from . import choices as gmodels
from .catalog import Catalog, Entry, Group

#: the list's columns (the name is what the combo shows and returns)
COLUMNS = ("name", "size", "quant", "source")
HEADING = Qt.ItemDataRole.UserRole + 1  # True on a group's heading row
OTHER_GROUP = "Recent and typed"
NOTE_COLOURS = {"info": "", "warn": "#b07000", "error": "#c0392b"}


class ModelPicker(QWidget):
    """A model name or path, with a browse button and, for a model with several quantizations, a list to flip."""

    sigChanged = Signal(str)
    sigDeriveWanted = Signal(object)  # models.QuantChoice

    def __init__(self, role: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.role = role
        self.combo = QComboBox()
        self.combo.setEditable(True)
        self.combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.combo.setObjectName(f"{role}_model")
        self.combo.setMinimumContentsLength(14)
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.list_model = QStandardItemModel(0, len(COLUMNS), self)
        self.combo.setModel(self.list_model)
        self.view = QTreeView()
        self.view.setObjectName(f"{role}_list")
        self.view.setHeaderHidden(True)
        self.view.setRootIsDecorated(False)
        self.view.setItemsExpandable(False)
        self.view.setUniformRowHeights(True)
        self.view.setAllColumnsShowFocus(True)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.combo.setView(self.view)
        self.combo.setMaxVisibleItems(22)
        self.names_model = QStringListModel(self)
        self.completer = QCompleter(self.names_model, self)
        self.completer.setFilterMode(Qt.MatchFlag.MatchContains)
        self.completer.setCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.completer.setCompletionMode(QCompleter.CompletionMode.PopupCompletion)
        self.completer.setMaxVisibleItems(14)
        self.combo.setCompleter(self.completer)
        self.groups: list[Group] = []
        self.recent: list[str] = []  # names used before (:meth:`remember`)
        self.show_recent = True  # False: the recent names are not offered (the draft list offers what fits)
        self.set_groups([Catalog().demo_group(gmodels.DEMO_CHOICES)])
        with QSignalBlocker(self.combo):
            self.combo.setCurrentIndex(self.combo.findText(gmodels.DEMO_CHOICES[0]))
        self.browse = QToolButton()
        self.browse.setText("…")
        self.browse.clicked.connect(self._browse)
        self.folder = QToolButton()
        self.folder.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_DirOpenIcon))
        self.folder.setToolTip("choose a folder holding several quantizations of one model")
        self.folder.clicked.connect(self._browse_folder)
        self.quants = QComboBox()
        self.quants.setObjectName(f"{role}_quants")
        self.quants.setToolTip("quantizations of this model; entries marked 'derive' are made from the "
                               "higher-precision copy")
        self.quants.setVisible(False)
        self.quants.activated.connect(self._quant_chosen)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.setSpacing(2)
        top.addWidget(self.combo, 1)
        top.addWidget(self.browse)
        top.addWidget(self.folder)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(top)
        lay.addWidget(self.quants)
        self.note = QLabel("")
        self.note.setObjectName(f"{role}_note")
        self.note.setWordWrap(True)
        self.note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.note.setVisible(False)
        self.note_kind = ""
        lay.addWidget(self.note)
        self.combo.activated.connect(lambda _i: self._commit())
        self.combo.lineEdit().editingFinished.connect(self._commit)
        self._last = ""
        self.choices: list[gmodels.QuantChoice] = []
        self.model_kind = ""
        self.set_model_kind("gguf")

    def set_model_kind(self, kind: str) -> None:
        """"gguf": the browse button picks a GGUF file; "folder": it picks a model folder."""
        if kind == self.model_kind:
            return
        self.model_kind = kind
        folder = kind == "folder"
        self.folder.setVisible(not folder)
        icon = QStyle.StandardPixmap.SP_DirOpenIcon if folder else QStyle.StandardPixmap.SP_FileIcon
        self.browse.setIcon(self.style().standardIcon(icon))
        if folder:
            self.browse.setToolTip(f"choose the MLX model folder of the {self.role} (written by mlx_lm.convert)")
            self.combo.setToolTip("a demo quantization or the path of an MLX model folder")
        else:
            self.browse.setToolTip(f"choose a GGUF file for the {self.role}")
            self.combo.setToolTip("a demo quantization (derived on first use) or the path of a GGUF file")
        self._refresh_quants(self.value())

    def value(self) -> str:
        return self.combo.currentText().strip()

    # -- the list ----------------------------------------------------------------------------
    def set_groups(self, groups: list[Group]) -> None:
        """List ``groups`` (each a heading and its rows); the current name stays, listed or not."""
        cur = self.value()
        self.groups = list(groups)
        with QSignalBlocker(self.combo):
            self.list_model.removeRows(0, self.list_model.rowCount())
            listed = {e.name for g in self.groups for e in g.entries}
            extras = [n for n in (self.recent if self.show_recent else []) if n not in listed]
            shown = self.groups + ([Group(OTHER_GROUP, tuple(Entry(n) for n in extras))] if extras else [])
            for g in shown:
                self._add_heading(g)
                for e in g.entries:
                    self._add_entry(e)
            self._restore(cur)
        self.names_model.setStringList([e.name for g in shown for e in g.entries])
        self._fit_popup()

    def _add_heading(self, g: Group) -> None:
        item = QStandardItem(g.title)
        item.setFlags(Qt.ItemFlag.NoItemFlags)  # never chosen, skipped by the arrow keys
        font = item.font()
        font.setBold(True)
        item.setFont(font)
        item.setData(True, HEADING)
        item.setToolTip(g.tip)
        self.list_model.appendRow(item)
        self.view.setFirstColumnSpanned(self.list_model.rowCount() - 1, QModelIndex(), True)

    def _add_entry(self, e: Entry) -> None:
        cells = [QStandardItem(v) for v in (e.name, e.size, e.quant, e.source)]
        for c in cells:
            c.setToolTip(e.tip or e.name)
            c.setEditable(False)
        cells[1].setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.list_model.appendRow(cells)

    def _restore(self, name: str) -> None:
        i = self.combo.findText(name) if name else -1
        if name and i < 0:  # the current name stays listed even where no group offers it
            self._add_entry(Entry(name))
            i = self.combo.count() - 1
        self.combo.setCurrentIndex(i)
        if i < 0:
            self.combo.setEditText(name)

    def _fit_popup(self) -> None:
        for c in range(len(COLUMNS)):
            self.view.resizeColumnToContents(c)
        width = sum(self.view.columnWidth(c) for c in range(len(COLUMNS))) + 24
        width += self.view.verticalScrollBar().sizeHint().width()
        self.view.setMinimumWidth(min(width, 760))

    def entry(self, name: str) -> Entry | None:
        """The row listed for ``name`` (its size, quantization, store), None when it is not listed."""
        return next((e for g in self.groups for e in g.entries if e.name == name), None)

    def names(self) -> list[str]:
        """Every name the list offers, in its order (headings left out)."""
        return [self.combo.itemText(i) for i in range(self.combo.count())
                if not self.list_model.item(i, 0).data(HEADING)]

    def set_note(self, text: str, kind: str = "info", *, tip: str = "") -> None:
        """The line under the picker ("" hides it); ``kind`` "warn" or "error" colours it; ``tip``, the whole
        story when the line is a short one."""
        self.note_kind = kind if text else ""
        colour = NOTE_COLOURS.get(kind, "")
        self.note.setStyleSheet(f"color: {colour};" if colour else "")
        self.note.setText(text)
        self.note.setToolTip(tip or text)
        self.note.setVisible(bool(text))
        self._fit_note()

    def _fit_note(self) -> None:
        """A wrapped label in a form in a scroll area is not given its height for its width: ask it, at the
        width it has (the picker's before the first layout)."""
        width = self.note.width() if self.note.width() > 50 else self.width()
        self.note.setMinimumHeight(0)  # else the label answers with the height it was fixed at
        self.note.setMaximumHeight(16777215)
        self.note.setFixedHeight(self.note.heightForWidth(max(width, 50)) if self.note.text() else 0)

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().resizeEvent(ev)
        self._fit_note()

    def set_value(self, name: str, *, emit: bool = False) -> None:
        with QSignalBlocker(self.combo):
            i = self.combo.findText(name)
            if i < 0:
                self._add_entry(Entry(name))
                i = self.combo.count() - 1
            self.combo.setCurrentIndex(i)
        self._refresh_quants(name)
        if emit:
            self._commit()
        else:
            self._last = name

    def remember(self, names: list[str]) -> None:
        """Offer ``names`` (recently used models) in the list."""
        new = [n for n in names if isinstance(n, str) and n and n not in self.recent]
        if new:
            self.recent.extend(new)
            if self.show_recent:
                self.set_groups(self.groups)

    def _commit(self) -> None:
        v = self.value()
        if v == self._last:
            return
        self._last = v
        self._refresh_quants(v)
        self.sigChanged.emit(v)

    def _refresh_quants(self, name: str) -> None:
        self.choices = gmodels.variants(name, self.model_kind)
        self.quants.setVisible(len(self.choices) > 1)
        with QSignalBlocker(self.quants):
            self.quants.clear()
            for c in self.choices:
                self.quants.addItem(c.label)
            cur = {str(Path(name).expanduser()), str(Path(name).expanduser().resolve())} if name else set()
            for i, c in enumerate(self.choices):
                if c.exists and c.path in cur:
                    self.quants.setCurrentIndex(i)

    def _quant_chosen(self, i: int) -> None:
        if not 0 <= i < len(self.choices):
            return
        c = self.choices[i]
        if c.exists:
            self.set_value(c.path, emit=True)
        else:
            self.sigDeriveWanted.emit(c)

    def _browse(self) -> None:
        start = self.value() if Path(self.value()).expanduser().exists() else str(Path.home())
        if self.model_kind == "folder":
            folder = QFileDialog.getExistingDirectory(self, f"Model folder of the {self.role}", start)
            if folder:
                self.set_value(folder, emit=True)
            return
        path, _ = QFileDialog.getOpenFileName(self, f"Choose the {self.role} model", start,
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.set_value(path, emit=True)

    def _browse_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, f"Folder with quantizations of the {self.role} model",
                                                  str(Path.home()))
        if not folder:
            return
        choices = [c for c in gmodels.siblings(folder) if c.exists]
        if choices:
            self.set_value(choices[0].path, emit=True)
