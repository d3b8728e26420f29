"""The main window: the run controls, the two panes, the two plots, the verdict bar, the Matrix and Kernel map tabs.

The window is a controller: it takes a :class:`RunConfig` from the generated
controls, checked before a run starts (:mod:`specview.gui.prerun`), submits it
to the model worker, lets :class:`~specview.gui.live.LiveView` draw the streamed
tokens, and shows finished (or opened) traces.
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSignalBlocker, QTimer, Signal
from PySide6.QtWidgets import QApplication, QMainWindow

from ..core.config import EngineSettings, RunConfig, settings_class
from ..core.errors import SpecviewError
from ..core.prompts import builtin_prompts
from ..core.trace import Trace
from .models import choices as gmodels
from .export import export_tab_report, report_source
from .locate import locate_link
from .live import Live
from .matrix import MatrixDialog
from .menus import build_menus
from .prerun import engine_notice, engine_refusal, focus_setting, form_config, in_app_words, trace_run
from .settings import read_settings, remember, restore_geometry, write_settings
from . import trace_files
from .theme import apply_theme
from .verdict_bar import crash_text, diagnosis_tooltip, speed_text, trace_verdict
from .window_ui import AUTO_RUN_MS, build_ui, connect_worker
from .messages import (ArmStarted, Derived, DeriveRequest, MatrixRequest, PreloadRequest, Progress, RunFailed,
                       RunFinished, RunRequest, RunStarted)
from .worker import WorkerHost

VERDICT_EVERY_S = 0.25  # the verdict bar's running count is rewritten at most this often
APP_SETTINGS = ("diagnose", "auto_run")


class MainWindow(QMainWindow):
    """specview's desktop window."""

    sigTraceShown = Signal(object)  # Trace, after it is fully displayed (live run or opened file)
    sigError = Signal(str)  # a message shown to the user
    sigBusy = Signal(bool)
    sigMatrixCell = Signal(object)  # a streamed matrix cell record, after the matrix tab shows it
    sigMatrixFinished = Signal(object)  # MatrixFinished, after the matrix tab shows the whole matrix
    sigReportWritten = Signal(object)  # {"html": Path, "markdown": Path, ...}

    def __init__(self, *, settings_path: str | os.PathLike[str] | None = None, preload: bool = False,
                 worker_host: WorkerHost | None = None):
        super().__init__()
        self.setWindowTitle("specview — speculative vs vanilla greedy")
        self.settings_path = Path(settings_path) if settings_path else None
        self.settings = read_settings(self.settings_path)
        self.prompts = {p.name: p.text or "" for p in builtin_prompts()}
        self.host = worker_host or WorkerHost(parent=self)
        self.trace: Trace | None = None
        self.last_good: Trace | None = None  # the last trace shown whole (a crash puts it back)
        self.crashed: RunFailed | None = None  # the last run whose engine died
        self._trace_verdict: dict[str, Any] = {}  # how the trace on screen was shown (cancelled, ...)
        self.request: RunRequest | None = None
        self.busy = False
        self.last_finished: RunFinished | None = None
        self.last_error: str | None = None
        self.file_error_box: Any = None  # the message box of the last file that could not be written
        self._derive: tuple[DeriveRequest, str] | None = None
        self.pending_preload: PreloadRequest | None = None  # the models loading before the first Run
        self._suspend_auto = True
        self._said, self._said_fork = 0.0, None  # when the running count was last written, and its fork

        build_ui(self)
        build_menus(self)
        connect_worker(self)
        self._apply_settings(self.settings)
        self.apply_theme(self.settings.get("theme", "system"))
        restore_geometry(self, self.settings.get("geometry"))
        self.auto_timer = QTimer(self)
        self.auto_timer.setSingleShot(True)
        self.auto_timer.timeout.connect(self._auto_run)
        self._suspend_auto = False
        if self.controls.engine_problem is not None:
            self.on_engine_checked(self.controls.backend_name(), self.controls.engine_problem)
        else:
            self.verdict.show_text("Ready. Press Run (Ctrl+R / F5) to run both arms; Esc cancels.", "info")
        if preload:
            try:
                self.pending_preload = self.host.preload(PreloadRequest(self.build_config()))
                self.set_busy(True, "loading the models…")
            except SpecviewError:
                pass

    @property
    def verdict_kind(self) -> str:
        return self.verdict.kind

    @property
    def frames(self) -> int:
        return self.live.frames

    # ------------------------------------------------------------ settings
    def _apply_settings(self, s: dict[str, Any]) -> None:
        self._suspend_auto = True
        try:
            for picker in (self.target, self.draft):
                picker.remember(s.get("recent", []))
            for name in APP_SETTINGS:
                box = getattr(self, name)
                with QSignalBlocker(box):
                    box.setChecked(bool(s.get(name)))
            self.controls.set_state(s["run"])
            with QSignalBlocker(self.act_boundaries):
                self.act_boundaries.setChecked(bool(s.get("boundaries")))
            self.panes.set_boundaries(bool(s.get("boundaries")))
        finally:
            self._suspend_auto = False

    def save_settings(self) -> None:
        run = self.controls.state()
        self.settings.update(run=run, diagnose=self.diagnose.isChecked(), auto_run=self.auto_run.isChecked(),
                             boundaries=self.act_boundaries.isChecked(),
                             recent=remember(self.settings.get("recent", []), run.get("target"), run.get("draft")),
                             geometry=base64.b64encode(bytes(self.saveGeometry())).decode("ascii"))
        write_settings(self.settings_path, self.settings)

    # ------------------------------------------------------------- config
    def build_config(self) -> RunConfig:
        """The run the controls describe, checked before anything loads (:func:`~specview.gui.prerun.form_config`):
        raises ConfigError naming a bad value."""
        return form_config(self.controls)

    def set_controls(self, **values: Any) -> None:
        """Set controls by setting name (``p_min=1.0``, ``backend="mlx"``, ``diagnose=False``...) as a user
        would; an auto re-run follows if it is on."""
        state = self.controls.state()
        for k, v in values.items():
            if k in APP_SETTINGS:
                getattr(self, k).setChecked(bool(v))
            elif k == "engine" and not isinstance(v, dict):
                raise TypeError("engine= takes the engine settings; the engine's name is backend=")
            elif k == "prompt":
                state["prompt"], state["prompt_tokens"] = v, None
            elif settings_class(k) is EngineSettings:
                state["engine"][k] = v
            else:
                state[k] = v
        self.controls.set_state(state)
        if self.controls.engine_problem is None:
            self.schedule_auto_run(AUTO_RUN_MS)

    def try_settings(self, settings: dict[str, Any]) -> None:
        """A "try" link in the verdict bar: set those controls and run."""
        self.set_controls(**settings)
        self.run()

    def schedule_auto_run(self, ms: int) -> None:
        if self.auto_run.isChecked() and not self._suspend_auto and hasattr(self, "auto_timer"):
            self.auto_timer.start(ms)

    def _auto_run(self) -> None:
        if self.auto_run.isChecked() and not self.long_job():  # never cancel a matrix or a kernel map unasked
            self.run()

    def long_job(self) -> bool:
        """A matrix, kernel map, prescription or quality run holds the worker (a run does not)."""
        return any(t.request is not None for t in (self.matrix_tab, self.kernels_tab, self.quality_tab))

    def on_engine_checked(self, name: str, problem: str | None) -> None:
        """The chosen engine was asked whether it runs here: no auto run while it cannot, and the verdict bar says
        so (:func:`~specview.gui.prerun.engine_notice`)."""
        self.engine_problem = problem
        if problem is not None and hasattr(self, "auto_timer"):
            self.auto_timer.stop()
        notice = engine_notice(name, problem, self.verdict.kind, self.verdict.text())
        if notice.verdict is not None:
            self.show_verdict(*notice.verdict, "")
        self.show_status(notice.status)

    # --------------------------------------------------------------- running
    def run(self, *, reuse_vanilla: bool = True) -> RunRequest | None:
        """Run both arms with the current controls (cancelling any run in progress)."""
        self.auto_timer.stop()
        try:
            cfg = self.build_config()
        except SpecviewError as exc:
            self.show_error(str(exc))
            focus_setting(self.controls, exc)
            return None
        return self.run_config(cfg, reuse_vanilla=reuse_vanilla, apply=False)

    def run_config(self, cfg: RunConfig, *, reuse_vanilla: bool = True, apply: bool = True) -> RunRequest | None:
        """Run exactly ``cfg`` (a matrix cell's, say), showing its settings in the controls first."""
        self.auto_timer.stop()
        if apply:
            self._suspend_auto = True
            try:
                self.controls.set_config(cfg)
            finally:
                self._suspend_auto = False
        why = engine_refusal(cfg)
        if why is not None:
            self.show_error(why)
            return None
        self.matrix_tab.request = None  # submitting cancels a running matrix
        self.tabs.setCurrentIndex(0)
        req = RunRequest(cfg, diagnose=self.diagnose.isChecked(), reuse_vanilla=reuse_vanilla)
        self.request = req
        self.side.streamed = self.live.begin(req).steps
        self.speed.setText("")  # the last run's figures are not this one's
        self.last_error = None
        self.host.submit(req)
        self.set_busy(True, "starting…")
        return req

    def cancel(self) -> None:
        if self.busy and self.kernels_tab.request is not None:
            self.kernels_tab.cancel()
        elif self.busy and (self.matrix_tab.request is not None or self.request is not None):
            self.host.cancel()
            what = "the matrix" if self.matrix_tab.request is not None else ""
            self.show_status(f"cancelling {what} (stops within one forward pass)…".replace("  ", " "))
        self.auto_timer.stop()

    def _current(self, rid: int) -> bool:
        return self.request is not None and rid == self.request.id

    def on_started(self, ev: RunStarted) -> None:
        if self._current(ev.request_id):
            self.show_status("running…")
            self.live.start_frames()

    def on_arm_started(self, ev: ArmStarted) -> None:
        if not self._current(ev.request_id):
            return
        self.live.on_arm_started(ev)
        if ev.arm == "vanilla":
            self.trace = None
            self.side.clear_trace()
            self.act_save.setEnabled(False)
            self.update_export_actions()
        self.show_status(f"{ev.arm} arm…")

    def on_frame(self, live: Live) -> None:
        req = live.request
        if req is None:
            return
        nv, ns = live.counts()
        total = req.cfg.max_tokens
        self.progress.setRange(0, 2 * total)
        self.progress.setValue(min(2 * total, nv + ns))
        now = time.perf_counter()
        if now - self._said < VERDICT_EVERY_S and (live.first_diff is None) == (self._said_fork is None):
            return  # new words lay the window out again: a few times a second is enough to read them
        self._said, self._said_fork = now, live.first_diff
        fork = f" · arms differ from token {live.first_diff}" if live.first_diff is not None else ""
        self.verdict.show_text(f"Running: vanilla {nv}/{total} tokens, speculative {ns}/{total}{fork}", "info")

    def on_diagnosing(self, ev: RunStarted) -> None:
        if not self._current(ev.request_id):
            return
        self.live.stop()
        fork = self.live.live.first_diff
        if fork is not None:
            self.verdict.show_text(f"The arms differ from token {fork}: diagnosing the fork (replays and controls)… "
                                   "Esc cancels.", "info")

    def on_progress(self, ev: Progress) -> None:
        if self.kernels_tab.on_progress(ev) or self.quality_tab.on_progress(ev):  # a map's fraction, a suite's ETA
            return
        # progress messages come while models load or derive and while the fork is diagnosed,
        # not while tokens stream: show an indeterminate bar until the next tokens arrive
        if self.busy:
            self.progress.setRange(0, 0)
        self.show_status(ev.message)

    def on_preloaded(self, rid: int) -> None:
        if self.pending_preload is not None and rid == self.pending_preload.id:
            self.pending_preload = None
            if self.request is None or not self.busy:
                self.set_busy(False, "models loaded; press Run (Ctrl+R)")

    def on_finished(self, ev: RunFinished) -> None:
        if not self._current(ev.request_id):
            return
        self.live.stop()
        self.last_finished = ev
        self.counters.setText(f"runs: vanilla {ev.vanilla_runs} · speculative {ev.speculative_runs} · "
                              f"models loaded {ev.loads}")
        self.set_busy(False, f"finished in {ev.seconds:.1f} s" + (" (cancelled)" if ev.cancelled else ""))
        self.show_trace(ev.trace, cancelled=ev.cancelled, diagnosis_error=ev.diagnosis_error)

    def on_failed(self, ev: RunFailed) -> None:
        if self._derive is not None and ev.request_id == self._derive[0].id:
            self._derive = None
        elif self.pending_preload is not None and ev.request_id == self.pending_preload.id:
            self.pending_preload = None
        elif self.matrix_tab.on_failed(ev.request_id, ev.message, ev.details):
            return
        elif self.kernels_tab.on_failed(ev.request_id, ev.message, ev.details):
            return
        elif not self._current(ev.request_id):
            return
        else:
            self.live.stop()
        self.set_busy(False, "")
        if ev.crash is not None:
            self.show_crash(ev)
        else:
            shown = self.restore_last_good()
            self.show_error(ev.message + ("\nThe panes and plots show the last finished run." if shown else ""),
                            ev.details)

    def restore_last_good(self) -> bool:
        """After a run that failed or crashed: the last finished run back on screen whole (texts, plots, speed), as
        the failed one had begun to replace it, or an empty window when there was none.  True when one is shown."""
        if self.last_good is not None:
            self.show_trace(self.last_good)
            return True
        self.trace = None
        self.side.show_empty()
        self.speed.setText("")
        self.act_save.setEnabled(False)
        self.update_export_actions()
        return False

    def show_crash(self, ev: RunFailed) -> None:
        """The engine's worker died: say so with the retry, keep the settings and the last finished run on screen,
        and keep the crashed run for File ▸ Save (a crash is itself a bug report)."""
        self.crashed = ev
        self.restore_last_good()
        t = ev.trace
        kept = len(t.vanilla.tokens) + len(t.speculative.tokens) if t is not None else 0
        self.last_error = ev.message
        self.verdict.show_text(crash_text(ev.message, ev.crash or {}, kept_tokens=kept), "error")
        self.verdict.setToolTip("\n".join((ev.crash or {}).get("log_tail") or []))
        self.show_status(f"engine crashed: {(ev.crash or {}).get('signal') or 'exit'}")
        self.sigError.emit(ev.message)

    def save_crash_trace(self, path: str | os.PathLike[str] | None = None) -> str | None:
        return trace_files.save_crash_trace(self, path)

    # ------------------------------------------------------------ matrix
    def run_matrix(self, spec: Any = None, *, out_dir: str | os.PathLike[str] | None = None) -> MatrixRequest | None:
        """Run a reproducer matrix on the model worker, streaming its cells into the Matrix tab.

        Without ``spec`` a dialog offers targets, drafters and n_max around the current controls.
        """
        self.auto_timer.stop()
        if spec is None:
            try:
                dlg = MatrixDialog(self.build_config(), diagnose=self.diagnose.isChecked(), parent=self)
                if dlg.exec() != MatrixDialog.DialogCode.Accepted:
                    return None
                spec = dlg.spec()
            except SpecviewError as exc:
                self.show_error(str(exc))
                return None
        self.abandon_run()
        req = self.matrix_tab.start(spec, self.host, out_dir=out_dir)
        if req is not None:
            self.tabs.setCurrentWidget(self.matrix_tab)
        return req

    def abandon_run(self) -> None:
        """A matrix or kernel map takes the worker: a run still streaming is cancelled by its submit, and its
        events are stale from here on."""
        self.auto_timer.stop()
        self.last_error = None
        self.request = None
        self.live.timer.stop()
        self.matrix_tab.request = None  # an interrupted matrix's last events are stale too

    def run_kernels(self) -> Any:
        """Run > Kernel map: the Kernel map tab, computing its map with the Run panel's engine settings."""
        self.tabs.setCurrentWidget(self.kernels_tab)
        return self.kernels_tab.start()

    def open_kernel_map(self, path: str | os.PathLike[str]) -> bool:
        """Show a ``specview.kernels/1`` file in the Kernel map tab."""
        if not self.kernels_tab.open(path):
            return False
        self.tabs.setCurrentWidget(self.kernels_tab)
        return True

    def on_matrix_finished(self, ev: Any) -> None:
        # a cell opened meanwhile keeps its verdict
        self.matrix_tab.on_finished(ev, show_verdict=self.tabs.currentWidget() is self.matrix_tab)
        self.update_export_actions()

    def show_verdict(self, text: str, kind: str, tooltip: str) -> None:
        self.verdict.show_text(text, kind)
        self.verdict.setToolTip(tooltip)

    def open_matrix(self, path: str | os.PathLike[str]) -> bool:
        """Show a ``specview.matrix/1`` file in the Matrix tab."""
        if not self.matrix_tab.open(path):
            return False
        self.tabs.setCurrentWidget(self.matrix_tab)
        self.update_export_actions()
        return True

    def open_cell(self, cfg: RunConfig | None, trace_path: str | None) -> None:
        """A double-clicked matrix cell: its saved trace when there is one, else a run of its config."""
        if trace_path and self.open_trace(trace_path) is not None:
            self.tabs.setCurrentIndex(0)
            return
        if cfg is not None:
            self.run_config(cfg)

    # ------------------------------------------------------------ report
    def report_source(self) -> tuple[str, Any] | None:
        """What File ▸ Export Report writes: the tab in front's run, matrix or kernel map (None: nothing yet)."""
        return report_source(self)

    def update_export_actions(self) -> None:
        """Enable Export Report when the tab in front has a report to write, Export fork card when a run is shown."""
        self.act_export.setEnabled(self.report_source() is not None)
        self.act_card.setEnabled(self.trace is not None)  # a fork card is a run's

    def export_report(self, folder: str | os.PathLike[str]) -> dict[str, Path] | None:
        """Write the HTML and Markdown report of what the tab in front shows into ``folder``
        (:func:`specview.gui.export.export_tab_report`)."""
        return export_tab_report(self, folder)

    def set_busy(self, busy: bool, status: str) -> None:
        """A job holds the worker (or no longer does): Cancel, the progress bar and the status line follow."""
        self.busy = busy
        self.cancel_button.setEnabled(busy)
        self.progress.setVisible(busy)
        if busy:
            self.progress.setRange(0, 0)
        self.show_status(status)
        self.sigBusy.emit(busy)

    def show_status(self, msg: str) -> None:
        self.status_label.setText(msg)

    # ------------------------------------------------------------ derivation
    def derive(self, choice: gmodels.QuantChoice, role: str) -> None:
        if choice.source is None:
            return
        kind = (self.target if role == "target" else self.draft).model_kind
        self._derive = (self.host.derive(DeriveRequest(choice, kind)), role)
        self.set_busy(True, f"deriving {choice.quant} from {Path(choice.source).name}…")

    def on_derived(self, ev: Derived) -> None:
        if self._derive is None or ev.request_id != self._derive[0].id:
            return
        role = self._derive[1]
        self._derive = None
        self.set_busy(False, f"derived {ev.quant} in {ev.seconds:.1f} s: {ev.path}")
        (self.target if role == "target" else self.draft).set_value(ev.path, emit=True)

    # ---------------------------------------------------------- displaying
    def show_trace(self, trace: Trace, *, cancelled: bool = False, diagnosis_error: str | None = None) -> None:
        """Show a finished or opened trace: panes, plots, marks, verdict."""
        self.trace = self.last_good = trace
        self.act_save.setEnabled(True)
        self.update_export_actions()
        self.live.live.pending = {"vanilla": [], "speculative": []}
        note = self.side.show_trace(trace)
        self.locate_tab.show_departure(trace)
        self._trace_verdict = dict(cancelled=cancelled, diagnosis_error=diagnosis_error, diag_note=note)
        self.show_trace_verdict()
        self.speed.setText(speed_text(trace))
        self.sigTraceShown.emit(trace)

    def show_trace_verdict(self) -> None:
        """The verdict bar for the trace on screen, with what the kernel map in its tab says about that run."""
        trace = self.trace
        if trace is None:
            return
        others = [c.path for c in self.target.choices if c.exists]
        text, kind = trace_verdict(trace, n_diffs=len(self.side.diffs), other_quants=others,
                                   kernel=self.kernels_tab.prediction_for(trace), **self._trace_verdict)
        self.verdict.show_text(text + locate_link(trace), kind)
        self.verdict.setToolTip(diagnosis_tooltip(trace.diagnosis if isinstance(trace.diagnosis, dict) else None))

    def on_tab_changed(self, _index: int) -> None:
        """The verdict bar and File ▸ Export Report speak of the tab in front: its run, matrix or map (the
        verdict not while that tab's job streams)."""
        self.update_export_actions()
        w = self.tabs.currentWidget()
        if w is self.side and not (self.busy and self.request is not None):
            self.show_trace_verdict()
        elif w is self.matrix_tab and self.matrix_tab.doc and self.matrix_tab.request is None:
            self.matrix_tab.show_verdict(str(self.matrix_tab.source or ""))
        elif w is self.kernels_tab and self.kernels_tab.request is None:
            self.kernels_tab.show_verdict()
        elif w is self.quality_tab and self.quality_tab.request is None and self.quality_tab.result is not None:
            self.quality_tab.show_verdict()
        elif w is self.probe_tab and self.probe_tab.request is None:
            self.verdict.show_text(*self.probe_tab.verdict())
            self.verdict.setToolTip("")

    def show_error(self, message: str, details: str = "") -> None:
        """Show an error in the verdict bar (the window stays usable)."""
        self.last_error = message
        self.verdict.show_text(f"<b>Error</b>: {in_app_words(message)}".replace("\n", "<br>"), "error")
        self.verdict.setToolTip(details or "")
        self.show_status("error")
        self.sigError.emit(message)

    def show_file_error(self, what: str, why: str) -> None:
        trace_files.show_file_error(self, what, why)

    # ------------------------------------------------------------ selection
    def select_token(self, i: int | None, *, scroll: bool = False) -> None:
        self.side.select_token(i, scroll=scroll)

    def next_mismatch(self) -> int | None:
        return self.side.next_mismatch()

    def previous_mismatch(self) -> int | None:
        return self.side.previous_mismatch()

    def jump_to_fork(self) -> None:
        self.side.jump_to_fork()

    # ------------------------------------------------------------ files
    def open_trace(self, path: str | os.PathLike[str]) -> Trace | None:
        return trace_files.open_trace(self, path)

    def set_controls_from_trace(self, trace: Trace) -> str | None:
        """Show the trace's run in the controls; a reason when it cannot be run again here."""
        cfg, why = trace_run(trace)
        if cfg is None:
            return why
        self._suspend_auto = True
        try:
            self.controls.set_config(cfg)
        finally:
            self._suspend_auto = False
        self.auto_timer.stop()
        return None

    def save_trace(self, path: str | os.PathLike[str]) -> Path | None:
        return trace_files.save_trace(self, path)

    # ------------------------------------------------------------ theme
    def apply_theme(self, name: str) -> None:
        name = apply_theme(name)
        self.settings["theme"] = name
        if name in self.theme_actions:
            self.theme_actions[name].setChecked(True)
        app = QApplication.instance()
        pal = self.palette() if app is None else app.palette()
        self.acceptance.apply_palette(pal)
        self.margin_plot.apply_palette(pal)
        self.locate_tab.apply_palette(pal)
        self.verdict.repaint_theme()

    # ------------------------------------------------------------ lifecycle
    def shutdown(self) -> bool:
        """Cancel, stop the model scan, free the models in their thread, stop and join both threads."""
        self.auto_timer.stop()
        self.live.timer.stop()
        scan_stopped = self.model_scan.stop()
        return self.host.stop() and scan_stopped

    def closeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        self.save_settings()
        self.shutdown()
        super().closeEvent(ev)
