"""The Side by side tab's new views: the Δ-margin / KL track under the margin plot (titled with the near-tie
density) and the acceptance histogram under the rounds, each drawing what the trace says, recomputed here."""

from __future__ import annotations

import numpy as np
import pytest

from specview.core.diagnose import ties
from specview.gui.side_by_side import SideBySide


@pytest.fixture
def view(shown):
    return shown(SideBySide(), 1100, 700, exposed=False)


def _deltas(trace):
    """[s(a) - s(b)] - [v(a) - v(b)] with a, b vanilla's top two, on the shared prefix and the fork."""
    c = trace.comparison
    n = c.agree + 1 if not c.identical else c.agree
    out = []
    for i in range(n):
        v, s = trace.vanilla.steps[i], trace.speculative.steps[i]
        lv, ls = dict(zip(v.top_ids, v.top_logits)), dict(zip(s.top_ids, s.top_logits))
        a, b = v.top_ids[0], v.top_ids[1]
        out.append((ls[a] - ls[b]) - (lv[a] - lv[b]) if a in ls and b in ls else None)
    return out


def test_the_track_draws_each_tokens_delta_margin_and_names_the_density(view, synth):
    t = synth(n=40, fork=25, diagnosis={"verdict": "near-tie", "envelope": {"max": 0.4, "positions": 25}})
    view.show_trace(t)
    tp = view.track_plot
    want = _deltas(t)
    x = np.asarray(tp.bars.opts["x"])
    h = np.asarray(tp.bars.opts["height"])
    assert list(x) == [i for i, d in enumerate(want) if d is not None]
    assert h == pytest.approx([d for d in want if d is not None], abs=1e-9)
    assert len(want) == 26 and x.max() <= 25  # nothing after the fork: the arms saw different texts there
    d = ties.tie_density(t)
    cal = d["bands"][0]
    assert cal["calibrated"] and cal["width"] == pytest.approx(0.8)
    title = tp.getPlotItem().titleLabel.text
    assert f"{cal['in_band']} of {d['positions']} compared positions" in title and "calibrated (0.8 logits)" in title
    assert tp.fork_line.isVisible() and tp.fork_line.value() == 25
    # the track follows the margin plot's token axis, and a selection anywhere draws on it
    assert tp.getPlotItem().getViewBox().linkedView(0) is view.margin_plot.getPlotItem().getViewBox()
    view.select_token(7)
    assert tp.select_line.isVisible() and tp.select_line.value() == 7


def test_a_click_on_the_track_selects_that_token_in_both_panes(view, synth, qtbot):
    view.show_trace(synth(n=40, fork=25))
    got = []
    view.track_plot.sigIndexClicked.connect(got.append)
    view.track_plot.sigIndexClicked.emit(12)  # what a click at token 12 emits (pyqtgraph's scene click)
    assert got == [12] and view.panes.selected == 12


def test_the_histogram_counts_how_far_the_drafts_survive(view, synth):
    t = synth(n=40, fork=None)
    view.show_trace(t)
    hg = view.histogram
    rounds = [r for r in t.speculative.rounds if r.index > 0]
    most = max(r.drafted for r in rounds)
    drafted = [sum(r.drafted >= k for r in rounds) for k in range(1, most + 1)]
    accepted = [sum(r.accepted >= k for r in rounds) for k in range(1, most + 1)]
    assert list(hg.drafted.opts["height"]) == drafted and list(hg.accepted.opts["height"]) == accepted
    assert [lab.toPlainText() for lab in hg.labels] == [f"{100 * a / d:.0f}%" for a, d in zip(accepted, drafted)]
    assert f"{len(rounds)} rounds" in hg.getPlotItem().titleLabel.text
    assert t.speculative.rounds[0].index == 0  # the prefill's round, drawn but no verify: both titles skip it
    assert f"· {len(rounds)} verify rounds" in view.acceptance.summary
    view.clear_trace()
    assert hg.empty and view.track_plot.empty


def test_screenshot_of_the_new_views(view, synth, tmp_path):
    """Renders (offscreen) so a broken paint path fails here, not in a user's window."""
    view.show_trace(synth(n=60, fork=40, diagnosis={"verdict": "near-tie", "envelope": {"max": 0.3, "positions": 40}}))
    img = view.grab().toImage()
    assert img.width() > 500 and img.height() > 300
    assert img.save(str(tmp_path / "side.png"))


