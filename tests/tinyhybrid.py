"""Tiny hybrid GGUF models written by the test suite: recurrent layers beside attention layers (no downloads).

Two of llama.cpp's hybrid architectures, each with random weights from a seed
and the tests' word vocabulary, small enough that llama.cpp loads one in a few
milliseconds:

* :func:`write_tiny_qwen35` -- Qwen3.5 (``qwen35``): a gated-delta-net layer, then a
  full-attention layer, optionally a multi-token-prediction block (``nextn``)
  after them, which llama.cpp's ``draft-mtp`` drafts with;
* :func:`write_tiny_lfm2` -- LiquidAI LFM2 (``lfm2``): short-convolution layers
  (a recurrent conv state) around an attention layer.

Their memory cannot drop a rejected draft with ``llama_memory_seq_rm``: a
speculative loop on them rolls back by recurrent-state snapshots or by a
checkpoint and a replay.  :func:`hybrid_pair` writes a target and a Q4_0 copy of
it (llama.cpp's own quantizer): a drafter that agrees with the target often but
not always, so rounds are accepted in part and both rollbacks and replays
happen.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tinymodel import WORDS, add_spm_vocab


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


class _Weights:
    """Seeded random matrices scaled by fan-in, so activations stay of order one through a few layers."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def mat(self, *shape: int, s: float = 0.35) -> np.ndarray:
        return (self.rng.standard_normal(shape).astype(np.float32) * s / np.sqrt(shape[-1]) * 4).astype(np.float32)

    @staticmethod
    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_qwen35(path: str | Path, *, seed: int = 0, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                      n_ff: int = 128, n_ctx: int = 2048, mtp: bool = True) -> Path:
    """Layer 0 a gated delta net, layer 1 full attention; with ``mtp`` layer 2 is an MTP block (nextn tensors)."""
    import gguf

    path = Path(path)
    tokens, scores, types = word_vocab()
    n_vocab = len(tokens)
    W = _Weights(seed)
    mat, ones = W.mat, W.ones
    head = n_embd // n_head
    d_state, n_group, dt_rank, d_inner, d_conv = 16, 2, 4, 64, 4
    key_dim, value_dim = d_state * n_group, d_inner
    n_block = 3 if mtp else 2

    arch = "qwen35"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-qwen35{'-mtp' if mtp else ''}-{seed}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_block)
    if mtp:
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
    for i in range(n_block):
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
    _finish(w)
    return path


#: the layer kinds of the tiny LFM2: short convolution, attention, short convolution
LFM2_LAYERS = ("conv", "attention", "conv")


def write_tiny_lfm2(path: str | Path, *, seed: int = 0, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                    n_ff: int = 128, n_ctx: int = 2048, l_cache: int = 3,
                    layers: tuple[str, ...] = LFM2_LAYERS) -> Path:
    """An ``lfm2`` model: ``layers`` names each block ("conv": a gated short convolution whose last
    ``l_cache - 1`` inputs are the recurrent state; "attention": GQA with q/k norms and NeoX RoPE).

    llama.cpp tells the two apart by ``lfm2.attention.head_count_kv`` per layer (0 for a conv layer);
    the final norm is named ``token_embd_norm`` as LiquidAI's converted files name it.
    """
    import gguf

    path = Path(path)
    tokens, scores, types = word_vocab()
    n_vocab = len(tokens)
    W = _Weights(seed)
    mat, ones = W.mat, W.ones
    head = n_embd // n_head
    n_kv = head * n_head_kv

    arch = "lfm2"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-lfm2-{seed}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(len(layers))
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_array(f"{arch}.attention.head_count_kv", [n_head_kv if k == "attention" else 0 for k in layers])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_uint32(f"{arch}.shortconv.l_cache", l_cache)
    w.add_file_type(0)
    add_spm_vocab(w, tokens, scores, types)
    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd, s=1.0))
    w.add_tensor("token_embd_norm.weight", ones(n_embd))
    w.add_tensor("output.weight", mat(n_vocab, n_embd, s=1.5))
    for i, kind in enumerate(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff))
        if kind == "conv":
            w.add_tensor(f"blk.{i}.shortconv.conv.weight", mat(n_embd, l_cache, s=0.6))
            w.add_tensor(f"blk.{i}.shortconv.in_proj.weight", mat(3 * n_embd, n_embd))
            w.add_tensor(f"blk.{i}.shortconv.out_proj.weight", mat(n_embd, n_embd))
            continue
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", ones(head))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", ones(head))
    _finish(w)
    return path


WRITERS = {"qwen35": write_tiny_qwen35, "lfm2": write_tiny_lfm2}
#: each architecture's pair: the writer's keyword arguments for the target (its drafter is a Q4_0 copy)
PAIRS = {"qwen35": {"n_embd": 128, "mtp": False}, "lfm2": {"n_embd": 128}}


def hybrid_pair(arch: str, folder: str | Path, *, seed: int = 0, quant: str = "Q4_0") -> tuple[Path, Path]:
    """``(target, drafter)`` in ``folder``: a tiny ``arch`` target and a ``quant`` copy of it (llama.cpp's own
    quantizer), which agrees with the target often but not always."""
    from specview.backends.llama_cpp.quantize import quantize

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = WRITERS[arch](folder / f"tiny-{arch}-{seed}.gguf", seed=seed, **PAIRS[arch])
    draft = quantize(target, folder / f"tiny-{arch}-{seed}.{quant}.gguf", quant, threads=1)
    return target, draft
