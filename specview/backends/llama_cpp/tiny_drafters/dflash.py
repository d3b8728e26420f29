"""A tiny random-weight DFlash drafter (``--spec-type draft-dflash``), and its DSpark variant (``draft-dspark``).

What llama.cpp reads (``src/models/dflash.cpp``, ``common/speculative.cpp``)
------------------------------------------------------------------------------
A DFlash drafter is a GGUF of architecture ``dflash``: a few non-causal
transformer layers that denoise a block ``[last token, <mask> x (n-1)]`` in one
pass, their keys and values seeded from the target's hidden states.  llama.cpp
turns on the extraction of the *inputs* of the target layers listed in
``dflash.target_layers`` (``llama_set_embeddings_layer_inp``), concatenates
them per token, runs them through ``fc`` and ``enc.output_norm`` and writes the
result, projected by each layer's ``attn_k`` / ``attn_v``, into the draft's KV
cache.  The target must be an architecture whose graph records its layer
inputs (``res->t_layer_inp[il]``: llama, qwen3, qwen3.5, gemma4, ... in
``src/models/*.cpp``), and each id must be below its block count (there is no
input "after the last layer": llama.cpp aborts with "layer input tensor is
null").

Keys (``dflash.`` prefix): the generic ``context_length``, ``embedding_length``,
``block_count``, ``feed_forward_length``, ``attention.head_count(_kv)``,
``attention.key_length`` / ``value_length`` (equal: the graph asserts it),
``rope.dimension_count``, ``rope.freq_base``,
``attention.layer_norm_rms_epsilon``; DFlash's own ``target_layers`` (required:
"DFlash model requires 'target_layers' in GGUF metadata") and ``block_size``
(default 16 when absent).  ``attention.causal`` is left out: llama.cpp then
runs the block non-causally, as DFlash is trained.  The mask token is
``tokenizer.ggml.mask_token_id``: without it llama.cpp fills the block with
token -1 and llama-server aborts at its first draft ("get_sub_batch: failed to
add embedding at index 1"), so the drafter names one: the target's own mask
token when it has one, else its unknown / padding / end token (the row only
has to exist; its embedding is the target's).

DSpark is DFlash plus a Markov head: ``markov_w1.weight`` {R, n_vocab} (the
previous token's code) and ``markov_w2.weight`` {R, n_vocab} (a bias on the
next position's logits), chained position by position inside the block.  The
presence of ``markov_w1.weight`` is what makes llama-server auto-detect
``draft-dspark`` (``common_speculative_types_from_gguf``).  A DSpark draft's
block is anchor-first when ``dflash.sample_from_anchor`` is true (or absent):
the block is ``[last token, <mask> x (n-1)]`` and every one of its n positions
is a draft, so a DSpark draft may be ``block_size`` long where a DFlash one
stops at ``block_size - 1``.  The optional confidence head is
``conf_proj.weight`` {n_embd + R, 1} (+ ``conf_proj.bias`` {1}), announced by
``dflash.has_confidence_head``.

How long a draft is
-------------------
The block is ``n_max + 1`` tokens for DFlash (the anchor, then ``n_max``
masks it reads drafts from) and ``n_max`` for anchor-first DSpark (every slot
is a draft), and llama.cpp clamps ``--spec-draft-n-max`` at load to the trained
block: ``n_max <= block_size - 1`` for DFlash, ``<= block_size`` for DSpark
(its log: "requested draft size ... exceeds the trained block size ...
clamping to N"; the server reports the clamp nowhere else).  With p_min 0
every round drafts that many, fewer only near the end of a request (the
tokens left minus one); p_min > 0 cuts a DFlash draft at the first token below
it and a DSpark draft at the first confidence below it.

Why this layout: the target's embeddings and lm_head, no ``d2t``
---------------------------------------------------------------
The drafter carries no token embedding and no lm_head: ``token_embd`` and
``output`` are optional for ``dflash``, and when they are missing the draft
graph borrows the target's through ``ctx_other`` (the target context
llama-server hands every draft context).  That needs the drafter as wide as
the target (``embedding_length`` = the target's ``n_embd``) and costs no
bytes.  A reduced vocabulary (``d2t``, I64 target ids, with the drafter's own
``output`` of ``n_embd x n_draft``) runs too, but for DFlash it only adds
bytes, and for DSpark it saves a few hundred kB of ``markov_w2`` (``markov_w1``
stays full-vocabulary) at the price of a drafter that can propose only
``n_draft`` of the target's tokens.  The full-vocabulary layout is the one
z-lab's DFlash checkpoints use and lets a random draft token match the
target's now and then.

What is left: one layer with one 64-wide head and a 64-wide FFN, and ``fc``
over three target layers (``spread_layers``: 2, 15, 27 of a 30-layer target),
which at ``3 x n_embd`` by ``n_embd`` is the largest tensor; DSpark adds two
rank-4 vocabulary tables.  Matrices F16, norms F32.  For SmolLM2-135M
(n_embd 576, vocab 49152) the tensors take 2,516,480 bytes (DFlash) and
3,302,912 bytes (DSpark), plus about 1.8 MB of copied tokenizer; llama-server
loads either in well under 0.1 s.

DSpark and ``--spec-draft-p-min``
---------------------------------
llama.cpp refuses a DSpark speculator with ``p_min > 0`` when the draft's
``dflash.has_confidence_head`` is present and not true (it truncates DSpark
drafts by the confidence head's score, not by token probability).  See
:func:`dspark_p_min_refusal`.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ....core.errors import ModelFileError
from .common import TargetFacts, Weights, _gguf, copy_tokenizer, read_target, spread_layers, write_atomically

ARCH = "dflash"
#: DFlash checkpoints are trained on 16-token blocks (z-lab's ``-b16`` drafters); llama.cpp's default too
BLOCK_SIZE = 16
N_LAYER = 1
HEAD_DIM = 64
N_FF = 64
MARKOV_RANK = 4

#: the message llama.cpp throws from common_speculative_impl_draft_dflash's constructor (common/speculative.cpp)
P_MIN_REFUSAL = "DSpark draft has no confidence head: please set --spec-draft-p-min 0"


def mask_token_id(target: TargetFacts) -> int:
    """The token the drafter fills its block with: the target's mask token, else its unknown, padding or end token."""
    tok = {name: value for name, value, _vt, _st in target.tokenizer}
    for key in ("tokenizer.ggml.mask_token_id", "tokenizer.ggml.unknown_token_id",
                "tokenizer.ggml.padding_token_id", "tokenizer.ggml.eos_token_id"):
        v = tok.get(key)
        if v is not None and 0 <= int(v) < target.n_vocab:
            return int(v)
    return 0


