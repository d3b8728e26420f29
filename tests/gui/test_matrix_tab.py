"""The Matrix tab: open a matrix file, run one on the model worker (streamed, cancellable), open a cell side by side.

Real llama.cpp on the tiny models the tests write (tests/tinymodel.py), one thread.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QDialogButtonBox

from specview.core.config import EngineSettings
from specview.core.matrix import MatrixSpec, PromptSpec, load_matrix, run_matrix
from specview.core.matrix.summary import cell_drafted_nothing
from specview.core.session import Session
from specview.core.trace import Trace

RUN_TIMEOUT = 300_000  # ms; the waits end on signals
PROMPT = PromptSpec(name="raw", tokens=(1, 270, 280, 290), chat=False)


def tiny_spec(tiny_dir: Path, **kw) -> MatrixSpec:
    d = dict(targets=[str(tiny_dir / "target.gguf"), str(tiny_dir / "other.gguf")],
             drafters=[str(tiny_dir / "draft.gguf"), "ngram-simple", "none"], n_max=[1, 3], prompts=[PROMPT],
             max_tokens=24, ignore_eos=True, engine=EngineSettings(threads=1), diagnose=False)
    d.update(kw)
    return MatrixSpec(**d)


@pytest.fixture(scope="module")
def matrix_file(tiny_dir, tmp_path_factory) -> Path:
    """A small matrix written by run_matrix on the tiny models, with each cell's trace saved."""
    root = tmp_path_factory.mktemp("matrix")
    session = Session()
    try:
        run = run_matrix(tiny_spec(tiny_dir), session, out=root / "m.json", traces_dir=root / "traces")
    finally:
        session.close()
    assert run.status == "complete"
    return root / "m.json"


def find_item(view, pred):
    t = view.table
    for r in range(t.rowCount()):
        for c in range(t.columnCount()):
            cell = view.cellAt(r, c)
            if cell is not None and pred(cell):
                return r, c, cell
    raise AssertionError("no such cell")


