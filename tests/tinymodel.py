"""Tiny llama-architecture GGUF models written by the test suite (no downloads).

A byte-fallback SPM vocabulary of a few hundred tokens, 2 layers of width 64,
F32 weights from a seeded generator: llama.cpp loads and runs one in well under
a second, which is enough to test the loops, the engine and the trace for real.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = [
    "the", "a", "an", "and", "of", "to", "in", "is", "it", "that", "sleep", "students", "essay",
    "model", "token", "draft", "target", "greedy", "speculative", "decoding", "fork", "bicycle",
    "history", "cat", "dog", "on", "for", "with", "as", "was", "are", "be", "this", "by", "from",
]



def add_spm_vocab(w, tokens, scores, types) -> None:
    """An SPM ("llama") tokenizer on GGUF writer ``w``: unk 0, BOS 1 (added), EOS 2."""
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

def vocab_tokens(extra: str = "") -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]  # UNKNOWN, CONTROL, CONTROL
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)  # BYTE
    pieces = ["\u2581" + w + extra for w in WORDS] + [w + extra for w in WORDS]
    pieces += ["\u2581", "\u2581\u2581", ".", ",", "\n"]
    for p in pieces:
        if p not in tokens:
            tokens.append(p)
            types.append(1)  # NORMAL
    scores = [0.0] * len(tokens)
    for i, t in enumerate(tokens):
        if types[i] == 1:
            scores[i] = -float(i) / 100.0 + len(t)  # prefer longer pieces
    return tokens, scores, types


def write_tiny_llama(
    path: str | Path,
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx: int = 2048,
    extra: str = "",
    scale: float = 0.35,
    base: np.random.Generator | None = None,
    noise: float = 0.0,
    chat_template: bool = True,
) -> Path:
    """Write a tiny llama GGUF.  ``extra`` changes the token texts (an incompatible vocabulary).

    With ``noise`` > 0 the weights are those of ``seed`` plus that much noise from
    ``seed + 1``: a "draft" that mostly agrees with its target.  With
    ``chat_template=False`` the file has no ``tokenizer.chat_template``.
    """
    import gguf

    path = Path(path)
    tokens, scores, types = vocab_tokens(extra)
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)
    nrng = np.random.default_rng(seed + 1) if noise else None

    def mat(*shape: int, s: float = scale) -> np.ndarray:
        a = rng.standard_normal(shape).astype(np.float32) * s / np.sqrt(shape[-1]) * 4
        if nrng is not None:
            a = a + nrng.standard_normal(shape).astype(np.float32) * noise * s / np.sqrt(shape[-1]) * 4
        return a.astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"tiny-llama-{seed}{extra}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(0)  # ALL_F32
    add_spm_vocab(w, tokens, scores, types)
    if chat_template:
        w.add_chat_template(  # ChatML, which llama.cpp's template detector knows
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        )

    n_kv = n_embd // n_head * n_head_kv
    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd, s=1.0))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", mat(n_vocab, n_embd, s=1.5))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
