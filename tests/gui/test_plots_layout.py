"""The Side by side plots as a user sees them: no envelope left from another run, empty runs shown as empty,
a histogram readable for any n_max and in either theme, titles and legends that fit a small window without
covering the data, and a fork card whose legend entries each have their own place."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF, QRectF
from PySide6.QtGui import QColor, QPalette

from specview.core.arms.compare import compare_arms
from specview.core.trace import ArmResult, Round
from specview.gui.plots import MarginPlot
from specview.gui.side_by_side import SideBySide
from specview.gui.theme import dark_palette
from specview.gui.track_plots import AcceptanceHistogram

DIAGNOSIS = {"verdict": "near-tie", "envelope": {"max": 0.6, "p95": 0.5, "positions": 30,
                                                 "series": [0.2 + 0.1 * (i % 4) for i in range(30)]},
             "at_risk": [3, 9, 20]}


@pytest.fixture
def view(shown):
    return shown(SideBySide(), 1240, 760)


def _envelope_pixels(plot: MarginPlot) -> int:
    """Pixels of the plot drawn in the envelope fill's colour."""
    want = plot.envelope_fill.brush().color()
    img = plot.grab().toImage()
    n = 0
    for y in range(0, img.height(), 2):
        for x in range(0, img.width(), 2):
            c = QColor(img.pixel(x, y))
            n += abs(c.red() - want.red()) + abs(c.green() - want.green()) + abs(c.blue() - want.blue()) < 12
    return n


def _shown_title(plot) -> str:
    """The title as the plot draws it (cut short where the plot is narrow)."""
    return plot.getPlotItem().titleLabel.text


def _no_envelope(plot: MarginPlot) -> bool:
    return (not plot.envelope_fill.isVisible() and plot.envelope_fill.path().isEmpty() and not plot.gap_lines
            and "replay envelope" not in " ".join(label.text for _s, label in plot.legend.items))


def _diagnosed(view, synth):
    view.show_trace(synth(n=64, fork=30, diagnosis=DIAGNOSIS))
    mp = view.margin_plot
    assert mp.envelope_fill.isVisible() and not mp.envelope_fill.path().isEmpty()
    return mp


def test_an_identical_run_after_a_diagnosed_fork_shows_no_envelope(view, synth, qtbot):
    mp = _diagnosed(view, synth)
    qtbot.wait(5)
    assert _envelope_pixels(mp) > 50  # the fill is drawn, in the colour counted here
    view.show_trace(synth(n=64, fork=None))  # no diagnosis: set_diagnosis(None) is all that clears it
    assert _no_envelope(mp)
    qtbot.wait(5)
    assert _envelope_pixels(mp) == 0


@pytest.mark.parametrize("clear", ["empty arrays", "new margins", "a new run starts", "no diagnosis"])
def test_every_way_of_replacing_the_margins_clears_the_envelope(view, synth, clear):
    """A failed run empties the plot, a trace shown again replaces the margins, a new run restarts the arms, a
    cancelled diagnosis draws none: none of them leaves the last diagnosis' fill, lines or marks."""
    mp = _diagnosed(view, synth)
    if clear == "empty arrays":
        mp.set_steps([], [])
        assert mp.empty and not mp.fork_line.isVisible()
    elif clear == "new margins":
        t = synth(n=80, fork=None)
        mp.set_steps(t.vanilla.steps, t.speculative.steps)
    elif clear == "a new run starts":
        mp.restart("vanilla")
    else:
        mp.set_diagnosis(None, [])
    assert _no_envelope(mp)
    x, _y = mp.at_risk.getData()
    assert len(x) == 0


def test_the_failed_runs_empty_plot_draws_nothing_of_the_last_envelope(view, synth, qtbot):
    mp = _diagnosed(view, synth)
    view.clear_trace()
    mp.set_steps([], [])  # what a window shows when the run failed before its first token
    qtbot.wait(5)
    assert mp.empty and _envelope_pixels(mp) == 0


def _empty_trace(synth):
    t = synth(n=40, fork=None)
    for arm in (t.vanilla, t.speculative):
        arm.steps, arm.tokens, arm.text = [], [], ""
    t.speculative.rounds = []
    t.comparison = compare_arms(t.vanilla, t.speculative)
    return t