def write_dflash(target: str | os.PathLike[str] | TargetFacts, out: str | os.PathLike[str], *, seed: int = 0,
                 dspark: bool = False, confidence_head: bool = False, block_size: int = BLOCK_SIZE) -> Path:
    """Write a random-weight DFlash drafter (DSpark with ``dspark=True``) for ``target`` to ``out``.

    ``confidence_head`` (DSpark only) adds ``conf_proj`` and marks the file
    ``dflash.has_confidence_head = true``; without it the file says false, and
    llama-server refuses it with ``--spec-draft-p-min`` above 0.
    ``block_size`` is the trained block the server clamps ``--spec-draft-n-max`` to.
    The same target and seed give a byte-identical file.  ``target`` may be
    the :class:`TargetFacts` :func:`read_target` returned, to write several
    drafters for one target without reading its header again.
    """
    _gguf()  # a clear error before any work when the gguf package is missing
    if confidence_head and not dspark:
        raise ValueError("a confidence head is part of a DSpark drafter: pass dspark=True")
    if block_size < 2:
        raise ValueError(f"block_size must be at least 2 (an anchor and one mask), not {block_size}")
    t = read_target(target)
    layers = spread_layers(t.n_layer)
    if not all(0 <= i < t.n_layer for i in layers):  # pragma: no cover - spread_layers stays inside
        raise ModelFileError(f"{t.path}: target layers {layers} are outside its {t.n_layer} layers")
    n_embd, n_vocab = t.n_embd, t.n_vocab
    mask = mask_token_id(t)
    kind = "DSpark" if dspark else "DFlash"
    w16 = np.float16

    def fill(w: Any) -> None:
        rng = Weights(seed)
        k = ARCH
        w.add_name(f"specview tiny random {kind} drafter for {t.path.name}")
        w.add_uint32(f"{k}.context_length", t.n_ctx_train)
        w.add_uint32(f"{k}.embedding_length", n_embd)
        w.add_uint32(f"{k}.block_count", N_LAYER)
        w.add_uint32(f"{k}.feed_forward_length", N_FF)
        w.add_uint32(f"{k}.attention.head_count", 1)
        w.add_uint32(f"{k}.attention.head_count_kv", 1)
        w.add_uint32(f"{k}.attention.key_length", HEAD_DIM)
        w.add_uint32(f"{k}.attention.value_length", HEAD_DIM)
        w.add_uint32(f"{k}.rope.dimension_count", HEAD_DIM)
        w.add_float32(f"{k}.rope.freq_base", t.rope_freq_base)
        w.add_float32(f"{k}.attention.layer_norm_rms_epsilon", t.rms_eps)
        w.add_array(f"{k}.target_layers", [int(i) for i in layers])
        w.add_uint32(f"{k}.block_size", int(block_size))
        if dspark:
            w.add_bool(f"{k}.sample_from_anchor", True)
            w.add_bool(f"{k}.has_confidence_head", bool(confidence_head))
        w.add_uint32("general.file_type", 1)  # mostly F16
        copy_tokenizer(w, t)
        w.add_uint32("tokenizer.ggml.mask_token_id", mask)

        # target features -> draft width: fc {n_target_layers * n_embd, n_embd}
        w.add_tensor("fc.weight", rng.mat(n_embd, len(layers) * n_embd).astype(w16))
        w.add_tensor("enc.output_norm.weight", rng.ones(n_embd))
        for il in range(N_LAYER):
            b = f"blk.{il}"
            w.add_tensor(f"{b}.attn_norm.weight", rng.ones(n_embd))
            w.add_tensor(f"{b}.attn_q.weight", rng.mat(HEAD_DIM, n_embd).astype(w16))
            w.add_tensor(f"{b}.attn_k.weight", rng.mat(HEAD_DIM, n_embd).astype(w16))
            w.add_tensor(f"{b}.attn_v.weight", rng.mat(HEAD_DIM, n_embd).astype(w16))
            w.add_tensor(f"{b}.attn_output.weight", rng.mat(n_embd, HEAD_DIM).astype(w16))
            w.add_tensor(f"{b}.attn_q_norm.weight", rng.ones(HEAD_DIM))
            w.add_tensor(f"{b}.attn_k_norm.weight", rng.ones(HEAD_DIM))
            w.add_tensor(f"{b}.ffn_norm.weight", rng.ones(n_embd))
            w.add_tensor(f"{b}.ffn_gate.weight", rng.mat(N_FF, n_embd).astype(w16))
            w.add_tensor(f"{b}.ffn_up.weight", rng.mat(N_FF, n_embd).astype(w16))
            w.add_tensor(f"{b}.ffn_down.weight", rng.mat(n_embd, N_FF).astype(w16))
        w.add_tensor("output_norm.weight", rng.ones(n_embd))
        if dspark:
            # markov_w1 {R, n_vocab}: a code per previous token; markov_w2 {R, n_vocab}: the bias it adds
            w.add_tensor("markov_w1.weight", rng.mat(n_vocab, MARKOV_RANK).astype(w16))
            w.add_tensor("markov_w2.weight", rng.mat(n_vocab, MARKOV_RANK).astype(w16))
            if confidence_head:
                # conf_proj {n_embd + R, 1}, conf_proj.bias {1}
                w.add_tensor("conf_proj.weight", rng.mat(1, n_embd + MARKOV_RANK))
                w.add_tensor("conf_proj.bias", np.zeros(1, dtype=np.float32))

    return write_atomically(out, ARCH, fill)


