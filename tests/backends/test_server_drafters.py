"""EAGLE-3, DFlash and DSpark end to end through a real llama-server, with the demo's tiny drafters.

For each spec type: both arms on the quantized demo target with ``demo:eagle3``
/ ``demo:dflash`` / ``demo:dspark`` (random weights, shaped for the demo by
``specview.backends.llama_cpp.tiny_drafters``), the comparison against an
independent reading of the two token lists, the serial-verify control (the same
server with ``-ub 1``: every row of a verify batch computed as plain decoding
computes it, so the speculative arm must equal plain decoding there, whatever
the drafter proposed; DFlash and DSpark drafters are non-causal and llama.cpp
cannot run them with ``-ub 1``, which specview refuses with that reason), the
diagnosis of a fork, the DSpark p_min refusal, the trace written and read
back, and the report's llama.cpp command lines.  A random drafter proposes
tokens the target rejects, but its verify passes are still 1 + n_drafted
tokens wide, which is what all of this needs.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from specview.backends.llama_cpp.demo import resolve
from specview.backends.llama_server import ServerRunner
from specview.core.config import DEMO_DRAFTERS, EngineSettings, RunConfig
from specview.core.demo import DEMO_PROMPT
from specview.core.errors import ConfigError
from specview.core.llama_flags import UB1_REFUSED
from specview.core.trace import Trace

from test_server import find_binary

pytestmark = [pytest.mark.demo, pytest.mark.slow]

#: llama.cpp's report ran DSpark at n_max 7; the others at llama.cpp's default
N_MAX = {"draft-eagle3": 3, "draft-dflash": 3, "draft-dspark": 7}
N_TOKENS = 40


def threads() -> int:
    return 0 if os.environ.get("SPECVIEW_THREADS") else 1  # 0: $SPECVIEW_THREADS decides


@pytest.fixture(scope="module")
def runner():
    binary = find_binary()
    r = ServerRunner()
    yield r, binary
    r.close()


def config(spec_type: str, binary: str, **kw) -> RunConfig:
    return RunConfig(target="demo:Q4_K_M", draft=f"demo:{DEMO_DRAFTERS[spec_type]}", spec_type=spec_type,
                     n_max=N_MAX[spec_type], max_tokens=N_TOKENS, prompt=DEMO_PROMPT, ignore_eos=True,
                     engine=EngineSettings(threads=threads(), n_ctx=512, server_bin=binary), backend="llama-server",
                     **kw)


@pytest.mark.parametrize("spec_type", list(N_MAX))
def test_a_tiny_drafter_runs_through_llama_server_end_to_end(runner, spec_type, tmp_path):
    from specview.core import report

    r, binary = runner
    cfg = config(spec_type, binary)
    t = r.run(cfg)
    rec = t.extra["server"]
    args = rec["speculative"]["server"]["args"]
    assert args[args.index("--spec-type") + 1] == spec_type
    assert args[args.index("-md") + 1] == str(resolve(cfg.draft))
    assert args[args.index("--spec-draft-n-max") + 1] == str(N_MAX[spec_type])

    # the drafter drafted, and the rounds rebuilt from the stream add up to the server's own totals
    s, v = t.speculative, t.vanilla
    assert s.reported_drafted > 0 and len(s.tokens) == len(v.tokens) == N_TOKENS
    assert rec["speculative"]["rounds"]["available"], rec["speculative"]["rounds"]
    assert sum(x.drafted for x in s.rounds) == s.reported_drafted
    assert sum(x.accepted for x in s.rounds) == s.reported_accepted
    assert 1 + sum(x.accepted + 1 for x in s.rounds[1:]) == len(s.tokens)
    assert all(0 <= x.accepted <= x.drafted <= N_MAX[spec_type] for x in s.rounds[1:])
    # the vanilla arm on the drafter's server is plain decoding: checked against a server without the drafter
    assert rec["vanilla"]["check"]["identical"], rec["vanilla"]["check"]

    # the comparison says what the two token lists say
    first = next((i for i, (a, b) in enumerate(zip(v.tokens, s.tokens)) if a != b), None)
    assert t.comparison.identical == (first is None)
    if first is not None:
        assert t.comparison.first_mismatch.index == first
        assert (t.comparison.first_mismatch.vanilla_token, t.comparison.first_mismatch.speculative_token) == \
            (v.tokens[first], s.tokens[first])

    if spec_type in UB1_REFUSED:
        # DFlash and DSpark drafters are non-causal and share the target's -ub: with -ub 1 llama.cpp aborts, so
        # specview refuses the control before starting a server that would die, and says why
        with pytest.raises(ConfigError, match="non-causal") as ei:
            r.run(replace(cfg, serial_verify=True))
        assert ei.value.setting == "serial_verify"
    else:
        # the serial-verify control: with -ub 1 every verify row is a one-token pass, so whatever this drafter
        # proposes, the speculative arm is plain decoding there; a stale draft state or a wrong position is not
        sv = r.run(replace(cfg, serial_verify=True))
        assert sv.extra["server"]["serial_verify"]["form"] == "ub1-server"
        assert sv.speculative.reported_drafted > 0
        assert sv.speculative.tokens == sv.vanilla.tokens, (spec_type, sv.comparison.first_mismatch)

    # a fork is diagnosed, and the verdict follows the control it ran (or, where it cannot run, says so)
    if first is not None:
        d = r.diagnose(t, cfg)
        control = d["serial_verify"]
        assert control["form"] == "ub1-server"
        if spec_type in UB1_REFUSED:
            assert control["identical_to_vanilla"] is None and "non-causal" in control["skipped"]
            assert not d["rule"].startswith("serial-verify"), d["rule"]
        elif control.get("identical_to_vanilla"):
            assert d["verdict"] == "near-tie" and d["rule"] == "serial-verify-reproduces-vanilla", d["explanation"]
        elif control.get("identical_to_vanilla") is False:
            assert d["verdict"] == "state", d["explanation"]

    # the trace reads back, and its report carries the exact llama.cpp command lines
    back = Trace.load(t.save(tmp_path / "trace.json"))
    assert back.speculative.tokens == s.tokens and back.config["spec_type"] == spec_type
    md = report.trace_markdown(back, {})
    assert f"--spec-type {spec_type}" in md and f"--spec-draft-n-max {N_MAX[spec_type]}" in md
    assert "--spec-draft-p-min 0" in md and "-md " in md


def test_dspark_without_a_confidence_head_refuses_p_min_as_llama_cpp_does(runner):
    """llama-server would log the refusal and serve with no speculation: specview refuses first, with its reason."""
    r, binary = runner
    with pytest.raises(ConfigError, match="DSpark draft has no confidence head") as ei:
        r.run(config("draft-dspark", binary, p_min=0.5))
    assert ei.value.setting == "p_min"
    # p_min 1, the zero-draft control, is refused the same way; DFlash takes any p_min
    with pytest.raises(ConfigError, match="confidence head"):
        r.run(config("draft-dspark", binary, p_min=1.0))
    t = r.run(replace(config("draft-dflash", binary, p_min=1.0), max_tokens=8))
    assert t.speculative.n_drafted == 0 and t.comparison.identical
