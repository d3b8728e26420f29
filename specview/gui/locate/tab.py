"""The Locate tab: where a batched verify pass first departs from the single-token pass, node by node.

It shows a saved locate (``specview.locate/1``, from File ▸ Open) or the
``departure`` a near-tie diagnosis recorded for the run on screen: a line
saying where the pass first departs, the |Δ|-along-the-graph plot, and the
locate's text.  A departure saved before the diagnosis kept its nodes has no
plot; the tab says how to get one.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QLabel, QPlainTextEdit, QSplitter, QTabWidget, QVBoxLayout, QWidget

from ...core.diagnose import departure_line
from ...core.errors import SpecviewError
from ...core.jsonfile import declares_schema
from ...core.locate.find import NO_FLIP_ON_A_SHARED_PREFIX, Located
from ...core.locate.plot import series_of
from ..verdict_bar import LOCATE_LINK
from .plot import LocatePlot

TAB_TIP = ("Where a verify pass first departs from the single-token pass: each graph node's |Δ| (specview locate, "
           "or a near-tie diagnosis of the run on screen)")


def is_locate_file(path: str | os.PathLike[str]) -> bool:
    """True for a ``specview.locate/...`` JSON file, read from its first bytes only."""
    return declares_schema(path, "specview.locate")


def departure_of(trace: Any) -> dict[str, Any] | None:
    """The near-tie diagnosis' departure record of ``trace``, where it located one."""
    d = trace.diagnosis if isinstance(getattr(trace, "diagnosis", None), dict) else {}
    dep = d.get("departure")
    return dep if isinstance(dep, dict) and not dep.get("skipped") and dep.get("where") else None


def locate_link(trace: Any) -> str:
    """The verdict bar's line for a departure: where the verify pass departs, linking to the Locate tab, or why it
    was not located ('' when the diagnosis has no departure)."""
    d = trace.diagnosis if isinstance(getattr(trace, "diagnosis", None), dict) else {}
    raw = d.get("departure")
    if isinstance(raw, dict) and raw.get("skipped"):
        return f"<br>Not located: {html.escape(str(raw['skipped']))}"
    dep = departure_of(trace)
    if dep is None:
        return ""
    words = departure_line(dep) or ""
    words = words[len("located: "):] if words.startswith("located: ") else words
    return (f"<br><b>Located</b>: {html.escape(words)} · <a href=\"{LOCATE_LINK}\">Show it along the graph</a>")


def departure_text(dep: dict[str, Any]) -> str:
    """The near-tie diagnosis' departure in sentences: where the verify pass departs, what its logits did, and,
    where they did not flip, why the run's fork still did (the note ``specview locate --trace`` prints)."""
    out = [f"Located on the same single-token prefix, row {dep.get('row')} of the width-{dep.get('width')} verify "
           f"pass at token {dep.get('position')} {dep['where']}."]
    if dep.get("weight_type") or dep.get("computed_in"):
        out.append(f"The op's weights: {dep.get('weight_type') or '?'} in {dep.get('weight_buffer') or '?'}; "
                   f"computed in {dep.get('computed_in') or '?'}.")
    n_diff, n_vocab = dep.get("logits_differ"), dep.get("n_vocab")
    if isinstance(n_diff, int) and isinstance(n_vocab, int):
        out.append(f"Its logits: {n_diff:,} of {n_vocab:,} differ between the two passes.")
        if n_diff == 0:
            out.append(f"So {NO_FLIP_ON_A_SHARED_PREFIX}.")
    if dep.get("observer_exact") is False:
        out.append("Observing the passes moved their logits: compare only what it says with that in mind.")
    return "\n\n".join(out)


