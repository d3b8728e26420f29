"""The app as a user sees it: panes that scroll together, empty plots that say what they will show,
and an identical run that says what to try next."""

from __future__ import annotations

import re
from html import unescape

import pytest

from specview.core.config import RunConfig
from specview.gui.verdict_bar import parse_try_link
from specview.gui.messages import ArmStarted, RunRequest, StepsEvent


def shown(make_window, qtbot, *, size=(1300, 700)):
    w = make_window()
    w.resize(*size)
    w.show()
    qtbot.waitExposed(w)
    return w


def scroll_to(pane, i: int) -> None:
    """Scroll ``pane`` as a user would, so that token ``i``'s line is at the top."""
    bar = pane.verticalScrollBar()
    bar.setValue(bar.value() + pane.token_rect(i).top())


@pytest.mark.parametrize("widths", [None, (700, 420)])
def test_the_panes_scroll_together_token_for_token_up_to_the_fork(synth, make_window, qtbot, qapp, widths):
    trace = synth(700, fork=600)
    w = shown(make_window, qtbot)
    w.show_trace(trace)
    qapp.processEvents()
    v, s = w.panes.vanilla, w.panes.speculative
    if widths:  # panes of different widths wrap the same text differently
        v.parentWidget().parentWidget().setSizes(list(widths))
        qapp.processEvents()
    checked = 0
    for a, b in ((v, s), (s, v)):
        for i in range(20, 560, 45):
            scroll_to(a, i)
            qapp.processEvents()
            if a.token_rect(i).top() != 0 or b.verticalScrollBar().value() == b.verticalScrollBar().maximum():
                continue  # the end of the text: nothing further to scroll to
            top = a.top_token()
            # the same token sits at the same height in both panes
            assert b.token_rect(top).top() == a.token_rect(top).top(), (a.arm, i)
            if widths is None:
                assert b.top_token() == top
            checked += 1
    assert checked >= 12


def test_scrolling_while_a_run_streams_keeps_both_panes_where_the_user_put_them(synth, make_window, qtbot, qapp):
    trace = synth(600, fork=450)
    w = shown(make_window, qtbot)
    w.panes.vanilla.parentWidget().parentWidget().setSizes([700, 420])  # the arms wrap differently
    req = RunRequest(RunConfig(prompt="x", max_tokens=600))
    w.request = req
    w.live.begin(req)
    live, v, s = w.live, w.panes.vanilla, w.panes.speculative
    live.on_arm_started(ArmStarted(req.id, "vanilla"))
    live.on_steps(StepsEvent(req.id, "vanilla", trace.vanilla.steps, []))
    live.on_arm_started(ArmStarted(req.id, "speculative"))
    live.on_steps(StepsEvent(req.id, "speculative", trace.speculative.steps[:400], trace.speculative.rounds[:10]))
    live.flush()
    qapp.processEvents()
    # streaming at the end: the first arm is shown at the same place as the second
    assert s.verticalScrollBar().value() == s.verticalScrollBar().maximum()
    assert v.token_rect(399).top() == s.token_rect(399).top()
    scroll_to(s, 100)  # the user scrolls back in the streaming pane
    qapp.processEvents()
    top = s.top_token()
    assert top <= 100 and v.token_rect(top).top() == s.token_rect(top).top()
    live.on_steps(StepsEvent(req.id, "speculative", trace.speculative.steps[400:], []))
    live.flush()
    qapp.processEvents()
    # neither pane jumped to the end: both still show the user's token at the same height
    assert s.top_token() == top and v.token_rect(top).top() == s.token_rect(top).top()
    w.request = None


