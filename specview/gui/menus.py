"""The main window's menus, keyboard shortcuts and file dialogs.

Every action is stored on the window (``window.act_run``, ...), so tests and
other code can trigger it as a user would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QFileDialog

from ..core.matrix.preset import preset_names
from .about import show_about_setup
from .card import export_card_dialog
from .models.menu import build_models_menu
from .theme import THEMES


def preset_title(name: str) -> str:
    from ..core.errors import SpecviewError
    from ..core.matrix.preset import load_preset

    try:
        return str(load_preset(name).preset["title"])
    except SpecviewError as exc:
        return str(exc)


def run_preset(w: Any, name: str, *, out_dir: Any = None) -> Any:
    """Run ▸ preset: a public report's matrix on its default models (the demo), on the Run panel's engine settings
    (threads, llama-server binary, ...); its cells stream into the Matrix tab with the findings in its summary."""
    from dataclasses import replace

    from ..core.errors import SpecviewError
    from ..core.matrix.preset import load_preset

    try:
        spec = load_preset(name)
        spec.engine = replace(w.build_config().engine)  # what the panel leaves unset the matrix decides, once
        spec.diagnose = bool(w.diagnose.isChecked())
    except SpecviewError as exc:
        w.show_error(str(exc))
        return None
    return w.run_matrix(spec, out_dir=out_dir)


def build_menus(w: Any) -> None:
    """Give the main window ``w`` its File, Run and View menus."""
    mb = w.menuBar()
    m_file = mb.addMenu("&File")
    w.act_open = QAction("&Open trace…", w, shortcut=QKeySequence.StandardKey.Open, triggered=lambda: open_dialog(w))
    w.act_save = QAction("&Save trace…", w, shortcut=QKeySequence.StandardKey.Save, triggered=lambda: save_dialog(w))
    w.act_save.setEnabled(False)
    w.act_open_matrix = QAction("Open &Matrix…", w, shortcut=QKeySequence("Ctrl+Shift+O"),
                                triggered=w.matrix_tab.choose_file)
    w.act_open_kernels = QAction("Open &kernel map…", w, triggered=lambda: open_kernels_dialog(w))
    w.act_open_kernels.setToolTip("show a saved kernel map (specview.kernels/1) in the Kernel map tab")
    w.act_export = QAction("&Export Report…", w, shortcut=QKeySequence("Ctrl+E"), triggered=lambda: export_dialog(w))
    w.act_export.setToolTip("write the HTML and Markdown report of what the tab in front shows (the run, the matrix "
                            "or the kernel map) into a folder")
    w.act_export.setEnabled(False)
    w.act_card = QAction("Export fork &card…", w, triggered=lambda: export_card_dialog(w))
    w.act_card.setToolTip("write the fork card (one PNG for a bug report) and copy it to the clipboard")
    w.act_card.setEnabled(False)
    act_quit = QAction("&Quit", w, shortcut=QKeySequence.StandardKey.Quit, triggered=w.close)
    m_file.addActions([w.act_open, w.act_save, w.act_open_matrix, w.act_open_kernels])
    m_file.addSeparator()
    m_file.addActions([w.act_export, w.act_card])
    m_file.addSeparator()
    m_file.addAction(act_quit)
    build_models_menu(w, mb)

    m_run = mb.addMenu("&Run")
    w.act_run = QAction("&Run both arms", w, triggered=lambda _checked=False: w.run())
    w.act_run.setShortcuts([QKeySequence("Ctrl+R"), QKeySequence("F5")])
    w.act_cancel = QAction("&Cancel", w, shortcut=QKeySequence("Esc"), triggered=w.cancel)
    w.act_next = QAction("&Next mismatch", w, shortcut=QKeySequence("F8"), triggered=w.next_mismatch)
    w.act_prev = QAction("&Previous mismatch", w, shortcut=QKeySequence("Shift+F8"), triggered=w.previous_mismatch)
    w.act_fork = QAction("Go to the &fork", w, shortcut=QKeySequence("Ctrl+J"), triggered=w.jump_to_fork)
    w.act_matrix = QAction("Run &matrix…", w, shortcut=QKeySequence("Ctrl+M"),
                           triggered=lambda _checked=False: w.run_matrix())
    w.act_matrix.setToolTip("run targets x drafters x n_max around the current settings (Esc cancels)")
    w.act_kernels = QAction("&Kernel map", w, shortcut=QKeySequence("Ctrl+K"),
                            triggered=lambda _checked=False: w.run_kernels())
    w.act_kernels.setToolTip("map which verify widths this build computes exactly like single-token passes, with "
                             "the Kernel map tab's targets and the current engine settings (Esc cancels)")
    m_run.addActions([w.act_run, w.act_matrix])
    m_presets = m_run.addMenu("Run a report's &preset matrix")
    m_presets.setToolTipsVisible(True)
    w.act_presets = {}
    for name in preset_names():
        title = preset_title(name)
        act = QAction(f"{name}: {title}", w, triggered=lambda _checked=False, n=name: run_preset(w, n))
        act.setToolTip(title)
        w.act_presets[name] = act
        m_presets.addAction(act)
    w.act_quality = QAction("&Quality: do forks change answers?", w, shortcut=QKeySequence("Ctrl+Shift+Q"),
                            triggered=lambda _checked=False: w.quality_tab.bring_to_front())
    w.act_quality.setToolTip("the Quality tab: a task suite through both arms with the current settings, and whether "
                             "any fork changes an answer")
    w.quality_tab.connect_cancel(w.act_cancel.triggered)
    m_run.addActions([w.act_kernels, w.act_quality, w.act_cancel])
    m_run.addSeparator()
    m_run.addActions([w.act_fork, w.act_next, w.act_prev])
    for a in (w.act_run, w.act_cancel, w.act_next, w.act_prev, w.act_fork, w.act_matrix, w.act_kernels):
        a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        w.addAction(a)

    m_view = mb.addMenu("&View")
    w.act_boundaries = QAction("Show token &boundaries", w, checkable=True, shortcut=QKeySequence("Ctrl+B"))
    w.act_boundaries.toggled.connect(w.panes.set_boundaries)
    m_view.addAction(w.act_boundaries)
    w.act_sync = QAction("&Scroll panes together", w, checkable=True, checked=True)
    w.act_sync.toggled.connect(lambda on: setattr(w.panes, "sync", on))
    m_view.addAction(w.act_sync)
    m_theme = m_view.addMenu("&Theme")
    w.theme_group = QActionGroup(w)
    w.theme_actions = {}
    for name in THEMES:
        a = QAction(f"&{name.capitalize()}", w, checkable=True)
        a.triggered.connect(lambda _c=False, n=name: w.apply_theme(n))
        w.theme_group.addAction(a)
        m_theme.addAction(a)
        w.theme_actions[name] = a
    m_view.addAction(w.controls_dock.toggleViewAction())

    m_help = mb.addMenu("&Help")
    w.act_about_setup = QAction("&About this setup…", w, triggered=lambda: show_about_setup(w))
    m_help.addAction(w.act_about_setup)


def open_dialog(w: Any) -> None:
    path, _ = QFileDialog.getOpenFileName(w, "Open a specview trace, matrix, kernel map or quality result",
                                          str(Path.cwd()), "specview files (*.json);;All files (*)")
    if not path:
        return
    from .quality import is_quality_file

    if is_quality_file(path):  # a quality.json opens in its tab
        if w.quality_tab.open(path):
            w.quality_tab.bring_to_front()
    else:
        w.open_trace(path)


def open_kernels_dialog(w: Any) -> None:
    path, _ = QFileDialog.getOpenFileName(w, "Open a kernel map", str(Path.cwd()),
                                          "specview kernel maps (*.json);;All files (*)")
    if path:
        w.open_kernel_map(path)


def save_dialog(w: Any) -> None:
    path, _ = QFileDialog.getSaveFileName(w, "Save the trace", str(Path.cwd() / "trace.json"), "specview traces (*.json)")
    if path:
        w.save_trace(path)


def export_dialog(w: Any) -> None:
    folder = QFileDialog.getExistingDirectory(w, "Folder for the report (report.html, report.md and plots)",
                                              str(Path.cwd()))
    if folder:
        w.export_report(folder)
