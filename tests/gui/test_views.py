"""The window on saved and synthetic traces: no model is loaded by any test here."""

from __future__ import annotations

import html
import json

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtTest import QTest

from specview.gui.models import choices as gmodels
from specview.gui.panes import Tints
from specview.gui.side_by_side import mismatch_positions


def contrast(a, b) -> float:
    """WCAG contrast ratio of two QColors."""
    def lum(c):
        def ch(v):
            v = v / 255.0
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
        return 0.2126 * ch(c.red()) + 0.7152 * ch(c.green()) + 0.0722 * ch(c.blue())
    la, lb = sorted((lum(a), lum(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def test_opened_trace_fills_panes_marks_fork_and_plots(synth, make_window, qtbot, tmp_path):
    trace = synth(40, fork=25)
    path = trace.save(tmp_path / "t.json")
    w = make_window()
    with qtbot.waitSignal(w.sigTraceShown, timeout=5000):
        w.open_trace(path)
    v, s = w.panes.vanilla, w.panes.speculative
    assert v.text() == trace.vanilla.text
    assert s.text() == trace.speculative.text
    assert v.mismatch_index == s.mismatch_index == 25
    assert w.margin_plot.fork_line.isVisible() and w.margin_plot.fork_line.value() == 25
    x, y = w.margin_plot.vanilla.getData()
    assert np.allclose(y, [st.margin for st in trace.vanilla.steps], atol=1e-5)
    # bars: one per round, heights are the rounds' drafted/accepted counts
    _, d = w.acceptance.drafted.getData()
    _, a = w.acceptance.accepted.getData()
    assert d.sum() == trace.speculative.n_drafted and a.sum() == trace.speculative.n_accepted
    assert trace.speculative.n_accepted + len(trace.speculative.rounds) == len(trace.speculative.tokens)
    # the fork's round is marked on the acceptance plot
    fork_round = trace.speculative.steps[25].round
    assert w.acceptance.fork_line.isVisible() and w.acceptance.fork_line.value() == fork_round
    assert "Forked at token 25" in w.verdict.text()
    # opening a trace loads no model
    assert w.host.worker.runner is None


def test_draft_tokens_tinted_target_tokens_plain(synth, make_window, qtbot):
    trace = synth(30, fork=None)
    w = make_window()
    w.show_trace(trace)
    pane = w.panes.speculative
    tints = Tints(pane.palette())
    n_draft = 0
    for i, st in enumerate(trace.speculative.steps):
        if "\n" in st.piece:
            continue  # a line break has no glyph to tint
        start, end = pane.token_range(i)
        cur = QTextCursor(pane.document())
        cur.setPosition(start + 1)  # the format of the character after `start`
        bg = cur.charFormat().background().color()
        if st.from_draft:
            n_draft += 1
            assert bg == tints.draft, i
        else:
            assert bg != tints.draft, i
    assert n_draft == sum(1 for st in trace.speculative.steps if st.from_draft and "\n" not in st.piece) > 0
    assert "Identical" in w.verdict.text()
    assert not w.margin_plot.fork_line.isVisible()


def test_mismatch_navigation_f8(synth, make_window, qtbot, qapp):
    trace = synth(40, fork=25)
    w = make_window()
    w.show_trace(trace)
    expected = [i for i in range(40) if trace.vanilla.tokens[i] != trace.speculative.tokens[i]]
    assert mismatch_positions(trace.vanilla.tokens, trace.speculative.tokens) == expected
    w.show()
    w.activateWindow()
    qtbot.waitActive(w)
    qapp.processEvents()
    w.select_token(None)
    seen = []
    for _ in range(3):
        QTest.keyClick(w.windowHandle(), Qt.Key.Key_F8)
        qapp.processEvents()  # key events from the window system are delivered by the event loop
        seen.append(w.panes.selected)
    assert seen == expected[:3]
    QTest.keyClick(w.windowHandle(), Qt.Key.Key_F8, Qt.KeyboardModifier.ShiftModifier)
    qapp.processEvents()
    assert w.panes.selected == expected[1]
    assert w.margin_plot.select_line.value() == expected[1]


def test_mismatch_positions_counts_length_difference_once():
    assert mismatch_positions([1, 2, 3], [1, 2, 3]) == []
    assert mismatch_positions([1, 2, 3], [1, 9, 3, 4, 5]) == [1, 3]


def test_tooltip_has_topk_margin_round_and_batch(synth, make_window):
    trace = synth(40, fork=25)
    w = make_window()
    w.show_trace(trace)
    st = trace.speculative.steps[25]
    tip = w.panes.speculative.tooltip_html(25)
    assert f"margin top-1 &minus; top-2: <b>{st.margin:.4f}</b>" in tip
    assert f"round {st.round}, batch T={st.batch_size}" in tip
    for tid, logit in zip(st.top_ids, st.top_logits):
        assert f"<td align=right>{tid}</td>" in tip and f"{logit:.4f}" in tip
    # the other arm's token at the fork is named
    assert f"vanilla has {html.escape(repr(trace.vanilla.steps[25].piece))}" in tip


def test_click_in_pane_selects_token_and_marks_plots(synth, make_window, qtbot):
    trace = synth(40, fork=25)
    w = make_window()
    w.show()
    w.show_trace(trace)
    qtbot.waitExposed(w)
    pane = w.panes.vanilla
    i = 7
    pane.ensure_token_visible(i)
    rect = pane.token_rect(i)
    start, end = pane.token_range(i)
    cur = QTextCursor(pane.document())
    cur.setPosition(end)
    rect_end = pane.cursorRect(cur)
    point = rect.center()
    point.setX((rect.left() + rect_end.left()) // 2) if rect_end.top() == rect.top() else None
    qtbot.mouseClick(pane.viewport(), Qt.MouseButton.LeftButton, pos=point)
    assert w.panes.selected == i
    assert w.margin_plot.select_line.isVisible() and w.margin_plot.select_line.value() == i
    assert w.acceptance.select_line.value() == trace.speculative.steps[i].round


def test_click_on_margin_plot_selects_token(synth, make_window, qtbot):
    trace = synth(40, fork=25)
    w = make_window()
    w.show()
    w.show_trace(trace)
    qtbot.waitExposed(w)
    plot = w.margin_plot
    plot.getPlotItem().getViewBox().setRange(xRange=(0, 39), yRange=(0, 6), padding=0)
    qtbot.wait(0)  # let the view box apply the range
    scene_pt = plot.getPlotItem().getViewBox().mapViewToScene(QPointF(12, 3))
    pos = plot.mapFromScene(scene_pt)
    qtbot.mouseClick(plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert w.panes.selected == 12
    assert w.panes.vanilla.selected_index == w.panes.speculative.selected_index == 12


def test_diagnosis_envelope_and_at_risk_are_drawn(synth, make_window):
    series = [0.1 * (i % 5) for i in range(25)]
    diag = {"verdict": "near-tie", "gap": 0.012, "explanation": "A near-tie flipped by batched numerics.",
            "envelope": {"max": 0.4, "p95": 0.35, "median": 0.2, "series": series}, "at_risk": [3, 9, 17]}
    trace = synth(40, fork=25, diagnosis=diag)
    w = make_window()
    w.show_trace(trace)
    x, y = w.margin_plot.envelope.getData()
    assert list(x) == list(range(25)) and np.allclose(y, series)
    pts = w.margin_plot.at_risk.getData()
    assert list(pts[0]) == [3, 9, 17]
    assert np.allclose(pts[1], [trace.vanilla.steps[i].margin for i in (3, 9, 17)])
    text = w.verdict.text()
    assert "near-tie" in text and "replay gap 0.0120" in text and "batched numerics" in text
    assert {ln.value() for ln in w.margin_plot.gap_lines} == {0.4, 0.35}


def test_diagnosis_of_unexpected_shape_is_ignored_not_fatal(synth, make_window):
    diag = {"verdict": 7, "envelope": {"series": "nonsense", "max": [1]}, "at_risk": "x"}
    w = make_window()
    w.show_trace(synth(30, fork=10, diagnosis=diag))
    assert len(w.margin_plot.envelope.getData()[0] or []) == 0
    assert "Forked at token 10" in w.verdict.text()


def test_bad_trace_file_shows_error_and_keeps_view(synth, make_window, qtbot, tmp_path):
    good = synth(30, fork=10).save(tmp_path / "good.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something/else"}))
    w = make_window()
    w.open_trace(good)
    with qtbot.waitSignal(w.sigError, timeout=2000) as blk:
        assert w.open_trace(bad) is None
    assert str(bad) in blk.args[0] and "not a specview trace" in blk.args[0]
    assert w.panes.vanilla.text() == w.trace.vanilla.text  # the good trace is still shown
    with qtbot.waitSignal(w.sigError, timeout=2000) as blk:
        w.open_trace(tmp_path / "missing.json")
    assert "no such file" in blk.args[0]


def test_empty_prompt_is_a_clear_error(make_window, qtbot):
    w = make_window()
    w.prompt.setPlainText("   ")
    with qtbot.waitSignal(w.sigError, timeout=2000) as blk:
        assert w.run() is None
    assert "prompt is empty" in blk.args[0]
    assert not w.busy


def test_settings_are_remembered(make_window, tmp_path):
    path = tmp_path / "cfg" / "gui.json"
    w = make_window(settings_path=path)
    w.set_controls(target="/models/x/Model.Q4_K_M.gguf", n_max=5, p_min=0.25, max_tokens=77, chat=False,
                   prompt="hello there", flash_attn="off", spec_type="ngram-simple")
    w.close()
    assert path.exists()
    w2 = make_window(settings_path=path)
    s = w2.controls.state()
    assert (s["target"], s["n_max"], s["p_min"], s["max_tokens"], s["chat"], s["prompt"], s["engine"]["flash_attn"],
            s["spec_type"]) == ("/models/x/Model.Q4_K_M.gguf", 5, 0.25, 77, False, "hello there", "off",
                                "ngram-simple")
    assert not w2.draft.isEnabled()  # ngram-simple needs no draft model


def test_defaults_open_on_the_demo_essay(make_window):
    w = make_window()
    cfg = w.build_config()
    from specview.core.config import DEMO_DRAFT, RunConfig
    from specview.core.demo import DEMO_PROMPT
    from specview.core.registry import Runner

    # the demo target `specview run` would take here: the quantization the machine picked where a run measured
    # it (BF16 where no quantization forks without repacking), else the default one
    here = Runner.resolve(RunConfig(prompt=DEMO_PROMPT), default_target=True, measure=False).config.target
    assert (cfg.target, cfg.draft, cfg.chat, cfg.max_tokens) == (here, DEMO_DRAFT, True, 256)  # as `specview run`
    assert cfg.prompt == DEMO_PROMPT
    assert w.prompt_choice.currentText() == "essay"
    assert {"essay", "technical", "code", "list"} <= set(w.prompts)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_themes_keep_tints_readable(make_window, qapp, theme):
    w = make_window()
    old = qapp.palette()
    try:
        w.apply_theme(theme)
        qapp.processEvents()  # the palette reaches the widgets through events
        pane = w.panes.vanilla
        t = Tints(pane.palette())
        assert (t.base.lightness() < 100) == (theme == "dark")
        for bg in (t.base, t.draft, t.draft_alt, t.mismatch, t.selected, t.plain_alt):
            assert contrast(t.text, bg) >= 4.5, (theme, bg.name())
        assert t.draft != t.base and t.mismatch != t.draft
    finally:
        qapp.setPalette(old)


def test_quantization_siblings_and_derivable(tmp_path):
    for name in ("SmolLM2-135M-Instruct.F16.gguf", "SmolLM2-135M-Instruct.Q8_0.gguf", "other-model-Q4_0.gguf"):
        (tmp_path / name).write_bytes(b"GGUF" + b"\0" * 40)
    ch = gmodels.siblings(tmp_path / "SmolLM2-135M-Instruct.Q8_0.gguf")
    assert [(c.quant, c.exists) for c in ch] == [
        ("F16", True), ("Q8_0", True), ("Q6_K", False), ("Q5_K_M", False), ("Q4_K_M", False), ("Q4_0", False)]
    q4 = ch[-1]
    assert q4.source == str(tmp_path / "SmolLM2-135M-Instruct.F16.gguf")
    assert q4.path == str(tmp_path / "SmolLM2-135M-Instruct.Q4_0.gguf")
    assert gmodels.quant_of("x-q4_k_m.gguf") == "Q4_K_M" and gmodels.quant_of("model.gguf") is None
    # a folder: the family with most files is listed
    assert [c.quant for c in gmodels.siblings(tmp_path) if c.exists] == ["F16", "Q8_0"]


def test_many_void_calls_and_emits_do_not_exhaust_none_or_true(qapp):
    """PySide6 6.12 on CPython 3.11 drops a reference to None per void call and to True per emit;
    without the guard this loop aborts the interpreter ("deallocating None")."""
    import sys

    from PySide6.QtCore import QObject, Signal

    from specview.gui import qtcompat

    class Emitter(QObject):
        sig = Signal(int)

    e = Emitter()
    got = []
    e.sig.connect(got.append)
    n = 3 * max(sys.getrefcount(None), sys.getrefcount(True)) if not qtcompat.guard() else 20000
    for i in range(n):
        e.setObjectName("x")
        e.sig.emit(i)
    assert len(got) == n


def test_gui_command_refuses_a_missing_trace(tmp_path, capsys):
    from specview.cli import main

    assert main(["gui", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: no such trace file" in capsys.readouterr().err


def test_long_runs_bin_the_acceptance_bars_by_mean(make_window):
    from specview.core.trace import Round
    from specview.gui.plots import MAX_BARS

    w = make_window()
    n = 2 * MAX_BARS + 7
    rounds = [Round(index=i, drafted=3, accepted=i % 4, draft_ms=0.0, verify_ms=0.0, batch_size=4, first_step=i)
              for i in range(n)]
    w.acceptance.set_rounds(rounds)
    x, a = w.acceptance.accepted.getData()
    b = w.acceptance.bin
    assert b == 3 and len(a) == -(-n // b) and len(x) == len(a) + 1
    assert a[0] == (0 + 1 + 2) / 3 and a[-1] == np.mean([i % 4 for i in range(b * (len(a) - 1), n)])
    assert x[-1] == n - 0.5  # the last bin ends at the last round
    assert f"means of {b}" in w.acceptance.summary


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_disabled_controls_look_disabled_in_every_theme(make_window, qapp, theme):
    from PySide6.QtGui import QPalette

    w = make_window()
    old = qapp.palette()
    try:
        w.apply_theme(theme)
        pal = qapp.palette()
        for role in (QPalette.ColorRole.ButtonText, QPalette.ColorRole.Text):
            on = pal.color(QPalette.ColorGroup.Active, role)
            off = pal.color(QPalette.ColorGroup.Disabled, role)
            assert abs(on.lightness() - off.lightness()) >= 60, (theme, role)
    finally:
        qapp.setPalette(old)


def test_the_margin_legend_names_what_is_drawn_each_in_its_own_place(synth, make_window, qtbot, qapp):
    w = make_window()
    w.show()
    qtbot.waitExposed(w)

    def legend():
        qapp.processEvents()
        items = w.margin_plot.getPlotItem().legend.items
        spots = {(round(s.pos().x()), round(s.pos().y())) for s, _label in items}
        assert len(spots) == len(items)  # no two entries drawn in one place
        return [label.text for _s, label in items]

    w.show_trace(synth(40, fork=25))
    assert legend() == ["vanilla", "speculative"]
    diag = {"verdict": "near-tie", "envelope": {"max": 0.4, "series": [0.2] * 25}, "at_risk": [3, 9]}
    w.show_trace(synth(40, fork=25, diagnosis=diag))
    assert legend() == ["vanilla", "speculative", "replay envelope (max 0.400)", "at risk"]
    w.show_trace(synth(40, fork=25))
    assert legend() == ["vanilla", "speculative"]