def test_empty_plots_say_what_they_will_show(synth, make_window, qtbot):
    w = shown(make_window, qtbot)
    for plot in (w.margin_plot, w.acceptance):
        pi = plot.getPlotItem()
        assert plot.empty and plot.hint.isVisible() and re.search(r"appears? here", plot.hint.text())
        assert not pi.getAxis("bottom").isVisible() and not pi.getAxis("left").isVisible()
        assert not pi.getAxis("bottom").autoSIPrefix and not pi.getAxis("left").autoSIPrefix  # never "x0.001"
    w.show_trace(synth(40, fork=25))
    for plot in (w.margin_plot, w.acceptance):
        assert not plot.empty and not plot.hint.isVisible()
        assert plot.getPlotItem().getAxis("bottom").isVisible()
    # a trace from an engine that reports no rounds, only its totals, says so where the bars would be
    no_rounds = synth(40, fork=None)
    no_rounds.speculative.rounds = []
    no_rounds.speculative.reported_drafted, no_rounds.speculative.reported_accepted = 30, 20
    w.show_trace(no_rounds)
    assert w.acceptance.empty and "no verify rounds" in w.acceptance.hint.text()


def verdict_lines(w) -> list[str]:
    return w.verdict.text().split("<br>")


def links(html_text: str) -> dict[str, dict]:
    return {unescape(t): parse_try_link(unescape(h)) for h, t in re.findall(r'<a href="([^"]+)">([^<]+)</a>', html_text)}


def test_an_identical_run_says_in_one_line_what_to_try_next(synth, make_window, qtbot, monkeypatch):
    w = shown(make_window, qtbot)
    trace = synth(40, fork=None)
    trace.config.update(target="demo:Q8_0", max_tokens=40, n_max=3, spec_type="draft-simple")
    w.show_trace(trace)
    head, hint = verdict_lines(w)
    assert "Identical" in head and "\n" not in hint
    got = links(hint)
    assert got == {"another quantization (Q4_K_M)": {"target": "demo:Q4_K_M"},
                   "a longer run (1024 tokens)": {"max_tokens": 1024},
                   "a larger n_max (8)": {"n_max": 8}}
    assert "on this machine" in hint
    runs = []
    monkeypatch.setattr(w, "run", lambda **kw: runs.append(w.build_config()))
    href = re.search(r'<a href="([^"]+)">a larger n_max', hint).group(1)
    w.verdict.linkActivated.emit(unescape(href))
    assert len(runs) == 1 and runs[0].n_max == 8 and w.controls["n_max"].value() == 8


def test_the_hint_names_the_users_own_quantizations_and_what_stopped_the_run(synth, make_window, qtbot, tmp_path):
    for q in ("Q8_0", "Q4_K_M", "F16"):
        (tmp_path / f"Model-{q}.gguf").write_bytes(b"GGUF" + b"\0" * 40)
    w = shown(make_window, qtbot)
    target = str(tmp_path / "Model-Q8_0.gguf")
    w.set_controls(target=target)
    trace = synth(40, fork=None)
    trace.config.update(target=target, max_tokens=2000, n_max=12, spec_type="draft-simple")
    trace.vanilla.stop_reason = "eos"  # stopped by the model before max_tokens
    w.show_trace(trace)
    got = links(verdict_lines(w)[1])
    assert got["another quantization (Model-F16.gguf)"] == {"target": str(tmp_path / "Model-F16.gguf")}
    assert got["a longer run (4000 tokens, ignoring EOS)"] == {"max_tokens": 4000, "ignore_eos": True}
    assert got["a larger n_max (24)"] == {"n_max": 24}


def test_nothing_drafted_says_why_the_arms_could_not_differ(synth, make_window, qtbot):
    w = shown(make_window, qtbot)
    trace = synth(30, fork=None)
    for r in trace.speculative.rounds:
        r.drafted = r.accepted = 0
    for st in trace.speculative.steps:
        st.from_draft = False
    trace.config.update(p_min=1.0)
    w.show_trace(trace)
    head, hint = verdict_lines(w)
    assert head.startswith("<b>Inconclusive</b>") and "p_min 1 is llama.cpp&#x27;s zero-draft control" in head
    assert w.verdict.kind == "unsure"  # the legend's grey: nothing speculative was tested
    assert links(hint) == {"lower p_min to 0 and run again": {"p_min": 0.0}}