def double_click(qtbot, view, r, c):
    t = view.table
    rect = t.visualItemRect(t.item(r, c))
    qtbot.mouseClick(t.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.mouseDClick(t.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def assert_shows_cell(w, trace: Trace, cell: dict) -> None:
    """The side-by-side view shows the cell's run: same fork (or identical), same token counts, same texts."""
    assert w.tabs.currentIndex() == 0
    fm = trace.comparison.first_mismatch
    assert trace.comparison.identical == cell["identical"]
    assert (None if fm is None else fm.index) == cell["first_mismatch"]
    assert (len(trace.vanilla.tokens), len(trace.speculative.tokens)) == (cell["n_vanilla"], cell["n_speculative"])
    assert w.panes.vanilla.text() == trace.vanilla.text and w.panes.speculative.text() == trace.speculative.text
    assert w.panes.vanilla.mismatch_index == cell["first_mismatch"]
    if cell_drafted_nothing(cell):  # identical, but nothing speculative was tested
        assert w.verdict.text().startswith("<b>Inconclusive</b>")
    elif cell["identical"]:
        assert "Identical" in w.verdict.text()
    else:
        assert f"Forked at token {cell['first_mismatch']}" in w.verdict.text()


def test_open_matrix_and_double_click_opens_the_saved_trace(matrix_file, make_window, qtbot):
    w = make_window()
    w.show()
    assert w.open_matrix(matrix_file)
    view = w.matrix_view
    assert w.tabs.currentWidget() is view
    doc = load_matrix(matrix_file)
    assert len(doc["cells"]) == 8  # 2 targets x (draft at n_max 1 and 3, ngram-simple, none)
    assert (view.table.rowCount(), view.table.columnCount()) == (2, 4)
    n_forks = sum(not c["identical"] for c in doc["cells"])
    assert f"Matrix complete</b>: 8 of 8 cells, {n_forks} forked, 0 failed" in w.verdict.text()
    # a forked cell when the tiny models fork, else the first draft-model cell
    forked = [c for c in doc["cells"] if not c["identical"]]
    want = forked[0] if forked else doc["cells"][0]
    r, c, cell = find_item(view, lambda x: x["index"] == want["index"])
    with qtbot.waitSignal(w.sigTraceShown, timeout=10_000) as blk:
        double_click(qtbot, view, r, c)
    trace = blk.args[0]
    assert_shows_cell(w, trace, cell)
    saved = Trace.load(matrix_file.parent / cell["trace"])
    assert trace.vanilla.tokens == saved.vanilla.tokens and trace.speculative.tokens == saved.speculative.tokens
    assert w.host.worker.runner is None  # the saved trace was opened; no model was loaded


def test_a_forked_cell_opens_at_its_fork(matrix_file, synth, make_window, qtbot, tmp_path):
    """The tiny models agree with themselves; a forked trace in place of one cell's shows the fork path."""
    doc = json.loads(matrix_file.read_text())
    forked = synth(40, fork=25)
    cell = doc["cells"][1]
    cell["trace"] = str(forked.save(tmp_path / "cell-001.json"))
    cell.update(identical=False, first_mismatch=25, n_vanilla=40, n_speculative=40, verdict="diverged")
    path = tmp_path / "forked.json"
    path.write_text(json.dumps(doc))
    w = make_window()
    w.show()
    assert w.open_trace(path) is None  # File > Open (and `specview gui FILE`) sends a matrix to its tab
    assert w.tabs.currentWidget() is w.matrix_view and w.last_error is None
    r, c, got = find_item(w.matrix_view, lambda x: x["index"] == 1)
    assert w.matrix_view.table.item(r, c).text().startswith("fork @ 25")
    assert "1 forked" in w.verdict.text() and w.verdict_kind == "bad"  # an undiagnosed fork
    with qtbot.waitSignal(w.sigTraceShown, timeout=10_000) as blk:
        double_click(qtbot, w.matrix_view, r, c)
    assert_shows_cell(w, blk.args[0], got)
    assert w.panes.selected == 25  # the view jumped to the fork


def test_a_cell_without_a_trace_is_run_with_its_config(matrix_file, make_window, qtbot, tmp_path):
    doc = json.loads(matrix_file.read_text())
    for cell in doc["cells"]:
        cell["trace"] = None
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc))
    w = make_window()
    w.show()
    w.diagnose.setChecked(False)
    assert w.open_matrix(bare)
    view = w.matrix_view
    r, c, cell = find_item(view, lambda x: x["params"]["drafter"].endswith("draft.gguf") and x["params"]["n_max"] == 3
                           and x["params"]["target"].endswith("target.gguf"))
    with qtbot.waitSignal(w.sigTraceShown, timeout=RUN_TIMEOUT) as blk:
        double_click(qtbot, view, r, c)
    trace = blk.args[0]
    assert_shows_cell(w, trace, cell)
    # the controls show the cell's settings, and the run was exactly the cell's configuration
    assert w.target.value() == cell["params"]["target"] and w.draft.value() == cell["params"]["drafter"]
    assert w.controls["n_max"].value() == 3 and w.controls["max_tokens"].value() == 24 and w.controls["threads"].value() == 1
    assert trace.prompt["tokens"] == list(PROMPT.tokens)
    assert w.host.worker.runner is not None and w.host.worker.runner.loads == 2


