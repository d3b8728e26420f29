"""Tiny random-weight drafters for llama.cpp's model-based speculative types, written with the gguf package.

One writer per ``--spec-type`` whose drafter is an architecture of its own:
EAGLE-3 (``eagle3``) and DFlash / DSpark (``dflash``; DSpark adds a Markov
head).  Each is shaped by the target it pairs with (its hidden size, layer
count and vocabulary) and is small enough to load in well under a second.
Their weights are random: they exercise a speculative path, every verify pass
1 + n_drafted tokens wide, and propose tokens the target nearly always rejects.
"""

from __future__ import annotations

import os
from pathlib import Path

from .common import TargetFacts

#: the writer of each spec type's drafter: (module, function, keyword arguments)
WRITERS = {
    "draft-eagle3": ("eagle3", "write_eagle3", {}),
    "draft-dflash": ("dflash", "write_dflash", {}),
    "draft-dspark": ("dflash", "write_dflash", {"dspark": True}),
}


def write_drafter(spec_type: str, target: str | os.PathLike[str] | TargetFacts, out: str | os.PathLike[str], *,
                  seed: int = 0) -> Path:
    """Write a tiny random-weight ``spec_type`` drafter shaped for ``target`` (a GGUF file, or the facts
    :func:`~.common.read_target` read from one) to ``out``, atomically."""
    import importlib

    if spec_type not in WRITERS:
        raise ValueError(f"no tiny drafter for {spec_type}; there are {', '.join(WRITERS)}")
    module, func, kw = WRITERS[spec_type]
    write = getattr(importlib.import_module(f"{__name__}.{module}"), func)
    return write(target, out, seed=seed, **kw)
