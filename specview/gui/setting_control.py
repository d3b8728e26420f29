"""One declared setting's control: the widget its type calls for, its label, range and tool tip from the declaration."""

from __future__ import annotations

import functools
import re
from dataclasses import Field
from typing import Any

from PySide6.QtCore import QSignalBlocker
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox, QWidget

from ..core.config import check_value, typed_default
from ..core.errors import ConfigError
from ..core.registry import get_backend

#: settings llama.cpp reads from the environment with this prefix, and the ggml backend they belong to
BUILD_KNOBS = {"GGML_VK_": "vulkan"}
INT_MAX = 1_000_000


@functools.lru_cache(maxsize=None)
def engine_builds(engine: str, api: str) -> bool:
    """Whether ``engine``'s llama.cpp build has the ggml backend ``api`` (True where the engine cannot tell, e.g. a
    server binary, so its knobs stay offered)."""
    try:
        builds = getattr(get_backend(engine), "builds_backend", None)
        return True if builds is None else bool(builds(api))
    except Exception:
        return True


def special_text(f: Field) -> str:
    """What a setting's lowest value means, in a word or two, when its declaration says so
    (``special=...``, or its help text's "``-1 = all``"); "" when it does not."""
    if f.metadata.get("special"):
        return str(f.metadata["special"])
    lo = f.metadata.get("min")
    m = re.search(r"(-?\d+)\s*=\s*([^,;(]+)", f.metadata.get("help") or "")
    if lo is None or m is None or int(m.group(1)) != lo:
        return ""
    return m.group(2).strip()


def _tooltip(f: Field) -> str:
    flags = " / ".join(f.metadata.get("flags") or ())
    helptext = f.metadata.get("help") or ""
    return f"{flags}: {helptext}" if flags else helptext


class SettingControl:
    """One declared setting's widget: reads and writes the setting's value."""

    def __init__(self, cls: type, f: Field, on_change):
        self.cls, self.field, self.name = cls, f, f.name
        meta = f.metadata
        d = typed_default(f)
        self.default = d
        tip = _tooltip(f)
        label = meta.get("label") or f.name
        if isinstance(d, bool):
            w: QWidget = QCheckBox(label)
            w.toggled.connect(on_change)
            self.label = ""
        elif meta.get("choices"):
            w = QComboBox()
            for c in meta["choices"]:
                w.addItem(str(c), c)
            w.currentIndexChanged.connect(on_change)
            self.label = label
        elif isinstance(d, int):
            w = QSpinBox()
            lo, hi = meta.get("min"), meta.get("max")
            w.setRange(int(lo) if lo is not None else -INT_MAX, int(hi) if hi is not None else INT_MAX)
            special = special_text(f)
            if special:
                w.setSpecialValueText(special)  # "-1 = all" reads better as "all"
            w.setKeyboardTracking(False)
            w.valueChanged.connect(on_change)
            self.label = label
        elif isinstance(d, float):
            w = QDoubleSpinBox()
            lo, hi = meta.get("min"), meta.get("max")
            w.setRange(lo if lo is not None else -1e9, hi if hi is not None else 1e9)
            w.setDecimals(3)
            w.setSingleStep((hi - lo) / 20 if lo is not None and hi is not None else 0.1)
            w.setKeyboardTracking(False)
            w.valueChanged.connect(on_change)
            self.label = label
        else:
            w = QLineEdit()
            if not d:
                w.setPlaceholderText("default")
            w.editingFinished.connect(on_change)
            self.label = label
        w.setObjectName(f.name)
        w.setToolTip(tip)
        self.widget = w

    def value(self) -> Any:
        w = self.widget
        if isinstance(w, QCheckBox):
            return w.isChecked()
        if isinstance(w, QComboBox):
            return w.currentData()
        if isinstance(w, QDoubleSpinBox):
            return round(w.value(), 6)
        if isinstance(w, QSpinBox):
            return w.value()
        return w.text().strip()

    def set_value(self, value: Any) -> bool:
        """Show ``value`` if the declaration accepts it; False (the control unchanged) if not."""
        try:
            value = check_value(self.cls, self.name, value)
        except ConfigError:
            return False
        w = self.widget
        with QSignalBlocker(w):
            if isinstance(w, QCheckBox):
                w.setChecked(bool(value))
            elif isinstance(w, QComboBox):
                w.setCurrentIndex(max(0, w.findData(value)))
            elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
                w.setValue(value)
            else:
                w.setText(str(value))
        return True

    def applies_to(self, engine: str) -> bool:
        only = self.field.metadata.get("only_for") or ()
        if only and engine not in only:
            return False
        env = str(self.field.metadata.get("env") or "")
        api = next((a for prefix, a in BUILD_KNOBS.items() if env.startswith(prefix)), None)
        return api is None or engine_builds(engine, api)  # Vulkan's knobs only for a Vulkan build
