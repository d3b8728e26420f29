"""The Quality tab: a task suite through both arms on the model worker, its 2x2 table, its items and their traces.

An engine registered for the test answers the generated ``arithmetic`` suite:
the vanilla arm always right, the speculative arm wrong on planted items (its
text forks at the answer's last digit); the diagnosis calls one planted fork
a state bug and the others near-ties.  The figures the tab shows are read
back from its widgets and checked against the plant, a double-clicked item
opens its own trace side by side, and a code suite whose confirmation is
answered No runs nothing.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QMessageBox

from answers import AnswerRunner, margin_of, wrong

from specview.core import verdicts
from specview.core.quality import QualityResult, load_suite, mcnemar_exact
from specview.core.registry import Backend, register_backend, unregister_backend
from specview.gui.quality import ExecuteConfirm, OutcomeTable
from specview.core.diagnose.ties import FIXED_BANDS
from specview.gui.quality.tables import DISCORDANT, ITEM_COLUMNS, TIE_COLUMNS, counts

ENGINE = "quality-gui-fake"
N_ITEMS = 7
PLANTED = (1, 4, 5)  # the speculative arm answers these wrong
STATE_ITEM = 4  # ... and its fork is diagnosed a state bug; the other planted forks near-ties
TIMEOUT = 60_000


class AnswerBackend(Backend):
    """The test's engine: its runner answers the suite (tests/answers.py), each made one kept in ``runners``."""

    name = ENGINE
    label = "Quality test engine"
    model_kind = "gguf"
    in_process = False
    runners: list[AnswerRunner] = []
    delay = 0.0

    def runner(self, *, progress=None):
        r = AnswerRunner(load_suite("arithmetic", n=N_ITEMS, seed=0), PLANTED, state_item=STATE_ITEM,
                         delay=AnswerBackend.delay)
        AnswerBackend.runners.append(r)
        return r


def calls() -> list:
    return [c for r in AnswerBackend.runners for c in r.calls]
@pytest.fixture
def engine():
    AnswerBackend.runners, AnswerBackend.delay = [], 0.0
    register_backend(ENGINE, AnswerBackend)
    yield ENGINE
    unregister_backend(ENGINE)


def window(make_window):
    w = make_window()
    w.set_controls(backend=ENGINE, target="demo:Q8_0", draft="demo:Q4_0", n_max=3, max_tokens=32)
    assert w.engine_problem is None
    return w


def run_suite(w, qtbot, tmp_path: Path) -> QualityResult:
    tab = w.quality_tab
    tab.form.choose("arithmetic")
    tab.form.items.setValue(N_ITEMS)
    suite = load_suite("arithmetic", n=N_ITEMS, seed=0)
    with qtbot.waitSignal(tab.sigFinished, timeout=TIMEOUT) as blk:
        assert tab.start(suite, out_dir=tmp_path / "q") is not None and w.busy
    res = blk.args[0].result
    assert res is not None and res.status == "complete" and not w.busy
    return res


def figures(table: OutcomeTable) -> list[list[int]]:
    return [[table.value(r, c) for c in range(3)] for r in range(3)]


def test_the_empty_table_shows_every_header_whole_and_tints_nothing(qtbot):
    """Before any run the 2x2 table is sized from its headers' size hints (a header not yet on screen has no width:
    the table was cut to "speculativ"), and with no figures no cell is tinted as a changed answer."""
    t = OutcomeTable()
    qtbot.addWidget(t)
    need = t.verticalHeader().sizeHint().width() + sum(t.columnWidth(c) for c in range(3))
    assert t.width() >= need
    for c in range(3):
        label = t.horizontalHeaderItem(c).text()
        assert t.columnWidth(c) >= t.horizontalHeader().fontMetrics().horizontalAdvance(label), label
    assert all(t.item(r, c).background().style() == Qt.BrushStyle.NoBrush for r in range(3) for c in range(3))


