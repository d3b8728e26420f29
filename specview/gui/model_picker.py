"""A model picker: a demo name or a model path, a browse button, and the model's other quantizations.

What a model is depends on the engine (``Backend.model_kind``): a GGUF file
("gguf") or a model folder ("folder").  For a model with several
quantizations beside it, a second list flips between them; entries marked
"derive" are written from the highest-precision copy on demand.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSignalBlocker, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QStyle,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from . import models as gmodels


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
        for name in gmodels.DEMO_CHOICES:
            self.combo.addItem(name)
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

    def set_value(self, name: str, *, emit: bool = False) -> None:
        with QSignalBlocker(self.combo):
            i = self.combo.findText(name)
            if i < 0:
                self.combo.addItem(name)
                i = self.combo.count() - 1
            self.combo.setCurrentIndex(i)
        self._refresh_quants(name)
        if emit:
            self._commit()
        else:
            self._last = name

    def remember(self, names: list[str]) -> None:
        """Offer ``names`` (recently used models) in the list."""
        for name in names:
            if isinstance(name, str) and name and self.combo.findText(name) < 0:
                self.combo.addItem(name)

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
