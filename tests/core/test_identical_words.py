"""What an identical run proves: the verify widths it exercised, or nothing when nothing was drafted."""

from __future__ import annotations

from specview.core.config import EngineSettings, RunConfig
from specview.core.diagnose.words import identical_words, verify_widths, widths_words
from specview.core.session import Session


def run(tiny_target, tiny_draft, **kw):
    cfg = RunConfig(target=str(tiny_target), draft=str(tiny_draft), prompt="the cat and the dog", max_tokens=24,
                    ignore_eos=True, engine=EngineSettings(threads=1), **kw)
    with Session() as s:
        trace = s.run(cfg)
        d = s.diagnose(trace, cfg)
    return trace, d


def test_a_zero_draft_run_is_inconclusive_for_speculation(tiny_target, tiny_draft):
    trace, d = run(tiny_target, tiny_draft, p_min=1.0)
    assert trace.comparison.identical and trace.speculative.n_drafted == 0
    assert d["verdict"] == "identical"
    assert "Inconclusive for speculation" in d["explanation"] and "zero-draft control" in d["explanation"]
    assert "lossless" not in d["explanation"]
    assert set(verify_widths(trace)) == {1}


def test_an_identical_run_says_which_widths_it_exercised(tiny_target, tiny_draft):
    trace, d = run(tiny_target, tiny_draft, n_max=3)
    assert trace.comparison.identical and trace.speculative.n_drafted > 0  # the tiny draft agrees with its target
    widths = verify_widths(trace)
    rounds = [r for r in trace.speculative.rounds if r.index >= 1]
    assert sum(widths.values()) == len(rounds)
    assert widths == {w: sum(1 for r in rounds if r.batch_size == w) for w in {r.batch_size for r in rounds}}
    assert "lossless on this run, at the verify widths it exercised" in d["explanation"]
    assert widths_words(widths) in d["explanation"]
    assert identical_words(trace) in d["explanation"]


def test_widths_words():
    assert widths_words({2: 10, 3: 20, 4: 56}) == "86 verify passes: width 2 ×10, 3 ×20, 4 ×56"
    assert widths_words({1: 1}) == "1 verify pass: width 1 ×1"
    assert "not known" in widths_words(None)
