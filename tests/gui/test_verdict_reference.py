"""A broken backend is said first in the verdict bar, before the fork and whatever its verdict."""

from __future__ import annotations

from specview.core.diagnose.reference import problems_of
from specview.gui.verdict_bar import backend_failure, trace_verdict


def _reference(kl: float, top1: float) -> dict:
    totals = {"kl_mean": kl, "same_top1": top1, "non_finite": 0}
    problems = problems_of(totals)
    return {"kind": "gpu", "test_label": "GPU (-ngl 99)", "reference_label": "CPU (-ngl 0)", "totals": totals,
            "ok": not problems, "problems": problems}


def test_broken_backend_comes_first_and_turns_the_bar_red(synth):
    ref = _reference(kl=2.7, top1=0.41)  # far beyond both limits: broken
    assert ref["ok"] is False and len(ref["problems"]) == 2
    trace = synth(diagnosis={"verdict": "near-tie", "rule": "serial-verify-reproduces-vanilla", "reference": ref,
                             "explanation": "The serial-verify control reproduces vanilla."})
    text, kind = trace_verdict(trace, n_diffs=3)
    assert kind == "bad"  # a near-tie alone would be "warn"
    first = text.split("<br>")[0]
    assert first.startswith("<b>Backend check failed</b>")
    assert "GPU (-ngl 99) against CPU (-ngl 0)" in first
    assert "2.7 nats is above the limit" in first and "41.0% of positions" in first
    assert text.index("Backend check failed") < text.index("Forked at token 25")


def test_a_sane_backend_adds_nothing(synth):
    ref = _reference(kl=0.0, top1=1.0)
    assert ref["ok"] is True
    trace = synth(diagnosis={"verdict": "near-tie", "reference": ref})
    text, kind = trace_verdict(trace, n_diffs=3)
    assert backend_failure(trace.diagnosis) is None
    assert "Backend check" not in text and kind == "warn"


def test_an_identical_run_on_a_broken_backend_is_still_flagged(synth):
    trace = synth(fork=None, diagnosis={"verdict": "identical", "reference": _reference(kl=0.5, top1=0.99)})
    text, kind = trace_verdict(trace)
    assert kind == "bad" and text.startswith("<b>Backend check failed</b>")
    assert "Identical" in text


def test_labels_are_escaped():
    ref = _reference(kl=1.0, top1=0.5)
    ref["test_label"] = "<script>x</script>"
    line = backend_failure({"reference": ref})
    assert "<script>" not in line and "&lt;script&gt;" in line
