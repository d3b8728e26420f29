"""What a trace keeps of its models' names, and the ``specview run`` line that re-runs it.

A run names its models the way the user typed them (``ollama:qwen3:8b``,
``demo:Q4_K_M``, a path); the engine loads a file.  The trace's
``config.models`` block keeps both, with the file's size and header hash, so
a report can be re-run on another machine by name and checked to be the same
file there::

    "models": {"target": {"name": "ollama:qwen3:8b", "path": ".../blobs/sha256-...",
                          "size": 5027783488, "header_hash": "9c1e..."}, "draft": {...}}
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from ..errors import SpecviewError
from ..llama_flags import _line
from .files import open_regular, read_text
from .header import read_header

#: the trace's ``config`` key that holds the block
MODELS_KEY = "models"
ROLES = ("target", "draft")


def _obj(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def model_record(name: str, path: str | None) -> dict[str, Any]:
    """``{"name", "path", "size", "header_hash", "sha256"}`` for a model named ``name`` that loaded from ``path``
    (size and hash None where the file cannot be read: the name and path are still worth keeping)."""
    rec: dict[str, Any] = {"name": name, "path": path, "size": None, "header_hash": None}
    if not path:
        return rec
    try:
        info = read_header(path)
        rec.update(size=info.size, header_hash=info.header_hash)
    except SpecviewError:
        try:
            rec["size"] = os.stat(path).st_size
        except OSError:
            pass
    digest = file_sha256(path)
    if digest:
        rec["sha256"] = digest
    return rec


def file_sha256(path: str) -> str | None:
    """The SHA-256 of a model file, as upstream bug reports ask for it; None for a folder or an unreadable file.

    An Ollama blob is named by its digest (``sha256-<hex>``); any other file is hashed once and the digest kept
    in specview's cache, by path, size and modification time, so a run of a file hashed before costs a stat.
    """
    import hashlib
    import json
    import re

    from ..jsonfile import write_atomic
    from ..paths import cache_dir

    named = re.fullmatch(r"sha256[-:]([0-9a-f]{64})", os.path.basename(path))
    if named:
        return named.group(1)
    try:
        st = os.stat(path)
        if not os.path.isfile(path):
            return None
        key = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}"
        store = cache_dir() / "sha256.json"
        try:
            known = json.loads(read_text(store, 64 << 20))
        except (OSError, ValueError, RecursionError):
            known = {}
        if not isinstance(known, dict):
            known = {}
        if isinstance(known.get(key), str):
            return known[key]
        h = hashlib.sha256()
        with os.fdopen(open_regular(path), "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        known[key] = h.hexdigest()
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(store, json.dumps(known, indent=0))
        except (OSError, SpecviewError):
            pass
        return known[key]
    except OSError:
        return None


def record_models(trace: Any) -> Any:
    """``trace`` (or None) with its ``config.models`` block: each model's name as given and the file it
    loaded (as the engine recorded it in ``trace.models``), with its size and header hash.  Never raises:
    a trace is worth more than this block."""
    if trace is None:
        return trace
    try:
        config, models = trace.config, _obj(getattr(trace, "models", None))
        block = dict(_obj(config.get(MODELS_KEY)))
        for role in ROLES:
            name = config.get(role)
            if not isinstance(name, str) or not name:
                continue
            path = _obj(models.get(role)).get("path")
            path = path if isinstance(path, str) else None
            old = _obj(block.get(role))
            if old.get("name") == name and old.get("path") == path and path is not None:
                continue
            block[role] = model_record(name, path)
        if block:
            config[MODELS_KEY] = block
    except Exception:  # noqa: BLE001 - recording names must never lose the run
        pass
    return trace


def _flag_words(f: Any, value: Any, default: Any) -> list[str]:
    flags = f.metadata.get("flags") or ()
    if not flags or value is None or value == default:
        return []
    if isinstance(value, bool):
        if value:
            return [flags[0]]
        off = f.metadata.get("off_flags") or ()
        if off:
            return [off[0]]
        long = next((x for x in flags if x.startswith("--")), None)
        return [f"--no-{long[2:]}"] if long else []
    return [flags[0], str(value)]


def rerun_command(trace: Any) -> str | None:
    """The ``specview run`` line that re-runs ``trace`` by its models' names, followed by a comment line per
    model that says the file each name resolved to here (size, header hash); None when the trace's settings
    do not read back as a run.  Settings this machine decided (``config.decided``) are left for the other
    machine to decide again."""
    from ..config import EngineSettings, RunConfig, declared, default_of

    raw = _obj(getattr(trace, "config", None))
    try:
        cfg = RunConfig.from_dict(dict(raw))
    except (SpecviewError, TypeError, ValueError):
        return None
    decided = set(_obj(raw.get("decided")))
    words = ["specview", "run"]
    if cfg.backend != "llama.cpp":
        words += ["--engine", cfg.backend]
    skip = {"prompt", "prompt_tokens", "backend"} | decided
    for cls, obj in ((RunConfig, cfg), (EngineSettings, cfg.engine)):
        for f in declared(cls):
            if f.name in skip or (f.name == "draft" and not cfg.uses_draft_model):
                continue
            value = getattr(obj, f.name)
            if "plain" in f.metadata and value == f.metadata["plain"]:
                continue  # a setting left unset that took llama.cpp's plain value
            default = None if f.name in ("target", "draft") else default_of(f)
            words += _flag_words(f, value, default)
    if cfg.prompt_tokens:
        words += ["--tokens", ",".join(str(t) for t in cfg.prompt_tokens)]
    elif cfg.prompt is not None:
        words += ["-p", cfg.prompt]
    line = _line(words)
    notes = []
    block = _obj(raw.get(MODELS_KEY))
    for role in ROLES:
        m = _obj(block.get(role))
        if role == "draft" and not cfg.uses_draft_model or not m.get("path"):
            continue
        size = f"{m['size']} bytes" if isinstance(m.get("size"), int) else "size unknown"
        hh = f", header #{m['header_hash']}" if m.get("header_hash") else ""
        notes.append(f"# {role} {m.get('name')}: {m['path']} ({size}{hh})")
    return "\n".join([line, *notes])