def test_a_run_cancelled_before_its_first_token_shows_the_plain_hints(view, synth):
    view.show_trace(_empty_trace(synth))
    tp, acc, hg = view.track_plot, view.acceptance, view.histogram
    assert tp.empty and _shown_title(tp) == ""  # no "0 of 0 compared positions"
    assert acc.empty and acc.hint.text() == acc.default_hint  # no totals to point to
    assert hg.empty and hg.hint.text() == hg.default_hint


def test_a_run_with_only_an_engines_totals_says_so(view, synth):
    t = _empty_trace(synth)
    t.speculative.reported_drafted, t.speculative.reported_accepted = 12, 9
    view.show_trace(t)
    assert view.acceptance.empty and "only the totals" in view.acceptance.hint.text()


def _arm(rounds: list[tuple[int, int]]) -> ArmResult:
    rs = [Round(index=0, drafted=0, accepted=0, draft_ms=0.0, verify_ms=1.0, batch_size=8, first_step=0)]
    first = 1
    for i, (d, a) in enumerate(rounds, start=1):
        rs.append(Round(index=i, drafted=d, accepted=a, draft_ms=0.5, verify_ms=1.0, batch_size=d + 1,
                        first_step=first))
        first += a + 1
    return ArmResult(name="speculative", rounds=rs)


@pytest.fixture
def histogram(shown):
    return shown(AcceptanceHistogram(), 640, 260)


def _x_in_widget(plot, x: float) -> float:
    vb = plot.getPlotItem().getViewBox()
    return plot.mapFromScene(vb.mapViewToScene(QPointF(x, 0))).x()


def test_a_huge_n_max_histogram_keeps_every_position_in_sight(histogram, qtbot):
    """n_max 100 (rounds drafting up to 100, accepting 0 to 46): a title of bounded length, every position with
    data inside the widget, percentage labels that do not run into each other."""
    rng = np.random.default_rng(3)
    rounds = [(100, 46), (100, 0)] + [(int(d), int(rng.integers(0, 10))) for d in rng.integers(10, 100, 30)]
    histogram.set_arm(_arm(rounds))
    qtbot.wait(5)
    pos = histogram.hist["positions"]
    assert len(pos) == 100 and all(p["drafted"] for p in pos)
    assert len(_shown_title(histogram)) <= 90  # not the rounds of each of 101 lengths
    assert "up to 46 in a round" in histogram.title
    width = histogram.viewport().width()
    for k in (1, 100):  # both bars of the first and last position
        assert 0 <= _x_in_widget(histogram, k - 0.4) and _x_in_widget(histogram, k + 0.4) <= width, k
    shown = [lab for lab in histogram.labels if lab.isVisible()]
    assert shown and shown[0].position == 1
    rects = [lab.sceneBoundingRect() for lab in shown]
    for i, a in enumerate(rects):
        assert a.left() >= 0 and a.right() <= width
        assert not any(a.intersects(b) for b in rects[i + 1:]), shown[i].toPlainText()


def test_few_positions_label_every_one_and_list_the_lengths(histogram):
    histogram.set_arm(_arm([(3, 0), (3, 1), (3, 3), (3, 2), (3, 3)]))
    assert [lab.isVisible() for lab in histogram.labels] == [True, True, True]
    assert _shown_title(histogram) == "5 rounds · mean 1.80 drafts accepted/round · accepting 0–3: 1/1/1/2"


def test_the_histograms_labels_follow_the_theme(histogram):
    histogram.set_arm(_arm([(3, 2), (3, 1)]))
    dark = dark_palette()
    histogram.apply_palette(dark)
    want = dark.color(QPalette.ColorRole.Text)
    assert histogram.labels and all(lab.color == want for lab in histogram.labels)
    assert all(lab.textItem.defaultTextColor() == want for lab in histogram.labels)


def test_verify_rounds_that_drafted_nothing_say_so(histogram):
    histogram.set_arm(_arm([(0, 0)] * 47))  # n_max 0
    assert histogram.empty and _shown_title(histogram) == ""
    assert "47 verify rounds drafted nothing" in histogram.hint.text()
    assert "appears here" not in histogram.hint.text()
    histogram.set_arm(None)
    assert histogram.hint.text() == histogram.default_hint


