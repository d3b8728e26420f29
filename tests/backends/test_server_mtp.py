"""draft-mtp through the llama-server engine, on a tiny random-weight Qwen3.5 GGUF with an MTP (nextn) block.

llama.cpp drafts with a model's own multi-token-prediction head for several
architectures (``src/models/*.cpp`` build an ``LLM_GRAPH_TYPE_DECODER_MTP``
graph).  The simplest dense one is Qwen3.5 (``qwen35``): a hybrid of
gated-delta-net (recurrent) and full-attention layers plus one MTP block after
the last layer (``qwen35.nextn_predict_layers = 1``).  The file below has one
recurrent layer, one attention layer and the MTP block, width 64, F32 weights
from a seeded generator, and the tests' tiny SPM vocabulary.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from specview.backends.llama_server import ServerRunner
from specview.core.config import EngineSettings, RunConfig

from test_server import find_binary

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tinymodel import WORDS, add_spm_vocab  # noqa: E402

pytestmark = [pytest.mark.slow]


def word_vocab() -> tuple[list[str], list[float], list[int]]:
    """An SPM vocabulary of words and the ASCII bytes only: every token is complete UTF-8 text on its own,
    so llama-server streams every token (it holds back a byte of a multi-byte character)."""
    tokens, types = ["<unk>", "<s>", "</s>"], [2, 3, 3]
    for b in range(128):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)  # BYTE
    for p in ["\u2581" + w for w in WORDS] + WORDS + ["\u2581", ".", ","]:
        if p not in tokens:
            tokens.append(p)
            types.append(1)
    scores = [0.0 if t != 1 else float(len(tokens[i])) - i / 100 for i, t in enumerate(types)]
    return tokens, scores, types


def write_tiny_qwen35_mtp(path: str | Path, *, seed: int = 0, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                          n_ff: int = 128, n_ctx: int = 2048) -> Path:
    """Layer 0 gated delta net, layer 1 full attention, layer 2 the MTP block (nextn tensors)."""
    import gguf

    path = Path(path)
    tokens, scores, types = word_vocab()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)
    head = n_embd // n_head
    d_state, n_group, dt_rank, d_inner, d_conv = 16, 2, 4, 64, 4
    key_dim, value_dim = d_state * n_group, d_inner

    def mat(*shape: int, s: float = 0.35) -> np.ndarray:
        return (rng.standard_normal(shape).astype(np.float32) * s / np.sqrt(shape[-1]) * 4).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    arch = "qwen35"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-qwen35-mtp-{seed}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(3)
    w.add_uint32(f"{arch}.nextn_predict_layers", 1)
    w.add_uint32(f"{arch}.full_attention_interval", 2)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(head)
    w.add_array(f"{arch}.rope.dimension_sections", [2, 3, 3, 0])
    w.add_rope_freq_base(10000.0)
    for k, v in (("conv_kernel", d_conv), ("inner_size", d_inner), ("state_size", d_state),
                 ("time_step_rank", dt_rank), ("group_count", n_group)):
        w.add_uint32(f"{arch}.ssm.{k}", v)
    w.add_file_type(0)
    add_spm_vocab(w, tokens, scores, types)
    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd, s=1.0))
    w.add_tensor("output_norm.weight", ones(n_embd))
    w.add_tensor("output.weight", mat(n_vocab, n_embd, s=1.5))
    n_kv = head * n_head_kv
    for i in range(3):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff))
        if i == 0:  # gated delta net
            w.add_tensor(f"blk.{i}.attn_qkv.weight", mat(key_dim * 2 + value_dim, n_embd))
            w.add_tensor(f"blk.{i}.attn_gate.weight", mat(value_dim, n_embd))
            w.add_tensor(f"blk.{i}.ssm_conv1d.weight", mat(key_dim * 2 + value_dim, d_conv))
            w.add_tensor(f"blk.{i}.ssm_dt.bias", np.zeros(dt_rank, dtype=np.float32))
            w.add_tensor(f"blk.{i}.ssm_a", -np.ones(dt_rank, dtype=np.float32))
            w.add_tensor(f"blk.{i}.ssm_beta.weight", mat(dt_rank, n_embd))
            w.add_tensor(f"blk.{i}.ssm_alpha.weight", mat(dt_rank, n_embd))
            w.add_tensor(f"blk.{i}.ssm_norm.weight", ones(d_state))
            w.add_tensor(f"blk.{i}.ssm_out.weight", mat(n_embd, value_dim))
            continue
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(head * n_head * 2, n_embd))  # query and its gate
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, head * n_head))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", ones(head))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", ones(head))
        if i == 2:  # the MTP block
            w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", mat(n_embd, 2 * n_embd))
            w.add_tensor(f"blk.{i}.nextn.enorm.weight", ones(n_embd))
            w.add_tensor(f"blk.{i}.nextn.hnorm.weight", ones(n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory) -> Path:
    return write_tiny_qwen35_mtp(tmp_path_factory.mktemp("mtp") / "tiny-qwen35-mtp.gguf")


def test_draft_mtp_runs_through_the_engine_on_a_tiny_mtp_model(mtp_model):
    from specview.core.arms.session import Session

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
