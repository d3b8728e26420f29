"""The window driving the real demo model (SmolLM2-135M): streaming, fork marking, flip-and-see, cancel, errors.

One window is shared by the module so the models load once; each test leaves it
idle.  The fork-producing configuration is demo:Q4_K_M with a demo:Q4_0 draft
on the essay prompt (on this CPU build it forks within the first 64 tokens).
"""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtTest import QTest

from specview.core.generate import GenOptions, run_to_end, vanilla_greedy
from specview.core.session import Session
from specview.gui import models as gmodels
from specview.gui.panes import Tints

pytestmark = pytest.mark.demo

RUN_TIMEOUT = 600_000  # ms: generous, the machine may be shared; the waits end on signals


@pytest.fixture(scope="module")
def win(qapp):
    from specview.gui.window import MainWindow

    w = MainWindow(settings_path=None)
    w.auto_run.setChecked(False)
    w.set_controls(target="demo:Q4_K_M", draft="demo:Q4_0", max_tokens=64, p_min=0.0, diagnose=False,
                   prompt="Write an essay on the importance of sleep for students.", chat=True)
    w.diagnose.setChecked(False)
    w.show()
    yield w
    assert w.shutdown(), "the model worker thread did not stop"
    assert w.host.thread.isFinished()
    w.close()


def run_and_wait(qtbot, w, start=None):
    with qtbot.waitSignal(w.sigTraceShown, timeout=RUN_TIMEOUT) as blk:
        (start or w.run)()
    return blk.args[0]


def ensure_base_config(w):
    w.auto_run.setChecked(False)
    w.set_controls(target="demo:Q4_K_M", max_tokens=64, p_min=0.0, ignore_eos=False)


def test_run_streams_both_arms_and_marks_the_fork(qtbot, win):
    ensure_base_config(win)
    steps_seen = {"vanilla": 0, "speculative": 0}
    win.host.worker.sigStep.connect(lambda ev: steps_seen.__setitem__(ev.arm, steps_seen[ev.arm] + 1))
    trace = run_and_wait(qtbot, win)
    v, s = trace.vanilla, trace.speculative
    # both arms streamed every token through the typed signal
    assert steps_seen == {"vanilla": len(v.tokens), "speculative": len(s.tokens)}
    # the panes hold exactly the arms' texts
    assert win.panes.vanilla.text() == v.text
    assert win.panes.speculative.text() == s.text
    # the fork is where the token lists first differ, computed here independently
    fm = trace.comparison.first_mismatch
    assert fm is not None, "demo:Q4_K_M with a Q4_0 draft is expected to fork within 64 tokens"
    first = next(i for i, (a, b) in enumerate(zip(v.tokens, s.tokens)) if a != b)
    assert fm.index == first
    assert win.panes.vanilla.mismatch_index == win.panes.speculative.mismatch_index == first
    assert win.panes.selected == first  # the view jumped to it
    assert win.margin_plot.fork_line.isVisible() and win.margin_plot.fork_line.value() == first
    assert win.acceptance.fork_line.value() == s.steps[first].round
    assert f"Forked at token {first}" in win.verdict.text()
    # plots hold the run's numbers
    _, mv = win.margin_plot.vanilla.getData()
    assert np.allclose(mv, [st.margin for st in v.steps])
    _, d = win.acceptance.drafted.getData()
    _, a = win.acceptance.accepted.getData()
    assert d.sum() == s.n_drafted and a.sum() == s.n_accepted
    assert s.n_accepted + len(s.rounds) == len(s.tokens)
    # accepted draft tokens are tinted, the target's own tokens are not
    pane, tints = win.panes.speculative, Tints(win.panes.speculative.palette())
    for i, st in enumerate(s.steps):
        start, end = pane.token_range(i)
        if end - start < 1 or "\n" in st.piece:
            continue
        cur = QTextCursor(pane.document())
        cur.setPosition(start + 1)
        assert (cur.charFormat().background().color() == tints.draft) == st.from_draft, i
    # the streamed vanilla arm equals plain greedy decoding computed here, on a separate session
    cfg = win.build_config()
    sess = Session()
    try:
        target = sess.model(cfg.backend, cfg.target, cfg.engine)
        toks = sess.prompt_tokens(cfg, target)
        eng = sess.engine("check", target, cfg.engine, sess.context_size(cfg, len(toks), target))
        ref = run_to_end(vanilla_greedy(eng, toks, GenOptions(max_tokens=cfg.max_tokens)))
    finally:
        sess.close()
    assert ref.tokens == v.tokens


def test_p_min_1_reruns_only_the_speculative_arm_and_is_identical(qtbot, win):
    ensure_base_config(win)
    if win.trace is None or win.trace.comparison.identical:
        run_and_wait(qtbot, win)
    before = win.last_finished
    vanilla_text = win.panes.vanilla.text()
    win.auto_run.setChecked(True)
    try:
        # flip the control as a user would; the debounced auto re-run starts the run
        trace = run_and_wait(qtbot, win, start=lambda: win.set_controls(p_min=1.0))
    finally:
        win.auto_run.setChecked(False)
    after = win.last_finished
    assert after.vanilla_runs == before.vanilla_runs  # the vanilla arm came from the session's cache
    assert after.speculative_runs == before.speculative_runs + 1
    assert trace.speculative.n_drafted == 0
    assert trace.comparison.identical
    assert win.panes.speculative.text() == win.panes.vanilla.text() == vanilla_text
    assert "Identical" in win.verdict.text()
    assert not win.margin_plot.fork_line.isVisible()
    assert win.panes.vanilla.mismatch_index is None