def test_the_two_means_say_which_is_which(view, synth):
    t = synth(n=60, fork=None)
    view.show_trace(t)
    verify = [r for r in t.speculative.rounds if r.index > 0]
    drafts = sum(r.accepted for r in verify) / len(verify)
    acc, hg = view.acceptance, view.histogram
    assert f"mean {drafts + 1:.2f} tokens/round" in acc.summary
    assert f"mean {drafts:.2f} drafts accepted/round" in hg.title
    for plot in (acc, hg):
        tip = plot.getPlotItem().titleLabel.toolTip()
        assert "tokens/round" in tip and "drafts accepted/round" in tip
    from specview.gui.verdict_bar import speed_text

    said = speed_text(t)  # the line over the tabs says it as the plot does
    assert f"mean {drafts + 1:.2f} tokens/round" in said and "accepted length" not in said


def _inside(rect: QRectF, p: QPointF) -> bool:
    return rect.left() < p.x() < rect.right() and rect.top() < p.y() < rect.bottom()


def _points_under_legend(plot, xs, ys) -> list[float]:
    legend = plot.getPlotItem().legend
    rect = legend.sceneBoundingRect()
    vb = plot.getPlotItem().getViewBox()
    return [x for x, y in zip(xs, ys) if _inside(rect, vb.mapViewToScene(QPointF(x, y)))]


def test_a_small_window_fits_titles_and_keeps_legends_off_the_data(view, synth, qtbot):
    """The Side by side tab of a 1280x720 window: every title within its plot (a wider title would widen the
    plot past its widget, legend and last bars out of sight), no bar, margin or label under a legend."""
    view.resize(920, 520)
    view.show_trace(synth(n=64, fork=30, diagnosis=DIAGNOSIS))
    qtbot.wait(20)
    for plot in (view.acceptance, view.margin_plot, view.track_plot, view.histogram):
        assert plot.getPlotItem().sceneBoundingRect().width() <= plot.viewport().width() + 1, plot.objectName()
        legend = plot.getPlotItem().legend
        if legend is not None:
            assert legend.sceneBoundingRect().right() <= plot.viewport().width(), plot.objectName()
    acc = view.acceptance
    edges, heights = acc.drafted.getData()
    tops = [(edges[i] + f * (edges[i + 1] - edges[i]), heights[i]) for i in range(len(heights)) for f in (0.1, 0.9)]
    assert _points_under_legend(acc, *zip(*tops)) == []
    mp = view.margin_plot
    for item in (mp.vanilla, mp.speculative):
        assert _points_under_legend(mp, item.xData, item.yData) == []
    hg = view.histogram
    shown = [lab for lab in hg.labels if lab.isVisible()]
    assert shown
    legend = hg.getPlotItem().legend
    if legend is not None:
        assert not any(lab.sceneBoundingRect().intersects(legend.sceneBoundingRect()) for lab in shown)
    view_rect = hg.getPlotItem().getViewBox().sceneBoundingRect()
    assert all(view_rect.contains(lab.sceneBoundingRect()) for lab in shown)


def test_the_fork_cards_legend_gives_each_entry_its_own_place(synth, monkeypatch, qapp):
    from specview.gui import card, export

    made = []

    def keep(*args, **kw):
        made.append(export_margin_plot(*args, **kw))
        return made[-1]

    export_margin_plot = export.margin_plot
    monkeypatch.setattr(export, "margin_plot", keep)
    t = synth(n=200, fork=120, diagnosis={**DIAGNOSIS, "at_risk": [3, 50, 118]})
    pixmap = card._plot_pixmap(t, 1168)
    assert not pixmap.isNull() and len(made) == 1
    items = made[0].legend.items
    assert [label.text for _s, label in items][-1] == "at risk"
    rects = [label.mapRectToScene(label.boundingRect()) for _s, label in items]
    for i, a in enumerate(rects):
        assert not any(a.intersects(b) for b in rects[i + 1:]), items[i][1].text
