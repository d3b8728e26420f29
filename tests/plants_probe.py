"""Probes that die on purpose, for the crash-probe tests: run in a real throwaway worker."""

from __future__ import annotations

import ctypes


def segv(*_args, **_kwargs):
    """What the multi-token decode does on an AMX CPU with repacked weights: a segmentation fault."""
    ctypes.string_at(0)


def fine(*_args, **_kwargs):
    return {"ok": True, "model": "planted.gguf", "n_tokens": 4}
