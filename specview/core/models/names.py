"""Store names (``ollama:qwen3:8b``, ``hf:org/repo:Q4_K_M``, ...) turned into the model they name.

A store name is ``<store>:<what the store calls it>[:<selector>]``: the
selector picks among a repository's files by quantization (``:Q4_K_M``, any
case) or by file name (``:model-q4_k_m.gguf``, or its path in the
repository).  ``ollama:`` names are ollama's own (``qwen3:8b``; ``qwen3`` means
``qwen3:latest``, as ollama reads it, never another tag); ``hf:`` and
``llama.cpp:`` take llama.cpp's ``-hf org/repo:TAG`` (the file whose name
ends with the tag: ``:UD-Q2_K_XL``), and ``lmstudio:`` LM Studio's own
``publisher/repo/file.gguf``.  A file several stores hold answers to every
store's name for it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import ModelFileError
from .info import ModelInfo, Scan
from .stores import OLLAMA_NAMESPACE, OLLAMA_REGISTRY

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


def _names(m: ModelInfo) -> tuple[str, ...]:
    return tuple(n.lower() for n in (m.name, *m.aliases))


_SHARD_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")


def _by_file(m: ModelInfo, sel: str) -> bool:
    """Whether selector ``sel`` (lower case) names ``m``'s file: its name, its stem, its path in the repository
    (LM Studio's ``pub/repo/file.gguf``), a folder of it named for the tag (``UD-Q2_K_XL/``), or the tag its
    name ends with, as llama.cpp's ``-hf org/repo:TAG`` and ollama's ``hf.co/org/repo:TAG`` pick a file
    (``Qwen3-8B-UD-Q2_K_XL.gguf``, shards ``-00001-of-00003`` aside)."""
    p = Path(m.path)
    posix = p.as_posix().lower()
    stem = _SHARD_SUFFIX.sub("", p.stem.lower())
    if sel in (p.name.lower(), p.stem.lower(), stem) or posix.endswith("/" + sel.strip("/")):
        return True
    if "/" not in sel and sel in (part.lower() for part in p.parent.parts[-2:]):
        return True
    return any(stem.endswith(sep + sel) for sep in "-._")


def _matches(m: ModelInfo, selector: str) -> bool:
    sel = selector.lower()
    return _by_file(m, sel) or sel == (m.quant or "").lower() or any(n.endswith(":" + sel) for n in _names(m))


def normal_name(name: str) -> str:
    """``name`` as the scan names models: ollama's long forms (``registry.ollama.ai/library/qwen3``,
    ``library/qwen3``) cut to ollama's short one, a tag-less ollama name given its ``:latest`` (as ollama
    reads it), and a Hugging Face host (``hf:hf.co/org/repo``, ``huggingface.co/``) dropped."""
    pre = _prefix(name)
    if pre is None:
        return name
    rest = name[len(pre):]
    if pre == "ollama:":
        for head in (f"{OLLAMA_REGISTRY}/", f"{OLLAMA_NAMESPACE}/"):
            if rest.lower().startswith(head):
                rest = rest[len(head):]
        if ":" not in rest.rsplit("/", 1)[-1]:
            rest += ":latest"
    elif pre == "hf:":
        for host in ("https://", "hf.co/", "huggingface.co/"):
            if rest.lower().startswith(host):
                rest = rest[len(host):]
    return pre + rest


def candidates(name: str, scan: Scan) -> list[ModelInfo]:
    """The models of ``scan`` that ``name`` may mean (before the engine's kind is considered)."""
    pre = _prefix(name)
    if pre is None:
        return []
    low = name.lower()
    exact = [m for m in scan.models if low in _names(m)]
    if exact:
        return exact
    low = normal_name(name).lower()
    exact = [m for m in scan.models if low in _names(m)]
    if exact or pre == "ollama:":  # ollama names a model by its exact tag; no tag means :latest
        return exact
    mine = [m for m in scan.models if any(n.startswith(pre) for n in _names(m))]
    # the name without a selector: every model of that repository
    head = [m for m in mine if any(n.startswith(low + ":") for n in _names(m))]
    if head:
        return head
    rest = low[len(pre):]
    if ":" in rest:  # repository:selector
        repo, selector = rest.split(":", 1)
    elif rest.count("/") >= 2:  # LM Studio's (and the hub's) path form: publisher/repo/file.gguf
        parts = rest.split("/")
        repo, selector = "/".join(parts[:2]), "/".join(parts[2:])
    else:
        return []
    group = pre + repo
    in_repo = [m for m in mine if any(n == group or n.startswith(group + ":") for n in _names(m))]
    by_file = [m for m in in_repo if _by_file(m, selector)]  # a file's own tag before the header's file type
    return by_file or [m for m in in_repo if _matches(m, selector)]


def _skipped(name: str, scan: Scan) -> str | None:
    """The problem the scan had with the file ``name`` names (a projector, a FIFO, a truncated download), when
    one of its problems lies where that store keeps it."""
    pre = _prefix(name)
    if pre is None:
        return None
    rest = normal_name(name)[len(pre):]
    source = _SOURCE[pre]
    repo = rest.split(":", 1)[0] if source != "ollama" else rest
    parts = [x for x in repo.split("/") if x]
    if source == "ollama":
        model, _, tag = rest.rpartition(":")
        bits = model.split("/")
        bits = ([OLLAMA_REGISTRY, OLLAMA_NAMESPACE] if len(bits) == 1 else [OLLAMA_REGISTRY] if len(bits) == 2
                else []) + bits
        places = ["/".join(["manifests", *bits, tag])]
    elif source == "lmstudio":
        places = ["/".join(parts[:2])]
    else:
        places = ["models--" + "--".join(parts[:2])]
    for r in scan.roots:
        if r.source != source:
            continue
        for place in places:
            top = os.path.join(r.path, place)
            hit = next((p for p in scan.problems if p.path == top or p.path.startswith(top + os.sep)), None)
            if hit is not None:
                return str(hit)
    return None


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
    if source == "ollama" and normal_name(name).lower().endswith(":latest") and \
            not name.lower().endswith(":latest"):
        stem = normal_name(name)[:-len("latest")].lower()
        tags = [m.name for m in scan.models if any(n.startswith(stem) for n in _names(m))]
        if tags:
            raise ModelFileError(f"{name}: ollama reads a name without a tag as {name[len('ollama:'):]}:latest, "
                                 f"which is not in ollama's store; name a tag: {', '.join(tags[:10])}")
    skipped = _skipped(name, scan)
    if skipped is not None:
        raise ModelFileError(f"{name}: the scan skipped it: {skipped}")
    mine = [m.name for m in scan.models if m.source == source and m.kind == kind]
    where = [r.path for r in scan.roots if r.source == source]
    if mine:
        shown = ", ".join(mine[:20]) + (f" and {len(mine) - 20} more" if len(mine) > 20 else "")
        raise ModelFileError(f"{name}: no such model in {_STORE_LABEL[source]}; it has {shown} "
                             "(specview models lists them all)")
    looked = f" (looked in {', '.join(where)})" if where else " (no such folder on this machine)"
    raise ModelFileError(f"{name}: {_STORE_LABEL[source]} has no {kind} models{looked}; "
                         "give a file path, or see specview models")