class LocateTab(QWidget):
    """The header line, the plot and the text of one locate or departure."""

    sigStatus = Signal(str)
    sigError = Signal(str, str)
    sigShown = Signal(object)  # the Located, or the departure record, now shown

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.header = QLabel("No locate yet: open one (File ▸ Open, a file from <code>specview locate --json</code>) "
                             "or diagnose a run whose fork is a near-tie.")
        self.header.setObjectName("locate_header")
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.header.setWordWrap(True)
        self.header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.plot = LocatePlot()
        self.details = QPlainTextEdit()
        self.details.setReadOnly(True)
        self.details.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.details.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.details.setPlaceholderText("The locate's text: the first differing node, its inputs, how the "
                                        "difference grows layer by layer, the logits.")
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.plot)
        split.addWidget(self.details)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        lay.addWidget(self.header)
        lay.addWidget(split, 1)
        self.located: Located | None = None
        self.departure: dict[str, Any] | None = None
        self.source: Path | None = None

    @classmethod
    def attach(cls, w: Any) -> LocateTab:
        """A Locate tab added to the main window ``w``'s tabs: its errors and status in the window, the verdict
        bar's link bringing it to the front, File ▸ Export Report following what it shows."""
        tab = cls()
        w.tabs.setTabToolTip(w.tabs.addTab(tab, "Locate"), TAB_TIP)
        tab.sigError.connect(w.show_error)
        tab.sigStatus.connect(w.show_status)
        tab.sigShown.connect(lambda _x: w.update_export_actions())
        w.verdict.sigLocate.connect(tab.bring_to_front)
        return tab

    def bring_to_front(self) -> None:
        tabs = self.parent()
        while tabs is not None and not isinstance(tabs, QTabWidget):
            tabs = tabs.parent()
        if tabs is not None:
            tabs.setCurrentWidget(self)

    def apply_palette(self, palette) -> None:
        self.plot.apply_palette(palette)

    # -- what it shows ---------------------------------------------------------------------
    def show_located(self, loc: Located, source: str | os.PathLike[str] | None = None) -> None:
        self.located, self.departure = loc, None
        self.source = Path(source) if source is not None else None
        self.plot.set_series(series_of(loc))
        name = f"{html.escape(self.source.name)}: " if self.source else ""
        self.header.setText(f"<b>{name}{html.escape(loc.target)}</b>, token {loc.position} as row {loc.row} of a "
                            f"width-{loc.width} pass: {html.escape(loc.where())}")
        self.details.setPlainText(loc.text())
        self.sigShown.emit(loc)

    def show_departure(self, trace: Any) -> bool:
        """Show the departure a near-tie diagnosis of ``trace`` recorded; False (and the tab cleared of any earlier
        departure) when it has none.  A locate opened from a file stays until another is shown."""
        dep = departure_of(trace)
        if dep is None:
            if self.departure is not None:
                self.clear()
            return False
        self.located, self.departure, self.source = None, dep, None
        s = series_of(dep)
        self.plot.set_series(s)
        if s is None:
            self.plot.set_hint("This diagnosis kept where the pass departs but not its nodes: run "
                               "`specview locate --trace TRACE.json --json OUT` and open OUT for the plot.")
        self.header.setText(f"<b>The run's fork</b>: row {dep.get('row')} of the width-{dep.get('width')} verify "
                            f"pass {html.escape(str(dep['where']))}")
        self.details.setPlainText(departure_text(dep))
        self.sigShown.emit(dep)
        return True

    def clear(self) -> None:
        self.located = self.departure = self.source = None
        self.plot.set_hint(None)
        self.plot.set_series(None)
        self.header.setText("No locate yet.")
        self.details.clear()

    def open(self, path: str | os.PathLike[str]) -> bool:
        """Show a ``specview.locate/1`` file; any other file is refused in the window, naming it."""
        try:
            loc = Located.load(path)
        except SpecviewError as exc:
            msg = str(exc)
            self.sigError.emit(msg if str(path) in msg else f"{path}: {msg}", "")
            return False
        self.show_located(loc, path)
        self.bring_to_front()
        self.sigStatus.emit(f"locate {path}")
        return True
