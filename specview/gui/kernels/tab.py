"""The Kernel map tab: compute a kernel map on the model worker, open and save one, and prescribe from it.

The map and the prescription run on the model worker's Session
(:class:`~specview.gui.messages.KernelMapRequest`,
:class:`~specview.gui.messages.PrescriptionRequest`), like a run or a matrix:
submitting one cancels whatever runs there, and a run or matrix submitted
later cancels it in turn.  The engine and its settings are the Run panel's
(``config()``, the window's :meth:`build_config`), because the map must be
made with the settings the runs will use.  The tab says what happens through
its signals; the window shows them in its verdict bar and status line.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from ...core.config import RunConfig
from ...core.demo import is_demo_name
from ...core.errors import SpecviewError
from ...core.jsonfile import declares_schema
from ...core.kernels.map import KernelMap
from ...core.kernels.text import parse_widths, ranges, settings_label
from ...core.prompts import builtin_prompts
from ...core.trace import json_safe, write_atomic
from ..controls import backend_facts
from ..messages import KernelMapFinished, KernelMapRequest, PrescriptionFinished, PrescriptionRequest, Progress
from ..worker import WorkerHost
from .check import BackendCheckPanel
from .form import DEMO_MAP_TARGETS, MapForm, PrescriptionPanel, show_field_error
from .view import KernelMapView
from .words import row_claim

TAB_TIP = ("the kernel map: which verify widths this build computes bit-identically to single-token passes, "
           "per target; and the settings that proves lossless")


def is_kernel_map_file(path: str | os.PathLike[str]) -> bool:
    """True for a ``specview.kernels/...`` JSON file (its schema key comes first), read from its first bytes only."""
    return declares_schema(path, "specview.kernels")


def map_verdict(km: KernelMap) -> tuple[str, str]:
    """(rich text, kind) of a kernel map: what each row proves."""
    groups: dict[str, list[str]] = {}
    for t in km.targets:
        groups.setdefault(row_claim(t), []).append(t.label)
    parts = [f"{html.escape(', '.join(labels))}: {html.escape(claim)}" for claim, labels in groups.items()]
    text = (f"<b>Kernel map</b> (widths {html.escape(ranges(km.widths))}, {len(km.prompts)} prompt"
            f"{'s' if len(km.prompts) != 1 else ''} x {km.positions} positions): " + "; ".join(parts) + ".")
    text += "<br><i>Select a row for its figures per width; Prescribe measures what the map proves.</i>"
    if any(not t.deterministic for t in km.targets):
        kind = "bad"
    elif all(t.safe_n_max() for t in km.targets):
        kind = "ok"
    else:
        kind = "warn"
    return text, kind


def prescription_verdict(pres: Any) -> tuple[str, str]:
    """(rich text, kind) of a prescription: the fastest proven-lossless setting, and any contradiction."""
    best = next((c for c in pres.lossless if c.measurement and c.measurement.speedup), None)
    if best is not None:
        m = best.measurement
        text = (f"<b>Prescription</b>: fastest proven lossless: {html.escape(m.target)} "
                f"<code>{html.escape(m.flags)}</code> at {m.speedup:.2f}x plain decoding")
        text += "." if m.speedup >= 1 else (": plain decoding is faster here (the draft costs more than the "
                                            "verify passes save).")
        kind = "ok" if m.speedup >= 1 else "warn"
    else:
        text, kind = "<b>Prescription</b>: nothing measured is proven lossless here.", "warn"
    if any(c.contradicted for c in pres.lossless):
        text += " <b>A proven setting was CONTRADICTED by its speed runs</b>: see the panel."
        kind = "bad"
    return text, kind


class KernelTab(QWidget):
    """The Kernel map tab: its controls, the heat grid with its detail, and the prescription panel."""

    sigVerdict = Signal(str, str, str)  # rich text, kind, tool tip
    sigStatus = Signal(str)
    sigError = Signal(str, str)  # message, details
    sigBusy = Signal(bool, str)  # busy, status
    sigProgress = Signal(int, int)  # done, total (per mille of the forward passes; 0, 0: indeterminate)
    sigSubmitting = Signal()  # a request is about to take the model worker (a run still streaming is cancelled)
    sigMapShown = Signal(object)  # KernelMap, after the grid shows it (computed or opened)
    sigMapFinished = Signal(object)  # KernelMapFinished, after the tab has shown it (a map or a cancellation)
    sigPrescriptionFinished = Signal(object)  # PrescriptionFinished, after the panel shows it

    def __init__(self, host: WorkerHost, config: Callable[[], RunConfig], parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("kernel_tab")
        self.host = host
        self.config = config
        self.request: KernelMapRequest | PrescriptionRequest | None = None
        self.kmap: KernelMap | None = None
        self.source: Path | None = None
        self.prescription: Any = None
        self._fraction: float | None = None
        self._current_target: str | None = None

        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.setSpacing(6)
        self.form = MapForm()
        lay.addWidget(self.form)
        prow = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setObjectName("kernel_progress")
        self.progress.setRange(0, 1000)
        self.progress.setFormat("%p%")
        self.progress.setMaximumWidth(260)
        self.progress_text = QLabel()
        self.progress_text.setObjectName("kernel_progress_text")
        self.progress_text.setTextFormat(Qt.TextFormat.PlainText)
        prow.addWidget(self.progress)
        prow.addWidget(self.progress_text, 1)
        lay.addLayout(prow)
        self._show_progress(False)
        self.view = KernelMapView()
        self.panel = PrescriptionPanel()
        self.view.bottom.addWidget(self.panel)
        self.view.bottom.setStretchFactor(0, 0)  # the figures take what they need, the prescription the rest
        self.view.bottom.setStretchFactor(1, 1)
        lay.addWidget(self.view, 1)
        self.check_panel = BackendCheckPanel(host, config)  # the backend against the reference, width by width
        lay.addWidget(self.check_panel)

        f = self.form
        f.run_button.clicked.connect(lambda _c=False: self.start())
        f.cancel_button.clicked.connect(self.cancel)
        f.open_button.clicked.connect(self.choose_file)
        f.save_button.clicked.connect(self.choose_save)
        f.sigAddTarget.connect(self.choose_target)
        self.panel.prescribe_button.clicked.connect(lambda _c=False: self.prescribe())
        self.panel.save_button.clicked.connect(self.choose_save_prescription)
        host.sigSubmitted.connect(self._on_submitted)
        host.worker.sigKernelMapFinished.connect(self._on_map_finished)  # bound slots: queued into this thread
        host.worker.sigPrescriptionFinished.connect(self._on_prescription_finished)

    # ------------------------------------------------------------ the Run panel's settings
    def refresh(self) -> RunConfig | None:
        """Read the Run panel: the engine line, the draft line and the default targets; None if it is invalid."""
        try:
            cfg = self.config()
        except SpecviewError as exc:
            self.form.engine.setText(f"the Run panel's settings are not valid: {exc}")
            return None
        label = backend_facts(cfg.backend)[0]
        e = cfg.engine
        threads = "every core" if e.threads == 0 else str(e.threads)
        self.form.engine.setText(f"{label}: flash attention {e.flash_attn}, -b {e.n_batch}, -ub {e.n_ubatch}, "
                                 f"threads {threads}, KV {e.kv_type}, GPU layers "
                                 f"{'all' if e.gpu_layers < 0 else e.gpu_layers} (the Run panel's)")
        self.panel.draft.setText(f"Draft model: {cfg.draft or 'none chosen'} (the Run panel's); speed runs "
                                 f"with {label}, each setting both arms on every prompt of the map")
        self._default_targets(cfg.target)
        return cfg

    def _default_targets(self, target: str) -> None:
        lst = self.form.targets
        if target == self._current_target and lst.count():
            return
        self._current_target = target
        if not lst.touched:  # the defaults follow the Run panel's target until the user chooses
            names = list(DEMO_MAP_TARGETS) if is_demo_name(target) else []
            if target not in names:
                names.insert(0, target)
            lst.set_names(names, [target])
        elif lst.find(target) is None:
            lst.add(target, False)

    def showEvent(self, ev) -> None:  # noqa: N802 - Qt name
        self.refresh()
        super().showEvent(ev)

    # ------------------------------------------------------------ the map
    def map_request(self) -> KernelMapRequest | None:
        """The request the controls describe, or None after saying what is wrong."""
        cfg = self.refresh()
        if cfg is None:
            self.sigError.emit(self.form.engine.text(), "")
            return None
        problem = self.form.widths_problem()
        if problem is not None:
            self.form.widths.setFocus()
            self.sigError.emit(f"Kernel map widths: {problem}", "")
            return None
        widths = parse_widths(self.form.widths.text())
        if max(widths) > cfg.engine.n_batch:
            msg = (f"widths go up to {max(widths)} but the Run panel's batch size (-b) is {cfg.engine.n_batch}: one "
                   "verify pass cannot be wider than the batch; narrow the widths or raise -b")
            show_field_error(self.form.widths_error, self.form.widths, msg)
            self.sigError.emit(f"Kernel map widths: {msg}", "")
            return None
        targets = self.form.targets.checked()
        if not targets:
            self.sigError.emit("Kernel map: check at least one target", "")
            return None
        names = self.form.prompts.checked()
        if not names:
            self.sigError.emit("Kernel map: check at least one prompt", "")
            return None
        prompts = [replace(p, chat=cfg.chat) for p in builtin_prompts(names)]
        return KernelMapRequest(targets=targets, prompts=prompts, widths=widths, positions=self.form.positions.value(),
                                settings=cfg.engine, backend=cfg.backend, stop_at_difference=self.form.stop.isChecked())

    def start(self, req: KernelMapRequest | None = None) -> KernelMapRequest | None:
        """Compute a map (the controls' unless ``req`` is given) on the worker, cancelling whatever runs there."""
        req = req or self.map_request()
        if req is None:
            return None
        self._submit(req)
        self.host.submit_kernel_map(req)
        n = len(req.targets)
        what = (f"{n} target{'s' if n != 1 else ''} x widths {ranges(req.widths)} x {len(req.prompts)} prompt"
                f"{'s' if len(req.prompts) != 1 else ''} x {req.positions} positions")
        extra = settings_label(req.settings)
        self.sigBusy.emit(True, f"kernel map: {what}…")
        self.sigVerdict.emit(f"Computing a kernel map: {html.escape(what)}"
                             f"{' (' + html.escape(extra) + ')' if extra else ''}. Esc cancels.", "info", "")
        return req

    def _submit(self, req: KernelMapRequest | PrescriptionRequest) -> None:
        self.sigSubmitting.emit()
        self.request = req
        self._fraction = None
        self._busy(True)

    def _busy(self, busy: bool) -> None:
        f = self.form
        f.cancel_button.setEnabled(busy)
        self._show_progress(busy)
        if busy:
            self.progress.setRange(0, 0)
            self.progress_text.setText("starting…")
        self.panel.prescribe_button.setEnabled(self.kmap is not None)

    def _show_progress(self, on: bool) -> None:
        self.progress.setVisible(on)
        self.progress_text.setVisible(on)

    def owns(self, rid: int) -> bool:
        return self.request is not None and rid == self.request.id

    @property
    def what(self) -> str:
        return "the prescription" if isinstance(self.request, PrescriptionRequest) else "the kernel map"

    def cancel(self) -> None:
        """Cancel the map or prescription in progress (it stops within one forward pass)."""
        if self.request is None:
            return
        self.request.cancel()
        self.sigStatus.emit(f"cancelling {self.what} (stops within one forward pass)…")
        self.progress_text.setText("cancelling…")

    def _release(self) -> None:
        self.request = None
        self._busy(False)

    def _on_submitted(self, req: Any) -> None:
        if self.request is not None and req is not self.request:  # a run or matrix took the worker: ours is cancelled
            self._release()

    def on_progress(self, ev: Progress) -> bool:
        """A progress report of ours (True), or of something else (False)."""
        if not self.owns(ev.request_id):
            return False
        if ev.fraction is not None:
            self._fraction = ev.fraction
        if self._fraction is None:
            self.progress.setRange(0, 0)
            self.sigProgress.emit(0, 0)
        else:
            done = round(1000 * self._fraction)
            self.progress.setRange(0, 1000)
            self.progress.setValue(done)
            self.sigProgress.emit(done, 1000)
        if ev.message:
            msg = ev.message
            for prefix in ("kernel map: ", "prescription: "):  # the status line names what runs once
                msg = msg.removeprefix(prefix)
            self.progress_text.setText(msg)
            pct = "" if self._fraction is None else f" {100 * self._fraction:.0f}%"
            self.sigStatus.emit(f"{self.what[4:]}{pct}: {msg}")
        return True

    def on_failed(self, rid: int, message: str, details: str) -> bool:
        """A failure of ours (True: the tab said so), or of something else (False)."""
        if not self.owns(rid):
            return False
        what = self.what
        self._release()
        self.sigBusy.emit(False, "")
        self.sigError.emit(f"{what[4:].capitalize()}: {message}", details)
        return True

    def _on_map_finished(self, ev: KernelMapFinished) -> None:
        if not self.owns(ev.request_id):
            return
        self._release()
        if ev.cancelled or ev.kmap is None:
            kept = " The map shown is the one before." if self.kmap is not None else ""
            self.sigVerdict.emit(f"<b>Kernel map cancelled</b> after {ev.seconds:.1f} s.{kept}", "info", "")
            self.sigBusy.emit(False, f"kernel map cancelled after {ev.seconds:.1f} s")
        else:
            self.show_map(ev.kmap, None)
            self.sigBusy.emit(False, f"kernel map computed in {ev.seconds:.1f} s; Save map… writes it")
        self.sigMapFinished.emit(ev)

    # ------------------------------------------------------------ what the map says of a run
    def prediction_for(self, trace: Any) -> Any:
        """What the map shown predicts for ``trace``'s run (a KernelPrediction), or None without a map."""
        if self.kmap is None:
            return None
        from ...core.kernels.evidence import predict_trace

        return predict_trace(self.kmap, trace, map_file=self.source)

    def map_for_report(self, trace: Any) -> Any:
        """The map to put in ``trace``'s report (its file, else the map): only one that covers the run."""
        from ...core.kernels.evidence import NOT_COVERED

        pred = self.prediction_for(trace)
        if pred is None or pred.status == NOT_COVERED:
            return None
        return str(self.source) if self.source is not None else self.kmap

    def show_verdict(self) -> None:
        """The verdict bar for what the tab shows: its prescription, else its map (nothing without one)."""
        if self.prescription is not None:
            self.sigVerdict.emit(*prescription_verdict(self.prescription), "")
        elif self.kmap is not None:
            text, kind = map_verdict(self.kmap)
            self.sigVerdict.emit(text, kind, str(self.source or ""))

    # ------------------------------------------------------------ showing, opening, saving
    def show_map(self, km: KernelMap, source: str | os.PathLike[str] | None) -> None:
        self.kmap = km
        self.source = Path(source) if source is not None else None
        self.view.setMap(km, source)
        self.form.show_map_settings(km)
        self.form.save_button.setEnabled(True)
        self.panel.prescribe_button.setEnabled(True)
        self._set_prescription(None)
        text, kind = map_verdict(km)
        self.sigVerdict.emit(text, kind, str(source or ""))
        self.sigMapShown.emit(km)

    def open(self, path: str | os.PathLike[str]) -> bool:
        """Show a ``specview.kernels/1`` file; a file that is not one is an error in the window, never a crash."""
        try:
            km = KernelMap.load(path)
        except SpecviewError as exc:
            self.sigError.emit(str(exc), "")
            return False
        self.show_map(km, path)
        self.sigStatus.emit(f"kernel map {path}")
        return True

    def save(self, path: str | os.PathLike[str]) -> Path | None:
        if self.kmap is None:
            self.sigError.emit("no kernel map to save yet: run one first", "")
            return None
        try:
            p = self.kmap.save(path)
        except (SpecviewError, OSError) as exc:
            self.sigError.emit(f"{path}: could not save the kernel map ({exc})", "")
            return None
        self.source = Path(p)
        self.view.setSource(self.source)
        self.sigStatus.emit(f"kernel map saved to {p}")
        return p

    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a kernel map", str(Path.cwd()),
                                              "specview kernel maps (*.json);;All files (*)")
        if path:
            self.open(path)

    def choose_save(self) -> None:
        start = str(self.source) if self.source is not None else str(Path.cwd() / "kernels.json")
        path, _ = QFileDialog.getSaveFileName(self, "Save the kernel map", start, "specview kernel maps (*.json)")
        if path:
            self.save(path)

    def choose_target(self) -> None:
        cfg = self.refresh()
        kind = backend_facts(cfg.backend)[1] if cfg is not None else "gguf"
        if kind == "folder":
            path = QFileDialog.getExistingDirectory(self, "Add a model folder to map", str(Path.cwd()))
        else:
            path, _ = QFileDialog.getOpenFileName(self, "Add a model file to map", str(Path.cwd()),
                                                  "GGUF models (*.gguf);;All files (*)")
        if path:
            self.add_target(path)

    def add_target(self, name: str, checked: bool = True) -> None:
        self.form.targets.add(name, checked)
        self.form.targets.touched = True

    # ------------------------------------------------------------ the prescription
    def prescribe(self) -> PrescriptionRequest | None:
        """Prescribe from the map shown with the Run panel's draft model, on the worker."""
        if self.kmap is None:
            self.sigError.emit("no kernel map yet: run or open one, then Prescribe", "")
            return None
        problem = self.panel.candidates_problem()
        if problem is not None:
            self.panel.candidates.setFocus()
            self.sigError.emit(f"Prescription n_max: {problem}", "")
            return None
        try:
            cfg = self.config()
        except SpecviewError as exc:
            self.sigError.emit(f"the Run panel's settings are not valid: {exc}", "")
            return None
        if not cfg.draft:
            self.sigError.emit("the prescription measures draft-model speculation: choose a draft model in the Run "
                               "panel first", "")
            return None
        req = PrescriptionRequest(self.kmap, cfg.draft, self.panel.candidate_values(), self.panel.tokens.value())
        self._submit(req)
        self.host.submit_prescription(req)
        self.sigBusy.emit(True, "prescription: measuring both arms per n_max…")
        self.sigVerdict.emit(f"Prescribing from the map shown with draft {html.escape(cfg.draft)}: both arms for "
                             f"each n_max on the map's prompts. Esc cancels.", "info", "")
        return req

    def _on_prescription_finished(self, ev: PrescriptionFinished) -> None:
        if not self.owns(ev.request_id):
            return
        self._release()
        if ev.cancelled or ev.prescription is None:
            self.sigVerdict.emit(f"<b>Prescription cancelled</b> after {ev.seconds:.1f} s.", "info", "")
            self.sigBusy.emit(False, f"prescription cancelled after {ev.seconds:.1f} s")
        else:
            self.show_prescription(ev.prescription)
            self.sigBusy.emit(False, f"prescription in {ev.seconds:.1f} s; Save prescription… writes it")
        self.sigPrescriptionFinished.emit(ev)

    def show_prescription(self, pres: Any) -> None:
        """Show a :class:`~specview.core.matrix.prescribe.Prescription` in the panel, and its gist in the verdict bar."""
        self._set_prescription(pres)
        text, kind = prescription_verdict(pres)
        self.sigVerdict.emit(text, kind, "")

    def _set_prescription(self, pres: Any) -> None:
        self.prescription = pres
        self.panel.text.setPlainText("" if pres is None else pres.text())
        self.panel.save_button.setEnabled(pres is not None)

    def save_prescription(self, path: str | os.PathLike[str]) -> Path | None:
        if self.prescription is None:
            self.sigError.emit("no prescription to save yet: Prescribe first", "")
            return None
        try:
            p = write_atomic(path, json.dumps(json_safe(self.prescription.to_json()), indent=1) + "\n")
        except (SpecviewError, OSError) as exc:
            self.sigError.emit(f"{path}: could not save the prescription ({exc})", "")
            return None
        self.sigStatus.emit(f"prescription saved to {p}")
        return p

    def choose_save_prescription(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save the prescription", str(Path.cwd() / "prescription.json"),
                                              "specview prescriptions (*.json)")
        if path:
            self.save_prescription(path)
