"""The Probe tab: ``specview probe`` on the model worker, its table filled row by row, a saved report reopened.

The engine is the tests' fake (tests/fakes.py) with a KV-cache fault planted at the first rollback of every
speculative context (``FaultyBackend``, ``keep-rejected``): the whole-rejection trigger must read ``state`` in
the table, in the state colour, and a trigger whose drafts are all accepted must not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QColor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fakes import FakeBackend, FaultyBackend  # noqa: E402

from specview.core import verdicts  # noqa: E402
from specview.core.probe import NAMES, RESULTS, ProbeReport  # noqa: E402
from specview.core.registry import register_backend, unregister_backend  # noqa: E402
from specview.gui.probe import ProbeTab, is_probe_file  # noqa: E402
from specview.gui.probe.tab import COLUMNS  # noqa: E402

ENGINE = "probe-gui-fake"
TIMEOUT = 60_000


@pytest.fixture
def engine():
    be = FaultyBackend(FakeBackend(), name=ENGINE)
    be.faults["0"] = "keep-rejected"
    register_backend(ENGINE, lambda: be)
    yield be
    unregister_backend(ENGINE)


def cells(tab: ProbeTab) -> list[list[str]]:
    t = tab.table
    return [[t.item(r, c).text() for c in range(t.columnCount())] for r in range(t.rowCount())]


def test_the_tab_runs_the_probe_and_shows_a_planted_fault_as_state(engine, make_window, qtbot, tmp_path):
    w = make_window()
    w.set_controls(backend=ENGINE, target="0", draft="1", n_max=3, max_tokens=16)
    tab = w.probe_tab
    assert isinstance(tab, ProbeTab) and w.tabs.indexOf(tab) >= 0
    tab.tokens.setValue(16)
    tab.long.setValue(64)
    with qtbot.waitSignal(tab.sigShown, timeout=TIMEOUT) as blk:
        assert tab.start() is not None
    report = blk.args[0]
    assert isinstance(report, ProbeReport)
    shown = cells(tab)
    assert len(shown) == len(report.rows) and [c[0] for c in shown] == [r.trigger for r in report.rows]
    assert set(NAMES) <= {c[0] for c in shown}
    assert all(c[3] in RESULTS for c in shown)
    by = {(r.trigger, r.label): (i, r) for i, r in enumerate(report.rows)}
    i, whole = by[("whole-reject", "reject")]
    assert engine.engines and any(e.faults for e in engine.engines)  # the fault really fired
    assert whole.result == "state" and shown[i][3] == "state"
    assert tab.table.item(i, COLUMNS.index("Result")).background().color() == QColor(verdicts.COLOURS["state"])
    _, zero = by[("zero-after-accept", "accept, none")]
    assert zero.result == "identical" and zero.reached  # all accepted: the planted rollback never fires
    # the saved report opens in the tab as it was shown
    path = report.save(tmp_path / "probe.json")
    assert is_probe_file(path)
    tab.table.setRowCount(0)
    assert tab.open(path) and cells(tab) == shown
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    errors = []
    tab.sigError.connect(lambda msg, _d: errors.append(msg))
    assert not tab.open(bad) and errors and "not a specview probe report" in errors[0]


def test_the_verdict_bar_speaks_of_the_probe_tab_in_front(engine, make_window, qtbot):
    """Switching to the Probe tab, or a probe finishing there, puts the probe's words in the verdict bar (it kept
    the last tab's, a quality run's "no evidence" in green over a probe's table)."""
    w = make_window()
    w.set_controls(backend=ENGINE, target="0", draft="1", n_max=3, max_tokens=16)
    w.verdict.show_text("<b>Quality</b> (arithmetic): left over", "ok")
    tab = w.probe_tab
    w.tabs.setCurrentWidget(tab)
    assert w.verdict.text().startswith("<b>Probe</b>: no probe yet.") and w.verdict.kind == "info"
    tab.tokens.setValue(16)
    tab.long.setValue(64)
    with qtbot.waitSignal(tab.sigShown, timeout=TIMEOUT) as blk:
        assert tab.start() is not None
    report = blk.args[0]
    assert report.worst == "state"  # the planted fault
    assert w.verdict.text().startswith("<b>Probe</b> (0): ") and w.verdict.kind == "bad"
    assert w.verdict.text().endswith("the worst result is state")
    n_state = sum(r.result == "state" for r in report.rows)
    assert f"{n_state} state" in w.verdict.text()
