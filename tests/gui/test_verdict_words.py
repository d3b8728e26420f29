"""What the verdict bar says of a run: a run that drafted nothing is inconclusive with the one step that makes it
draft; a serial-verify run tested the loop but not batched verification; a diagnosis the user cancelled leaves the
run as it finished; an arm with no tokens has no speed; the kernel map's line is one sentence."""

from __future__ import annotations

import dataclasses
import re

import pytest

from specview.core.diagnose.words import identical_words
from specview.core.kernels.evidence import DIFFER, NOT_COVERED, PROVEN, KernelPrediction
from specview.gui.verdict_bar import (DIAGNOSIS_CANCELLED, kernel_line, parse_try_link, speed_text,
                                      trace_verdict)


def _links(text: str) -> list[dict]:
    return [parse_try_link(h) for h in re.findall(r'href="([^"]+)"', text) if parse_try_link(h) is not None]


def _drafting_nothing(synth, **config):
    """An identical synthetic run whose every verify round drafted nothing, under ``config``."""
    trace = synth(fork=None)
    trace.config.update(config)
    trace.speculative.rounds = [dataclasses.replace(r, drafted=0, accepted=0, batch_size=1 if r.index else 12,
                                                    draft_tokens=[]) for r in trace.speculative.rounds]
    assert trace.speculative.n_drafted == 0
    return trace


@pytest.mark.parametrize("config,why,link", [
    ({"n_max": 0}, "n_max 0 allows no draft token", {"n_max": 3}),
    ({"p_min": 1.0}, "p_min 1 is llama.cpp's zero-draft control", {"p_min": 0.0}),
    ({"spec_type": "none", "draft": None}, "the spec type is none", {"spec_type": "draft-simple"}),
    ({"spec_type": "ngram-simple", "draft": None, "ngram_size_n": 12},
     "ngram-simple drafts only where its last 12 tokens occurred earlier", {"spec_type": "draft-simple"}),
])
def test_a_run_that_drafted_nothing_is_inconclusive_with_the_step_that_makes_it_draft(synth, config, why, link):
    trace = _drafting_nothing(synth, **config)
    trace.diagnosis = {"verdict": "identical", "explanation": identical_words(trace)}
    text, kind = trace_verdict(trace)
    assert len(text.split("<br>")) == 2  # the head and the step; the explanation would say the head again
    assert kind == "unsure"  # the legend's grey, not the identical green
    assert text.startswith("<b>Inconclusive</b>: both arms produced the same 40 tokens")
    assert "<b>Identical</b>" not in text
    assert why in text.replace("&#x27;", "'")
    assert _links(text) == [link]  # one step, and it fits the cause
    assert "another quantization" not in text and "No fork here" not in text


def test_a_run_that_drafted_something_keeps_its_identical_head(synth):
    text, kind = trace_verdict(synth(fork=None))
    assert kind == "ok" and text.startswith("<b>Identical</b>: both arms produced the same 40 tokens.")
    assert "No fork here" in text and {"target": "demo:Q4_K_M"} in _links(text)


def test_a_serial_verify_run_says_it_did_not_test_batched_verification(synth):
    trace = synth(fork=None)
    trace.config["serial_verify"] = True
    text, kind = trace_verdict(trace)
    head = text.split("<br>")[0]
    assert head.startswith("<b>Identical</b> with serial verify") and "not batched verification" in head
    assert _links(text) == [{"serial_verify": False}]  # the next step is the batched run, not another target
    assert "another quantization" not in text


def test_a_cancelled_diagnosis_leaves_the_fork_shown_and_unclassified(synth):
    text, kind = trace_verdict(synth(fork=25), diagnosis_error=DIAGNOSIS_CANCELLED, n_diffs=15)
    assert text.startswith("<b>Forked at token 25</b>")
    assert "Cancelled after" not in text and "failed" not in text
    assert "The diagnosis was cancelled by the user, so the fork is not classified" in text
    assert _links(text) == [{}]  # run again, as it is
    assert kind == "bad"  # an unclassified fork, as the grid colours one


def test_a_cancelled_diagnosis_of_an_identical_run_shows_the_run(synth):
    text, kind = trace_verdict(synth(fork=None), diagnosis_error=DIAGNOSIS_CANCELLED)
    assert text.startswith("<b>Identical</b>") and kind == "ok"
    assert "The diagnosis was cancelled by the user" in text and "failed" not in text


def test_a_failed_diagnosis_is_still_called_failed(synth):
    text, _ = trace_verdict(synth(fork=25), diagnosis_error="replay ran out of context")
    assert "diagnosis failed: replay ran out of context" in text


def test_an_arm_with_no_tokens_has_no_speed(synth):
    trace = synth(fork=None)
    for arm in (trace.vanilla, trace.speculative):
        arm.tokens, arm.steps = [], []
    text = speed_text(trace)
    assert "tok/s" not in text and "speedup" not in text
    assert text.startswith("vanilla: no tokens · speculative: no tokens")


def test_an_arm_with_tokens_keeps_its_speed(synth):
    trace = synth(fork=None)
    trace.speculative.tokens, trace.speculative.steps = [], []
    text = speed_text(trace)
    assert text.startswith("vanilla <b>100.0</b> tok/s · speculative: no tokens") and "speedup" not in text


def _prediction(status: str, **kw) -> KernelPrediction:
    base = dict(status=status, target="demo:Q4_K_M", n_max=3, widths=[1, 2, 3, 4], row="demo:Q4_K_M [t 1]",
                safe_n_max=0, first_differing=4, identical_share=0.0, max_delta=0.4477, flips=0,
                evidence="16 rows at widths 1-4 on essay tokens 1-24", map_file=None,
                reason="the map finds width 4 differing from single-token passes for demo:Q4_K_M [t 1]: 0.0% of its "
                       "16 rows bit-identical, max |Δ| 0.4477 logits, 0 argmax flips; a fork at widths 1-4 (n_max 3) "
                       "is what the kernels predict is possible")
    base.update(kw)
    return KernelPrediction(**base)


def test_the_kernel_line_of_an_unsaved_map_is_one_sentence(synth):
    line, loud = kernel_line(_prediction(DIFFER), synth(fork=30))
    assert not loud
    assert line == ("Kernel map (not saved): kernels differ from single-token passes at width 4 for demo:Q4_K_M "
                    "[t 1] (0.0% of its rows bit-identical, max |Δ| 0.4477 logits, 0 argmax flips), within the widths "
                    "1-4 (n_max 3) this run verifies at, so this fork is what those kernels make possible.")


def test_the_kernel_line_names_a_saved_map_and_an_identical_run(synth):
    line, _ = kernel_line(_prediction(DIFFER, map_file="/maps/k.json"), synth(fork=None))
    assert line.startswith("Kernel map k.json: kernels differ from single-token passes at width 4")
    assert line.endswith("so a fork is possible; this run stayed identical, but another prompt may fork.")
    line, _ = kernel_line(_prediction(PROVEN, map_file="/maps/k.json", first_differing=None), synth(fork=None))
    assert line == ("Kernel map k.json: proven lossless for this run, since for demo:Q4_K_M [t 1] the verify passes "
                    "at widths 1-4 (n_max 3) compute bit-identically to single-token passes (16 rows at widths 1-4 on "
                    "essay tokens 1-24); this run is identical, as the map predicts.")
    line, _ = kernel_line(_prediction(NOT_COVERED, reason="the map does not cover demo:Q8_0"), synth(fork=None))
    assert line == "<i>Kernel map (not saved): the map does not cover demo:Q8_0.</i>"
