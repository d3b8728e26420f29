"""A tiny llama GGUF that carries another model's vocabulary (every ``tokenizer.*`` key copied from its header).

The draft picker must offer such a model for that other model: same tokens,
same token types, same merges, so the same vocabulary fingerprint, with
random weights of width 8 that no one is meant to run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

_SCALARS = {"UINT8": "add_uint8", "INT8": "add_int8", "UINT16": "add_uint16", "INT16": "add_int16",
            "UINT32": "add_uint32", "INT32": "add_int32", "FLOAT32": "add_float32", "UINT64": "add_uint64",
            "INT64": "add_int64", "FLOAT64": "add_float64", "BOOL": "add_bool", "STRING": "add_string"}


def write_with_vocab_of(src: str | Path, dest: str | Path, *, n_embd: int = 8, seed: int = 0) -> Path:
    """Write ``dest``: a 1-layer llama of width ``n_embd`` whose tokenizer keys are ``src``'s."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    dest = Path(dest)
    w = gguf.GGUFWriter(str(dest), "llama")
    w.add_name(f"tiny-with-vocab-of-{Path(src).stem}")
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0].name
        value = field.contents()
        if kind == "ARRAY":
            w.add_array(key, value)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        else:
            getattr(w, _SCALARS[kind])(key, value)
    n_head, n_ff = 2, 16
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_file_type(0)  # ALL_F32
    rng = np.random.default_rng(seed)

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", mat(n_vocab, n_embd))
    for name, shape in (("attn_norm", (n_embd,)), ("attn_q", (n_embd, n_embd)), ("attn_k", (n_embd, n_embd)),
                        ("attn_v", (n_embd, n_embd)), ("attn_output", (n_embd, n_embd)), ("ffn_norm", (n_embd,)),
                        ("ffn_gate", (n_ff, n_embd)), ("ffn_up", (n_ff, n_embd)), ("ffn_down", (n_embd, n_ff))):
        w.add_tensor(f"blk.0.{name}.weight", np.ones(shape, dtype=np.float32) if len(shape) == 1 else mat(*shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest
