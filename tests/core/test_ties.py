"""Near-tie density recomputed from the trace by a second, independent reading of it.

The fake target's rows of passes wider than one token are off by a planted
epsilon, so its speculative arm forks at near-ties; each trace is read again
here (numpy over the recorded top-k, positions up to the first fork) and the
counts, the fork's margin, the bands and the Wilson interval must agree.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fakes import FakeBackend
from specview.core.diagnose import ties
from specview.core.stats import wilson
from specview.core.registry import register_backend
from specview.core.session import RunConfig, Session


@pytest.fixture(scope="module")
def traces():
    register_backend("fake", FakeBackend)
    s = Session()
    out = []
    for i, prompt in enumerate(("one two three", "four five", "six seven eight nine", "ten")):
        cfg = RunConfig(backend="fake", target="0:0:0.5", draft="0:1.0", prompt=prompt, max_tokens=60,
                        ignore_eos=True, n_max=4)
        out.append(s.run(cfg))
    return out


def _recount(trace, width: float, unit: str) -> tuple[int, int, int, int]:
    """(compared positions, in band, flipped in band, flipped outside) read straight from the arms."""
    vt, st = trace.vanilla.tokens, trace.speculative.tokens
    n = min(len(vt), len(st))
    fork = next((i for i in range(n) if vt[i] != st[i]), None)
    upto = n if fork is None else fork + 1
    inside = flipped = outside = 0
    for i in range(upto):
        lg = np.sort(np.array([x for x in trace.vanilla.steps[i].top_logits if x is not None], float))[::-1]
        lp = lg - (lg.max() + np.log(np.exp(lg - lg.max()).sum()))
        m = (lp[0] - lp[1]) if unit == "nats" else (lg[0] - lg[1])
        flip = vt[i] != st[i]
        if m <= width:
            inside += 1
            flipped += flip
        else:
            outside += flip
    return upto, inside, flipped, outside


def test_counts_match_an_independent_reading(traces):
    assert any(not t.comparison.identical for t in traces), "the planted epsilon forks at least one prompt"
    for t in traces:
        d = ties.tie_density(t, envelope=0.5, source="planted")
        names = [b["name"] for b in d["bands"]]
        assert names == ["calibrated", "0.125 nats", "0.5 nats", "2.0 logits"]
        for b in d["bands"]:
            upto, inside, flipped, outside = _recount(t, b["width"], b["unit"])
            assert d["positions"] == upto
            assert (b["in_band"], b["flipped"], b["flipped_outside"]) == (inside, flipped, outside), b["name"]
            lo, hi = wilson(flipped, inside)
            if inside:
                assert b["rate"] == pytest.approx(flipped / inside) and (b["low"], b["high"]) == (lo, hi)
        assert d["bands"][0]["width"] == pytest.approx(2 * 0.5)  # twice the envelope: both logits move
        assert d["flips"] == (0 if t.comparison.identical else 1)


def test_the_fork_is_inside_the_calibrated_band_of_its_planted_error(traces):
    """A row off by at most 0.5 per logit moves a margin by at most 1: every fork lies within 2 x 0.5."""
    forked = [t for t in traces if not t.comparison.identical]
    for t in forked:
        d = ties.tie_density(t, envelope=0.5, source="planted")
        i = t.comparison.first_mismatch.index
        assert d["fork"]["index"] == i
        assert d["fork"]["logits"] == pytest.approx(t.vanilla.steps[i].margin, abs=1e-4)
        cal = d["bands"][0]
        assert cal["flipped"] == 1 and cal["flipped_outside"] == 0
        assert d["fork"]["width"] == t.speculative.steps[i].batch_size > 1


def test_nats_and_logits_are_the_same_number():
    class S:
        top_logits = [3.5, 3.25, -1.0, 0.5]
        margin = 0.25

    nats, logits = ties.step_margins(S)
    assert logits == pytest.approx(0.25) and nats == pytest.approx(0.25, abs=1e-12)
    S.top_logits = [None, 2.0]  # fewer than two finite logits: the recorded margin
    assert ties.step_margins(S) == (0.25, 0.25)


def test_combine_sums_runs_band_by_band(traces):
    ds = [ties.tie_density(t, envelope=0.1 * (k + 1), source="planted") for k, t in enumerate(traces)]
    total = ties.combine(ds + [None])
    assert total["runs"] == len(traces)
    assert total["positions"] == sum(d["positions"] for d in ds)
    for j, b in enumerate(total["bands"]):
        assert b["in_band"] == sum(d["bands"][j]["in_band"] for d in ds)
        assert b["flipped"] == sum(d["bands"][j]["flipped"] for d in ds)
    cal = total["bands"][0]
    assert cal["width"] is None and cal["width_range"] == pytest.approx([0.2, 0.8])
    assert "calibrated (0.2–0.8 logits)" == ties.band_label(cal)
    assert ties.combine([None, {}]) is None


def test_by_width_splits_the_compared_positions(traces):
    for t in traces:
        d = ties.tie_density(t)
        assert sum(w["positions"] for w in d["by_width"]) == d["positions"]
        for j, b in enumerate(d["bands"]):
            assert sum(w["bands"][j]["in_band"] for w in d["by_width"]) == b["in_band"]


def test_without_an_envelope_only_the_fixed_bands_and_the_reason(traces):
    t = traces[0]
    saved = t.diagnosis
    try:
        t.diagnosis = None
        d = ties.tie_density(t)
        assert [b["name"] for b in d["bands"]] == [b.name for b in ties.FIXED_BANDS]
        assert d["envelope"]["max"] is None and "no envelope" in d["envelope"]["source"]
        t.diagnosis = {"envelope": {"max": 0.02, "positions": 7}}
        d = ties.tie_density(t)
        assert d["bands"][0]["calibrated"] and d["bands"][0]["width"] == pytest.approx(0.04)
        t.diagnosis = {"reference": {"widths": [{"width": 1, "drift": {"max_logit_delta": 9.0}},
                                                {"width": 3, "drift": {"max_logit_delta": 0.125}}]}}
        d = ties.tie_density(t)
        assert d["bands"][0]["width"] == pytest.approx(0.25) and "width drift" in d["envelope"]["source"]
    finally:
        t.diagnosis = saved
    text = ties.format_ties(ties.tie_density(t, envelope=0.5))
    assert text.startswith("near-tie density") and "0.125 nats" in text and "calibrated (1 logits)" in text


def test_a_flip_outside_a_band_is_what_the_band_calls_a_bug(traces):
    t = next(t for t in traces if not t.comparison.identical)
    i = t.comparison.first_mismatch.index
    m = t.vanilla.steps[i].margin
    d = ties.tie_density(t, envelope=m / 4, source="tiny")  # a band half the fork's margin
    cal = d["bands"][0]
    assert cal["flipped"] == 0 and cal["flipped_outside"] == 1
    assert "bug by this band" in ties.says(cal)
    assert math.isclose(cal["width"], m / 2, abs_tol=1e-6)


def test_the_wilson_interval_is_the_quality_suites_own():
    from specview.core.quality import stats as quality_stats

    assert ties.wilson is wilson is quality_stats.wilson  # one definition (core/stats.py), not a copy
