"""The window driving the real demo model (SmolLM2-135M): streaming, fork marking, flip-and-see, cancel, errors.

One window is shared by the module so the models load once; each test leaves it
idle.  The base configuration is demo:Q4_K_M with a demo:Q4_0 draft on the
essay prompt.  Whether and where a target forks depends on the CPU's kernels
and the thread split, so the tests that need a fork take the first candidate
of ``tests/forks.py`` that forks here (``find_fork``), never a fixed one.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from forks import find_fork
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtTest import QTest

from specview.core.arms.generate import GenOptions, run_to_end, vanilla_greedy
from specview.core.session import Session
from specview.gui.models import choices as gmodels
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


@pytest.fixture(scope="module")
def fork():
    """The first candidate configuration that forks on this machine (found by a plain Session, as the app runs)."""
    session = Session()
    try:
        return find_fork(session)
    finally:
        session.close()


def fork_controls(fork) -> dict:
    c = fork.cfg
    return dict(target=c.target, draft=c.draft, prompt=c.prompt, max_tokens=c.max_tokens, n_max=c.n_max,
                p_min=c.p_min, flash_attn=c.engine.flash_attn, threads=c.engine.threads, chat=c.chat,
                ignore_eos=c.ignore_eos)


def run_and_wait(qtbot, w, start=None):
    with qtbot.waitSignal(w.sigTraceShown, timeout=RUN_TIMEOUT) as blk:
        (start or w.run)()
    return blk.args[0]


def ensure_base_config(w):
    w.auto_run.setChecked(False)
    w.set_controls(target="demo:Q4_K_M", draft="demo:Q4_0", max_tokens=64, p_min=0.0, ignore_eos=False, n_max=3,
                   prompt="Write an essay on the importance of sleep for students.", chat=True, flash_attn="auto",
                   threads=0)


def test_run_streams_both_arms_and_marks_the_fork(qtbot, win, fork):
    ensure_base_config(win)
    win.set_controls(**fork_controls(fork))
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
    assert fm is not None and fm.index == fork.index, f"{fork.describe()}, but not in the app"
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
        target = sess.model(cfg.backend, cfg.target, sess.resolve(cfg).settings)
        toks = sess.prompt_tokens(cfg, target)
        eng = sess.engine("check", target, sess.resolve(cfg).settings, sess.context_size(cfg, len(toks), target))
        ref = run_to_end(vanilla_greedy(eng, toks, GenOptions(max_tokens=cfg.max_tokens)))
    finally:
        sess.close()
    assert ref.tokens == v.tokens


def test_p_min_1_reruns_only_the_speculative_arm_and_is_identical(qtbot, win, fork):
    ensure_base_config(win)
    win.set_controls(**fork_controls(fork))  # a run that forks on this machine, whatever it decided
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
    assert win.verdict.text().startswith("<b>Inconclusive</b>")  # nothing drafted: nothing speculative tested
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


def test_cancel_during_the_speculative_arm_stops_it_within_a_round_or_two(qtbot, win):
    """The cancel flag set at speculative token K: the arm stops at its next cancel point, not at the end."""
    ensure_base_config(win)
    n_max, k, n = 3, 8, 256
    win.set_controls(max_tokens=n, ignore_eos=True, n_max=n_max)
    req = {}

    def on_step(ev):  # runs on the worker thread, the moment the token is made
        if ev.arm == "speculative" and ev.step.index == k and "at" not in req:
            req["at"] = ev.step.index
            win.request.cancel()

    win.host.worker.sigStep.connect(on_step, Qt.ConnectionType.DirectConnection)
    try:
        trace = run_and_wait(qtbot, win)
    finally:
        win.host.worker.sigStep.disconnect(on_step)
    v, s = trace.vanilla, trace.speculative
    assert req.get("at") == k
    assert v.stop_reason != "cancelled" and len(v.tokens) == n  # the vanilla arm had finished
    assert s.stop_reason == "cancelled", s.stop_reason
    # the round in flight and, at most, one more (the cancel crosses to the engine while a round runs)
    assert k + 1 <= len(s.tokens) <= k + 1 + 2 * (n_max + 1), len(s.tokens)
    assert "Cancelled" in win.verdict.text() and not win.busy
    ensure_base_config(win)


def test_cancel_during_the_diagnosis_cuts_it_short(qtbot, win, fork):
    """Esc while the fork is diagnosed: the run is shown as it finished, undiagnosed, in a fraction of a whole
    diagnosis' time."""
    ensure_base_config(win)
    win.set_controls(**fork_controls(fork))
    win.diagnose.setChecked(True)
    marks = {}

    def on_diagnosing(ev):  # on the window's thread, as a user's Esc would be
        marks["diagnosing"] = time.perf_counter()
        if marks.get("cancel"):
            win.cancel()

    win.host.worker.sigDiagnosing.connect(on_diagnosing)
    try:
        full = run_and_wait(qtbot, win)  # the whole diagnosis, timed from its start to the shown trace
        t_full = time.perf_counter() - marks["diagnosing"]
        assert full.diagnosis is not None and full.diagnosis["verdict"] == "near-tie", full.diagnosis
        marks["cancel"] = True
        cut = run_and_wait(qtbot, win)  # both arms come from the cache; the diagnosis starts at once
        t_cut = time.perf_counter() - marks["diagnosing"]
    finally:
        win.host.worker.sigDiagnosing.disconnect(on_diagnosing)
        win.diagnose.setChecked(False)
    assert cut.diagnosis is None and cut.comparison.first_mismatch.index == fork.index
    # the arms had finished: the run is shown as it is, its fork not classified
    assert win.verdict.text().startswith(f"<b>Forked at token {fork.index}</b>") and not win.busy
    assert "The diagnosis was cancelled by the user" in win.verdict.text() and "Cancelled" not in win.verdict.text()
    assert t_cut < t_full / 2, (t_cut, t_full)
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


def test_a_failed_run_puts_the_last_finished_run_back_whole(qtbot, win):
    """A run refused by the engine (its prompt does not fit the context) had begun to replace the window's run:
    the panes, the plots and the speed line show the last finished run again, and the error says so."""
    from specview.gui.verdict_bar import speed_text

    ensure_base_config(win)
    good = run_and_wait(qtbot, win)
    assert win.speed.text() == speed_text(good) != ""
    try:
        win.set_controls(n_ctx=256, prompt="The quick brown fox jumps over the lazy dog. " * 60)
        with qtbot.waitSignal(win.sigError, timeout=RUN_TIMEOUT) as blk:
            win.run()
            assert win.speed.text() == ""  # while it runs, the last run's figures are not shown as its own
        assert "context" in blk.args[0] and not win.busy
        assert "Raise <b>Context</b> to at least" in win.verdict.text() and "--n-ctx" not in win.verdict.text()
        assert win.trace is good and win.verdict_kind == "error"
        assert "The panes and plots show the last finished run." in win.verdict.text()
        assert win.panes.vanilla.text() == good.vanilla.text and win.panes.speculative.text() == good.speculative.text
        assert win.speed.text() == speed_text(good)
        plot = win.side.margin_plot
        assert (plot.n_vanilla, plot.n_speculative) == (len(good.vanilla.steps), len(good.speculative.steps))
    finally:
        win.set_controls(n_ctx=0)


def test_saved_trace_reopens_identically(qtbot, win, make_window, tmp_path, fork):
    ensure_base_config(win)
    win.set_controls(**fork_controls(fork))  # a run that forks on this machine, whatever it decided
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
