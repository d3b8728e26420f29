"""Every llama-server spec type that needs no extra model, on the demo, through the llama-server engine.

For each type: the run works end to end, the vanilla arm taken on that type's
own server (speculation off by request) equals the vanilla arm of a server with
no speculation at all, token for token and log-probability for log-probability,
and the rebuilt rounds add up to the server's own totals.
"""

from __future__ import annotations


import pytest

from specview.backends.llama_server import ServerRunner
from specview.core.config import EngineSettings, RunConfig

from test_server import find_binary

pytestmark = [pytest.mark.demo, pytest.mark.slow]

MODEL_FREE = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# a prompt that invites repetition, so the n-gram drafters find something to draft
PROMPT = "List the numbers one to twelve in words, one per line, then the same list again."


@pytest.fixture(scope="module")
def setup():
    binary = find_binary()
    eng = EngineSettings(threads=1, n_ctx=512, server_bin=binary)

    def cfg(spec_type: str) -> RunConfig:
        return RunConfig(target="demo:Q8_0", draft=None, spec_type=spec_type, max_tokens=64, prompt=PROMPT,
                         ignore_eos=True, engine=eng, backend="llama-server")

    with ServerRunner(single_server=False) as plain:  # the reference: vanilla on a server without speculation
        ref = plain.run(cfg("none"))
    runner = ServerRunner()
    yield cfg, ref, runner
    runner.close()


@pytest.mark.parametrize("spec_type", MODEL_FREE)
def test_a_model_free_spec_type_runs_and_its_vanilla_is_plain_decoding(setup, spec_type):
    cfg, ref, runner = setup
    t = runner.run(cfg(spec_type), reuse_vanilla=False)
    rec = t.extra["server"]
    assert rec["protocol"] == "single-server", rec.get("protocol_reason")
    args = rec["speculative"]["server"]["args"]
    assert args[args.index("--spec-type") + 1] == spec_type and "-md" not in args
    assert rec["vanilla"]["server"]["pid"] == rec["speculative"]["server"]["pid"]
    assert rec["vanilla"]["drafted"] == 0 and rec["vanilla"]["off_shape"] == []
    # the single-server protocol's premise, for this type
    assert t.vanilla.tokens == ref.vanilla.tokens
    for a, b in zip(t.vanilla.steps, ref.vanilla.steps):
        assert a.top_ids == b.top_ids and a.top_logits == b.top_logits
    s = t.speculative
    assert len(s.tokens) == 64 and s.drafter == spec_type
    assert rec["speculative"]["rounds"]["available"], rec["speculative"]["rounds"]
    assert sum(r.drafted for r in s.rounds) == s.reported_drafted
    assert sum(r.accepted for r in s.rounds) == s.reported_accepted
    assert 1 + sum(r.accepted + 1 for r in s.rounds[1:]) == len(s.tokens)
    # the accepted drafts are the server's own argmax: every round's tokens are the ones vanilla chose, up to a fork
    # (which, with nothing wrong, only a near-tie flipped by the verify batch's numerics can cause)
    if not t.comparison.identical:
        d = runner.diagnose(t, cfg(spec_type))
        assert d["verdict"] == "near-tie", d["explanation"]
        assert d["serial_verify"]["identical_to_vanilla"] in (True, None), d["serial_verify"]
