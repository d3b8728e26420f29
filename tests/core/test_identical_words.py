"""What an identical run proves: the verify widths it exercised; the loop alone when every verify row was its own
single-token pass (serial verify, -ub 1); nothing when nothing was drafted, with why and what makes it draft."""

from __future__ import annotations

import dataclasses

from synthetic import synthetic_trace

from specview.core.config import EngineSettings, RunConfig
from specview.core.diagnose import format_verdict
from specview.core.diagnose.words import (drafted_nothing, identical_words, single_row_verify, verify_widths,
                                          widths_words)
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


def test_a_serial_verify_run_tested_the_loop_but_not_batched_verification(tiny_target, tiny_draft):
    trace, d = run(tiny_target, tiny_draft, n_max=3, serial_verify=True)
    assert trace.comparison.identical and trace.speculative.n_drafted > 0
    words = d["explanation"]
    assert "lossless" not in words  # no batched verify pass ran: nothing was proven of one
    assert "with serial verify: every verify row was computed as its own single-token pass" in words
    assert "no batched verify pass ran" in words and "but not batched verification" in words
    assert f"{trace.speculative.n_drafted} tokens drafted" in words
    assert words.endswith("To test that, run it again without serial verify.")
    assert words in format_verdict(d)  # what `specview run` prints


def test_n_max_0_says_why_nothing_was_drafted_and_what_makes_it_draft(tiny_target, tiny_draft):
    trace, d = run(tiny_target, tiny_draft, n_max=0)
    assert trace.comparison.identical and trace.speculative.n_drafted == 0
    assert "(n_max 0 allows no draft token)" in d["explanation"]
    assert d["explanation"].endswith("Inconclusive for speculation: to test it, raise n_max to 3 and run again.")


def _no_drafts(**config):
    trace = synthetic_trace(fork=None)
    trace.config.update(config)
    trace.speculative.rounds = [dataclasses.replace(r, drafted=0, accepted=0) for r in trace.speculative.rounds]
    return trace


def test_ngram_simple_that_found_no_repeat_says_so():
    words = identical_words(_no_drafts(spec_type="ngram-simple", draft=None, ngram_size_n=6))
    assert "ngram-simple drafts only where its last 6 tokens occurred earlier in the prompt or the output, and " \
           "they never did" in words
    assert words.endswith("to test it, use a draft model (spec type draft-simple) and run again.")


def test_an_engine_that_reports_no_drafts_is_not_said_to_have_drafted_none():
    trace = synthetic_trace(fork=None)
    trace.speculative.rounds = []  # mlx_lm.server: no rounds and no totals
    assert trace.speculative.n_drafted == 0 and not drafted_nothing(trace)
    assert "drafted no token" not in identical_words(trace)


def test_ub1_on_llama_cpp_is_single_row_verify_too():
    trace = synthetic_trace(fork=None)
    trace.config["engine"]["n_ubatch"] = 1
    assert single_row_verify(trace) == "-ub 1"
    assert identical_words(trace).endswith("To test that, run it again with a larger micro-batch (-ub 512).")
    trace.config["backend"] = "mlx"  # mlx has no micro-batches: its verify passes stay batched
    assert single_row_verify(trace) is None and "lossless on this run" in identical_words(trace)
