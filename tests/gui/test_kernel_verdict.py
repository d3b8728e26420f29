"""The kernel map in the Kernel map tab speaks in the run's verdict bar and joins its report.

A toy engine with a planted kernel switch at width 5 gives a map that proves n_max <= 3 lossless: a run at
n_max 2 must read "proven lossless" and stay identical, a run at n_max 6 must read "kernels differ" at width 5,
a map of another target must say it does not cover the run, and a fork in a run the map proves lossless is the
loud contradiction.  Switching tabs shows each tab's own verdict.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_kernels_tab import TIMEOUT, choose, toy, toy_window  # noqa: F401  (toy is a fixture)

from specview.core.kernels.evidence import DIFFER, NOT_COVERED, PROVEN, KernelPrediction
from specview.gui.verdict_bar import kernel_line, trace_verdict


def _map(w, kt, qtbot, targets: list[str], *, path: Path | None = None):
    w.tabs.setCurrentWidget(kt)  # as a user does: the map is run from its tab
    choose(kt, targets=targets, prompts=["essay"], widths="1-8", positions=24)
    with qtbot.waitSignal(kt.sigMapFinished, timeout=TIMEOUT) as blk:
        kt.start()
    km = blk.args[0].kmap
    assert km is not None
    if path is not None:
        assert kt.save(path) is not None
    return km


def _run(w, qtbot, **controls):
    w.set_controls(**controls)
    with qtbot.waitSignal(w.sigTraceShown, timeout=TIMEOUT) as blk:
        w.tabs.setCurrentWidget(w.side)
        w.run()
    return blk.args[0]


def test_the_map_speaks_in_the_run_verdict_and_joins_the_report(toy, make_window, qtbot, tmp_path):
    w, kt = toy_window(make_window, prompt="the cat sat on the mat", max_tokens=24, diagnose=False)
    km = _map(w, kt, qtbot, ["dispatch:5:0.05"], path=tmp_path / "k.json")
    assert km.targets[0].safe_n_max() == 3
    trace = _run(w, qtbot, n_max=2)
    assert trace.comparison.identical
    text = w.verdict.text()
    assert "Kernel map k.json" in text and "proven lossless" in text and "as the map predicts" in text
    assert w.verdict.kind == "ok"
    written = w.export_report(tmp_path / "report")
    md = Path(written["markdown"]).read_text()
    assert "Kernel map" in md and "proven-lossless" in md.replace(" ", "-").lower()

    trace = _run(w, qtbot, n_max=6)  # widths 1-7 reach the planted switch at 5
    text = w.verdict.text()
    assert "kernels differ from single-token passes at width 5" in text

    # a map of another target does not cover the run: said in passing, and kept out of the report
    _map(w, kt, qtbot, ["dispatch:3:1.0"])
    w.tabs.setCurrentWidget(w.side)
    assert "does not cover" in w.verdict.text()
    written = w.export_report(tmp_path / "report2")
    assert "Kernel map" not in Path(written["markdown"]).read_text()


def test_each_tab_brings_back_its_own_verdict(toy, make_window, qtbot):
    w, kt = toy_window(make_window, prompt="the cat sat", max_tokens=8, diagnose=False)
    _run(w, qtbot, n_max=2)
    run_text = w.verdict.text()
    assert run_text.startswith("<b>Identical</b>")
    _map(w, kt, qtbot, ["dispatch:5:0.05"])
    w.tabs.setCurrentWidget(kt)
    assert w.verdict.text().startswith("<b>Kernel map</b>")
    w.tabs.setCurrentWidget(w.side)
    assert w.verdict.text().startswith("<b>Identical</b>") and "Kernel map" in w.verdict.text()
    w.tabs.setCurrentWidget(kt)
    assert w.verdict.text().startswith("<b>Kernel map</b>")


def _prediction(status: str, **kw) -> KernelPrediction:
    base = dict(status=status, target="demo:Q4_K_M", n_max=3, widths=[1, 2, 3, 4], row="demo:Q4_K_M [t 1]",
                safe_n_max=3, map_file="/maps/k.json", reason="why")
    base.update(kw)
    return KernelPrediction(**base)


def test_a_fork_the_map_proves_impossible_is_the_loud_line(synth):
    forked = synth(fork=25, diagnosis={"verdict": "near-tie"})
    text, kind = trace_verdict(forked, n_diffs=3, kernel=_prediction(PROVEN))
    assert kind == "bad"  # a near-tie alone is amber; the contradiction turns it red
    line = text.split("<br>")[-1]
    assert line.startswith("<b>Kernel map k.json</b>: CONTRADICTION: this run forks at token 25")
    assert "--serial-verify" in line
    same = synth(fork=None)
    text, kind = trace_verdict(same, kernel=_prediction(PROVEN))
    assert kind == "ok" and "as the map predicts" in text and "CONTRADICTION" not in text


@pytest.mark.parametrize("status,identical,want", [
    (DIFFER, False, "Kernel map k.json: why, so this fork is what those kernels make possible."),
    (DIFFER, True, "Kernel map k.json: why, so a fork is possible; this run stayed identical, but another prompt "
                   "may fork."),
    (NOT_COVERED, True, "<i>Kernel map k.json: why.</i>"),
])
def test_the_line_follows_the_prediction(synth, status, identical, want):
    trace = synth(fork=None if identical else 25)
    line, loud = kernel_line(_prediction(status), trace)
    assert not loud and want in line


def test_map_text_is_escaped(synth):
    line, _ = kernel_line(_prediction(DIFFER, reason="<img src=x>", map_file="/m/<b>.json"), synth(fork=None))
    assert "<img" not in line and "&lt;img src=x&gt;" in line and "&lt;b&gt;.json" in line
