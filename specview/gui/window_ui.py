"""The main window's widgets and their wiring: the verdict bar, the tabs, the Run dock, the status bar, the worker."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QLabel, QProgressBar, QTabWidget, QVBoxLayout, QWidget

from .controls import ControlsPanel
from .kernels import TAB_TIP as KERNELS_TIP, KernelTab
from .live import LiveView
from .locate import LocateTab
from .matrix import MatrixTab
from .matrix.tab import TAB_TIP
from .quality import QualityTab
from .models.menu import attach_discovery
from .probe import ProbeTab
from .side_by_side import SideBySide
from .verdict_bar import VerdictBar

AUTO_RUN_MS = 450  # debounce for flip-and-see
AUTO_RUN_PROMPT_MS = 1200  # longer while typing a prompt


def build_ui(w: Any) -> None:
    """Make the window's widgets, store each on the window (``w.verdict``, ``w.tabs``, ``w.controls``, ...) and
    connect their signals to the window's slots."""
    central = QWidget()
    lay = QVBoxLayout(central)
    lay.setContentsMargins(6, 6, 6, 4)
    lay.setSpacing(4)
    w.verdict = VerdictBar()
    w.verdict.sigTry.connect(w.try_settings)
    w.verdict.sigSaveCrash.connect(w.save_crash_trace)
    w.speed = QLabel()
    w.speed.setObjectName("speed")
    w.speed.setTextFormat(Qt.TextFormat.RichText)
    w.speed.setMargin(2)
    w.speed.setWordWrap(True)  # long model paths must wrap, never widen the window past the screen
    w.speed.setMinimumWidth(1)
    lay.addWidget(w.verdict)
    lay.addWidget(w.speed)
    w.side = SideBySide()
    w.panes, w.margin_plot, w.acceptance = w.side.panes, w.side.margin_plot, w.side.acceptance
    w.side.sigStatus.connect(w.show_status)
    w.matrix_view = w.matrix_tab = MatrixTab()
    w.tabs = QTabWidget()
    w.tabs.setObjectName("tabs")
    w.tabs.setDocumentMode(True)
    w.tabs.addTab(w.side, "Side by side")
    w.tabs.addTab(w.matrix_tab, "Matrix")
    w.tabs.setTabToolTip(1, TAB_TIP)
    w.kernels_tab = kt = KernelTab(w.host, w.build_config)
    w.tabs.addTab(kt, "Kernel map")
    w.tabs.setTabToolTip(2, KERNELS_TIP)
    w.locate_tab = LocateTab.attach(w)
    w.tabs.currentChanged.connect(w.on_tab_changed)
    lay.addWidget(w.tabs, 1)
    w.setCentralWidget(central)
    w.live = LiveView(w.panes, w.margin_plot, w.acceptance, w)
    w.live.sigFrame.connect(w.on_frame)

    mt = w.matrix_tab
    mt.sigOpenRun.connect(w.open_cell)
    mt.sigVerdict.connect(w.show_verdict)
    mt.sigStatus.connect(w.show_status)
    mt.sigError.connect(w.show_error)
    mt.sigBusy.connect(w.set_busy)
    mt.sigProgress.connect(lambda done, total: (w.progress.setRange(0, total), w.progress.setValue(done)))
    mt.sigCell.connect(w.sigMatrixCell)
    mt.sigFinished.connect(w.sigMatrixFinished)
    mt.sigCell.connect(lambda _rec: w.update_export_actions())
    kt.sigSubmitting.connect(w.abandon_run)
    kt.sigMapShown.connect(lambda _km: w.update_export_actions())
    kt.sigVerdict.connect(w.show_verdict)
    kt.sigStatus.connect(w.show_status)
    kt.sigError.connect(w.show_error)
    kt.sigBusy.connect(w.set_busy)
    kt.sigProgress.connect(lambda done, total: (w.progress.setRange(0, total), w.progress.setValue(done)))

    dock = QDockWidget("Run", w)
    dock.setObjectName("controls_dock")
    dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                     | QDockWidget.DockWidgetFeature.DockWidgetFloatable)
    w.panel = ControlsPanel(w.prompts)
    dock.setWidget(w.panel)
    w.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, dock)
    w.controls_dock = dock
    c = w.controls = w.panel.controls
    w.engine, w.target, w.draft, w.spec_type = c.engine, c.target, c.draft, c.spec_type
    w.prompt, w.prompt_choice = c.prompt, c.prompt_choice
    w.auto_run, w.diagnose = w.panel.auto_run, w.panel.diagnose
    w.run_button, w.cancel_button = w.panel.run_button, w.panel.cancel_button
    c.sigChanged.connect(lambda: w.schedule_auto_run(AUTO_RUN_MS))
    c.sigChanged.connect(kt.refresh)
    c.sigPromptEdited.connect(lambda: w.schedule_auto_run(AUTO_RUN_PROMPT_MS))
    c.sigEngineChecked.connect(w.on_engine_checked)
    c.sigDeriveWanted.connect(w.derive)
    w.diagnose.toggled.connect(lambda _on: w.schedule_auto_run(AUTO_RUN_MS))
    w.run_button.clicked.connect(lambda _checked=False: w.run())
    w.cancel_button.clicked.connect(w.cancel)

    w.status_label = QLabel()
    w.counters = QLabel()
    w.counters.setObjectName("counters")
    w.progress = QProgressBar()
    w.progress.setMaximumWidth(180)
    w.progress.setTextVisible(False)
    w.progress.setVisible(False)
    w.statusBar().addWidget(w.status_label, 1)
    w.statusBar().addPermanentWidget(w.counters)
    w.statusBar().addPermanentWidget(w.progress)
    w.quality_tab = QualityTab.attach(w)
    w.probe_tab = ProbeTab.attach(w)
    attach_discovery(w)


def connect_worker(w: Any) -> None:
    """Connect the model worker's signals to the window's slots (bound methods: queued into the GUI thread)."""
    worker = w.host.worker
    worker.sigRunStarted.connect(w.on_started)
    worker.sigArmStarted.connect(w.on_arm_started)
    worker.sigSteps.connect(w.live.on_steps)
    worker.sigDiagnosing.connect(w.on_diagnosing)
    worker.sigFinished.connect(w.on_finished)
    worker.sigFailed.connect(w.on_failed)
    worker.sigProgress.connect(w.on_progress)
    worker.sigDerived.connect(w.on_derived)
    worker.sigPreloaded.connect(w.on_preloaded)
    worker.sigMatrixCell.connect(w.matrix_tab.on_cell)
    worker.sigMatrixFinished.connect(w.on_matrix_finished)  # a bound slot: queued into this thread
