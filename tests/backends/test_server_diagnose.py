"""A real fork on a quantized target, diagnosed from outside llama-server, on any CPU.

Whether a demo target forks, and where, depends on the CPU's kernels and the
thread count, so the test searches the fixed candidates of ``tests/forks.py``
(run on llama-server at one thread) for a fork, and fails, naming what it
tried, when none forks.  A natural fork has no bug behind it, so its verdict
must be a near-tie, and the serial-verify control (both arms on a ``-ub 1``
server) must give vanilla back: facts measured here, not the verdict rule
applied to the diagnosis' own numbers.
"""

from __future__ import annotations

import json

import pytest

from forks import find_server_fork

from specview.backends.llama_server import ServerRunner
from specview.core.diagnose import far_threshold, format_verdict

from test_server import find_binary

pytestmark = [pytest.mark.demo, pytest.mark.slow]



@pytest.fixture(scope="module")
def forked():
    """(runner, cfg, trace) of the first candidate of tests/forks.py that forks on llama-server here."""
    binary = find_binary()
    runner = ServerRunner()

    def undiagnosed(t):
        assert t.diagnosis is None  # a run never diagnoses by itself (--no-diagnose relies on it)

    try:
        fork = find_server_fork(runner, binary, each=undiagnosed)
        yield runner, fork.cfg, fork.trace
    finally:
        runner.close()


def test_a_real_fork_on_a_q4_k_m_target_is_diagnosed_from_the_outside(forked):
    runner, cfg, t = forked
    d = runner.diagnose(t, cfg)
    fm = t.comparison.first_mismatch
    out = d["outside"]
    vrep, srep, sv = out["vanilla_repeat"], out["speculative_repeat"], d["serial_verify"]
    assert (d["fork"], d["vanilla_token"], d["speculative_token"]) == (fm.index, fm.vanilla_token,
                                                                       fm.speculative_token)
    # a natural fork: nothing but batched-versus-single numerics is behind it
    assert d["verdict"] == "near-tie", d["explanation"]

    # determinism is judged only by the arms' own requests repeated on a fresh slot; at one thread both repeat
    assert vrep["positions"] == fm.index + 1 and srep["positions"] == fm.index + 1
    assert vrep["identical"] and srep["identical"], d["explanation"]
    with ServerRunner(single_server=False) as fresh:  # measured here, independently: vanilla on its own server
        again = fresh.run(cfg)
    assert again.vanilla.tokens == t.vanilla.tokens and again.speculative.tokens == t.speculative.tokens

    # every replay in another shape names its shape and was evaluated in it; none decides determinism
    for x in out["shapes"]["at_fork"]:
        assert x["shape"].startswith(f"the last {x['T']} prefix tokens") and x["evaluated"] == x["T"]
    for x in out["shapes"]["chunked"]:
        assert sum(x["evaluated"]) == fm.index and all(e <= x["T"] for e in x["evaluated"])

    # the gap is the vanilla arm's own: log p(a) - log p(b) in the row that chose a
    # (a near-tie: the speculative arm's token is among vanilla's own top candidates at the fork)
    st = t.vanilla.steps[fm.index]
    assert fm.speculative_token in st.top_ids and not d["gap_is_lower_bound"], (st.top_ids, fm)
    assert abs(d["gap"] - (st.top_logits[0] - st.top_logits[st.top_ids.index(fm.speculative_token)])) < 1e-4
    assert 0 <= d["gap"] <= far_threshold(d["envelope"]["max"])

    # the serial-verify control: both arms on the same server with -ub 1
    assert sv["form"] == "ub1-server" and "-ub" in sv["server"]["args"]
    args = sv["server"]["args"]
    assert args[args.index("-ub") + 1] == "1"
    # the demo draft proposes tokens, so the control ran, and with every pass one token wide it gives vanilla back
    assert sv["n_drafted"] > 0 and sv["n_tokens"] == cfg.max_tokens, sv
    assert sv["identical_to_vanilla"] is True, sv
    assert d["rule"] == "serial-verify-reproduces-vanilla", d["explanation"]

    text = format_verdict(d)
    assert f"VERDICT  {d['verdict'].upper()}" in text and "serial verify" in text
    json.dumps(d)  # the trace can hold it
    assert t.diagnosis is d


def test_a_serial_verify_run_puts_both_arms_on_a_ub1_server(forked):
    runner, cfg, t = forked
    from dataclasses import replace

    s = runner.run(replace(cfg, serial_verify=True))
    rec = s.extra["server"]
    assert rec["serial_verify"]["form"] == "ub1-server"
    for arm in ("vanilla", "speculative"):
        args = rec[arm]["server"]["args"]
        assert args[args.index("-ub") + 1] == "1"
    assert all(getattr(st, "serial", True) for st in s.speculative.steps)
    # the fork of the batched run is gone: every verify row one token wide gives the ub-1 server's vanilla back
    assert s.speculative.n_drafted > 0
    assert s.comparison.identical, s.comparison.first_mismatch
