"""draft-mtp through the llama-server engine, on a tiny random-weight Qwen3.5 GGUF with an MTP (nextn) block.

llama.cpp drafts with a model's own multi-token-prediction head for several
architectures (``src/models/*.cpp`` build an ``LLM_GRAPH_TYPE_DECODER_MTP``
graph).  The simplest dense one is Qwen3.5 (``qwen35``): a hybrid of
gated-delta-net (recurrent) and full-attention layers plus one MTP block after
the last layer (``qwen35.nextn_predict_layers = 1``).  The file below has one
recurrent layer, one attention layer and the MTP block, width 64, F32 weights
from a seeded generator, and the tests' tiny SPM vocabulary (``tests/tinyhybrid.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specview.backends.llama_server import ServerRunner
from specview.core.config import EngineSettings, RunConfig

from test_server import find_binary

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tinyhybrid import write_tiny_qwen35  # noqa: E402

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory) -> Path:
    return write_tiny_qwen35(tmp_path_factory.mktemp("mtp") / "tiny-qwen35-mtp.gguf", mtp=True)


def test_draft_mtp_runs_through_the_engine_on_a_tiny_mtp_model(mtp_model):
    from specview.core.session import Session

    binary = find_binary()
    eng = EngineSettings(threads=1, n_ctx=512, server_bin=binary)
    c = RunConfig(target=str(mtp_model), draft=None, spec_type="draft-mtp", n_max=3, max_tokens=48,
                  prompt="the cat and the dog", chat=False, ignore_eos=True, engine=eng, backend="llama-server")
    with ServerRunner() as r:
        t = r.run(c)
    rec = t.extra["server"]
    args = rec["speculative"]["server"]["args"]
    assert args[args.index("--spec-type") + 1] == "draft-mtp" and "-md" not in args
    assert args[args.index("--spec-draft-n-max") + 1] == "3"
    s = t.speculative
    assert s.n_drafted > 0  # the server drafted with the model's own MTP head
    # the single-server premise was checked at run time against a server without MTP, and the trace says how
    assert rec["protocol"] == "single-server" and rec["vanilla"]["check"]["identical"], rec.get("protocol_reason")
    # every token streamed, so every round is rebuilt, and the rounds add up to the server's own totals
    assert rec["speculative"]["rounds"]["available"], rec["speculative"]["rounds"]
    assert sum(r.drafted for r in s.rounds) == s.n_drafted
    assert 1 + sum(r.accepted + 1 for r in s.rounds[1:]) == len(s.tokens) == 48
    assert all(r.drafted <= 3 for r in s.rounds)
    # plain decoding on the server is llama.cpp's in-process plain decoding of the same file
    sess = Session()
    try:
        local = sess.run(RunConfig(target=str(mtp_model), draft=None, spec_type="none", max_tokens=48,
                                   prompt_tokens=tuple(t.prompt["tokens"]), ignore_eos=True,
                                   engine=EngineSettings(threads=1, n_ctx=512))).vanilla
    finally:
        sess.close()
    assert t.vanilla.tokens == local.tokens
    # F32 weights: a verify batch rounds differently from a single-token pass only in the last bits, so the
    # speculative arm can leave vanilla only where vanilla's top two logits (nearly) tie, and then for the runner-up;
    # a stale MTP embedding or a wrong position moves logits by far more
    if not t.comparison.identical:
        fm = t.comparison.first_mismatch
        st = t.vanilla.steps[fm.index]
        assert st.margin < 1e-3 and fm.speculative_token == st.top_ids[1], (fm, st.top_ids[:2], st.margin)
