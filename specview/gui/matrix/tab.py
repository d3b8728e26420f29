"""The Matrix tab: the grid of a reproducer matrix, opened from a file or run on the model worker.

A running matrix streams its cells into the grid as they finish; it runs on
the runner of the matrix's engine, like a single run (see
:mod:`specview.gui.worker`).  The tab says what happens through its signals;
the window shows them in its verdict bar and status line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFileDialog, QWidget

from ...core.errors import SpecviewError
from ...core.jsonfile import declares_schema
from ...core.paths import new_results_folder, results_dir
from ..controls import engine_problem
from ..verdict_bar import matrix_verdict
from ..messages import MatrixCell, MatrixFinished, MatrixRequest
from ..worker import WorkerHost
from .view import MatrixView

TAB_TIP = ("a reproducer matrix: which targets, drafters and n_max fork; double-click a cell to open it side by side; "
           "over the prompt suite, each setting's divergence rate with its interval and the gaps at its forks")


class MatrixTab(MatrixView):
    """The matrix grid, and the matrix running on the worker."""

    sigVerdict = Signal(str, str, str)  # rich text, kind, tool tip
    sigStatus = Signal(str)
    sigError = Signal(str, str)  # message, details
    sigBusy = Signal(bool, str)  # busy, status
    sigProgress = Signal(int, int)  # cells done, cells in all
    sigCell = Signal(object)  # a streamed cell record, after the grid shows it
    sigFinished = Signal(object)  # MatrixFinished, after the grid shows the whole matrix

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.request: MatrixRequest | None = None

    def start(self, spec: Any, host: WorkerHost, *, out_dir: str | os.PathLike[str] | None = None,
              allow_weak: bool = False) -> MatrixRequest | None:
        """Run ``spec`` on the worker (cancelling whatever runs there); the grid fills as cells finish.

        The matrix JSON and each cell's trace are written to ``out_dir`` (by
        default a new folder under the results folder,
        :func:`~specview.core.paths.results_dir`, which outlives the app), so a
        finished cell opens side by side without running again.  A matrix over
        a code suite that runs its code (``quality.execute``) is refused where
        this machine's sandbox lacks a promised fence, unless ``allow_weak``
        (``specview matrix --allow-weak-sandbox``); its spec records the
        sandbox.
        """
        from ...core.matrix import MatrixRun, expand
        from ...core.quality.execute import sandbox_record

        try:
            spec.validate()
            if spec.quality and spec.quality.get("execute"):
                spec.quality["sandbox"] = sandbox_record(allow_weak)
        except SpecviewError as exc:
            self.sigError.emit(str(exc), "")
            return None
        problem = engine_problem(spec.backend, spec.engine)
        if problem is not None:
            self.sigError.emit(f"the {spec.backend} engine is not available: {problem}", "")
            return None
        label = (spec.preset or {}).get("name", "")  # a preset's name; a matrix of one's own has none
        try:
            folder = Path(out_dir) if out_dir is not None else new_results_folder("matrix", label)
        except SpecviewError as exc:
            self.sigError.emit(str(exc), "")
            return None
        out = folder / "matrix.json"
        req = MatrixRequest(spec, out=str(out), traces_dir=str(folder / "traces"))
        n = len(expand(spec))
        self.setMatrix(MatrixRun(spec=spec, cells=expand(spec)).to_json(), source=out)
        self.request = req
        host.submit_matrix(req)
        self.sigBusy.emit(True, f"matrix: 0 of {n} cells…")
        self.sigVerdict.emit(f"Running a matrix of {n} cells; Esc cancels.", "info", "")
        return req

    def owns(self, rid: int) -> bool:
        return self.request is not None and rid == self.request.id

    def on_cell(self, ev: MatrixCell) -> None:
        if not self.owns(ev.request_id):
            return
        self.addCell(ev.record)
        done = len(self.doc.get("cells", []))
        total = int(self.doc.get("n_cells", done) or done)
        self.sigProgress.emit(done, max(1, total))
        self.sigStatus.emit(f"matrix: {done} of {total} cells")
        self.sigCell.emit(ev.record)

    def on_finished(self, ev: MatrixFinished, *, show_verdict: bool) -> None:
        """The matrix ended; ``show_verdict`` is False when a cell opened meanwhile keeps the bar."""
        if not self.owns(ev.request_id):
            return
        req, self.request = self.request, None
        assert req is not None
        self.setMatrix(ev.doc, source=req.out)
        if show_verdict:
            self.show_verdict(f"written to {req.out}")
        self.sigBusy.emit(False, f"matrix {ev.doc.get('status', '')} in {ev.seconds:.1f} s: {req.out}")
        self.sigFinished.emit(ev)

    def on_failed(self, rid: int, message: str, details: str) -> bool:
        """A failure of the running matrix (True) or of something else (False)."""
        if not self.owns(rid):
            return False
        self.request = None
        self.sigBusy.emit(False, "")
        self.sigError.emit(f"the matrix stopped: {message}", details)
        return True

    def show_verdict(self, tooltip: str = "") -> None:
        text, kind = matrix_verdict(self.doc)
        self.sigVerdict.emit(text, kind, tooltip)

    def open(self, path: str | os.PathLike[str]) -> bool:
        """Show a ``specview.matrix/1`` file."""
        try:
            self.loadFile(path)
        except SpecviewError as exc:
            self.sigError.emit(str(exc), "")
            return False
        self.show_verdict(str(path))
        self.sigStatus.emit(f"matrix {path}")
        return True

    def choose_file(self) -> None:
        """Ask for a matrix file and open it (the tab's Open matrix… button, File ▸ Open Matrix…)."""
        kept = results_dir() / "matrix"  # where the matrices run from the app are, if any ran
        start = kept if kept.is_dir() else Path.cwd()
        path, _ = QFileDialog.getOpenFileName(self, "Open a specview matrix", str(start),
                                              "specview matrices (*.json);;All files (*)")
        if path:
            self.open(path)


def is_matrix_file(path: str | os.PathLike[str]) -> bool:
    """True for a ``specview.matrix/...`` JSON file (its schema key comes first), read from its first bytes only."""
    return declares_schema(path, "specview.matrix")