def test_the_table_adds_up_and_matches_the_result(engine, make_window, qtbot, tmp_path: Path):
    w = window(make_window)
    res = run_suite(w, qtbot, tmp_path)
    tab = w.quality_tab
    shown = figures(tab.outcomes)
    # the plant, counted independently: every vanilla answer passes, the planted speculative ones fail
    b = len(PLANTED)
    assert shown == [[N_ITEMS - b, b, N_ITEMS], [0, 0, 0], [N_ITEMS - b, b, N_ITEMS]]
    assert shown == counts(res.table)
    for r in range(2):  # each row and column adds up to its total, the totals to n
        assert shown[r][0] + shown[r][1] == shown[r][2] and shown[0][r] + shown[1][r] == shown[2][r]
    assert shown[2][2] == shown[0][2] + shown[1][2] == len(calls()) == N_ITEMS
    # the discordant cells are tinted, a changed one in the state colour; the others are not
    for r in range(2):
        for c in range(2):
            bg = tab.outcomes.item(r, c).background().color()
            if (r, c) in DISCORDANT:
                want = verdicts.COLOURS["state" if shown[r][c] else "diverged"]
                assert bg == QColor(want), (r, c)
            else:
                assert tab.outcomes.item(r, c).background().style() == Qt.BrushStyle.NoBrush
    p = mcnemar_exact(b, 0)
    assert res.p_mcnemar == pytest.approx(p) == pytest.approx(2 * 0.5 ** b)
    text = tab.headline.text()
    assert ("No evidence speculation changes answers" in text) == (p >= 0.05)
    assert "STATE fork" in text  # the planted state bug is named in the headline
    assert f"vanilla passes {N_ITEMS} of {N_ITEMS}" in tab.rates.text()
    assert f"speculative passes {N_ITEMS - b} of {N_ITEMS}" in tab.rates.text()
    # the items: one row each, in suite order, the state fork on a changed answer marked and bold
    items = tab.items
    assert items.rowCount() == N_ITEMS
    ids = [o.item_id for o in res.items]
    assert [items.item(r, 0).text() for r in range(N_ITEMS)] == ids
    for r in range(N_ITEMS):
        row = [items.item(r, c).text() for c in range(items.columnCount())]
        assert row[1] == "pass" and row[2] == ("fail" if r in PLANTED else "pass")
        assert row[3] == ("no" if r in PLANTED else "yes")
        assert row[ITEM_COLUMNS.index("verdict")] == ("⚠ STATE (answer changed)" if r == STATE_ITEM else "near-tie" if r in PLANTED
                          else "identical")
        assert items.item(r, 0).font().bold() is (r == STATE_ITEM)
        if r in PLANTED:
            assert row[4].startswith(f"@{res.items[r].fork_index}:") and row[5] == res.items[r].fork_context
    # the result file the tab points at reads back to the same table
    saved = QualityResult.load(tab.source)
    assert counts(saved.table) == shown and [o.item_id for o in saved.items] == ids
    # File ▸ Export Report with the tab in front writes the quality run's report
    w.tabs.setCurrentWidget(tab)
    assert w.act_export.isEnabled() and w.report_source() == ("quality run", tab.result)
    written = w.export_report(tmp_path / "report")
    assert written is not None and res.items[STATE_ITEM].item_id in written["html"].read_text()


