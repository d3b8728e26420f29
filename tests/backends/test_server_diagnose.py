"""A real fork on a quantized target, diagnosed from outside llama-server, on any CPU.

Whether the Q4_K_M demo forks, and where, depends on the CPU's kernels and the
thread count, so the test searches a small fixed set of runs for a fork and
asserts the verdict's logic against the facts the diagnosis measured -- and
against facts measured independently here -- never a verdict one machine
happens to produce.
"""

from __future__ import annotations

import json

import pytest

from specview.backends.llama_server import ServerRunner
from specview.core.config import EngineSettings, RunConfig
from specview.core.diagnose import classify, far_threshold, format_verdict
from specview.core.prompts import builtin_prompts
from specview.core.verdicts import RULES, VERDICTS

from test_server import find_binary

pytestmark = [pytest.mark.demo, pytest.mark.slow]

N = 40


@pytest.fixture(scope="module")
def forked():
    """(runner, cfg, trace) of the first run in a fixed list that forks on this machine (skip if none does)."""
    binary = find_binary()
    eng = EngineSettings(threads=1, n_ctx=512, server_bin=binary)
    runner = ServerRunner()
    try:
        for prompt in builtin_prompts():
            for n_max in (3, 6):
                cfg = RunConfig(target="demo:Q4_K_M", draft="demo:Q4_0", spec_type="draft-simple", n_max=n_max,
                                max_tokens=N, prompt=prompt.text, engine=eng, backend="llama-server")
                t = runner.run(cfg)
                assert t.diagnosis is None  # a run never diagnoses by itself (--no-diagnose relies on it)
                if not t.comparison.identical:
                    yield runner, cfg, t
                    return
        pytest.skip("no fork within 40 tokens in the fixed runs on this CPU")
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
    assert d["verdict"] in VERDICTS and d["rule"] in RULES

    # determinism is judged only by the arms' own requests repeated on a fresh slot
    assert vrep["positions"] == fm.index + 1 and srep["positions"] == fm.index + 1
    with ServerRunner(single_server=False) as fresh:  # measured here, independently: vanilla on its own server
        again = fresh.run(cfg)
    deterministic = again.vanilla.tokens == t.vanilla.tokens and again.speculative.tokens == t.speculative.tokens
    if deterministic and vrep["identical"] and srep["identical"]:
        assert d["verdict"] != "nondeterministic", d["explanation"]
    if d["verdict"] == "nondeterministic":
        assert not vrep["identical"] or not srep["identical"]

    # every replay in another shape names its shape and was evaluated in it; none decides determinism
    for x in out["shapes"]["at_fork"]:
        assert x["shape"].startswith(f"the last {x['T']} prefix tokens") and x["evaluated"] == x["T"]
    for x in out["shapes"]["chunked"]:
        assert sum(x["evaluated"]) == fm.index and all(e <= x["T"] for e in x["evaluated"])

    # the gap is the vanilla arm's own: log p(a) - log p(b) in the row that chose a
    st = t.vanilla.steps[fm.index]
    if fm.speculative_token in st.top_ids and not d["gap_is_lower_bound"]:
        assert abs(d["gap"] - (st.top_logits[0] - st.top_logits[st.top_ids.index(fm.speculative_token)])) < 1e-4
        assert d["gap"] >= 0

    # the serial-verify control: both arms on the same server with -ub 1
    assert sv["form"] == "ub1-server" and "-ub" in sv["server"]["args"]
    args = sv["server"]["args"]
    assert args[args.index("-ub") + 1] == "1"
    if sv["identical_to_vanilla"] is None:
        assert sv["n_drafted"] == 0 and sv["skipped"]
    else:
        assert sv["n_drafted"] > 0 and sv["n_tokens"] == N

    # the verdict is core's rule applied to exactly these facts
    expected = classify(identical=False, vanilla_repeat_identical=vrep["identical"],
                        spec_reproduced=srep["identical"],
                        spec_rerun_consistent=None if srep["identical"] else False,
                        serial_verify_identical=sv["identical_to_vanilla"],
                        gap=None if d["gap_is_lower_bound"] else d["gap"], env_max=d["envelope"]["max"])
    assert (d["verdict"], d["rule"]) == expected
    if sv["identical_to_vanilla"] is True and vrep["identical"] and srep["identical"]:
        far = far_threshold(d["envelope"]["max"])
        assert d["verdict"] == ("state" if d["gap"] is not None and d["gap"] > far else "near-tie")
    if sv["identical_to_vanilla"] is False and vrep["identical"] and srep["identical"]:
        assert (d["verdict"], d["rule"]) == ("state", "serial-verify-differs")

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
    d = runner.diagnose(s, replace(cfg, serial_verify=True)) if not s.comparison.identical else None
    if d is not None:  # a fork with every pass one token wide is the control failing, not a near-tie
        assert d["rule"] in ("serial-verify-differs", "vanilla-repeat-disagrees", "speculative-replays-disagree")
