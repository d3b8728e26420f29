"""Faults planted into mlx-lm, the same way inside an mlx_lm.server process and inside the test process.

* ``near-tie``: every forward pass of more than one token (a verify pass) pushes
  the runner-up of each row whose top two logits are closer than :data:`TAU`
  just above the top one.  Single-token passes are untouched, and the KV cache
  never sees it (only the output logits change): a stand-in for batched
  kernels that round differently and flip near-ties.
* ``rollback``: the speculative loop's cache rollback trims one position too
  few, so a rejected draft stays in the target's KV cache: a state bug.

:func:`launcher` writes an executable that installs a plant and runs
``mlx_lm.server``; give it as the engine's ``server_bin``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

#: rows whose top-1/top-2 logit gap is below this flip in a planted verify pass
TAU = 0.3


def install(kind: str) -> Callable[[], None]:
    """Plant ``kind`` into the imported mlx-lm; return the function that removes it."""
    if kind == "near-tie":
        import mlx.core as mx
        from mlx_lm.models import llama

        orig = llama.Model.__call__

        def flipping(self, inputs, cache=None, input_embeddings=None):
            out = orig(self, inputs, cache=cache, input_embeddings=input_embeddings)
            if inputs.shape[1] > 1:
                srt = mx.sort(out, axis=-1)
                top1, top2 = srt[..., -1:], srt[..., -2:-1]
                flip = (out == top2) & ((top1 - top2) < TAU)
                out = mx.where(flip, top1 + 0.01, out)
            return out

        llama.Model.__call__ = flipping
        return lambda: setattr(llama.Model, "__call__", orig)
    if kind == "rollback":
        import importlib

        gen = importlib.import_module("mlx_lm.generate")  # the package exports a function of the same name

        orig_trim = gen.trim_prompt_cache

        def keep_one(cache, n):
            return orig_trim(cache, max(0, n - 1))

        gen.trim_prompt_cache = keep_one
        return lambda: setattr(gen, "trim_prompt_cache", orig_trim)
    raise ValueError(f"unknown plant {kind!r}")


def launcher(folder: Path, kind: str) -> Path:
    """An executable ``mlx_lm.server`` with ``kind`` planted."""
    path = folder / f"mlx_lm-server-{kind}"
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import mlx_plants\n"
        f"mlx_plants.install({kind!r})\n"
        "from mlx_lm.server import main\n"
        "main()\n",
        encoding="utf-8",
    )
    os.chmod(path, 0o755)
    return path