def dspark_p_min_refusal(draft_path: str | os.PathLike[str], *, spec_type: str | None = "draft-dspark") -> str | None:
    """llama.cpp's reason for refusing ``--spec-draft-p-min`` > 0 with this draft, or None when it takes it.

    llama.cpp (common/speculative.cpp, the constructor of the DFlash/DSpark
    speculator) refuses when all of these hold:

    * the speculator is DSpark: ``--spec-type draft-dspark``, or no
      ``--spec-type`` and a ``dflash`` file with ``markov_w1.weight`` (the
      server's auto-detection).  ``draft-dflash`` never refuses: DFlash cuts its
      draft where a token's probability falls below p_min;
    * ``p_min > 0`` (the caller's condition: this answers for any p_min above 0);
    * the draft has a ``dflash.has_confidence_head`` key whose value is not
      true.  A file without the key counts as having a confidence head, whether
      or not it has a ``conf_proj`` tensor.

    It throws "DSpark draft has no confidence head: please set
    --spec-draft-p-min 0"; llama-server catches it, logs "failed to initialize
    speculative decoding context: <that>" and goes on serving with no
    speculative decoding at all (no draft_n in its timings).  It exits only when
    synthetic acceptance was asked for.  ``spec_type`` is the ``--spec-type``
    the server gets (None or "auto": none, the server detects it from the file).
    Only the file's header is read, skipping its tokenizer arrays.
    """
    kv, tensors = scan_header(draft_path)
    if kv.get("general.architecture") != ARCH:
        return None
    if spec_type in (None, "", "auto"):
        is_dspark = "markov_w1.weight" in tensors
    else:
        is_dspark = spec_type == "draft-dspark"
    if not is_dspark:
        return None
    key = f"{ARCH}.has_confidence_head"
    if key not in kv or _as_text(kv[key]) == "true":
        return None
    return P_MIN_REFUSAL


