"""The Probe tab: ``specview probe`` in the app, its table filled row by row as each trigger is proven.

The probe runs as a job on the model worker (:class:`~specview.gui.messages.JobRequest`) for the Run panel's
target and engine settings: the in-process half on that engine, the llama-server half (when asked for) on the
Run panel's server binary.  A saved report (``specview probe --json``) opens here too.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QCheckBox, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QPushButton, QSpinBox,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ...core.config import RunConfig
from ...core.errors import SpecviewError
from ...core.jsonfile import declares_schema
from ...core.probe.result import IDENTICAL, NEAR_TIE, STATE, ProbeReport, TriggerResult
from ...core.verdicts import COLOURS
from ..messages import JobFinished, JobRequest
from ..worker import WorkerHost

TAB_TIP = ("The known triggers of real rollback and state bugs (zero-draft after accepted drafts, whole rejections, "
           "deep rollbacks, a neighbour request, the context's edge, a long run, n-gram loops, every rollback mode), "
           "each forced and proven by its control")
COLUMNS = ("Trigger", "Variant", "Engine", "Result", "Tokens", "Fork", "Evidence")
#: each result's cell colour, from the verdicts' own
RESULT_COLOURS = {IDENTICAL: COLOURS["identical"], NEAR_TIE: COLOURS["near-tie"], STATE: COLOURS["state"]}
#: the verdict bar's tint for a report's worst result
RESULT_KINDS = {IDENTICAL: "ok", NEAR_TIE: "warn", STATE: "bad"}


def is_probe_file(path: str | os.PathLike[str]) -> bool:
    """True for a ``specview.probe/...`` JSON file, read from its first bytes only."""
    return declares_schema(path, "specview.probe")


class ProbeTab(QWidget):
    """The form (tokens, long run, llama-server too), the table, and the worker job that fills it."""

    sigStatus = Signal(str)
    sigError = Signal(str, str)
    sigBusy = Signal(bool, str)
    sigShown = Signal(object)  # the ProbeReport now shown
    _sigRow = Signal(int, object)  # request id, TriggerResult (from the worker thread)

    def __init__(self, host: WorkerHost | None, config: Callable[[], RunConfig], parent: QWidget | None = None):
        super().__init__(parent)
        self.host, self.config = host, config
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        form = QHBoxLayout()
        self.tokens = QSpinBox()
        self.tokens.setRange(8, 4096)
        self.tokens.setValue(48)
        self.tokens.setToolTip("tokens per short run")
        self.long = QSpinBox()
        self.long.setRange(8, 65536)
        self.long.setValue(2048)
        self.long.setToolTip("tokens of the long run")
        self.server = QCheckBox("Also on llama-server")
        self.server.setToolTip("run the triggers on the Run panel's llama-server binary too (-ub 1 the control)")
        self.run_button = QPushButton("Run probe")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.open_button = QPushButton("Open…")
        for label, wdg in (("Tokens", self.tokens), ("Long run", self.long)):
            form.addWidget(QLabel(label))
            form.addWidget(wdg)
        for wdg in (self.server, self.run_button, self.cancel_button, self.open_button):
            form.addWidget(wdg)
        form.addStretch(1)
        lay.addLayout(form)
        self.title = QLabel("No probe yet: Run probe forces each trigger on the Run panel's target.")
        self.title.setObjectName("probe_title")
        self.title.setWordWrap(True)
        self.title.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.title)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("probe_table")
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.horizontalHeader().setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(True)
        lay.addWidget(self.table, 1)
        self.report: ProbeReport | None = None
        self.request: JobRequest | None = None
        self._rows: list[TriggerResult] = []
        self.run_button.clicked.connect(lambda _c=False: self.start())
        self.cancel_button.clicked.connect(self.cancel)
        self.open_button.clicked.connect(self.choose_file)
        self._sigRow.connect(self._on_row)
        if host is not None:
            host.worker.sigJobFinished.connect(self._on_finished)  # bound slots: queued into this thread
            host.worker.sigFailed.connect(self._on_failed)

    @classmethod
    def attach(cls, w: Any) -> "ProbeTab":
        """A Probe tab added to the main window ``w``'s tabs, its errors, status and busy state in the window."""
        tab = cls(w.host, w.build_config)
        w.tabs.setTabToolTip(w.tabs.addTab(tab, "Probe"), TAB_TIP)
        tab.sigError.connect(w.show_error)
        tab.sigStatus.connect(w.show_status)
        tab.sigBusy.connect(w.set_busy)
        # a report shown while the tab is in front (a probe finished, a file opened) is the verdict bar's
        tab.sigShown.connect(lambda _r: w.on_tab_changed(w.tabs.currentIndex()) if w.tabs.currentWidget() is tab
                             else None)
        return tab

    # -- running ---------------------------------------------------------------------------------
    def start(self) -> JobRequest | None:
        """Probe the Run panel's target on the worker; the table fills as each row is proven."""
        from ...core.probe.run import run_probe

        try:
            cfg = self.config()
        except SpecviewError as exc:
            self.sigError.emit(f"Probe: {exc}", "")
            return None
        from ...core.registry import get_backend

        server, n, long_n = self.server.isChecked(), self.tokens.value(), max(self.long.value(), self.tokens.value())
        try:
            be = get_backend(cfg.backend)
        except SpecviewError as exc:
            self.sigError.emit(f"Probe: {exc}", "")
            return None
        in_process = be.in_process
        if not in_process and be.model_kind != "gguf":
            self.sigError.emit(f"Probe: the probe runs in-process and on llama-server; the {cfg.backend} engine is "
                               "neither", "")
            return None

        def work(runner: Any, text: Any, fraction: Any, cancel: Any) -> Any:
            return run_probe(cfg.target, backend=cfg.backend if in_process else "llama.cpp", settings=cfg.engine,
                             in_process=in_process, server=server or not in_process, n=n, long_n=long_n,
                             n_max=max(1, cfg.n_max), progress=text, cancel=cancel,
                             on_row=lambda row: self._sigRow.emit(rid, row), runner=runner if in_process else None)

        req = JobRequest(cfg.backend, work)
        rid = req.id
        self.request = req
        self._rows = []
        self.table.setRowCount(0)
        self.title.setText(f"Probing <b>{html.escape(cfg.target)}</b>…")
        if self.host is not None:
            self.host.submit_job(req)
        self._busy(True)
        self.sigBusy.emit(True, "probe: forcing each trigger…")
        return req

    def cancel(self) -> None:
        if self.request is not None:
            self.request.cancel()
            self.sigStatus.emit("cancelling the probe (stops within one forward pass)…")

    def _busy(self, on: bool) -> None:
        self.run_button.setEnabled(not on)
        self.cancel_button.setEnabled(on)

    def _on_row(self, rid: int, row: TriggerResult) -> None:
        if self.request is None or rid != self.request.id:
            return
        self._rows.append(row)
        self._add_row(row)
        self.sigStatus.emit(f"probe: {row.trigger} ({row.label}, {row.engine}): {row.result}")

    def _on_finished(self, ev: JobFinished) -> None:
        if self.request is None or ev.request_id != self.request.id:
            return
        self.request = None
        self._busy(False)
        if ev.result is None:
            self.title.setText(f"Probe cancelled after {ev.seconds:.1f} s; {len(self._rows)} rows finished.")
            self.sigBusy.emit(False, "probe cancelled")
            return
        self.show_report(ev.result)
        self.sigBusy.emit(False, f"probe done in {ev.seconds:.1f} s")

    def _on_failed(self, ev: Any) -> None:
        if self.request is None or getattr(ev, "request_id", None) != self.request.id:
            return
        self.request = None
        self._busy(False)
        self.sigBusy.emit(False, "")
        self.sigError.emit(f"the probe stopped: {ev.message}", getattr(ev, "details", ""))

    # -- showing -----------------------------------------------------------------------------------
    def _add_row(self, r: TriggerResult) -> None:
        i = self.table.rowCount()
        self.table.insertRow(i)
        fork = "" if r.first_mismatch is None else str(r.first_mismatch)
        for j, text in enumerate((r.trigger, r.label, r.engine, r.result, str(r.n_tokens), fork, r.evidence)):
            item = QTableWidgetItem(text)
            if j == 3:
                item.setBackground(QBrush(QColor(RESULT_COLOURS.get(r.result, COLOURS["inconclusive"]))))
            if j == 6:
                item.setToolTip(text)
            self.table.setItem(i, j, item)

    def show_report(self, report: ProbeReport, source: str | os.PathLike[str] | None = None) -> None:
        self.report = report
        self.table.setRowCount(0)
        for r in report.rows:
            self._add_row(r)
        self.table.resizeColumnsToContents()
        counts = {k: sum(1 for r in report.rows if r.result == k) for k in dict.fromkeys(r.result for r in report.rows)}
        where = f" · {html.escape(Path(source).name)}" if source else ""
        worst = report.worst
        colour = RESULT_COLOURS.get(worst, COLOURS["inconclusive"])
        self.title.setText(f"<b>{html.escape(report.target)}</b>{where}: "
                           + ", ".join(f"{v} {html.escape(k)}" for k, v in counts.items())
                           + f" <span style='background:{colour}'>&nbsp;worst: {html.escape(worst)}&nbsp;</span>"
                           + "".join(f"<br>note: {html.escape(n)}" for n in report.notes))
        self.sigShown.emit(report)

    def verdict(self) -> tuple[str, str]:
        """What the verdict bar says with this tab in front: the report's results and its worst (HTML, kind), or
        what the tab does before any probe."""
        r = self.report
        if r is None:
            return ("<b>Probe</b>: no probe yet. Run probe forces the known triggers of rollback and state bugs on "
                    "the Run panel's target and proves each result, or Open… shows a saved report.", "info")
        counts = {k: sum(1 for x in r.rows if x.result == k) for k in dict.fromkeys(x.result for x in r.rows)}
        said = ", ".join(f"{v} {html.escape(k)}" for k, v in counts.items()) or "no trigger ran"
        return (f"<b>Probe</b> ({html.escape(r.target)}): {said}; the worst result is {html.escape(r.worst)}",
                RESULT_KINDS.get(r.worst, "unsure"))

    def open(self, path: str | os.PathLike[str]) -> bool:
        """Show a saved probe report; any other file is an error in the window, naming it."""
        try:
            report = ProbeReport.load(path)
        except SpecviewError as exc:
            self.sigError.emit(str(exc), "")
            return False
        self.show_report(report, path)
        self.sigStatus.emit(f"probe report {path}")
        return True

    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a probe report", str(Path.cwd()),
                                              "specview probe reports (*.json);;All files (*)")
        if path:
            self.open(path)
