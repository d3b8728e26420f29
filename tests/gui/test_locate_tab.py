"""The Locate tab: the plot shows a locate's figures node by node, marks its first differing node, follows a
near-tie run's departure, opens locate files and refuses others by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specview.core.config import EngineSettings
from specview.core.locate.find import Located, LogitsDiff, NodeDiff, NodeSource
from specview.core.locate.plot import graph_record
from specview.gui.export import locate_plot_png
from specview.gui.locate import LocatePlot, LocateTab
from specview.gui.verdict_bar import LOCATE_LINK


def made_located(seed: int = 0, n_layers: int = 4, per_layer: int = 9) -> Located:
    """A locate whose nodes differ from a random point on, with random sizes, some skipped, some identical."""
    rng = np.random.default_rng(seed)
    nodes = [NodeDiff(index=0, name="embd", op="GET_ROWS", type="f32", shape=(8,), batched_shape=(8, 4), layer=None,
                      status="identical", part="input", n_elems=8)]
    start = int(rng.integers(3, n_layers * per_layer // 2))
    for layer in range(n_layers):
        for k in range(per_layer):
            i = len(nodes)
            skipped = k == 4
            differs = not skipped and i >= start and rng.random() < 0.7
            w = NodeSource(name=f"blk.{layer}.w{k}", op="NONE", type="q4_K", shape=(8, 8), buffer="CPU_REPACK",
                           weight=True) if k % 3 == 0 else None
            nodes.append(NodeDiff(index=i, name=f"n{k}-{layer}", op="MUL_MAT" if w else "ADD", type="f32", shape=(8,),
                                  batched_shape=(8, 4), layer=layer, part=f"blk.{layer}",
                                  status="skipped" if skipped else ("differs" if differs else "identical"),
                                  buffer="CPU", sources=[w] if w else [],
                                  max_abs=float(10 ** rng.uniform(-7, -1)) if differs else 0.0,
                                  n_diff=3 if differs else 0, n_elems=8))
    return Located(target="toy", backend="toy", settings=EngineSettings(), model={}, position=5, width=4, row=1,
                   n_prompt=3, single_tokens=[1], batch_tokens=[1, 2, 3, 4], selection="all", observer_exact=True,
                   nodes=nodes, logits=LogitsDiff(n_vocab=16, n_diff=5, max_abs=0.1, argmax_single=3,
                                                  argmax_batched=3, margin_single=1.0))


def plotted(plot: LocatePlot) -> tuple[list[tuple[int, float]], list[int]]:
    """(x, y) of the differing points as given to the plot, and the x of the points drawn as bit-identical."""
    x, y = plot.differs.getOriginalDataset()
    sx, _ = plot.same.getData()
    return list(zip(x.astype(int).tolist(), y.tolist())), sx.astype(int).tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_plot_shows_the_located_figures_and_marks_the_first_differing_node(qtbot, seed):
    loc = made_located(seed)
    tab = LocateTab()
    qtbot.addWidget(tab)
    tab.show_located(loc)
    pts, same = plotted(tab.plot)
    assert pts == [(d.index, d.max_abs) for d in loc.nodes if d.status == "differs"]
    assert same == [d.index for d in loc.nodes if d.status == "identical"]  # skipped nodes are not drawn
    first = next(d for d in loc.nodes if d.status == "differs")
    assert tab.plot.first_line.isVisible() and tab.plot.first_line.value() == first.index
    fx, fy = tab.plot.first_dot.getOriginalDataset()
    assert (fx.tolist(), fy.tolist()) == ([first.index], [first.max_abs])
    assert first.name in tab.plot.first_label.textItem.toPlainText()
    # identical nodes sit below every difference, on the log axis
    _, sy = tab.plot.same.getData()
    assert (10 ** sy < min(d.max_abs for d in loc.nodes if d.status == "differs")).all()
    assert loc.where() in tab.header.text() and tab.details.toPlainText() == loc.text()
    # hover: the node under the point, with its op, weight buffer and |Δ|
    i = tab.plot.nearest(first.index + 0.3)
    text = tab.plot.hover(i)
    assert text.startswith(f"{first.name}  (node {first.index}") and f"{first.max_abs:.3g}" in text
    assert (first.weight is None) or f"in {first.weight.buffer}" in text
    # one layer band per odd layer: boundaries shaded
    shown = [b for b in tab.plot.bands if b.isVisible()]
    assert len(shown) == 2 and shown[0].getRegion()[0] == next(d.index for d in loc.nodes if d.part == "blk.1") - 0.5
    top = tab.plot.getPlotItem().getAxis("top")
    assert top.isVisible() and top._tickLevels and "blk.0" in [p for _x, p in top._tickLevels[0]]
    # cleared: the hint alone, no layer axis naming the last locate's blocks
    tab.clear()
    assert not top.isVisible() and top._tickLevels is None and not tab.plot.hint.isHidden()


def test_a_near_tie_departure_plots_the_same_and_links_from_the_verdict(make_window, synth, qtbot):
    loc = made_located(3)
    dep = {**loc.summary(), "graph": json.loads(json.dumps(graph_record(loc)))}
    trace = synth(diagnosis={"verdict": "near-tie", "rule": "serial-verify", "departure": dep})
    w = make_window()
    w.show_trace(trace)
    assert LOCATE_LINK in w.verdict.text() and loc.where() in w.verdict.text()
    pts, _ = plotted(w.locate_tab.plot)
    assert pts == [(d.index, d.max_abs) for d in loc.nodes if d.status == "differs"]
    w.verdict.linkActivated.emit(LOCATE_LINK)
    assert w.tabs.currentWidget() is w.locate_tab
    # a run without a departure clears it; its verdict has no link
    w.show_trace(synth(diagnosis={"verdict": "near-tie", "rule": "serial-verify"}))
    assert LOCATE_LINK not in w.verdict.text() and w.locate_tab.plot.series is None


def test_a_departure_whose_logits_do_not_differ_says_why_the_run_still_forked():
    """The diagnosis locates the fork's pass on the single-token prefix, where its logits may not differ at all: the
    tab says so in words, with the reason ``specview locate --trace`` gives, never as a bare "logits_differ: 0"."""
    from specview.core.locate.find import NO_FLIP_ON_A_SHARED_PREFIX
    from specview.gui.locate.tab import departure_text

    dep = {"where": "first differs at blk.3 ffn_out-3: MUL_MAT on q4_K weights in CPU_REPACK", "position": 30,
           "width": 4, "row": 1, "weight_type": "q4_K", "weight_buffer": "CPU_REPACK", "computed_in": "CPU",
           "logits_differ": 0, "n_vocab": 49152, "observer_exact": True}
    said = departure_text(dep)
    assert said.startswith("Located on the same single-token prefix, row 1 of the width-4 verify pass at token 30 "
                           "first differs at blk.3 ffn_out-3")
    assert "Its logits: 0 of 49,152 differ between the two passes." in said
    assert f"So {NO_FLIP_ON_A_SHARED_PREFIX}." in said and "logits_differ" not in said
    said = departure_text({**dep, "logits_differ": 7, "observer_exact": False})
    assert "Its logits: 7 of 49,152 differ" in said and NO_FLIP_ON_A_SHARED_PREFIX not in said
    assert "Observing the passes moved their logits" in said


def test_file_open_shows_a_locate_and_refuses_a_foreign_file_by_name(make_window, qtbot, tmp_path):
    loc = made_located(4)
    path = loc.save(tmp_path / "loc.json")
    w = make_window()
    w.open_trace(path)  # File ▸ Open recognises the schema
    assert w.tabs.currentWidget() is w.locate_tab and w.locate_tab.located is not None
    assert [d.max_abs for d in w.locate_tab.located.nodes] == [d.max_abs for d in loc.nodes]
    assert w.report_source()[0] == "locate"
    foreign = tmp_path / "other.json"
    foreign.write_text(json.dumps({"schema": "specview.kernels/1"}))
    with qtbot.waitSignal(w.locate_tab.sigError) as blk:
        assert not w.locate_tab.open(foreign)
    assert str(foreign) in blk.args[0] and "not a specview locate" in blk.args[0]
    assert w.locate_tab.located is not None  # the locate shown stays


def test_the_report_plot_is_a_png_of_the_same_widget(qtbot):
    png = locate_plot_png(made_located(5))
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert locate_plot_png({"where": "x"}) is None  # a departure without its nodes has no plot
