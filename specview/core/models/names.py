"""Store names (``ollama:qwen3:8b``, ``hf:org/repo:Q4_K_M``, ...) turned into the model they name.

A store name is ``<store>:<what the store calls it>[:<selector>]``: the
selector picks among a repository's files by quantization (``:Q4_K_M``, any
case) or by file name (``:model-q4_k_m.gguf``, or its path in the
repository).  ``ollama:`` names are ollama's own (``qwen3:8b``; ``qwen3`` for
``qwen3:latest``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelFileError
from .info import ModelInfo, Scan

#: the prefixes of names that resolve through a scan of the stores, and the source each names
STORE_PREFIXES = ("ollama:", "hf:", "lmstudio:", "llama.cpp:")
_SOURCE = {"ollama:": "ollama", "hf:": "hf", "lmstudio:": "lmstudio", "llama.cpp:": "llama.cpp"}
_STORE_LABEL = {"ollama": "ollama's store", "hf": "the Hugging Face cache", "lmstudio": "LM Studio's models",
                "llama.cpp": "llama.cpp's download cache"}
_KIND_LABEL = {"gguf": "a GGUF file (the llama.cpp engines)", "folder": "a model folder (the MLX engines)"}


def _prefix(s: str) -> str | None:
    low = s.lower()
    return next((p for p in STORE_PREFIXES if low.startswith(p)), None)


def is_store_name(s: str) -> bool:
    """Whether ``s`` names a model in a store (``ollama:``, ``hf:``, ``lmstudio:``, ``llama.cpp:``), not a path
    or a demo name.  A path that exists is never a store name."""
    if not isinstance(s, str) or _prefix(s) is None or len(s) <= len(_prefix(s) or ""):
        return False
    try:
        return not os.path.exists(s)
    except (OSError, ValueError):
        return True


def _matches(m: ModelInfo, selector: str) -> bool:
    sel = selector.lower()
    p = Path(m.path)
    return sel in {(m.quant or "").lower(), p.name.lower(), p.stem.lower()} or \
        any(a.lower().endswith(":" + sel) for a in (m.name, *m.aliases))


def candidates(name: str, scan: Scan) -> list[ModelInfo]:
    """The models of ``scan`` that ``name`` may mean (before the engine's kind is considered)."""
    pre = _prefix(name)
    if pre is None:
        return []
    low = name.lower()
    exact = [m for m in scan.models if low in (m.name.lower(), *(a.lower() for a in m.aliases))]
    if exact:
        return exact
    source = _SOURCE[pre]
    mine = [m for m in scan.models if m.source == source]
    # the name without a selector: every model of that repository (or ollama model, any tag)
    head = [m for m in mine if m.name.lower().startswith(low + ":")]
    if head:
        return head
    rest = name[len(pre):]
    if source != "ollama" and ":" in rest:  # repository:selector
        repo, selector = rest.split(":", 1)
        group = (pre + repo).lower()
        in_repo = [m for m in mine if m.name.lower() == group or m.name.lower().startswith(group + ":")]
        return [m for m in in_repo if _matches(m, selector)]
    return []


#: how long a scan made to resolve a name serves the next names (a run resolves its target and draft,
#: then each engine resolves them again): a name it cannot resolve always scans afresh
RESCAN_AFTER = 30.0
_last: list = []  # [(monotonic time, Scan)]


def _recent_scan(name: str, kind: str) -> Scan:
    import time

    from .scan import default_roots
    from .scan import scan as do_scan

    roots = default_roots()
    if _last and time.monotonic() - _last[0][0] < RESCAN_AFTER and _last[0][1].roots == roots:
        s = _last[0][1]
        if any(m.kind == kind and os.path.exists(m.path) for m in candidates(name, s)):
            return s
    s = do_scan(roots)
    _last[:] = [(time.monotonic(), s)]
    return s


def resolve_name(name: str, kind: str, *, scan: Scan | None = None) -> ModelInfo:
    """The model ``name`` names, of ``kind`` ("gguf" for the llama.cpp engines, "folder" for MLX).

    ``scan`` is a scan already made (else the stores are scanned now, with the
    header cache).  A name that matches nothing, or more than one model, raises
    a :class:`~specview.core.errors.ModelFileError` that lists the candidates
    (the names to type).
    """
    if _prefix(name) is None:
        raise ModelFileError(f"{name}: not a store name (they start with {', '.join(STORE_PREFIXES)})")
    if scan is None:
        scan = _recent_scan(name, kind)
    source = _SOURCE[_prefix(name) or ""]
    found = candidates(name, scan)
    fits = [m for m in found if m.kind == kind]
    if len(fits) == 1:
        return fits[0]
    if len(fits) > 1:
        raise ModelFileError(f"{name} matches {len(fits)} models; name one of them: "
                             + ", ".join(m.name for m in fits))
    if found:
        raise ModelFileError(f"{name} is {_KIND_LABEL.get(found[0].kind, found[0].kind)}, and this engine needs "
                             f"{_KIND_LABEL.get(kind, kind)}: pick another model or another --engine")
    mine = [m.name for m in scan.models if m.source == source and m.kind == kind]
    where = [r.path for r in scan.roots if r.source == source]
    if mine:
        shown = ", ".join(mine[:20]) + (f" and {len(mine) - 20} more" if len(mine) > 20 else "")
        raise ModelFileError(f"{name}: no such model in {_STORE_LABEL[source]}; it has {shown} "
                             "(specview models lists them all)")
    looked = f" (looked in {', '.join(where)})" if where else " (no such folder on this machine)"
    raise ModelFileError(f"{name}: {_STORE_LABEL[source]} has no {kind} models{looked}; "
                         "give a file path, or see specview models")
