"""The Kernel map tab: a map computed on the model worker, shown as a heat grid whose cells must say exactly
what the map's figures say; cancelling, opening and saving maps, the prescription, and the engines it refuses.

Toy engines with a planted kernel switch (rows of a pass at least ``wide`` tokens wide are off by ``eps``) give
maps whose safe widths are known in advance; the demo model gives a real one, compared with ``kernel_map``
called directly (which widths are bit-identical differs per CPU; that the tab shows the direct computation does
not).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import pytest
from fakes import FakeEngine, KernelToy, Noisy
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtTest import QTest

from specview.core.config import EngineSettings
from specview.core.kernels.map import KernelMap, kernel_map
from specview.core.prompts import builtin_prompts
from specview.core.registry import Backend, register_backend, unregister_backend
from specview.core.inprocess import InProcessBackend
from specview.core.session import Session
from specview.gui.kernels import cell_look, is_kernel_map_file, row_claim
from specview.gui.kernels.words import (
    CONTROL_FAILED,
    IDENTICAL,
    INK,
    RAMP,
    level,
    metric_text,
)

TOY = "kernels-gui-toy"
TIMEOUT = 60_000  # ms; every wait ends on a signal
DEMO_TIMEOUT = 600_000


class CountingEngine(FakeEngine):
    """Counts every forward pass (across threads), and can take its time over each."""

    passes = 0
    delay = 0.0

    def eval(self, tokens, rows):
        if CountingEngine.delay:
            time.sleep(CountingEngine.delay)
        out = super().eval(tokens, rows)
        CountingEngine.passes += 1
        return out


class NoisyEngine(Noisy, CountingEngine):
    """Fresh noise on every pass: a backend that does not reproduce itself."""


class ToyLoaded(KernelToy):
    """Names: 'dispatch:WIDE:EPS' or 'noisy'; every pass counted."""

    engine, noisy_engine, max_text = CountingEngine, NoisyEngine, 40


class ToyBackend(InProcessBackend):
    name = TOY
    label = "Toy kernels"

    def load(self, name: str, settings: EngineSettings) -> ToyLoaded:
        return ToyLoaded(name)


class ServerLikeBackend(Backend):
    """An engine that is its own process: the map cannot split its verify passes."""

    name = "kernels-gui-server"
    label = "Server-like engine"
    model_kind = "gguf"
    in_process = False

    def __init__(self):
        self.runners: list[Any] = []

    def runner(self, *, progress=None):
        raise AssertionError("the kernel map must not start a server engine's runner")


@pytest.fixture
def toy():
    register_backend(TOY, ToyBackend)
    CountingEngine.passes, CountingEngine.delay = 0, 0.0
    yield TOY
    CountingEngine.delay = 0.0
    unregister_backend(TOY)


def toy_window(make_window, target: str = "dispatch:5:0.05", **controls):
    w = make_window()
    w.set_controls(backend=TOY, target=target, draft="dispatch:99:0", threads=1, **controls)
    assert w.engine_problem is None
    kt = w.kernels_tab
    w.tabs.setCurrentWidget(kt)  # the tab reads the Run panel when it is shown
    kt.refresh()
    return w, kt


def choose(kt, *, targets: list[str], prompts: list[str], widths: str, positions: int, stop: bool = False) -> None:
    for t in targets:
        kt.add_target(t, checked=True)
    kt.form.targets.set_checked(targets)
    kt.form.prompts.set_checked(prompts)
    kt.form.widths.setText(widths)
    kt.form.positions.setValue(positions)
    kt.form.stop.setChecked(stop)


def colour_of(item) -> str | None:
    brush = item.background()
    return None if brush.style() == Qt.BrushStyle.NoBrush else brush.color().name()


def assert_grid_shows(kt, km: KernelMap) -> None:
    """Every cell and row label of the tab's grid is what the map's own figures say, in the metric shown."""
    view = kt.view
    assert view.table.rowCount() == len(km.targets) and view.table.columnCount() == len(km.widths)
    for i, t in enumerate(km.targets):
        head = view.table.verticalHeaderItem(i).text()
        assert head.startswith(t.label) and head.endswith(row_claim(t))
        for j, w in enumerate(km.widths):
            st = t.widths[w]
            item = view.table.item(i, j)
            if st.bit_identical:
                assert item.text() == "=" and colour_of(item) == QColor(IDENTICAL).name()
            else:
                assert item.text().startswith(metric_text(view.metric, st)) and "=" not in item.text()
                assert ("!" in item.text()) == (st.flips > 0 and view.metric != "flips")
                assert item.text().endswith("…") == st.stopped
                want = CONTROL_FAILED if w == 1 else RAMP[level(view.metric, st)]
                assert colour_of(item) == QColor(want).name() != QColor(IDENTICAL).name()
            if colour_of(item) is not None:
                assert item.foreground().color().name() == QColor(INK).name()
            assert f"{st.identical} of {st.rows} rows bit-identical" in item.toolTip()


def test_a_planted_kernel_switch_shows_exactly_its_safe_widths(toy, make_window, qtbot, tmp_path):
    w, kt = toy_window(make_window)
    choose(kt, targets=["dispatch:5:0.05", "dispatch:3:1.0", "noisy"], prompts=["essay"], widths="1-8", positions=10)
    with qtbot.waitSignal(kt.sigMapFinished, timeout=TIMEOUT) as blk:
        req = w.act_kernels.trigger() or kt.request  # Run > Kernel map (Ctrl+K)
        assert req is not None and w.busy and w.tabs.currentWidget() is kt
        assert kt.form.cancel_button.isEnabled() and not kt.progress.isHidden()
    km = blk.args[0].kmap
    assert km is kt.kmap and not w.busy and not kt.form.cancel_button.isEnabled()
    assert [t.target for t in km.targets] == ["dispatch:5:0.05", "dispatch:3:1.0", "noisy"]
    switch5, switch3, noisy = km.targets
    # the planted models imply the safe widths: rows narrower than the switch are the single-token rows
    assert switch5.safe_widths() == [1, 2, 3, 4] and switch5.safe_n_max() == 3
    assert switch3.safe_widths() == [1, 2] and switch3.safe_n_max() == 1
    assert not noisy.deterministic and noisy.safe_n_max() is None
    view = kt.view
    heads = [view.table.verticalHeaderItem(i).text().splitlines()[1] for i in range(3)]
    assert heads == ["proven lossless up to n_max 3", "proven lossless up to n_max 1", "not deterministic"]
    for i, wide in ((0, 5), (1, 3)):
        assert [view.table.item(i, j).text() == "=" for j in range(8)] == [w_ < wide for w_ in range(1, 9)]
    assert colour_of(view.table.item(2, 0)) == QColor(CONTROL_FAILED).name()  # the failed rollback control
    # every cell says what the figures say, in every metric
    for metric in ("max_delta", "identical_share", "p95_delta", "flips", "below_shift"):
        view.metric_box.setCurrentIndex(view.metric_box.findData(metric))
        assert view.metric == metric
        assert_grid_shows(kt, km)
    # the figures are the map's, computed again directly on a Session of our own
    with Session() as s:
        direct = kernel_map(s, ["dispatch:5:0.05", "dispatch:3:1.0"], [replace(builtin_prompts(["essay"])[0],
                            chat=w.build_config().chat)], range(1, 9), 10, EngineSettings(threads=1), backend=TOY)
    for a, b in zip(direct.targets, km.targets[:2]):
        assert a.label == b.label
        assert [(s.rows, s.identical, s.max_delta, s.flips) for s in a.widths.values()] == \
            [(s.rows, s.identical, s.max_delta, s.flips) for s in b.widths.values()]
    # selecting a row shows its detail and what it proves
    view.table.setCurrentCell(1, 4)
    assert view.selected == 1
    assert view.claim.text().startswith("n_max <= 1 is proven lossless here (widths 1-2 bit-identical")
    assert view.detail.rowCount() == 8
    for r, wd in enumerate(range(1, 9)):
        st = switch3.widths[wd]
        assert view.detail.item(r, 0).text().startswith(str(wd))
        assert view.detail.item(r, 1).text() == str(st.rows)
        assert view.detail.item(r, 2).text().startswith(f"{st.identical} (")
        assert view.detail.item(r, 5).text() == str(st.flips)
    assert view.detail.selectedItems() and view.detail.selectedItems()[0].row() == 4  # width 5, the cell chosen
    assert "Kernel map" in w.verdict.text() and w.verdict_kind == "bad"  # a nondeterministic row
    assert view.facts.text().startswith(TOY) and "threads 1" in view.facts.text()
    assert "prompts essay x 10 positions" in view.facts.text()


def test_esc_cancels_a_map_within_one_pass_and_the_tab_works_again(toy, make_window, qtbot):
    w, kt = toy_window(make_window)
    w.show()
    w.activateWindow()
    qtbot.waitActive(w)
    choose(kt, targets=["dispatch:5:0.05"], prompts=["code", "essay"], widths="1-16", positions=400)
    CountingEngine.delay = 0.002  # a few seconds of forward passes
    with qtbot.waitSignal(kt.sigProgress, timeout=TIMEOUT, check_params_cb=lambda done, total: 0 < done < total):
        req = w.run_kernels()
    assert req is not None and not req.cancelled
    with qtbot.waitSignal(kt.sigMapFinished, timeout=TIMEOUT) as blk:
        QTest.keyClick(w.windowHandle(), Qt.Key.Key_Escape)
        at_cancel = CountingEngine.passes
        assert req.cancelled
    ev = blk.args[0]
    assert ev.cancelled and ev.kmap is None
    assert CountingEngine.passes - at_cancel <= 1  # the pass under way, then no other
    assert not w.busy and kt.request is None and not kt.form.cancel_button.isEnabled()
    assert "Kernel map cancelled" in w.verdict.text() and kt.kmap is None
    # the tab is usable again: the next map runs to the end
    CountingEngine.delay = 0.0
    kt.form.positions.setValue(6)
    kt.form.widths.setText("1-3")
    with qtbot.waitSignal(kt.sigMapFinished, timeout=TIMEOUT) as blk2:
        kt.form.run_button.click()
    assert blk2.args[0].kmap is not None and kt.kmap.targets[0].safe_widths() == [1, 2, 3]
    assert_grid_shows(kt, kt.kmap)


def test_bad_widths_are_said_next_to_the_field_and_nothing_starts(toy, make_window):
    w, kt = toy_window(make_window)
    for text, words in (("3-1", "ranges run low-high"), ("1-x", "is not a width"), ("", "give the widths")):
        kt.form.widths.setText(text)
        assert kt.start() is None
        assert not kt.form.widths_error.isHidden()
        assert words in kt.form.widths_error.text() and words in w.last_error
        assert kt.request is None and w.host.current is None and not w.busy
    kt.form.widths.setText("1-32")
    w.set_controls(n_batch=16)
    assert kt.start() is None and "batch size (-b) is 16" in kt.form.widths_error.text()
    kt.form.widths.setText("1-4")
    kt.form.widths_problem()
    assert kt.form.widths_error.isHidden() and kt.form.widths_error.text() == ""


def test_save_open_and_refuse_maps(toy, make_window, qtbot, tmp_path, monkeypatch):
    _w, kt = toy_window(make_window)
    choose(kt, targets=["dispatch:3:1.0"], prompts=["list"], widths="1-4", positions=6, stop=True)
    with qtbot.waitSignal(kt.sigMapFinished, timeout=TIMEOUT):
        kt.start()
    # stopped at the first difference: the differing widths say their figures cover only the rows measured
    t = kt.kmap.targets[0]
    assert [t.widths[wd].stopped for wd in (1, 2, 3, 4)] == [False, False, True, True]
    for j in (2, 3):
        item = kt.view.table.item(0, j)
        assert item.text().endswith("…") and "stopped at the first difference" in item.toolTip()
    assert kt.view.table.item(0, 1).text() == "="
    saved = kt.save(tmp_path / "map.json")
    assert saved is not None and is_kernel_map_file(saved)
    assert json.loads(saved.read_text())["schema"] == "specview.kernels/1"
    assert "map.json" in kt.view.title.text()
    # File > Open (and `specview gui map.json`) sends a kernel map to its tab, in another window
    w2 = make_window()
    with qtbot.waitSignal(w2.kernels_tab.sigMapShown, timeout=5000):
        assert w2.open_trace(saved) is None
    assert w2.tabs.currentWidget() is w2.kernels_tab and w2.last_error is None
    assert_grid_shows(w2.kernels_tab, KernelMap.load(saved))
    assert w2.host.worker.runner is None  # opening a map loads no model
    # its targets, prompts, widths and positions are in the controls: Run map computes it again
    f2 = w2.kernels_tab.form
    assert f2.targets.checked() == ["dispatch:3:1.0"] and f2.prompts.checked() == ["list"]
    assert (f2.widths.text(), f2.positions.value()) == ("1-4", 6)
    assert w2.kernels_tab.form.save_button.isEnabled() and w2.kernels_tab.panel.prescribe_button.isEnabled()
    # File > Open kernel map…
    monkeypatch.setattr("specview.gui.menus.QFileDialog.getOpenFileName", lambda *a, **k: (str(saved), ""))
    w2.tabs.setCurrentIndex(0)
    w2.act_open_kernels.trigger()
    assert w2.tabs.currentWidget() is w2.kernels_tab
    # corrupt and foreign files: specview's own words in the window, the map shown stays
    bad = tmp_path / "bad.json"
    for content, words in (('{"schema": "specview.kernels/1", "backend": 3}', "malformed kernel map"),
                           (('{"schema": "specview.kernels/1", "backend": "x", "widths": [1], "positions": 2, '
                             '"top_k": 8, "prompts": [], "targets": [{"widths": [{"width": 1, "rows": 2, '
                             '"identical": 3, "flips": 0}], "prompts": []}]}'), "3 identical rows of 2"),
                           ('{"schema": "specview.kernels/1", ', "not valid JSON")):
        bad.write_text(content)
        assert w2.open_trace(bad) is None
        assert words in w2.last_error and str(bad) in w2.last_error
        assert w2.verdict_kind == "error" and "Traceback" not in w2.verdict.text()
        assert w2.kernels_tab.kmap is not None and w2.kernels_tab.view.table.rowCount() == 1
    assert not w2.open_kernel_map(tmp_path / "none.json") and "no such file" in w2.last_error
    trace_like = tmp_path / "trace.json"
    trace_like.write_text('{"schema": "specview.trace/1"}')
    assert not w2.open_kernel_map(trace_like) and "not a specview kernel map" in w2.last_error


def test_the_empty_per_width_table_is_wide_enough_for_its_headers(qtbot):
    """Before any map the per-width table took a sliver of its splitter ("Width | Rov"): it is at least as wide as
    its headers need (up to the cap every table has)."""
    from specview.gui.kernels.view import KernelMapView

    view = KernelMapView()
    qtbot.addWidget(view)
    detail = view.detail
    dh = detail.horizontalHeader()
    headers = sum(dh.sectionSizeHint(c) for c in range(detail.columnCount()))
    assert detail.minimumWidth() >= min(headers, 760 - 2 * detail.frameWidth() - 4)


def test_a_matrix_file_still_opens_in_the_matrix_tab(make_window, tmp_path):
    from specview.core.matrix import MatrixRun, MatrixSpec, PromptSpec, expand

    spec = MatrixSpec(targets=["demo:Q8_0"], drafters=["none"], n_max=[1],
                      prompts=[PromptSpec(name="raw", tokens=(1, 2, 3), chat=False)], max_tokens=4)
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(MatrixRun(spec=spec, cells=expand(spec)).to_json()))
    assert not is_kernel_map_file(path)
    w = make_window()
    assert w.open_trace(path) is None
    assert w.tabs.currentWidget() is w.matrix_view and w.last_error is None and w.kernels_tab.kmap is None


def test_an_engine_that_is_not_in_process_is_refused_in_words(make_window, qtbot):
    backend = ServerLikeBackend()
    register_backend(ServerLikeBackend.name, lambda: backend)
    try:
        w = make_window()
        w.set_controls(backend=ServerLikeBackend.name, target="demo:Q8_0")
        with qtbot.waitSignal(w.sigError, timeout=TIMEOUT) as blk:
            req = w.run_kernels()
            assert req is not None and w.busy
        msg = blk.args[0]
        assert "needs an engine whose forward passes specview runs itself" in msg
        assert ServerLikeBackend.name in msg and "--engine llama.cpp" in msg
        assert not w.busy and w.kernels_tab.request is None and w.host.worker.runners == {}
        assert "Traceback" not in w.verdict.text() and w.verdict_kind == "error"
    finally:
        unregister_backend(ServerLikeBackend.name)


def test_prescription_panel_fills_and_saves(toy, make_window, qtbot, tmp_path):
    w, kt = toy_window(make_window, target="dispatch:5:1.0")
    assert not kt.panel.prescribe_button.isEnabled()  # nothing to prescribe from yet
    choose(kt, targets=["dispatch:5:1.0"], prompts=["essay"], widths="1-6", positions=12)
    with qtbot.waitSignal(kt.sigMapFinished, timeout=TIMEOUT):
        kt.start()
    kt.panel.candidates.setText("1-4")
    kt.panel.tokens.setValue(12)
    with qtbot.waitSignal(kt.sigPrescriptionFinished, timeout=TIMEOUT) as blk:
        kt.panel.prescribe_button.click()
        assert w.busy and kt.form.cancel_button.isEnabled()
    pres = blk.args[0].prescription
    assert pres is not None and not w.busy and pres.draft == "dispatch:99:0"
    text = kt.panel.text.toPlainText()
    assert text == pres.text() and kt.panel.text.isReadOnly()
    proven = [c.n_max for c in pres.lossless if c.kind == "n_max"]
    assert max(proven) == 3 and "--spec-draft-n-max 3" in text and "proven by the kernel map" in text
    assert not any(c.contradicted for c in pres.lossless)
    assert "Prescription" in w.verdict.text()
    out = kt.save_prescription(tmp_path / "p.json")
    doc = json.loads(out.read_text())
    assert doc["schema"] == "specview.prescription/1" and doc["draft"] == "dispatch:99:0"
    assert [c["n_max"] for c in doc["lossless"]] == [c.n_max for c in pres.lossless]
    # a new map makes the old prescription stale: the panel empties
    with qtbot.waitSignal(kt.sigMapFinished, timeout=TIMEOUT):
        kt.start()
    assert kt.panel.text.toPlainText() == "" and not kt.panel.save_button.isEnabled()


def test_a_run_takes_the_worker_from_a_map(toy, make_window, qtbot):
    """Submitting a run cancels a map in progress; the tab lets go and the run's busy state is the window's."""
    w, kt = toy_window(make_window, prompt="the cat sat", max_tokens=8, diagnose=False)
    choose(kt, targets=["dispatch:5:0.05"], prompts=["essay"], widths="1-16", positions=400)
    CountingEngine.delay = 0.002
    with qtbot.waitSignal(kt.sigProgress, timeout=TIMEOUT, check_params_cb=lambda done, total: 0 < done < total):
        req = kt.start()
    CountingEngine.delay = 0.0
    with qtbot.waitSignal(w.sigTraceShown, timeout=TIMEOUT):
        w.run()
        assert req.cancelled and kt.request is None and not kt.form.cancel_button.isEnabled()
    assert not w.busy and w.tabs.currentIndex() == 0 and kt.kmap is None


def test_closing_the_window_mid_map_leaves_no_thread(toy, make_window, qtbot):
    w, kt = toy_window(make_window)
    choose(kt, targets=["dispatch:5:0.05"], prompts=["essay"], widths="1-16", positions=400)
    CountingEngine.delay = 0.002
    with qtbot.waitSignal(kt.sigProgress, timeout=TIMEOUT, check_params_cb=lambda done, total: 0 < done < total):
        kt.start()
    w.close()
    assert w.host.thread.isFinished() and not w.host.thread.isRunning()


@pytest.mark.demo
def test_a_real_demo_map_in_the_tab_equals_the_direct_computation(make_window, qtbot):
    w = make_window()
    w.set_controls(backend="llama.cpp", target="demo:Q8_0", draft="demo:Q4_0", threads=1)
    kt = w.kernels_tab
    w.tabs.setCurrentWidget(kt)
    choose(kt, targets=["demo:Q8_0", "demo:Q4_K_M"], prompts=["essay"], widths="1-5", positions=16)
    with qtbot.waitSignal(kt.sigMapFinished, timeout=DEMO_TIMEOUT) as blk:
        w.act_kernels.trigger()
    km = blk.args[0].kmap
    assert km is not None and [t.target for t in km.targets] == ["demo:Q8_0", "demo:Q4_K_M"]
    cfg = w.build_config()
    decided = Session.resolve(cfg).settings  # the map records the settings as decided here (no repack on AMX)
    assert all(t.settings == decided and t.threads_used == 1 for t in km.targets)
    with Session() as s:
        direct = kernel_map(s, ["demo:Q8_0", "demo:Q4_K_M"], [replace(builtin_prompts(["essay"])[0], chat=cfg.chat)],
                            range(1, 6), 16, cfg.engine)
    for metric in ("max_delta", "identical_share", "flips"):
        kt.view.setMetric(metric)
        assert_grid_shows(kt, direct)  # the tab's cells are the direct map's, figure for figure
        for i, t in enumerate(direct.targets):
            for j, wd in enumerate(direct.widths):
                look = cell_look(t.widths[wd], metric)
                assert kt.view.table.item(i, j).text() == look.text
    for a, b in zip(direct.targets, km.targets):
        assert a.label == b.label and a.safe_widths() == b.safe_widths() and a.safe_n_max() == b.safe_n_max()
        assert [p.tokens for p in a.prompts] == [p.tokens for p in b.prompts]
        for wd in direct.widths:
            x, y = a.widths[wd], b.widths[wd]
            assert (x.rows, x.identical, x.flips, x.below_shift, x.first_difference) == \
                (y.rows, y.identical, y.flips, y.below_shift, y.first_difference)
            assert (x.max_delta, x.p95_delta) == (y.max_delta, y.p95_delta)
        assert a.deterministic  # the width-1 control holds on a CPU build at one thread


def test_a_prescription_cancels_and_keeps_the_map(toy, make_window, qtbot):
    w, kt = toy_window(make_window, target="dispatch:5:1.0")
    choose(kt, targets=["dispatch:5:1.0"], prompts=["essay"], widths="1-6", positions=8)
    with qtbot.waitSignal(kt.sigMapFinished, timeout=TIMEOUT):
        kt.start()
    km = kt.kmap
    kt.panel.tokens.setValue(400)
    CountingEngine.delay = 0.002
    with qtbot.waitSignal(kt.sigProgress, timeout=TIMEOUT):  # the first speed run has started
        req = kt.prescribe()
    with qtbot.waitSignal(kt.sigPrescriptionFinished, timeout=TIMEOUT) as blk:
        w.cancel()  # what Esc does
        assert req.cancelled
    assert blk.args[0].cancelled and blk.args[0].prescription is None
    assert not w.busy and kt.request is None and kt.kmap is km and kt.panel.text.toPlainText() == ""
    assert "Prescription cancelled" in w.verdict.text()
