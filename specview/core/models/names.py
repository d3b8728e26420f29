"""Store names (``ollama:qwen3:8b``, ``hf:org/repo:Q4_K_M``, ...) turned into the model they name."""

from __future__ import annotations

from .info import ModelInfo, Scan

#: the prefixes of names that resolve through a scan of the stores
STORE_PREFIXES = ("ollama:", "hf:", "lmstudio:", "llama.cpp:")


def is_store_name(s: str) -> bool:
    """Whether ``s`` names a model in a store (``ollama:``, ``hf:``, ``lmstudio:``, ``llama.cpp:``), not a path
    or a demo name.  A path that exists is never a store name."""
    raise NotImplementedError


def resolve_name(name: str, kind: str, *, scan: Scan | None = None) -> ModelInfo:
    """The model ``name`` names, of ``kind`` ("gguf" for the llama.cpp engines, "folder" for MLX).

    ``scan`` is a scan already made (else the stores are scanned now).  A
    name that matches nothing, or more than one model, raises a
    :class:`~specview.core.errors.ModelFileError` that lists the candidates
    (the names to type).
    """
    raise NotImplementedError
