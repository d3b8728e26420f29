"""A matrix keeps each cell's near-tie density, and its rates sum them per setting: recomputed from the saved
traces, on the fake backend whose batched rows carry a planted error (so some prompts fork at near-ties)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fakes import FakeBackend
from specview.core.diagnose import ties
from specview.core.matrix import MatrixSpec, PromptSpec, format_rates, load_matrix, run_matrix
from specview.core.registry import get_backend, register_backend, unregister_backend
from specview.core.report import matrix_html
from specview.core.session import Session
from specview.core.trace import Trace


class ToyNames(FakeBackend):
    name = "toy-ties"
    model_kind = "name"


PROMPTS = [PromptSpec(f"p{i}", text=t, chat=False, category="misc")
           for i, t in enumerate(["hello world", "the cat sat", "one two three", "quick brown fox", "a b c d e"])]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    register_backend("toy-ties", ToyNames)
    get_backend("toy-ties")
    tmp = tmp_path_factory.mktemp("m")
    spec = MatrixSpec(targets=["0:0:0.5"], drafters=["0"], n_max=[4], prompts=PROMPTS, max_tokens=48,
                      ignore_eos=True, backend="toy-ties", diagnose=True)
    runner = Session()
    try:
        run_matrix(spec, runner, out=tmp / "m.json", traces_dir=tmp / "t")
    finally:
        runner.close()
    yield tmp, load_matrix(tmp / "m.json")
    unregister_backend("toy-ties")


def _in_band(trace: Trace, width: float) -> tuple[int, int]:
    """(positions whose vanilla top-2 logit gap is within ``width``, flips among them) up to the first fork."""
    vt, st = trace.vanilla.tokens, trace.speculative.tokens
    n = min(len(vt), len(st))
    fork = next((i for i in range(n) if vt[i] != st[i]), None)
    inside = flipped = 0
    for i in range(n if fork is None else fork + 1):
        lg = np.sort([x for x in trace.vanilla.steps[i].top_logits if x is not None])[::-1]
        if lg[0] - lg[1] <= width:
            inside += 1
            flipped += vt[i] != st[i]
    return inside, flipped


def test_each_cell_keeps_the_density_its_trace_gives(matrix):
    tmp, doc = matrix
    cells = doc["cells"]
    assert any(not c["identical"] for c in cells), "the planted error forks at least one prompt"
    for c in cells:
        t = Trace.load(tmp / c["trace"])
        d, again = c["ties"], ties.tie_density(t)
        # the live run's margins, against the trace's own (its logits are kept to 5 decimals)
        assert {k: v for k, v in d.items() if k != "fork"} == {k: v for k, v in again.items() if k != "fork"}
        if d["fork"] is not None:
            assert d["fork"]["index"] == again["fork"]["index"] == c["first_mismatch"]
            assert d["fork"]["logits"] == pytest.approx(again["fork"]["logits"], abs=2e-5)
        two = next(b for b in d["bands"] if b["name"] == "2.0 logits")
        assert (two["in_band"], two["flipped"]) == _in_band(t, 2.0)
        if not c["identical"]:
            # the diagnosis measured an envelope before the fork: the calibrated band is twice it
            assert d["bands"][0]["calibrated"]
            assert d["bands"][0]["width"] == pytest.approx(2 * t.diagnosis["envelope"]["max"], abs=1e-6)


def test_the_rates_sum_the_cells_band_by_band(matrix):
    _, doc = matrix
    g = doc["rates"]["settings"][0]
    t = g["ties"]
    cells = doc["cells"]
    assert t["runs"] == len(cells) and t["flips"] == sum(not c["identical"] for c in cells)
    assert t["positions"] == sum(c["ties"]["positions"] for c in cells)
    for b in t["bands"]:
        mine = [next(x for x in c["ties"]["bands"] if x["name"] == b["name"]) for c in cells
                if any(x["name"] == b["name"] for x in c["ties"]["bands"])]
        assert b["in_band"] == sum(x["in_band"] for x in mine) and b["flipped"] == sum(x["flipped"] for x in mine)
    text = "\n".join(format_rates(doc["rates"]))
    assert "near-ties" in text and "0.125 nats" in text and "2.0 logits" in text
    html = matrix_html(doc)
    assert "Near-tie density" in html and "2.0 logits" in html


def test_the_markdown_report_has_each_settings_near_ties(matrix):
    from specview.core.report import matrix_markdown

    _, doc = matrix
    md = matrix_markdown(doc)
    g = doc["rates"]["settings"][0]
    assert "#### Near-tie density" in md
    for b in g["ties"]["bands"]:
        assert f"{b['flipped']} of {b['in_band']} flipped" in md or b["in_band"] == 0