def test_run_matrix_streams_cells_from_the_worker(tiny_dir, make_window, qtbot, tmp_path):
    w = make_window()
    spec = tiny_spec(tiny_dir, targets=[str(tiny_dir / "target.gguf")], n_max=[1, 3])
    cells = []
    w.sigMatrixCell.connect(lambda rec: cells.append((rec["index"], len(w.matrix_view.doc["cells"]))))
    with qtbot.waitSignal(w.sigMatrixFinished, timeout=RUN_TIMEOUT) as blk:
        req = w.run_matrix(spec, out_dir=tmp_path / "run")
        assert req is not None and w.busy and w.tabs.currentWidget() is w.matrix_view
        # the planned grid is laid out before any cell finishes
        assert w.matrix_view.table.rowCount() * w.matrix_view.table.columnCount() == 4
    doc = blk.args[0].doc
    # every cell came through the typed signal, one at a time, in order
    assert cells == [(i, i + 1) for i in range(4)]
    assert doc["status"] == "complete" and len(doc["cells"]) == doc["n_cells"] == 4
    assert all(c["status"] == "ok" for c in doc["cells"])
    assert doc["counters"] == {"loads": 2, "vanilla_runs": 1, "speculative_runs": 4}
    assert load_matrix(tmp_path / "run" / "matrix.json")["cells"] == doc["cells"]
    assert not w.busy and "Matrix complete" in w.verdict.text()
    # the finished cells open side by side from their saved traces
    r, c, cell = find_item(w.matrix_view, lambda x: x["params"]["drafter"] == "none")
    w.show()
    with qtbot.waitSignal(w.sigTraceShown, timeout=10_000) as blk2:
        double_click(qtbot, w.matrix_view, r, c)
    assert_shows_cell(w, blk2.args[0], cell)
    assert cell["identical"] and cell["n_drafted"] == 0


def test_a_matrix_without_an_output_folder_is_kept_in_the_results_folder(tiny_dir, make_window, qtbot, tmp_path,
                                                                        monkeypatch):
    """Run > preset and Run > matrix name no folder: the matrix and its traces go to a new folder under the results
    folder ($SPECVIEW_RESULTS, else the user's data folder), which outlives the app, and the verdict says where."""
    monkeypatch.setenv("SPECVIEW_RESULTS", str(tmp_path / "results"))
    w = make_window()
    spec = tiny_spec(tiny_dir, targets=[str(tiny_dir / "target.gguf")], drafters=["none"], n_max=[1])
    with qtbot.waitSignal(w.sigMatrixFinished, timeout=RUN_TIMEOUT) as blk:
        req = w.run_matrix(spec)
        assert req is not None
    folders = list((tmp_path / "results" / "matrix").iterdir())
    assert len(folders) == 1 and req.out == str(folders[0] / "matrix.json")
    assert load_matrix(req.out)["cells"] == blk.args[0].doc["cells"]
    assert len(list((folders[0] / "traces").glob("*.json"))) == 1
    assert req.out in w.verdict.toolTip()


def test_a_results_folder_that_cannot_be_made_is_an_error_not_a_run(tiny_dir, make_window, tmp_path, monkeypatch):
    blocked = tmp_path / "results"
    blocked.write_text("a file where the folder should be\n")
    monkeypatch.setenv("SPECVIEW_RESULTS", str(blocked))
    w = make_window()
    before = w.host.current
    assert w.run_matrix(tiny_spec(tiny_dir)) is None
    assert not w.busy and w.host.current is before and w.matrix_tab.request is None
    shown = html.unescape(w.verdict.text())
    assert f"cannot make a results folder in {blocked / 'matrix'}: Not a directory" in shown


def test_escape_cancels_a_running_matrix(tiny_dir, make_window, qtbot, tmp_path):
    w = make_window()
    w.show()
    w.activateWindow()
    qtbot.waitActive(w)
    spec = tiny_spec(tiny_dir, max_tokens=400, n_max=[1, 2, 3, 4])
    with qtbot.waitSignal(w.sigMatrixCell, timeout=RUN_TIMEOUT):
        w.run_matrix(spec, out_dir=tmp_path / "run")
    with qtbot.waitSignal(w.sigMatrixFinished, timeout=RUN_TIMEOUT) as blk:
        QTest.keyClick(w.windowHandle(), Qt.Key.Key_Escape)
    doc = blk.args[0].doc
    assert doc["status"] == "interrupted" and 1 <= len(doc["cells"]) < doc["n_cells"] == 12
    assert "Matrix cancelled" in w.verdict.text() and not w.busy
    # the window is usable: a bad matrix file is an error in the verdict bar, not a crash
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert not w.open_matrix(bad) and "not a specview matrix" in w.verdict.text()


