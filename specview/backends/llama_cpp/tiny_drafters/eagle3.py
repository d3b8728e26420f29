"""A tiny random-weight EAGLE-3 drafter (GGUF architecture ``eagle3``) for ``--spec-type draft-eagle3``.

What llama.cpp reads (``src/models/eagle3.cpp``, ``src/llama-model.cpp``,
``common/speculative.cpp``):

* the generic keys every architecture needs: ``eagle3.context_length``,
  ``.embedding_length``, ``.block_count`` (EAGLE-3 has exactly one decoder
  layer; the graph asserts it), ``.feed_forward_length``,
  ``.attention.head_count`` / ``.head_count_kv`` / ``.key_length`` /
  ``.value_length`` (the head size otherwise defaults to n_embd / n_head),
  ``.attention.layer_norm_rms_epsilon`` (required), ``.rope.dimension_count``
  and ``.rope.freq_base``;
* ``eagle3.target_layers``: exactly three int32 target layer ids whose layer
  inputs the target hands over (an id equal to the target's block count means
  its final hidden state); ``eagle3.target_hidden_size``: the target's n_embd;
  the encoder's input is their concatenation, 3 * target_hidden_size wide.
  ``norm_before_residual`` and ``norm_before_fc`` are optional and left off
  (both false, the original EAGLE-3 layout);
* tensors ``fc.weight`` {3 * n_embd_tgt, n_embd} (the feature fusion), one
  decoder layer ``blk.0.attn_norm`` (on the token embedding),
  ``blk.0.attn_norm_2`` (EAGLE-3's hidden_norm, on the fused features),
  ``attn_q/k/v`` taking the 2 * n_embd concatenation of both, ``attn_output``,
  ``ffn_norm/gate/up/down``, and ``output_norm``.

The choice that keeps it small: ``token_embd`` and ``output`` are left out, so
llama.cpp takes the target's (through ``ctx_other``, which llama.cpp's
speculative setup points at the target context; llama-server's memory fit,
which builds the draft context without it, logs "eagle3 requires ctx_other to
be set" and goes on).  The target's embedding rows then feed the drafter's
``attn_norm`` and its lm_head reads the drafter's hidden state, so the
drafter's n_embd must be the target's (576 for SmolLM2-135M): a narrower one
aborts the server on ``GGML_ASSERT(ggml_can_repeat(b, a))``.  An own small
vocabulary through ``d2t`` would still need ``output`` rows of that width plus
an int64 map, and an own ``token_embd`` would have to cover the whole target
vocabulary (49152 rows): both only add bytes.  What remains is dominated by
``fc`` (3 * 576 x 576); everything else is kept narrow (one attention head of
64, a feed-forward of 64).  Matrices are F16, norms F32: 2.7 MB of weights for
SmolLM2-135M (4.5 MB with the copied tokenizer), which llama-server loads,
context included, in under a tenth of a second.

The weights come from a seeded generator (``Weights(seed)``), so the same seed
writes a byte-identical file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .common import TargetFacts, Weights, _gguf, copy_tokenizer, read_target, spread_layers, write_atomically

ARCH = "eagle3"
#: the drafter's attention: one head (query, key and value) of this size
HEAD_DIM = 64
#: the drafter's feed-forward width
N_FF = 64


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16)


def _fill(w: Any, t: TargetFacts, seed: int) -> None:
    gguf = _gguf()
    n_embd = t.n_embd  # must equal the target's: the target's token_embd and output are shared
    layers = spread_layers(t.n_layer)
    rng = Weights(seed)

    w.add_name(f"specview tiny random EAGLE-3 drafter for {t.path.name}")
    w.add_file_type(1)  # LLAMA_FTYPE_MOSTLY_F16
    w.add_uint32(f"{ARCH}.context_length", t.n_ctx_train)
    w.add_uint32(f"{ARCH}.embedding_length", n_embd)
    w.add_uint32(f"{ARCH}.block_count", 1)
    w.add_uint32(f"{ARCH}.feed_forward_length", N_FF)
    w.add_uint32(f"{ARCH}.attention.head_count", 1)
    w.add_uint32(f"{ARCH}.attention.head_count_kv", 1)
    w.add_uint32(f"{ARCH}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{ARCH}.attention.value_length", HEAD_DIM)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", t.rms_eps)
    w.add_uint32(f"{ARCH}.rope.dimension_count", HEAD_DIM)
    w.add_float32(f"{ARCH}.rope.freq_base", t.rope_freq_base)
    w.add_key_value(f"{ARCH}.target_layers", layers, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    w.add_uint32(f"{ARCH}.target_hidden_size", t.n_embd)
    copy_tokenizer(w, t)

    # gguf stores a (rows, cols) array as the ggml tensor {cols, rows}
    w.add_tensor("fc.weight", _f16(rng.mat(n_embd, 3 * t.n_embd)))
    w.add_tensor("output_norm.weight", rng.ones(n_embd))
    w.add_tensor("blk.0.attn_norm.weight", rng.ones(n_embd))
    w.add_tensor("blk.0.attn_norm_2.weight", rng.ones(n_embd))
    for name in ("attn_q", "attn_k", "attn_v"):
        w.add_tensor(f"blk.0.{name}.weight", _f16(rng.mat(HEAD_DIM, 2 * n_embd)))
    w.add_tensor("blk.0.attn_output.weight", _f16(rng.mat(n_embd, HEAD_DIM)))
    w.add_tensor("blk.0.ffn_norm.weight", rng.ones(n_embd))
    w.add_tensor("blk.0.ffn_gate.weight", _f16(rng.mat(N_FF, n_embd)))
    w.add_tensor("blk.0.ffn_up.weight", _f16(rng.mat(N_FF, n_embd)))
    w.add_tensor("blk.0.ffn_down.weight", _f16(rng.mat(n_embd, N_FF)))


def write_eagle3(target: str | os.PathLike[str] | TargetFacts, out: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write an EAGLE-3 drafter for ``target`` to ``out`` (atomically) and return its path.

    It reads the target's low, middle and high layers (``spread_layers``), shares
    the target's token embeddings and lm_head, and carries the target's tokenizer.
    """
    t = read_target(target)
    return write_atomically(out, ARCH, lambda w: _fill(w, t, seed))
