"""The Matrix tab shows a cell that drafted nothing as inconclusive: the legend's grey, its words, its tooltip; the
verdict bar counts such cells and turns grey when no cell drafted."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtGui import QColor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from test_matrix import spec  # noqa: E402  (the matrix tests' spec)
from test_matrix_nothing_drafted import HonestDrafts  # noqa: E402  (their fake, drafting what settings allow)

from specview.core.matrix import load_matrix, run_matrix  # noqa: E402
from specview.core.verdicts import COLOURS  # noqa: E402
from specview.gui.matrix import MatrixView  # noqa: E402
from specview.gui.verdict_bar import matrix_verdict  # noqa: E402


def _view(qtbot, tmp_path: Path, **kw) -> MatrixView:
    run_matrix(spec(**kw), HonestDrafts(), out=tmp_path / "m.json")
    view = MatrixView()
    qtbot.addWidget(view)
    view.loadFile(tmp_path / "m.json")
    return view


def test_a_cell_that_drafted_nothing_is_grey_and_says_inconclusive(qtbot, tmp_path: Path):
    view = _view(qtbot, tmp_path)
    t = view.table
    none_col = [t.horizontalHeaderItem(c).text() for c in range(t.columnCount())].index("none")
    for r in range(t.rowCount()):
        item = t.item(r, none_col)
        assert view.cellAt(r, none_col)["n_drafted"] == 0
        assert item.background().color() == QColor(COLOURS["inconclusive"])
        assert item.text().startswith("inconclusive\nnothing drafted")
        assert "the spec type is none, so no drafter ran" in item.toolTip()
    drafted = t.item(0, 0)  # F16 with Q4_0 n_max=1 p_min=0: drafted, identical
    assert view.cellAt(0, 0)["n_drafted"] > 0
    assert drafted.background().color() == QColor(COLOURS["identical"]) and drafted.text().startswith("identical")
    assert "18 inconclusive (nothing drafted)" in view.summary.text()


def test_the_matrix_bar_counts_cells_that_drafted_nothing(tmp_path: Path):
    run_matrix(spec(), HonestDrafts(), out=tmp_path / "m.json")
    text, kind = matrix_verdict(load_matrix(tmp_path / "m.json"))
    assert "36 of 36 cells, 12 forked, 0 failed, 18 drafted nothing (inconclusive)." in text and kind == "bad"
    run_matrix(spec(drafters=["none"]), HonestDrafts(), out=tmp_path / "none.json")
    text, kind = matrix_verdict(load_matrix(tmp_path / "none.json"))
    assert "6 drafted nothing (inconclusive)" in text and kind == "unsure"  # tested nothing: not the identical green