def test_matrix_dialog_builds_the_spec_around_the_controls(make_window, tiny_dir):
    from specview.gui.matrix import MatrixDialog

    w = make_window()
    w.set_controls(target="demo:Q8_0", draft="demo:Q4_0", n_max=4, max_tokens=32)
    dlg = MatrixDialog(w.build_config(), diagnose=False, parent=w)
    spec = dlg.spec()
    assert spec.targets == ["demo:Q8_0", "demo:Q4_K_M"]
    assert spec.drafters == ["demo:Q4_0", "ngram-simple", "none"] and spec.n_max == [1, 4]
    assert spec.max_tokens == 32 and spec.prompts[0].text == w.prompt.toPlainText().strip()
    assert dlg.count.text() == "8 cells"  # 2 targets x (2 n_max + ngram-simple + none)
    for _v, box in dlg.boxes["drafters"]:
        box.setChecked(False)
    assert "empty" in dlg.count.text()
    assert not dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()


def test_the_matrix_dialog_opens_at_the_size_its_boxes_need(qtbot):
    """A dialog shown at its minimum squeezed the prompt suite's category boxes to half their height: it opens at
    its size hint, each box whole, and the categories sit right under the prompt suite they belong to."""
    from specview.core.config import RunConfig
    from specview.gui.matrix import MatrixDialog

    dlg = MatrixDialog(RunConfig(target="demo:Q4_K_M", draft="demo:Q4_0", prompt="hi", max_tokens=48), diagnose=True)
    qtbot.addWidget(dlg)
    dlg.show()
    qtbot.waitExposed(dlg)
    assert dlg.height() >= dlg.sizeHint().height()
    for _cat, box in dlg.category_boxes:
        assert box.height() >= box.sizeHint().height(), box.text()
    def y(widget):
        return widget.mapTo(dlg, widget.rect().topLeft()).y()

    assert all(y(dlg.prompt_suite) < y(box) < y(dlg.prompt_task) for _cat, box in dlg.category_boxes)


def test_run_matrix_action_runs_what_the_dialog_chose(tiny_dir, make_window, qtbot, monkeypatch):
    from PySide6.QtWidgets import QDialog

    from specview.gui.matrix import MatrixDialog

    def choose(dlg):  # the user keeps the current target and draft, n_max 1 only, and no ngram-simple
        for axis, keep in (("targets", str(tiny_dir / "target.gguf")), ("drafters", None), ("n_max", 1)):
            for value, box in dlg.boxes[axis]:
                box.setChecked(value != "ngram-simple" if axis == "drafters" else value == keep)
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(MatrixDialog, "exec", choose)
    w = make_window()
    w.diagnose.setChecked(False)
    w.set_controls(target=str(tiny_dir / "target.gguf"), draft=str(tiny_dir / "draft.gguf"), n_max=3, max_tokens=16,
                   ignore_eos=True, chat=False, prompt="the cat sat on the", threads=1, diagnose=False)
    with qtbot.waitSignal(w.sigMatrixFinished, timeout=RUN_TIMEOUT) as blk:
        w.act_matrix.trigger()
    doc = blk.args[0].doc
    assert doc["status"] == "complete" and doc["spec"]["n_max"] == [1]
    assert [c["params"]["drafter"] for c in doc["cells"]] == [str(tiny_dir / "draft.gguf"), "none"]
    assert {c["params"]["target"] for c in doc["cells"]} == {str(tiny_dir / "target.gguf")}
    assert all(c["n_vanilla"] == 16 for c in doc["cells"])
