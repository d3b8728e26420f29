"""The Kernel map tab's controls: what to map (targets, prompts, widths, positions) and the prescription's inputs.

Plain widgets that only parse what the user typed; the tab
(:mod:`specview.gui.kernels.tab`) turns them into worker requests.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from ...core.errors import ConfigError
from ...core.kernels.text import parse_widths, ranges
from ...core.matrix.prescribe import DEFAULT_CANDIDATES, DEFAULT_TOKENS
from ...core.prompts import builtin_names
from ..panes import is_dark

#: the demo quantizations a map of a demo target offers, from the most to the least precise
DEMO_MAP_TARGETS = ("demo:F16", "demo:Q8_0", "demo:Q4_K_M", "demo:Q4_0")
DEFAULT_WIDTHS_TEXT = "1-16"
DEFAULT_POSITIONS = 128


class CheckList(QListWidget):
    """Names with check boxes; ``touched`` once the user has changed a check."""

    def __init__(self, name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName(name)
        self.touched = False
        self._quiet = False
        self.itemChanged.connect(self._changed)
        self.setUniformItemSizes(True)

    def _changed(self, _item: QListWidgetItem) -> None:
        if not self._quiet:
            self.touched = True

    def names(self) -> list[str]:
        return [self.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.count())]

    def checked(self) -> list[str]:
        return [self.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.count())
                if self.item(i).checkState() == Qt.CheckState.Checked]

    def add(self, name: str, checked: bool, tip: str = "") -> QListWidgetItem:
        """Add ``name`` (or find it) and set its check."""
        item = self.find(name)
        self._quiet = True
        try:
            if item is None:
                item = QListWidgetItem(name)
                item.setData(Qt.ItemDataRole.UserRole, name)
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                item.setToolTip(tip or name)
                self.addItem(item)
            item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
        finally:
            self._quiet = False
        return item

    def find(self, name: str) -> QListWidgetItem | None:
        return next((self.item(i) for i in range(self.count()) if self.item(i).data(Qt.ItemDataRole.UserRole) == name),
                    None)

    def set_names(self, names: Iterable[str], checked: Iterable[str]) -> None:
        on = set(checked)
        self._quiet = True
        try:
            self.clear()
        finally:
            self._quiet = False
        for n in names:
            self.add(n, n in on)

    def set_checked(self, names: Iterable[str]) -> None:
        """Check exactly ``names`` (as a user would: marks the list touched)."""
        on = set(names)
        for i in range(self.count()):
            it = self.item(i)
            it.setCheckState(Qt.CheckState.Checked if it.data(Qt.ItemDataRole.UserRole) in on
                             else Qt.CheckState.Unchecked)


def error_label(name: str) -> QLabel:
    lab = QLabel()
    lab.setObjectName(name)
    lab.setTextFormat(Qt.TextFormat.PlainText)
    lab.setWordWrap(True)
    lab.setVisible(False)
    return lab


def show_field_error(label: QLabel, field: QWidget, message: str | None) -> None:
    """Show ``message`` next to ``field`` (None clears it), in a red that reads on the theme's background."""
    if message is None:
        label.setVisible(False)
        label.setText("")
        field.setStyleSheet("")
        return
    red = "#ff8a80" if is_dark(label.palette()) else "#c62828"
    label.setStyleSheet(f"color:{red}")
    label.setText(message)
    label.setVisible(True)
    field.setStyleSheet(f"border: 1px solid {red}")


def list_height(lst: QListWidget, rows: int) -> int:
    return lst.fontMetrics().lineSpacing() * rows + 4 * rows + 2 * lst.frameWidth() + 4


