"""Help ▸ About this setup: the doctor's facts, gathered off the GUI thread, with a Copy button."""

from __future__ import annotations

from importlib.metadata import version

from PySide6.QtGui import QGuiApplication

from specview.gui.about import WAITING, AboutSetupDialog


def test_about_dialog_shows_the_llama_cpp_version_and_copies(qtbot):
    dlg = AboutSetupDialog()
    qtbot.addWidget(dlg)
    with qtbot.waitSignal(dlg.sigReady, timeout=60_000) as got:
        pass
    dlg.thread.join(10)
    text = dlg.text.toPlainText()
    assert got.args[0] == text != WAITING
    assert f"llama-cpp-python {version('llama_cpp_python')}" in text
    assert "[machine]" in text
    assert dlg.copy_button.isEnabled()
    dlg.copy_button.click()
    assert QGuiApplication.clipboard().text() == text


def test_help_menu_opens_it(make_window, qtbot):
    w = make_window()
    w.act_about_setup.trigger()
    dlg = w.about_setup
    with qtbot.waitSignal(dlg.sigReady, timeout=60_000):
        pass
    dlg.thread.join(10)
    assert "llama-cpp-python" in dlg.text.toPlainText()
    dlg.close()
