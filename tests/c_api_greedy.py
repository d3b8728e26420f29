"""Greedy decoding written directly against llama-cpp-python's C API, sharing no code with specview.

The reference the llama.cpp engine's tests compare its vanilla arm with: the prompt is prefilled in
chunks of ``chunk`` tokens (n_batch = n_ubatch = chunk), then one token per pass, each the argmax of
the last row.  The weights load as this machine loads them (``door.c_load``: no repack where a run here
decides none), so the reference runs the kernels the engine runs.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import door
import numpy as np


def c_api_greedy(path: str | Path, prompt: list[int], n: int, *, n_ctx: int, chunk: int, threads: int,
                 ignore_eos: bool = False) -> list[int]:
    """``n`` greedy tokens after ``prompt`` on ``path``, at ``threads`` threads (the thread count can move logits).

    ``ignore_eos``: as llama.cpp's ``--ignore-eos``, every token ``llama_vocab_is_eog`` names is banned."""
    import llama_cpp as ll

    model = door.c_load(ll, path)
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, chunk, chunk
    cp.n_threads = cp.n_threads_batch = threads
    ctx = door.c_context(ll, model, cp)
    vocab = ll.llama_model_get_vocab(model)
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    eog = [i for i in range(n_vocab) if ll.llama_vocab_is_eog(vocab, i)] if ignore_eos else []
    batch = ll.llama_batch_init(chunk, 0, 1)
    pos = 0

    def decode(toks: list[int]) -> np.ndarray:
        nonlocal pos
        for i, t in enumerate(toks):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(toks) - 1
        batch.n_tokens = len(toks)
        assert ll.llama_decode(ctx, batch) == 0
        pos += len(toks)
        p = ll.llama_get_logits_ith(ctx, len(toks) - 1)
        return np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)).copy()

    for i in range(0, len(prompt), chunk):
        row = decode(prompt[i:i + chunk])
    out = []
    for _ in range(n):
        row[eog] = -np.inf
        t = int(np.argmax(row))
        out.append(t)
        row = decode([t])
    ll.llama_batch_free(batch)
    ll.llama_free(ctx)
    ll.llama_model_free(model)
    return out