class MapForm(QGroupBox):
    """Targets, prompts, widths, positions and 'stop at first difference'; the map's buttons."""

    sigAddTarget = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Map", parent)
        self.setObjectName("kernel_form")
        grid = QGridLayout(self)
        grid.setContentsMargins(8, 6, 8, 6)
        grid.setHorizontalSpacing(12)
        grid.setVerticalSpacing(4)

        tcol = QVBoxLayout()
        tcol.setSpacing(2)
        tcol.addWidget(QLabel("Targets"))
        self.targets = CheckList("kernel_targets")
        self.targets.setAccessibleName("Targets to map")
        self.targets.setToolTip("each checked target is one row of the map, under the Run panel's engine settings")
        self.targets.setFixedHeight(list_height(self.targets, 5))
        self.targets.setMinimumWidth(220)
        tcol.addWidget(self.targets)
        self.add_target = QPushButton("Add file…")
        self.add_target.setObjectName("kernel_add_target")
        self.add_target.setToolTip("add a model file (a GGUF for llama.cpp, a model folder for mlx) to the targets")
        self.add_target.clicked.connect(self.sigAddTarget)
        tcol.addWidget(self.add_target, 0, Qt.AlignmentFlag.AlignLeft)
        tcol.addStretch(1)
        grid.addLayout(tcol, 0, 0)

        pcol = QVBoxLayout()
        pcol.setSpacing(2)
        pcol.addWidget(QLabel("Prompts"))
        self.prompts = CheckList("kernel_prompts")
        self.prompts.setAccessibleName("Built-in prompts to map")
        self.prompts.setToolTip("the built-in prompts whose greedy continuations are teacher-forced (the Run "
                                "panel's chat template setting applies)")
        names = builtin_names()
        self.prompts.set_names(names, names)
        self.prompts.setFixedHeight(list_height(self.prompts, 5))
        self.prompts.setMinimumWidth(110)
        self.prompts.setMaximumWidth(170)
        pcol.addWidget(self.prompts)
        pcol.addStretch(1)
        grid.addLayout(pcol, 0, 1)

        form = QFormLayout()
        form.setVerticalSpacing(4)
        form.setHorizontalSpacing(8)  # the style's own spacing is 0 here: "Positions" would touch its box
        self.widths = QLineEdit(DEFAULT_WIDTHS_TEXT)
        self.widths.setObjectName("kernel_widths")
        self.widths.setToolTip("verify widths to map, e.g. 1-16 or 1-4,8,16; width 1 (the rollback control) is "
                               "always mapped. A draft of n_max tokens verifies at widths 1..n_max+1")
        self.widths.setMaximumWidth(160)
        self.widths.textEdited.connect(lambda _t: self.widths_problem())
        self.widths_error = error_label("kernel_widths_error")
        form.addRow("Widths", self.widths)
        form.addRow("", self.widths_error)
        self.positions = QSpinBox()
        self.positions.setObjectName("kernel_positions")
        self.positions.setRange(1, 65536)
        self.positions.setValue(DEFAULT_POSITIONS)
        self.positions.setMaximumWidth(160)
        self.positions.setToolTip("teacher-forced positions per prompt, measured at every width: a claim covers "
                                  "these positions and no more (map as far as you generate)")
        form.addRow("Positions", self.positions)
        self.stop = QCheckBox("Stop at first difference")
        self.stop.setObjectName("kernel_stop")
        self.stop.setToolTip("stop measuring a width at its first differing row: the safe widths are answered as "
                             "fully, for less time, but a differing width's figures cover only the rows measured")
        form.addRow("", self.stop)
        self.engine = QLabel()
        self.engine.setObjectName("kernel_engine")
        self.engine.setTextFormat(Qt.TextFormat.PlainText)
        self.engine.setWordWrap(True)
        self.engine.setMinimumWidth(200)
        self.engine.setToolTip("the map uses the engine and engine settings of the Run panel: the thread count, "
                               "flash attention and -ub change the kernels, so map with the settings you run")
        form.addRow("Engine", self.engine)
        grid.addLayout(form, 0, 2)
        grid.setColumnStretch(2, 1)

        bcol = QVBoxLayout()
        bcol.setSpacing(4)
        self.run_button = QPushButton("Run map")
        self.run_button.setObjectName("kernel_run")
        self.run_button.setDefault(True)
        self.run_button.setToolTip("compute the map on the model worker (Ctrl+K); Esc cancels")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("kernel_cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.setToolTip("stop the map or the prescription within one forward pass (Esc)")
        self.open_button = QPushButton("Open map…")
        self.open_button.setObjectName("kernel_open")
        self.open_button.setToolTip("show a saved kernel map (specview.kernels/1 JSON, from `specview kernels -o`)")
        self.save_button = QPushButton("Save map…")
        self.save_button.setObjectName("kernel_save")
        self.save_button.setEnabled(False)
        self.save_button.setToolTip("write the map shown as JSON (specview.kernels/1)")
        for b in (self.run_button, self.cancel_button, self.open_button, self.save_button):
            b.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
            bcol.addWidget(b)
        bcol.addStretch(1)
        grid.addLayout(bcol, 0, 3)

    def show_map_settings(self, km: Any) -> None:
        """Take a map's targets, built-in prompts, widths and positions, so Run map computes it again."""
        for t in km.targets:
            self.targets.add(t.target, True)
        self.targets.set_checked(t.target for t in km.targets)
        builtin = set(self.prompts.names())
        names = [p.name for p in km.prompts]
        if names and all(n in builtin for n in names):
            self.prompts.set_checked(names)
        self.targets.touched = True  # the map's targets are the choice now, whatever the Run panel's target
        self.widths.setText(ranges(km.widths).replace(" ", ""))
        self.widths_problem()
        self.positions.setValue(int(km.positions))

    def widths_problem(self) -> str | None:
        """Parse the widths; show what is wrong next to the field (and return it), or clear it."""
        try:
            parse_widths(self.widths.text())
        except ConfigError as exc:
            msg = f"{exc}"
            show_field_error(self.widths_error, self.widths, msg)
            return msg
        if not self.widths.text().strip():
            show_field_error(self.widths_error, self.widths, "give the widths to map, e.g. 1-16")
            return "give the widths to map, e.g. 1-16"
        show_field_error(self.widths_error, self.widths, None)
        return None


class PrescriptionPanel(QGroupBox):
    """The prescription's inputs (n_max to measure, tokens per arm), its buttons and its read-only text."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Prescription", parent)
        self.setObjectName("kernel_prescription")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 6, 8, 6)
        lay.setSpacing(4)
        buttons = QHBoxLayout()
        self.prescribe_button = QPushButton("Prescribe")
        self.prescribe_button.setObjectName("kernel_prescribe")
        self.prescribe_button.setEnabled(False)
        self.prescribe_button.setToolTip("turn the map shown into settings proven lossless here, each with its "
                                         "speedup measured with the Run panel's draft model")
        self.save_button = QPushButton("Save prescription…")
        self.save_button.setObjectName("kernel_save_prescription")
        self.save_button.setEnabled(False)
        self.save_button.setToolTip("write the prescription as JSON (specview.prescription/1)")
        buttons.addWidget(self.prescribe_button)
        buttons.addWidget(self.save_button)
        buttons.addStretch(1)
        lay.addLayout(buttons)
        row = QHBoxLayout()
        row.addWidget(QLabel("n_max"))
        self.candidates = QLineEdit(ranges(DEFAULT_CANDIDATES))
        self.candidates.setObjectName("kernel_candidates")
        self.candidates.setToolTip("the n_max values whose speed is measured (each up to the widest width mapped "
                                   "minus one); the largest one the map proves is always measured")
        self.candidates.setMaximumWidth(150)
        self.candidates.textEdited.connect(lambda _t: self.candidates_problem())
        row.addWidget(self.candidates)
        row.addWidget(QLabel("tokens per arm"))
        self.tokens = QSpinBox()
        self.tokens.setObjectName("kernel_tokens")
        self.tokens.setRange(4, 8192)
        self.tokens.setValue(DEFAULT_TOKENS)
        self.tokens.setToolTip("tokens per arm of each speed run (end-of-generation ignored)")
        row.addWidget(self.tokens)
        row.addStretch(1)
        lay.addLayout(row)
        self.candidates_error = error_label("kernel_candidates_error")
        lay.addWidget(self.candidates_error)
        self.draft = QLabel()
        self.draft.setObjectName("kernel_draft")
        self.draft.setTextFormat(Qt.TextFormat.PlainText)
        self.draft.setWordWrap(True)
        lay.addWidget(self.draft)
        self.text = QPlainTextEdit()
        self.text.setObjectName("kernel_prescription_text")
        self.text.setAccessibleName("Prescription")
        self.text.setReadOnly(True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setPlaceholderText("Prescribe turns the map shown into the speculative settings it proves "
                                     "lossless here, each with its measured speedup over plain decoding, and the "
                                     "fastest lossy setting for comparison. It runs both arms with the Run panel's "
                                     "draft model for each n_max, on the map's prompts.")
        lay.addWidget(self.text, 1)

    def candidates_problem(self) -> str | None:
        try:
            parse_widths(self.candidates.text())
        except ConfigError as exc:
            msg = str(exc).replace("widths", "n_max values").replace("a width", "an n_max")
            show_field_error(self.candidates_error, self.candidates, msg)
            return msg
        show_field_error(self.candidates_error, self.candidates, None)
        return None

    def candidate_values(self) -> tuple[int, ...]:
        return parse_widths(self.candidates.text())
