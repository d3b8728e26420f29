"""The matrix grid widget: colours by verdict, streaming cells, and opening a cell as a RunConfig or trace."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from test_matrix import FakeSession, spec  # noqa: E402  (the matrix tests' fake session)

from specview.core.matrix import load_matrix, run_matrix  # noqa: E402
from specview.core.config import RunConfig  # noqa: E402
from specview.core.verdicts import COLOURS as VERDICT_COLOURS  # noqa: E402
from specview.core.verdicts import category as cell_category  # noqa: E402
from specview.gui.matrix import MatrixView  # noqa: E402


@pytest.fixture
def doc(tmp_path: Path):
    out = tmp_path / "m.json"
    run_matrix(spec(), FakeSession(), out=out, traces_dir=tmp_path / "traces")
    d = load_matrix(out)
    d["cells"][1]["verdict"] = "near-tie"  # give the grid every category to colour
    d["cells"][1]["identical"] = False
    d["cells"][1]["first_mismatch"] = 4
    d["cells"][2] = dict(d["cells"][2], status="error", error="<b>boom</b>", verdict="error")
    out.write_text(json.dumps(d))
    return out


def test_cells_are_coloured_by_verdict(qtbot, doc):
    view = MatrixView()
    qtbot.addWidget(view)
    view.loadFile(doc)
    t = view.table
    assert (t.rowCount(), t.columnCount()) == (6, 6)  # 3 targets x 2 prompts; 4 Q4_0 settings, ngram, none
    seen = set()
    for r in range(t.rowCount()):
        for c in range(t.columnCount()):
            cell = view.cellAt(r, c)
            cat = cell_category(cell)
            seen.add(cat)
            assert t.item(r, c).background().color() == QColor(VERDICT_COLOURS[cat])
            if cat == "identical":
                assert t.item(r, c).text().startswith("identical")
            elif cat in ("diverged", "near-tie"):
                assert t.item(r, c).text().startswith(f"fork @ {cell['first_mismatch']}")
    assert seen == {"identical", "diverged", "near-tie", "error"}
    assert "F16" in view.summary.text()
    assert view.summary.textFormat() == Qt.TextFormat.PlainText  # "<b>boom</b>" is shown, not rendered
    assert "<b>boom</b>" in view.summary.text()


def test_double_click_and_enter_open_the_cell(qtbot, doc):
    view = MatrixView()
    qtbot.addWidget(view)
    view.loadFile(doc)
    view.show()
    cfgs, traces, runs = [], [], []
    view.sigOpenCell.connect(cfgs.append)
    view.sigOpenTrace.connect(traces.append)
    view.sigOpenRun.connect(lambda c, t: runs.append((c, t)))
    target_row = next(r for r in range(view.table.rowCount()) if view.table.verticalHeaderItem(r).text() ==
                      "Q8_0 · raw")
    rect = view.table.visualItemRect(view.table.item(target_row, 2))
    qtbot.mouseClick(view.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())  # a real double
    qtbot.mouseDClick(view.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())  # click starts with one
    assert len(cfgs) == 1 and isinstance(cfgs[0], RunConfig)
    cfg = cfgs[0]
    assert (cfg.target, cfg.draft, cfg.n_max, cfg.p_min, cfg.prompt_tokens) == ("demo:Q8_0", "demo:Q4_0", 4, 0.0,
                                                                                (5, 6, 7))
    assert len(traces) == 1 and Path(traces[0]).exists()
    assert runs == [(cfg, traces[0])]  # one signal carries both
    view.table.setCurrentCell(target_row, 4)  # ngram-simple
    qtbot.keyClick(view.table, Qt.Key.Key_Return)
    assert cfgs[-1].spec_type == "ngram-simple" and cfgs[-1].target == "demo:Q8_0"


def test_streamed_cells_fill_the_planned_grid(qtbot, tmp_path: Path):
    view = MatrixView()
    qtbot.addWidget(view)
    out = tmp_path / "m.json"
    fake = FakeSession()
    counts = []

    def on_cell(rec):
        if not view.doc:
            view.setMatrix(json.loads(out.read_text()))
        view.addCell(rec)
        counts.append(sum(view.cellAt(r, c) is not None
                          for r in range(view.table.rowCount()) for c in range(view.table.columnCount())))

    run_matrix(spec(), fake, out=out, on_cell=on_cell, cancel=lambda: len(fake.calls) >= 7)
    assert counts == [1, 2, 3, 4, 5, 6, 7]
    assert view.table.rowCount() * view.table.columnCount() == 36  # the planned cells are laid out already


def test_the_one_line_rates_hint_of_a_one_prompt_matrix_is_shown_whole(qtbot, tmp_path: Path):
    """Over one prompt the rates panel shrinks to its line of words: measured once its words are set, so the
    splitter gives it the whole line (it kept the height of "No matrix." and cut the line in half)."""
    from specview.core.prompts import PromptSpec

    out = tmp_path / "one.json"
    run_matrix(spec(prompts=[PromptSpec("essay", "Write an essay.")]), FakeSession(), out=out,
               traces_dir=tmp_path / "traces")
    view = MatrixView()
    qtbot.addWidget(view)
    view.resize(1200, 700)
    view.show()
    qtbot.waitExposed(view)
    view.loadFile(out)
    qtbot.wait(50)
    panel = view.rates_panel
    assert panel.compact and panel.hint.text().startswith("Rates need more prompts")
    m = panel.layout().contentsMargins()
    assert panel.height() >= panel.hint.heightForWidth(panel.hint.width()) + m.top() + m.bottom()


def test_an_empty_matrix_tab_says_how_to_get_a_matrix(make_window):
    """Before any matrix the tab names the menu item that runs one and the button that opens one, as they are."""
    from specview.gui.matrix.view import NO_MATRIX

    w = make_window()
    view = w.matrix_tab  # the tab is the view
    assert view.title.text() == NO_MATRIX
    run_menu = next(a.menu() for a in w.menuBar().actions() if a.text().replace("&", "") == "Run")
    assert any(a.text().replace("&", "") + " (" + a.shortcut().toString() + ")" in NO_MATRIX
               for a in run_menu.actions())
    assert view.open_button.text() in NO_MATRIX and view.rates_panel.hint.text() == ""