def test_the_near_tie_density_shown_is_the_one_the_answers_texts_give(engine, make_window, qtbot, tmp_path: Path):
    """Each step's margin follows its character (tests/answers.py), so the near-tie steps per band are counted here
    from the two arms' texts alone; the tab's table must say the same, and an older result without counts says
    why it has none."""
    w = window(make_window)
    run_suite(w, qtbot, tmp_path)
    tab = w.quality_tab
    suite = load_suite("arithmetic", n=N_ITEMS, seed=0)
    texts = {"vanilla": [f"The answer is {it.answer}." for it in suite.items],
             "speculative": [f"The answer is {wrong(it.answer) if i in PLANTED else it.answer}."
                             for i, it in enumerate(suite.items)]}
    assert not tab.ties.isHidden() and tab.ties.rowCount() == len(FIXED_BANDS)
    rows = tab.ties.texts()
    for r, (band, row) in enumerate(zip(FIXED_BANDS, rows)):
        assert row[0] == band.name and band.source in tab.ties.item(r, 0).toolTip()
        for arm, col in (("vanilla", 1), ("speculative", 2)):
            steps = sum(len(t) for t in texts[arm])
            near = sum(margin_of(ch) <= band.width for t in texts[arm] for ch in t)
            assert row[col].startswith(f"{near} of {steps} steps ("), (band.name, arm, row[col])
        # every planted fork is at the answer's last digit, a 0.1 margin: a near-tie in every band
        assert row[3].startswith(f"{len(PLANTED)} of {len(PLANTED)} at a near-tie")
        assert row[4].startswith(f"{len(PLANTED)} of {len(PLANTED)} at a near-tie")
    assert [tab.ties.horizontalHeaderItem(c).text() for c in range(tab.ties.columnCount())] == list(TIE_COLUMNS)
    assert f"{N_ITEMS} item(s)" in tab.ties_note.text()
    # the bands differ on this run: letters are near-ties only in the 2.0-logit band
    assert rows[0][1].split(" of ")[0] == rows[1][1].split(" of ")[0] != rows[2][1].split(" of ")[0]

    # a result written before the counts were kept: no table, and the note says why and what to do
    saved = json.loads(tab.source.read_text())
    for item in saved["items"]:
        item.pop("ties", None)
    saved.pop("near_ties", None)
    old = tmp_path / "old" / "quality.json"
    old.parent.mkdir()
    old.write_text(json.dumps(saved))
    other = make_window()
    assert other.quality_tab.open(old)
    assert other.quality_tab.ties.isHidden() and other.quality_tab.ties.rowCount() == 0
    note = other.quality_tab.ties_note.text()
    assert "not counted" in note and f"{N_ITEMS} item(s)" in note and "run the suite again" in note


