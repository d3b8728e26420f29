"""File ▸ Export Report writes the report of what the tab in front shows: the run, the matrix or the kernel map."""

from __future__ import annotations

from pathlib import Path

from test_kernels_tab import TIMEOUT, choose, toy, toy_window  # noqa: F401  (toy is a fixture)
from test_matrix_view import FakeSession, spec  # the matrix tests' fake session

from specview.core.matrix import run_matrix



def test_export_follows_the_tab_in_front(toy, make_window, qtbot, tmp_path):
    w, kt = toy_window(make_window, prompt="the cat sat", max_tokens=8, diagnose=False)
    # the Kernel map tab is in front and empty: nothing to report, and saying so if asked anyway
    assert not w.act_export.isEnabled() and not w.act_card.isEnabled()
    assert w.export_report(tmp_path / "none") is None and "no kernel map to report yet" in w.last_error
    choose(kt, targets=["dispatch:5:0.05"], prompts=["essay"], widths="1-6", positions=12)
    with qtbot.waitSignal(kt.sigMapFinished, timeout=TIMEOUT):
        kt.start()
    assert w.act_export.isEnabled() and not w.act_card.isEnabled()  # a map, no run: no fork card
    written = w.export_report(tmp_path / "map")
    md = Path(written["markdown"]).read_text()
    assert md.startswith("## specview kernel map") and "dispatch:5:0.05" in md
    assert "vanilla" not in md.split("### ")[0]  # the map's own report, not a run's

    matrix = tmp_path / "m.json"
    run_matrix(spec(), FakeSession(), out=matrix)
    assert w.open_matrix(matrix) and w.tabs.currentWidget() is w.matrix_tab
    assert w.act_export.isEnabled()
    written = w.export_report(tmp_path / "matrix")
    assert Path(written["markdown"]).read_text().startswith("## specview matrix")

    w.tabs.setCurrentWidget(w.side)  # no run yet
    assert not w.act_export.isEnabled()
    with qtbot.waitSignal(w.sigTraceShown, timeout=TIMEOUT):
        w.run()
    assert w.act_export.isEnabled() and w.act_card.isEnabled()
    written = w.export_report(tmp_path / "run")
    run_md = Path(written["markdown"]).read_text()
    assert run_md.startswith("## specview: ") and "### Kernel map" in run_md  # the map covers this run
    w.tabs.setCurrentWidget(w.matrix_tab)
    assert w.act_card.isEnabled()  # the run's fork card stays exportable from any tab
