"""Traces of draft-eagle3, draft-dflash and draft-dspark runs on a real llama-server, opened in the app.

The runs use the demo's tiny drafters (random weights: nearly every draft is
rejected, every verify pass still 1 + n_drafted wide).  The window must show
each like any trace: both texts, the fork or "identical", one acceptance bar
per rebuilt round adding up to the server's totals, and the drafter controls
set to the trace's spec type with the draft picker live on its drafter's file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from specview.core.config import DEMO_DRAFTERS, EngineSettings, RunConfig
from specview.core.demo import DEMO_PROMPT

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "backends"))
from test_server import find_binary  # noqa: E402

pytestmark = [pytest.mark.demo, pytest.mark.slow]

N_MAX = {"draft-eagle3": 3, "draft-dflash": 3, "draft-dspark": 7}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    from specview.backends.llama_server import ServerRunner

    binary = find_binary()
    threads = 0 if os.environ.get("SPECVIEW_THREADS") else 1
    out = {}
    with ServerRunner() as r:
        for st, n_max in N_MAX.items():
            cfg = RunConfig(target="demo:Q4_K_M", draft=f"demo:{DEMO_DRAFTERS[st]}", spec_type=st, n_max=n_max,
                            max_tokens=24, prompt=DEMO_PROMPT, ignore_eos=True, backend="llama-server",
                            engine=EngineSettings(threads=threads, n_ctx=512, server_bin=binary))
            out[st] = r.run(cfg).save(tmp_path_factory.mktemp("traces") / f"{st}.json")
    return out


@pytest.mark.parametrize("spec_type", list(N_MAX))
def test_a_drafter_trace_opens_in_the_app(traces, spec_type, make_window, qtbot):
    from specview.core.trace import Trace

    path = traces[spec_type]
    trace = Trace.load(path)
    w = make_window()
    errors: list = []
    w.sigError.connect(errors.append)
    with qtbot.waitSignal(w.sigTraceShown, timeout=10000):
        assert w.open_trace(path) is not None
    assert not errors
    assert w.panes.vanilla.text() == trace.vanilla.text
    assert w.panes.speculative.text() == trace.speculative.text
    fm = trace.comparison.first_mismatch
    if fm is None:
        assert "Identical" in w.verdict.text() or "identical" in w.verdict.text()
    else:
        assert f"Forked at token {fm.index}" in w.verdict.text()
        assert w.panes.vanilla.mismatch_index == fm.index
    # one bar per rebuilt round, adding up to what the server reported
    s = trace.speculative
    assert s.rounds and s.n_drafted > 0 and s.n_drafted == trace.extra["server"]["speculative"]["timings"]["draft_n"]
    _, drafted = w.acceptance.drafted.getData()
    _, accepted = w.acceptance.accepted.getData()
    assert drafted.sum() == s.n_drafted and accepted.sum() == s.n_accepted
    # the controls show the run: its spec type, and the draft picker live on the demo's drafter of that type
    c = w.controls
    assert c.spec_type.currentData() == spec_type
    from specview.backends.llama_cpp.demo import resolve

    assert c.draft.isEnabled() and Path(c.draft.value()) == resolve(f"demo:{DEMO_DRAFTERS[spec_type]}")