def test_the_rates_panel_names_each_settings_near_ties(qtbot, tmp_path):
    """A matrix on the fake backend (its batched rows carry a planted error): the selected setting's line and
    its tool tip give the near-tie density the rates summed from the cells."""
    from fakes import FakeBackend
    from specview.core.matrix import MatrixSpec, PromptSpec, load_matrix, run_matrix
    from specview.core.registry import register_backend, unregister_backend
    from specview.core.session import Session
    from specview.gui.matrix.rates import RatesPanel

    class Toy(FakeBackend):
        name = "toy-ties-gui"
        model_kind = "name"

    register_backend("toy-ties-gui", Toy)
    try:
        spec = MatrixSpec(targets=["0:0:0.5"], drafters=["0"], n_max=[4], max_tokens=40, ignore_eos=True,
                          prompts=[PromptSpec(f"p{i}", text=t, chat=False) for i, t in
                                   enumerate(["hello world", "the cat sat", "quick brown fox"])],
                          backend="toy-ties-gui", diagnose=True)
        with Session() as s:
            run_matrix(spec, s, out=tmp_path / "m.json")
    finally:
        unregister_backend("toy-ties-gui")
    doc = load_matrix(tmp_path / "m.json")
    g = doc["rates"]["settings"][0]
    panel = RatesPanel()
    qtbot.addWidget(panel)
    panel.set_rates(doc["rates"], prompts=3)
    panel.select_setting(0)
    b = next((b for b in g["ties"]["bands"] if b.get("calibrated")), g["ties"]["bands"][0])
    assert f"near-ties: {b['in_band']} of {g['ties']['positions']} compared positions" in panel.selection.text()
    tip = panel.tree.topLevelItem(0).toolTip(0)
    assert "near-ties" in tip and "2.0 logits" in tip and "0.125 nats" in tip


def test_a_run_after_a_run_draws_every_margin_while_streaming_and_when_shown(view, synth, qtbot):
    """The track plot shares the margin plot's token axis. Emptied when a run starts and resized when the
    layout moves, it must not shrink the margins to its own unit range: every streamed token stays in view,
    and the finished trace's curves hold every token (pyqtgraph draws only what is in view)."""
    mp, tp = view.margin_plot, view.track_plot
    vb = mp.getPlotItem().getViewBox()
    n = 64
    for _ in range(2):  # the second run starts where the first one's trace was shown
        t = synth(n=n, fork=25)
        v, s = mp.margins(t.vanilla.steps), mp.margins(t.speculative.steps)
        view.clear_trace()
        for arm, k_s in (("vanilla", 0), ("speculative", n)):
            mp.restart(arm)
            for k in (8, 32, n):
                mp.set_arrays(v[:k], s[:min(k, k_s)], x_max=n)
                lo, hi = vb.viewRange()[0]
                assert lo <= 0 and hi >= n - 1, f"{arm} arm at {k} tokens: x range {lo:.2f}..{hi:.2f}"
                qtbot.wait(5)  # a frame is painted
        view.show_trace(t)
        tp.resize(tp.width(), tp.height() - 40)  # the layout moves before the next paint
        for item in (mp.vanilla, mp.speculative):
            x, _ = item.getData()
            assert list(x) == list(range(n))
        qtbot.wait(5)
        assert vb.viewRange()[0][0] <= 0 and vb.viewRange()[0][1] >= n - 1


def test_an_emptied_track_shows_its_hint_alone(view, synth):
    """A new run empties the track: no mark of the last run's fork or selection, no KL axis over the hint."""
    tp = view.track_plot
    right = tp.getPlotItem().getAxis("right")
    assert tp.empty and not right.isVisible()
    view.show_trace(synth(n=40, fork=25))
    view.select_token(7)
    assert not tp.empty and right.isVisible() and tp.fork_line.isVisible() and tp.select_line.isVisible()
    view.clear_trace()
    assert tp.empty and tp.hint.isVisible()
    assert not right.isVisible() and not tp.fork_line.isVisible() and not tp.select_line.isVisible()
