"""The Kernel map tab's backend check at every verify width: the Run panel's target, on its engine and
settings, against the reference (the CPU, or one thread on a CPU-only build), widths 1 to n_max + 1.

It runs as a job on the model worker (:class:`~specview.gui.messages.JobRequest`) and shows, per width, the
figures ``specview check --widths`` prints (:func:`specview.core.diagnose.reference.width_table`).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QPushButton, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from ...core.config import RunConfig
from ...core.diagnose.reference import WIDTH_HEADERS, check_texts, widths_upto, width_table
from ...core.errors import SpecviewError
from ...core.prompts import builtin_prompts
from ...core.registry import get_backend
from ..messages import JobFinished, JobRequest
from ..worker import WorkerHost

#: greedy tokens the reference adds after the prompt: the positions checked at every width
CONTINUATION = 32


class BackendCheckPanel(QWidget):
    """A button, a verdict line and the per-width table."""

    sigFinished = Signal(object)  # the check's result dict (None when cancelled), after the panel shows it

    def __init__(self, host: WorkerHost, config: Callable[[], RunConfig], parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("backend_check_panel")
        self.host, self.config = host, config
        self.request: JobRequest | None = None
        self.result: dict[str, Any] | None = None
        # the button and the verdict on the left, the table (a row per width) across the rest of the tab's width
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        left = QVBoxLayout()
        lay.addLayout(left)
        row = QHBoxLayout()
        self.button = QPushButton("Check the backend at every verify width")
        self.button.setObjectName("backend_check_button")
        self.button.setToolTip("Teacher-force the Run panel's prompt and a greedy continuation on this build and "
                               "on the reference (the CPU; one thread on a CPU-only build), in passes of exactly "
                               "W tokens for W = 1 to n_max + 1: KL, the same top-1 and the max |Δ| per width")
        row.addWidget(self.button)
        row.addStretch(1)
        left.addLayout(row)
        self.verdict = QLabel("The backend, width by width, against the reference: not checked yet.")
        self.verdict.setObjectName("backend_check_verdict")
        self.verdict.setWordWrap(True)
        self.verdict.setFixedWidth(340)
        left.addWidget(self.verdict)
        left.addStretch(1)
        self.table = QTableWidget(0, len(WIDTH_HEADERS))
        self.table.setObjectName("backend_check_table")
        self.table.setHorizontalHeaderLabels(list(WIDTH_HEADERS))
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setMaximumHeight(170)
        lay.addWidget(self.table, 1)
        self.setMaximumHeight(180)
        self.button.clicked.connect(lambda _c=False: self.start())
        host.worker.sigJobFinished.connect(self._on_finished)  # bound slots: queued into this thread
        host.worker.sigFailed.connect(self._on_failed)

    def start(self) -> JobRequest | None:
        """Submit the check for the Run panel's settings; None (after saying why) when it cannot run."""
        try:
            cfg = self.config()
        except SpecviewError as exc:
            self.verdict.setText(f"The Run panel's settings are not valid: {exc}")
            return None
        if not get_backend(cfg.backend).in_process:
            self.verdict.setText(f"The {cfg.backend} engine cannot return every position's logits: check the same "
                                 "model with the llama.cpp engine (the same build).")
            return None
        text = cfg.prompt or (builtin_prompts(["essay"])[0].text or "")
        widths = widths_upto(cfg.draft_width)
        chat = True if cfg.chat is None else bool(cfg.chat)

        def work(runner: Any, say: Any, fraction: Any, cancel: Any) -> Any:
            return runner.job(check_texts, backend=cfg.backend, target=cfg.target, settings=cfg.engine,
                              texts=[("prompt", text)], chat=chat, continuation=CONTINUATION, progress=say,
                              cancel=cancel, widths=widths)

        self.request = JobRequest(cfg.backend, work)
        self.button.setEnabled(False)
        self.verdict.setText(f"Checking {cfg.target} at widths {widths[0]}–{widths[-1]}…")
        self.host.submit_job(self.request)
        return self.request

    def _on_finished(self, ev: JobFinished) -> None:
        if self.request is None or ev.request_id != self.request.id:
            return
        self.request = None
        self.button.setEnabled(True)
        if ev.result is None:
            self.verdict.setText("Backend check cancelled.")
        else:
            self.show_result(ev.result)
        self.sigFinished.emit(ev.result)

    def _on_failed(self, ev: Any) -> None:
        if self.request is None or ev.request_id != self.request.id:
            return
        self.request = None
        self.button.setEnabled(True)
        self.verdict.setText(f"The backend check stopped: {ev.message}")

    def show_result(self, result: dict[str, Any]) -> None:
        self.result = result
        if result.get("skipped"):
            self.verdict.setText(f"Backend check not run: {result['skipped']}")
            self.table.setRowCount(0)
            return
        ok = result.get("ok")
        head = (f"<b>{'Sane' if ok else 'BROKEN'}</b>: {html.escape(str(result.get('test_label')))} against "
                f"{html.escape(str(result.get('reference_label')))}, {html.escape(str(result.get('target')))}")
        if not ok:
            head += ": " + html.escape("; ".join(result.get("problems") or []))
        self.verdict.setText(head + ". <i>pair</i>: against the reference at that width; <i>drift</i>: this "
                             "setup at that width against its own width-1 rows.")
        _, rows = width_table(result)
        self.table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            for j, v in enumerate(r):
                self.table.setItem(i, j, QTableWidgetItem(v))


__all__ = ["BackendCheckPanel"]
