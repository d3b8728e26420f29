"""Where a near-tie's verify pass first departs, on the fork card and in the verdict bar: synthetic traces carrying
a diagnosis' ``departure`` record (made from a locate, as the diagnosis makes it)."""

from __future__ import annotations

import json

from specview.core.config import EngineSettings
from specview.core.locate.find import Located, LogitsDiff, NodeDiff, NodeSource
from specview.core.locate.plot import graph_record
from specview.gui.card import ForkCard, fork_card_png, verdict_lines
from specview.gui.verdict_bar import LOCATE_LINK


def located(*, differs: bool = True, granularity: str = "op") -> Located:
    w = NodeSource(name="blk.3.ffn_down.weight", op="NONE", type="q4_K", shape=(1536, 576), buffer="CPU_REPACK",
                   weight=True)
    x = NodeSource(name="ffn_mul-3", op="MUL", type="f32", shape=(1536,), buffer="CPU", weight=False)
    nodes = [NodeDiff(index=0, name="embd", op="GET_ROWS", type="f32", shape=(576,), batched_shape=(576, 4),
                      layer=None, part="input", status="identical", n_elems=576)]
    nodes.append(NodeDiff(index=1, name="ffn_out-3", op="MUL_MAT", type="f32", shape=(576,), batched_shape=(576, 4),
                          layer=3, part="blk.3", status="differs" if differs else "identical", buffer="CPU",
                          sources=[x, w], max_abs=2.4e-6 if differs else 0.0, n_diff=17 if differs else 0,
                          n_elems=576))
    return Located(target="demo:Q4_K_M", backend="llama.cpp", settings=EngineSettings(), model={}, position=30,
                   width=4, row=1, n_prompt=19, single_tokens=[5], batch_tokens=[4, 5, 6, 7], selection="all",
                   observer_exact=True, nodes=nodes, granularity=granularity,
                   logits=LogitsDiff(n_vocab=49152, n_diff=49000 if differs else 0, max_abs=0.02 if differs else 0.0,
                                     argmax_single=3, argmax_batched=3, margin_single=0.01))


def departure(loc: Located) -> dict:
    """The record a near-tie diagnosis keeps (core.locate.departure), through JSON as a saved trace holds it."""
    return json.loads(json.dumps({**loc.summary(), "graph": graph_record(loc)}))


def near_tie(synth, dep):
    return synth(diagnosis={"verdict": "near-tie", "rule": "serial-verify-reproduces-vanilla", "gap": 0.004,
                            "departure": dep})


def test_the_card_says_where_the_verify_pass_first_departs(qapp, synth):
    loc = located()
    t = near_tie(synth, departure(loc))
    want = ("located: row 1 of the width-4 verify pass first differs at blk.3 ffn_out-3: MUL_MAT on q4_K weights in "
            "CPU_REPACK, 17 of 576 elements")
    line = next(x for x in verdict_lines(t) if x.startswith("located:"))
    assert line.startswith(want)
    card = ForkCard(t)
    assert "first differs at blk.3 ffn_out-3: MUL_MAT on q4_K weights in CPU_REPACK" in card.numbers.text()
    card.deleteLater()
    assert fork_card_png(t)  # it still draws


def test_the_card_says_when_nothing_departs_or_it_was_not_located(qapp, synth):
    same = verdict_lines(near_tie(synth, departure(located(differs=False))))
    assert "located: row 1 of the width-4 pass is bit-identical to the single-token pass at every node" in same
    skipped = verdict_lines(near_tie(synth, {"skipped": "the llama-server engine cannot show the nodes"}))
    assert "located: not run (the llama-server engine cannot show the nodes)" in skipped
    assert not any(x.startswith("located") for x in verdict_lines(synth(diagnosis={"verdict": "near-tie"})))


def test_an_mlx_departure_says_it_is_per_layer(qapp, synth):
    loc = located(granularity="layer")
    loc.nodes[1].name, loc.nodes[1].op = "blk.3", "layer"
    loc.nodes[1].sources[1] = NodeSource(name="blk.3 weights", op="NONE", type="4-bit (group 64)", shape=(576, 1536),
                                         buffer="MLX cpu", weight=True)
    line = next(x for x in verdict_lines(near_tie(synth, departure(loc))) if x.startswith("located:"))
    assert "first differs at blk.3 (layer 3 output) on 4-bit (group 64) weights in MLX cpu" in line
    assert "per layer, not per op" in line


def test_the_verdict_bar_says_it_in_words(make_window, synth, qtbot):
    loc = located()
    w = make_window()
    w.show_trace(near_tie(synth, departure(loc)))
    text = w.verdict.text()
    assert ("<b>Located</b>: row 1 of the width-4 verify pass first differs at blk.3 ffn_out-3: MUL_MAT on q4_K "
            "weights in CPU_REPACK") in text and LOCATE_LINK in text
    # nothing departs: the sentence says so once, not "pass row 1 of the pass"
    w.show_trace(near_tie(synth, departure(located(differs=False))))
    text = w.verdict.text()
    assert "<b>Located</b>: row 1 of the width-4 pass is bit-identical" in text and text.count("width-4 pass") == 1
    # not located: the reason, and no link to a plot there is not
    w.show_trace(near_tie(synth, {"skipped": "the llama-server engine cannot show the nodes"}))
    text = w.verdict.text()
    assert "Not located: the llama-server engine cannot show the nodes" in text and LOCATE_LINK not in text