def test_escape_cancels_a_run(qtbot, win, qapp):
    ensure_base_config(win)
    win.set_controls(max_tokens=3000, ignore_eos=True)
    win.activateWindow()
    qtbot.waitActive(win)
    with qtbot.waitSignal(win.host.worker.sigStep, timeout=RUN_TIMEOUT):
        win.run()
    assert win.busy and win.cancel_button.isEnabled()
    with qtbot.waitSignal(win.sigTraceShown, timeout=RUN_TIMEOUT) as blk:
        QTest.keyClick(win.windowHandle(), Qt.Key.Key_Escape)
    trace = blk.args[0]
    assert trace.vanilla.stop_reason == "cancelled"
    assert 1 <= len(trace.vanilla.tokens) < 3000
    assert win.panes.vanilla.text() == trace.vanilla.text
    assert "Cancelled" in win.verdict.text()
    assert not win.busy and not win.cancel_button.isEnabled()
    ensure_base_config(win)


def test_new_request_cancels_the_running_one(qtbot, win):
    ensure_base_config(win)
    win.set_controls(max_tokens=3000, ignore_eos=True)
    with qtbot.waitSignal(win.host.worker.sigStep, timeout=RUN_TIMEOUT):
        first = win.run()
    win.set_controls(max_tokens=16, ignore_eos=False)
    trace = run_and_wait(qtbot, win)
    assert first.cancelled
    assert len(trace.vanilla.tokens) <= 16 and trace.vanilla.stop_reason != "cancelled"
    assert win.panes.vanilla.text() == trace.vanilla.text
    ensure_base_config(win)


def test_bad_model_shows_error_and_the_window_stays_usable(qtbot, win, tmp_path):
    ensure_base_config(win)
    bad = tmp_path / "broken.gguf"
    bad.write_text("this is not a model")
    win.set_controls(target=str(bad))
    with qtbot.waitSignal(win.sigError, timeout=RUN_TIMEOUT) as blk:
        win.run()
    msg = blk.args[0]
    assert str(bad) in msg and "not a GGUF model file" in msg
    assert win.verdict_kind == "error" and not win.busy
    win.set_controls(target="demo:Q4_K_M")
    trace = run_and_wait(qtbot, win)
    assert win.panes.vanilla.text() == trace.vanilla.text and len(trace.vanilla.tokens) > 0


def test_saved_trace_reopens_identically(qtbot, win, make_window, tmp_path):
    ensure_base_config(win)
    if win.trace is None or win.trace.comparison.identical:
        run_and_wait(qtbot, win)
    path = win.save_trace(tmp_path / "run.json")
    assert path is not None and path.exists()
    other = make_window()
    with qtbot.waitSignal(other.sigTraceShown, timeout=10_000):
        other.open_trace(path)
    assert other.host.worker.runner is None  # no model was needed
    for a, b in ((win.panes.vanilla, other.panes.vanilla), (win.panes.speculative, other.panes.speculative)):
        assert a.text() == b.text()
        assert a.mismatch_index == b.mismatch_index
        assert [s.token for s in a.steps] == [s.token for s in b.steps]
    for item in ("vanilla", "speculative"):
        x1, y1 = getattr(win.margin_plot, item).getData()
        x2, y2 = getattr(other.margin_plot, item).getData()
        assert np.array_equal(x1, x2) and np.allclose(y1, y2, atol=1e-5)
    assert np.array_equal(win.acceptance.accepted.getData()[1], other.acceptance.accepted.getData()[1])
    assert win.margin_plot.fork_line.value() == other.margin_plot.fork_line.value()
    assert win.verdict.text() == other.verdict.text()
    assert win.speed.text() == other.speed.text()


def test_deriving_a_missing_quantization_from_a_folder(qtbot, win, tmp_path):
    from specview.backends.llama_cpp import demo

    src = demo.resolve("demo:Q8_0")
    link = tmp_path / src.name
    link.symlink_to(src)
    choices = gmodels.siblings(link)
    q4 = next(c for c in choices if c.quant == "Q4_0")
    assert not q4.exists and q4.source == str(link)
    win.target.set_value(str(link))
    assert win.target.quants.isVisible() or win.target.quants.count() > 1
    with qtbot.waitSignal(win.host.worker.sigDerived, timeout=RUN_TIMEOUT) as blk:
        win.derive(q4, "target")
    assert blk.args[0].path == q4.path
    with open(q4.path, "rb") as fh:
        assert fh.read(4) == b"GGUF"
    assert win.target.value() == q4.path
    assert [c.quant for c in gmodels.siblings(link) if c.exists] == ["Q8_0", "Q4_0"]
    ensure_base_config(win)
