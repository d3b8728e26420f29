"""The Quality tab: does speculative decoding change answers?  A task suite run through both arms, on the worker.

The suite runs as a job on the model worker (:class:`~specview.gui.messages.JobRequest`),
on the runner of the Run panel's engine with the Run panel's settings
(``config()``, the window's :meth:`build_config`), like a matrix: submitting it
cancels whatever runs there, a run or matrix submitted later cancels it in turn,
Esc cancels it between forward passes (the finished items are kept), and each
finished item streams into the tables with the progress and the ETA.  Each
item's result and trace are written to a new folder under the results folder
(``quality.json`` and ``traces/``; :func:`~specview.core.paths.results_dir`),
so a finished item opens side by side without running again, in this session
or a later one.

A suite that runs model-written code asks first (:class:`.confirm.ExecuteConfirm`);
No leaves nothing run.  The tab says what happens through its signals; the
window shows them in its verdict bar, status line and progress bar.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QProgressBar, QTabWidget, QVBoxLayout, QWidget

from ...core.config import RunConfig
from ...core.errors import SpecviewError
from ...core.jsonfile import declares_schema
from ...core.paths import new_results_folder
from ..messages import JobFinished, JobRequest, Progress
from ..worker import WorkerHost
from .confirm import ExecuteConfirm, checked_sandbox, probe
from .form import QualityForm
from .tables import ItemsTable, NearTieTable, OutcomeTable
from .words import headline, rate_words, ties_note

TAB_TIP = ("task outcomes: a suite of tasks with checkable answers through both arms; whether any fork changes an "
           "answer (McNemar's exact test), each arm's pass rate, and the fork of every changed answer")


def is_quality_file(path: str | os.PathLike[str]) -> bool:
    """True for a ``specview.quality/...`` JSON file, read from its first bytes only."""
    return declares_schema(path, "specview.quality")


class QualityTab(QWidget):
    """The suite form, the 2x2 table with the test and the rates, the near-tie density, and the items."""

    sigVerdict = Signal(str, str, str)  # rich text, kind, tool tip
    sigStatus = Signal(str)
    sigError = Signal(str, str)  # message, details
    sigBusy = Signal(bool, str)  # busy, status
    sigProgress = Signal(int, int)  # items done, items in all
    sigSubmitting = Signal()  # the suite is about to take the model worker (a run still streaming is cancelled)
    sigOpenTrace = Signal(str)  # a double-clicked item's saved trace
    sigShown = Signal(object)  # the QualityResult now shown (streamed, finished or opened)
    sigFinished = Signal(object)  # JobFinished of a suite run, after the tab shows it
    _sigItem = Signal(int, object, object)  # request id, ItemOutcome, QualityProgress (from the worker thread)

    def __init__(self, host: WorkerHost, config: Callable[[], RunConfig],
                 diagnose: Callable[[], bool] = lambda: True, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("quality_tab")
        self.host, self.config, self.diagnose = host, config, diagnose
        self.request: JobRequest | None = None
        self.result: Any = None  # the QualityResult on screen
        self.source: Path | None = None  # its quality.json
        self._live: tuple[Any, dict[str, Any], list[Any]] | None = None  # suite, config, outcomes while running
        self.tabs: QTabWidget | None = None  # the window's tabs, once attached

        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        self.form = QualityForm()
        lay.addWidget(self.form)
        row = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setObjectName("quality_progress")
        self.progress.setMaximumWidth(260)
        self.progress_text = QLabel()
        self.progress_text.setTextFormat(Qt.TextFormat.PlainText)
        row.addWidget(self.progress)
        row.addWidget(self.progress_text, 1)
        lay.addLayout(row)
        self._show_progress(False)
        self.title = QLabel("No quality run yet: choose a suite and press Run suite (the Run panel's target, drafter "
                            "and settings), or open a quality.json.")
        self.title.setObjectName("quality_title")
        self.title.setWordWrap(True)
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        self.headline = QLabel()
        self.headline.setObjectName("quality_headline")
        self.headline.setWordWrap(True)
        self.headline.setTextFormat(Qt.TextFormat.RichText)
        self.headline.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.title)
        lay.addWidget(self.headline)
        mid = QHBoxLayout()
        self.outcomes = OutcomeTable()
        mid.addWidget(self.outcomes, 0, Qt.AlignmentFlag.AlignTop)
        self.rates = QLabel()
        self.rates.setObjectName("quality_rates")
        self.rates.setWordWrap(True)
        self.rates.setTextFormat(Qt.TextFormat.PlainText)
        self.rates.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        mid.addWidget(self.rates, 1)
        lay.addLayout(mid)
        self.ties = NearTieTable()
        lay.addWidget(self.ties)
        self.ties_note = QLabel()
        self.ties_note.setObjectName("quality_ties_note")
        self.ties_note.setWordWrap(True)
        self.ties_note.setTextFormat(Qt.TextFormat.PlainText)
        lay.addWidget(self.ties_note)
        self.items = ItemsTable()
        lay.addWidget(self.items, 1)

        f = self.form
        f.run_button.clicked.connect(lambda _c=False: self.start())
        f.cancel_button.clicked.connect(self.cancel)
        f.open_button.clicked.connect(self.choose_file)
        self.items.sigOpenTrace.connect(self.sigOpenTrace)
        self._sigItem.connect(self._on_item)
        host.sigSubmitted.connect(self._on_submitted)
        host.worker.sigJobFinished.connect(self._on_finished)  # bound slots: queued into this thread
        host.worker.sigFailed.connect(self._on_failed)

    @classmethod
    def attach(cls, w: Any) -> QualityTab:
        """A Quality tab added to the main window ``w``: its verdicts, errors, status, busy state and progress in
        the window, Esc and the Run panel's Cancel stopping it, a double-clicked item opening side by side."""
        tab = cls(w.host, w.build_config, lambda: w.diagnose.isChecked())
        w.tabs.setTabToolTip(w.tabs.addTab(tab, "Quality"), TAB_TIP)
        tab.tabs = w.tabs
        tab.sigSubmitting.connect(w.abandon_run)
        tab.sigVerdict.connect(w.show_verdict)
        tab.sigStatus.connect(w.show_status)
        tab.sigError.connect(w.show_error)
        tab.sigBusy.connect(w.set_busy)
        tab.sigProgress.connect(lambda done, total: (w.progress.setRange(0, total), w.progress.setValue(done)))
        tab.sigOpenTrace.connect(lambda path: w.open_cell(None, path))
        tab.connect_cancel(w.cancel_button.clicked)
        # File ▸ Export Report writes the result in front
        tab.sigShown.connect(lambda _res: w.update_export_actions())
        w.tabs.currentChanged.connect(lambda i: tab.show_verdict(str(tab.source or "")) if w.tabs.widget(i) is tab
                                      and tab.request is None else None)
        return tab

    def connect_cancel(self, *triggers: Any) -> None:
        """Let these signals (the window's Esc action, the Run panel's Cancel button) cancel a running suite."""
        for t in triggers:
            t.connect(lambda *_a: self.cancel())

    def bring_to_front(self) -> None:
        """Show the tab in front of the window's others (nothing for a tab on its own)."""
        if self.tabs is not None:
            self.tabs.setCurrentWidget(self)

    # ------------------------------------------------------------ running
    def start(self, suite: Any = None, *, execute: bool | None = None, allow_weak: bool = False,
              out_dir: str | os.PathLike[str] | None = None) -> JobRequest | None:
        """Run ``suite`` (the form's when None) with the Run panel's settings on the worker.

        A suite that runs model-written code asks first (``execute=None``), or takes ``execute`` as the answer;
        a No runs nothing and returns None.  Where this machine's sandbox lacks a promised fence the code runs
        only with the confirmation's checkbox ticked (or ``allow_weak``, the app's ``--allow-weak-sandbox``),
        else nothing runs and the error names what is missing; the result records the sandbox and whether it
        was allowed weak.  Results go to ``out_dir`` (by default a new folder under the results folder,
        :func:`~specview.core.paths.results_dir`, which outlives the app).
        """
        from ...core.quality import RESULT_FILE, QualityError, load_suite, run_quality

        try:
            cfg = self.config()
            if suite is None:
                name, n, seed = self.form.spec()
                suite = load_suite(name, n=n, seed=seed)
        except (QualityError, SpecviewError) as exc:
            self.sigError.emit(f"Quality: {exc}", "")
            return None
        sandbox = None
        if suite.needs_execute:
            report = probe()
            if isinstance(report, Exception):
                return self._refused(suite, f"Quality: {report}")
            if execute is None:
                dlg = ExecuteConfirm(suite, self)
                execute, allow_weak = dlg.confirmed(), dlg.allow_weak
            if not execute:
                self.sigStatus.emit(f"nothing ran: scoring {suite.name} needs its model-written code run")
                self.sigVerdict.emit(f"<b>Nothing ran</b>: scoring {html.escape(suite.name)} runs the code the model "
                                     "writes, and that was declined.", "info", "")
                return None
            try:
                sandbox = checked_sandbox(allow_weak)
            except SpecviewError as exc:
                return self._refused(suite, f"Quality: {exc}")
        try:
            folder = Path(out_dir) if out_dir is not None else new_results_folder("quality", suite.name)
        except SpecviewError as exc:
            self.sigError.emit(f"Quality: {exc}", "")
            return None
        diagnose = "discordant" if self.diagnose() else "none"
        execute = bool(suite.needs_execute)

        def work(runner: Any, text: Any, fraction: Any, cancel: Any) -> Any:
            def on_item(outcome: Any, prog: Any) -> None:
                fraction(prog.done / max(1, prog.total))
                self._sigItem.emit(rid, outcome, prog)

            return run_quality(runner, cfg, suite, execute=execute, out_dir=folder, progress=text, cancel=cancel,
                               on_item=on_item, diagnose=diagnose, sandbox=sandbox)

        req = JobRequest(cfg.backend, work)
        rid = req.id
        self.sigSubmitting.emit()
        self.request = req
        self.source = folder / RESULT_FILE
        self._live = (suite, cfg.to_dict(), [])
        self._show_live()
        self.host.submit_job(req)
        self._busy(True)
        n = len(suite.items)
        self.sigBusy.emit(True, f"quality: 0 of {n} items…")
        self.sigProgress.emit(0, max(1, n))
        self.sigVerdict.emit(f"Running the task suite {html.escape(suite.name)}: {n} items through both arms. "
                             "Esc cancels (finished items are kept).", "info", "")
        return req

    def _refused(self, suite: Any, message: str) -> None:
        """Nothing runs: the sandbox is not what running ``suite``'s code needs (``message`` says why)."""
        self.sigError.emit(message, f"nothing ran: scoring {suite.name} runs the code the model writes")
        return None

    def owns(self, rid: int) -> bool:
        return self.request is not None and rid == self.request.id

    def cancel(self) -> None:
        """Cancel the suite in progress (it stops within one forward pass; finished items are kept)."""
        if self.request is None:
            return
        self.request.cancel()
        self.sigStatus.emit("cancelling the quality run (stops within one forward pass)…")
        self.progress_text.setText("cancelling…")

    def _busy(self, busy: bool) -> None:
        self.form.set_busy(busy)
        self._show_progress(busy)
        if busy:
            self.progress.setRange(0, 0)
            self.progress_text.setText("starting…")

    def _show_progress(self, on: bool) -> None:
        self.progress.setVisible(on)
        self.progress_text.setVisible(on)

    def _release(self) -> None:
        self.request = None
        self._live = None
        self._busy(False)

    def _on_submitted(self, req: Any) -> None:
        if self.request is not None and req is not self.request:  # a run or matrix took the worker: ours stops
            self._release()
            self.sigBusy.emit(False, "")

    def on_progress(self, ev: Progress) -> bool:
        """A progress line of ours (True: the tab shows it, with its ETA), or of something else (False)."""
        if not self.owns(ev.request_id):
            return False
        if ev.message:
            self.progress_text.setText(ev.message)
            self.sigStatus.emit(ev.message)
        return True

    def _on_item(self, rid: int, outcome: Any, prog: Any) -> None:
        if not self.owns(rid) or self._live is None:
            return
        self._live[2].append(outcome)
        self.progress.setRange(0, max(1, prog.total))
        self.progress.setValue(prog.done)
        self.progress_text.setText(prog.line)
        self.sigProgress.emit(prog.done, max(1, prog.total))
        self._show_live()

    def _show_live(self) -> None:
        from ...core.quality import QualityResult

        suite, cfg, done = self._live
        self.show_result(QualityResult(suite=suite, config=cfg, items=list(done)).refresh(), self.source,
                         running=True)

    def _on_finished(self, ev: JobFinished) -> None:
        if not self.owns(ev.request_id):
            return
        folder = self.source
        self._release()
        res = ev.result
        if res is None:
            self.sigBusy.emit(False, f"quality run cancelled after {ev.seconds:.1f} s")
            self.sigVerdict.emit("<b>Quality run cancelled</b>; nothing finished.", "info", "")
        else:
            self.show_result(res, folder)
            self.show_verdict(str(folder or ""))
            self.sigBusy.emit(False, f"quality run {res.status} in {ev.seconds:.1f} s: {folder}")
        self.sigFinished.emit(ev)

    def _on_failed(self, ev: Any) -> None:
        if not self.owns(ev.request_id):
            return
        self._release()
        self.sigBusy.emit(False, "")
        self.sigError.emit(f"the quality run stopped: {ev.message}", ev.details)

    # ------------------------------------------------------------ showing
    def show_result(self, res: Any, source: str | os.PathLike[str] | None = None, *, running: bool = False) -> None:
        """Show a :class:`~specview.core.quality.QualityResult` (its item traces are relative to ``source``'s
        folder)."""
        self.result = res
        self.source = Path(source) if source is not None else None
        n_all = len(res.suite.items)
        status = "running" if running else res.status
        where = f" · {self.source}" if self.source is not None else ""
        self.title.setText(f"{res.suite.name}: {len(res.items)} of {n_all} items ({status}) · "
                           f"{res.config.get('target')} with {res.config.get('draft') or res.config.get('spec_type')}"
                           f"{where}")
        text, kind = headline(res)
        colour = {"ok": "#2e7d32", "warn": "#b7791f", "bad": "#c62828"}.get(kind)
        self.headline.setText(f"<b style='color:{colour}'>{html.escape(text)}</b>" if colour else html.escape(text))
        self.outcomes.set_table(res.table)
        errors = sum(1 for o in res.items if o.error)
        self.rates.setText("\n".join([rate_words("vanilla", res.vanilla_rate),
                                      rate_words("speculative", res.spec_rate),
                                      f"McNemar's exact test on the {res.table.only_vanilla + res.table.only_speculative}"
                                      " discordant items (the changed answers; the tinted cells)"]
                                     + ([f"{errors} item(s) could not run (outside the table)"] if errors else [])))
        self.ties.set_summary(res.near_ties)
        self.ties_note.setText(ties_note(res, running=running))
        self.items.set_items(res.items, self.source.parent if self.source is not None else None)
        if not running:  # the form says what was run, so Run suite runs it again
            self.form.show_suite(res.suite)
        self.sigShown.emit(res)

    def show_verdict(self, tooltip: str = "") -> None:
        if self.result is not None:
            text, kind = headline(self.result)
            self.sigVerdict.emit(f"<b>Quality</b> ({html.escape(self.result.suite.name)}): {html.escape(text)}", kind,
                                 tooltip)

    def open(self, path: str | os.PathLike[str]) -> bool:
        """Show a saved ``quality.json``; a file that is not one is an error in the window, never a crash."""
        from ...core.quality import QualityResult

        try:
            res = QualityResult.load(path)
        except SpecviewError as exc:
            self.sigError.emit(str(exc), "")
            return False
        self.show_result(res, path)
        self.show_verdict(str(path))
        self.sigStatus.emit(f"quality result {path}")
        return True

    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a quality result", str(Path.cwd()),
                                              "specview quality results (*.json);;All files (*)")
        if path:
            self.open(path)


__all__ = ["QualityTab", "TAB_TIP", "is_quality_file"]