def _as_text(v: Any) -> str:
    """A metadata value as llama.cpp prints it for ``llama_model_meta_val_str``: a bool "true"/"false", a string itself."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if isinstance(v, str) else repr(v)


#: struct formats of GGUF's scalar value types (gguf.GGUFValueType's numbers)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def scan_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], set[str]]:
    """A GGUF file's scalar metadata and tensor names, read from its header without building its arrays.

    gguf.GGUFReader parses every tokenizer array (over a second for a 49k-token
    vocabulary); a config check needs a few scalars and whether a tensor exists.
    """
    p = Path(path)
    try:
        with open(p, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[:4] != b"GGUF":
                raise ModelFileError(f"{p}: not a GGUF file (no GGUF magic)")
            pos = 8  # magic, version
            n_tensors, n_kv = struct.unpack_from("<QQ", m, pos)
            pos += 16

            def string(at: int) -> tuple[str, int]:
                (n,) = struct.unpack_from("<Q", m, at)
                return m[at + 8:at + 8 + n].decode("utf-8", "replace"), at + 8 + n

            def skip(vtype: int, at: int) -> int:
                if vtype in _SCALAR:
                    return at + struct.calcsize(_SCALAR[vtype])
                if vtype == _STRING:
                    (n,) = struct.unpack_from("<Q", m, at)
                    return at + 8 + n
                if vtype == _ARRAY:
                    etype, count = struct.unpack_from("<IQ", m, at)
                    at += 12
                    if etype in _SCALAR:
                        return at + count * struct.calcsize(_SCALAR[etype])
                    for _ in range(count):
                        at = skip(etype, at)
                    return at
                raise ModelFileError(f"{p}: unknown GGUF value type {vtype} in its header")

            kv: dict[str, Any] = {}
            for _ in range(n_kv):
                key, pos = string(pos)
                (vtype,) = struct.unpack_from("<I", m, pos)
                pos += 4
                if vtype in _SCALAR:
                    (kv[key],) = struct.unpack_from(_SCALAR[vtype], m, pos)
                elif vtype == _STRING:
                    kv[key], _ = string(pos)
                pos = skip(vtype, pos)
            tensors: set[str] = set()
            for _ in range(n_tensors):
                name, pos = string(pos)
                (n_dims,) = struct.unpack_from("<I", m, pos)
                pos += 4 + 8 * n_dims + 4 + 8  # dims, type, offset
                tensors.add(name)
    except (OSError, ValueError, struct.error) as exc:
        raise ModelFileError(f"{p}: cannot read its GGUF header ({exc})") from None
    return kv, tensors