def test_double_click_opens_the_items_own_trace(engine, make_window, qtbot, tmp_path: Path):
    w = window(make_window)
    res = run_suite(w, qtbot, tmp_path)
    w.show()
    w.tabs.setCurrentWidget(w.quality_tab)
    items = w.quality_tab.items
    for r in (STATE_ITEM, 0):
        rect = items.visualItemRect(items.item(r, 0))
        with qtbot.waitSignal(w.sigTraceShown, timeout=10_000) as blk:
            qtbot.mouseClick(items.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
            qtbot.mouseDClick(items.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        t = blk.args[0]
        assert t.config["quality"]["item"] == res.items[r].item_id
        assert t.config["quality"]["speculative_pass"] is (r not in PLANTED)
        assert w.tabs.currentIndex() == 0 and w.trace is t
        assert t.comparison.identical is (r not in PLANTED)
        w.tabs.setCurrentWidget(w.quality_tab)


def code_suite(tmp_path: Path) -> Path:
    f = tmp_path / "code.jsonl"
    f.write_text(json.dumps({"id": "add", "prompt": "def add(a, b):\n", "entry_point": "add",
                             "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}) + "\n")
    return f


def test_the_confirmations_no_runs_nothing(engine, make_window, qtbot, tmp_path: Path, monkeypatch):
    w = window(make_window)
    asked: list[ExecuteConfirm] = []

    def answer_no(dlg):
        asked.append(dlg)
        return QMessageBox.StandardButton.No

    monkeypatch.setattr(ExecuteConfirm, "exec", answer_no)
    tab = w.quality_tab
    tab.form.choose(str(code_suite(tmp_path)))
    before = w.host.current
    assert tab.start(out_dir=tmp_path / "q") is None
    assert len(asked) == 1 and calls() == [] and tab.request is None
    assert w.host.current is before and not w.busy and not (tmp_path / "q").exists()
    assert "Nothing ran" in w.verdict.text()
    # the question says what would run and what the sandbox enforces
    dlg = asked[0]
    info = dlg.informativeText()
    assert "1 code item" in info and "up to 2 programs" in info and dlg.lines
    assert all(line in info or line.replace("'", "&#x27;") in info for line in dlg.lines)
    assert dlg.defaultButton() is dlg.button(QMessageBox.StandardButton.No)


def test_a_saved_result_opens_and_a_bad_file_is_an_error(engine, make_window, qtbot, tmp_path: Path):
    w = window(make_window)
    res = run_suite(w, qtbot, tmp_path)
    other = make_window()
    path = tmp_path / "q" / "quality.json"
    assert other.quality_tab.open(path)
    assert figures(other.quality_tab.outcomes) == counts(res.table)
    assert other.quality_tab.items.trace_path(STATE_ITEM) == str(tmp_path / "q" / res.items[STATE_ITEM].trace_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{\"schema\": \"specview.quality/1\"}")
    assert not other.quality_tab.open(bad) and other.verdict_kind == "error"
    assert figures(other.quality_tab.outcomes) == counts(res.table)  # what was shown stays


def test_the_fork_card_says_whether_the_answer_changed(qapp, synth):
    from specview.gui.card import ForkCard

    t = synth(n=40, fork=25)
    assert ForkCard(t).task is None  # a prompt from no suite: nothing about answers
    t.config["quality"] = {"suite": "arithmetic", "item": "arithmetic-0002", "expected": "961", "vanilla_pass": True,
                           "speculative_pass": False, "vanilla_got": "961", "speculative_got": "951"}
    card = ForkCard(t)
    text = card.task.text()
    assert "answer changed: yes: vanilla passes, speculative fails" in text
    assert "expected &#x27;961&#x27;" in text or "expected '961'" in text
    assert "951" in text and "arithmetic-0002" in text
    t.config["quality"].update(speculative_pass=True, speculative_got="961")
    card = ForkCard(t)
    assert "answer changed: no: both arms pass" in card.task.text()


def test_a_matrix_over_a_task_suite_shows_its_answers_beside_its_forks(qtbot, tmp_path: Path):
    from specview.core.matrix import MatrixSpec, run_matrix
    from specview.core.matrix.quality import suite_block, task_prompts
    from specview.gui.matrix import MatrixView
    from specview.gui.matrix.rates import COL_ANSWERS

    suite = load_suite("arithmetic", n=N_ITEMS, seed=0)
    spec = MatrixSpec(targets=["demo:Q8_0"], drafters=["demo:Q4_0", "none"], n_max=[3], p_min=[0.0],
                      flash_attn=["auto"], prompts=task_prompts(suite), max_tokens=32, diagnose=True,
                      quality=suite_block("arithmetic", N_ITEMS, 0))
    run_matrix(spec, AnswerRunner(suite, PLANTED, state_item=STATE_ITEM), out=tmp_path / "m.json")
    view = MatrixView()
    qtbot.addWidget(view)
    view.loadFile(tmp_path / "m.json")
    tree = view.rates_panel.tree
    assert not tree.isColumnHidden(COL_ANSWERS)
    rows = {tree.topLevelItem(i).toolTip(0).split(":")[0]: tree.topLevelItem(i).text(COL_ANSWERS)
            for i in range(tree.topLevelItemCount())}
    b = len(PLANTED)
    p = f"{mcnemar_exact(b, 0):.3g}"
    assert sorted(rows.values()) == sorted([f"{N_ITEMS - b} same / {b} changed (p={p}) [{b} only vanilla passes, "
                                            f"0 only speculative]; 1 changed at a STATE fork", f"{N_ITEMS} same / 0 "
                                            "changed (p=1)"])
    texts = [view.table.item(r, c).text() for r in range(view.table.rowCount())
             for c in range(view.table.columnCount())]
    assert sum("ANSWER CHANGED" in t for t in texts) == 1  # the state fork's
    assert sum("answer changed" in t for t in texts) == b - 1
    assert sum("answer same" in t for t in texts) == 2 * N_ITEMS - b


def test_a_suite_without_an_output_folder_is_kept_in_the_results_folder(engine, make_window, qtbot,
                                                                        tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SPECVIEW_RESULTS", str(tmp_path / "results"))
    w = window(make_window)
    tab = w.quality_tab
    with qtbot.waitSignal(tab.sigFinished, timeout=TIMEOUT) as blk:
        assert tab.start(load_suite("arithmetic", n=N_ITEMS, seed=0)) is not None
    folders = list((tmp_path / "results" / "quality").iterdir())
    assert len(folders) == 1 and folders[0].name.split("-")[2] == "arithmetic"
    kept = QualityResult.load(folders[0] / "quality.json")
    assert [o.item_id for o in kept.items] == [o.item_id for o in blk.args[0].result.items]
    assert len(kept.items) == N_ITEMS


def test_a_results_folder_that_cannot_be_made_is_an_error_not_a_suite(engine, make_window, tmp_path: Path,
                                                                     monkeypatch):
    blocked = tmp_path / "results"
    blocked.write_text("a file where the folder should be\n")
    monkeypatch.setenv("SPECVIEW_RESULTS", str(blocked))
    w = window(make_window)
    tab = w.quality_tab
    before = w.host.current
    assert tab.start(load_suite("arithmetic", n=N_ITEMS, seed=0)) is None
    assert w.host.current is before and not w.busy and tab.request is None and calls() == []
    assert f"Quality: cannot make a results folder in {blocked / 'quality'}" in html.unescape(w.verdict.text())


def test_escape_cancels_a_running_suite_and_keeps_the_finished_items(engine, make_window, qtbot, tmp_path: Path):
    AnswerBackend.delay = 0.3
    w = window(make_window)
    tab = w.quality_tab
    suite = load_suite("arithmetic", n=N_ITEMS, seed=0)
    with qtbot.waitSignal(tab.sigShown, timeout=TIMEOUT, check_params_cb=lambda res: len(res.items) == 1):
        tab.start(suite, out_dir=tmp_path / "q")
    assert w.busy and tab.request is not None and w.progress.maximum() == N_ITEMS
    with qtbot.waitSignal(tab.sigFinished, timeout=TIMEOUT) as blk:
        w.act_cancel.trigger()  # Esc
    res = blk.args[0].result
    assert res.status == "interrupted" and 1 <= len(res.items) < N_ITEMS
    assert not w.busy and tab.request is None and tab.form.run_button.isEnabled()
    kept = QualityResult.load(tmp_path / "q" / "quality.json")
    assert [o.item_id for o in kept.items] == [o.item_id for o in res.items]
    assert figures(tab.outcomes)[2][2] == len(res.items) == len(calls())


def test_a_task_suite_from_the_matrix_dialog_is_the_cli_one(qtbot):
    import argparse

    from specview.commands.matrix import add_parser, spec_from_args
    from specview.core.config import RunConfig
    from specview.gui.matrix import MatrixDialog

    cfg = RunConfig(prompt="Write an essay on sleep.", target="demo:Q4_K_M", draft="demo:Q4_0", n_max=3)
    dlg = MatrixDialog(cfg, diagnose=True)
    qtbot.addWidget(dlg)
    assert not dlg.task_suite.isEnabled()
    dlg.prompt_task.setChecked(True)
    dlg.task_suite.setCurrentText("arithmetic")
    dlg.task_items.setValue(5)
    assert dlg.task_suite.isEnabled() and not dlg.stop_box.isEnabled() and not dlg.stop_box.isChecked()
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    cli = spec_from_args(p.parse_args(["matrix", "--suite", "arithmetic", "--items", "5", "--targets", "demo:Q4_K_M",
                                       "--drafters", "demo:Q4_0", "--n-max", "3"]))
    spec = dlg.spec()
    assert spec.to_json() == cli.to_json()
    assert spec.quality == {"suite": "arithmetic", "items": 5, "seed": 0, "execute": False}
    assert [q.name for q in spec.prompts] == [it.id for it in load_suite("arithmetic", n=5).items]
    assert spec.stop_after_fork is None and dlg.count.text().startswith("5 cells (5 prompts × 1 setting)")
