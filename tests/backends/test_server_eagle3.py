"""draft-eagle3 through the llama-server engine, with a tiny random-weight EAGLE-3 drafter written for the demo target.

The drafter (``tiny_drafters.eagle3.write_eagle3``) is llama.cpp's ``eagle3``
architecture: a feature-fusion ``fc`` over three of the target's layers and one
decoder layer, sharing the target's token embeddings and lm_head.  Its weights
are random, so the target rejects nearly every drafted token; what is checked
is that llama-server loads and drafts with it, that specview's per-round record
adds up to the server's totals, and that both arms stay the target's greedy
decoding up to the last bits of a batched pass.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_server import find_binary

from specview.backends.llama_cpp.tiny_drafters import eagle3
from specview.backends.llama_server import ServerRunner
from specview.core.config import EngineSettings, RunConfig

pytestmark = [pytest.mark.demo, pytest.mark.slow]

N_MAX = 3
N_TOKENS = 48


@pytest.fixture(scope="module")
def target() -> Path:
    from specview.backends.llama_cpp.demo import resolve

    return Path(resolve("demo:Q8_0"))


@pytest.fixture(scope="module")
def drafter(target, tmp_path_factory) -> Path:
    return eagle3.write_eagle3(target, tmp_path_factory.mktemp("eagle3") / "tiny-eagle3.gguf", seed=0)


def fields(path: Path) -> dict:
    import gguf

    r = gguf.GGUFReader(str(path))
    out = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    out["tensors"] = {t.name: [int(n) for n in t.shape] for t in r.tensors}
    return out


def test_the_drafter_is_an_eagle3_model_shaped_for_its_target(target, drafter):
    d, t = fields(drafter), fields(target)
    arch = t["general.architecture"]
    n_embd, n_layer = t[f"{arch}.embedding_length"], t[f"{arch}.block_count"]
    assert d["general.architecture"] == "eagle3" and d["eagle3.block_count"] == 1
    assert d["general.name"] == f"specview tiny random EAGLE-3 drafter for {target.name}"
    layers = d["eagle3.target_layers"]
    assert len(layers) == 3 and layers == sorted(set(layers)) and all(0 <= i < n_layer for i in layers), layers
    assert d["eagle3.target_hidden_size"] == n_embd
    # the target's token embeddings and lm_head are shared, so the drafter is as wide as the target
    assert "token_embd.weight" not in d["tensors"] and "output.weight" not in d["tensors"]
    assert d["eagle3.embedding_length"] == n_embd
    assert d["tensors"]["fc.weight"] == [3 * n_embd, n_embd]
    assert d["tensors"]["blk.0.attn_q.weight"][0] == 2 * n_embd  # token embedding and fused features, side by side
    assert d["tokenizer.ggml.tokens"] == t["tokenizer.ggml.tokens"]
    assert {k: v for k, v in d.items() if k.startswith("tokenizer.")} == \
        {k: v for k, v in t.items() if k.startswith("tokenizer.")}


@pytest.fixture(scope="module")
def trace(target, drafter):
    binary = find_binary()
    # one thread unless $SPECVIEW_THREADS says otherwise (threads=0 reads it)
    eng = EngineSettings(threads=0 if os.environ.get("SPECVIEW_THREADS") else 1, n_ctx=512, server_bin=binary)
    c = RunConfig(target=str(target), draft=str(drafter), spec_type="draft-eagle3", n_max=N_MAX, max_tokens=N_TOKENS,
                  prompt="The three primary colours are", chat=False, ignore_eos=True, engine=eng,
                  backend="llama-server")
    with ServerRunner() as r:
        return r.run(c)


def test_llama_server_drafts_with_it_and_the_rounds_add_up(trace, drafter):
    t = trace
    rec = t.extra["server"]
    args = rec["speculative"]["server"]["args"]
    assert args[args.index("--spec-type") + 1] == "draft-eagle3"
    assert args[args.index("-md") + 1] == str(drafter)
    assert args[args.index("--spec-draft-n-max") + 1] == str(N_MAX)
    s = t.speculative
    assert s.n_drafted > 0  # the server ran the EAGLE-3 encoder and decoder on the target's layers
    assert rec["speculative"]["rounds"]["available"], rec["speculative"]["rounds"]
    assert sum(r.drafted for r in s.rounds) == s.n_drafted == s.reported_drafted
    assert sum(r.accepted for r in s.rounds) <= s.reported_accepted
    assert 1 + sum(r.accepted + 1 for r in s.rounds[1:]) == len(s.tokens) == N_TOKENS
    assert all(0 <= r.accepted <= r.drafted <= N_MAX for r in s.rounds)
    # the single-server premise: with the drafter loaded, vanilla is what a server without it decodes
    assert rec["protocol"] == "single-server" and rec["vanilla"]["check"]["identical"], rec.get("protocol_reason")
    assert len(t.vanilla.tokens) == N_TOKENS


def test_the_speculative_arm_leaves_vanilla_only_at_a_near_tie(trace):
    # a verify pass is 1 + n_drafted rows wide; the quantized target's batched kernels may round differently from a
    # one-token pass, which can flip vanilla's choice only where its top two log-probabilities nearly tie, and then to
    # the runner-up; a wrong position, a stale KV cache or a drafted token taken unverified moves far more than that
    t = trace
    if not t.comparison.identical:
        fm = t.comparison.first_mismatch
        st = t.vanilla.steps[fm.index]
        assert st.margin is not None and st.margin < 0.1 and fm.speculative_token == st.top_ids[1], \
            (fm, st.top_ids[:2], st.margin)
