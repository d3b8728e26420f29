"""One model's facts from its header: :func:`read_header`, for a GGUF file or a model folder.

Reads are remembered by (path, size, mtime): in this process, and on disk in
specview's cache folder (:class:`HeaderCache`), so a warm scan reads no
header at all.
"""

from __future__ import annotations

import json
import os
import re
import struct
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import SpecviewError
from ..jsonfile import write_atomic
from . import folder as mfolder
from . import gguf
from .files import NotRegular, read_text
from .info import ModelHeaderError, ModelInfo, NotAModel, VocabPrint

#: bumped whenever what a header read records changes, so a cached read is never stale
CACHE_VERSION = 2
_SHARD = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)
#: words in a model's name that say how it was made, not what it is (dropped for its family)
_NOT_FAMILY = re.compile(r"(?i)[-_. ](instruct|chat|it|base|gguf|mlx|hf|\d+(\.\d+)?[bmk]|a\d+(\.\d+)?b|"
                         r"i?q\d[\w]*|f16|bf16|f32|fp16|\d+bit|\d+-bit|v\d+(\.\d+)*)(?=$|[-_. ])")


def shard_of(name: str) -> tuple[int, int] | None:
    """(index, count) of a split GGUF's shard file name (``x-00001-of-00003.gguf``), else None."""
    m = _SHARD.match(name)
    return (int(m["i"]), int(m["n"])) if m else None


def _shards(path: Path) -> list[Path]:
    m = _SHARD.match(path.name)
    if not m:
        return [path]
    n = int(m["n"])
    return [path.with_name(f"{m['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


def family_of(title: str | None, basename: str | None, fallback: str) -> str:
    """A model's family for grouping (``SmolLM2``, ``Qwen3``): its header's ``general.basename`` when it has
    one, else its name (or file name) without the size, quantization and tuning words."""
    if basename:
        b = basename.strip()
        return title.strip()[:len(b)] if title and title.strip().lower().startswith(b.lower()) else b
    text = (title or fallback or "").strip()
    text = re.sub(r"(?i)\.gguf$", "", text)
    prev = None
    while prev != text:
        prev = text
        text = _NOT_FAMILY.sub("", text).strip(" -_.")
    return text or (title or fallback or "?")


def _drafter(hd: gguf.Header) -> tuple[str | None, str | None, int | None]:
    """(kind, target description, the target's hidden width it needs) of an EAGLE-3 / DFlash / DSpark head."""
    arch = hd.arch
    if arch == "eagle3":
        kind = "eagle3"
        width = hd.arch_int("target_hidden_size") or hd.arch_int("embedding_length")
    elif arch in ("dflash", "dspark"):
        kind = "dspark" if (arch == "dspark" or "markov_w1.weight" in hd.tensors) else "dflash"
        width = hd.arch_int("embedding_length")  # a DFlash head borrows the target's embeddings: its own width
    else:
        return None, None, None
    target = hd.get("general.base_model.0.name") or hd.get("general.base_model.0.repo_url")
    if not isinstance(target, str) or not target:
        m = re.search(r"\bfor (\S+)\s*$", str(hd.get("general.name") or ""))
        target = re.sub(r"(?i)\.gguf$", "", m.group(1)) if m else None
    return kind, target, width


def _not_a_model(path: Path, hd: gguf.Header) -> None:
    """Refuse, with what it is, a GGUF that llama.cpp does not run as a model: a multimodal projector, a
    vocabulary-only file (llama.cpp's ``ggml-vocab-*.gguf``), a file of no tensors at all."""
    arch = hd.arch
    if arch is None:
        raise ModelHeaderError(str(path), "a GGUF file with no general.architecture: not a llama.cpp model")
    if arch == "clip":
        raise NotAModel(str(path), "a multimodal projector (architecture clip), not a model to run: "
                                          "llama.cpp takes it beside its model with --mmproj")
    if hd.tensors:
        return
    split = hd.get("split.count")
    if isinstance(split, int) and not isinstance(split, bool) and split > 1 and shard_of(path.name):
        return  # the first shard of a split model may hold the metadata alone (gguf-split --no-tensor-first-split)
    if hd.n_tokens:
        raise NotAModel(str(path), f"a vocabulary-only file ({hd.n_tokens} tokens of a {arch} tokenizer and "
                                          "no weights, as llama.cpp's ggml-vocab-*.gguf): not a model to run")
    raise NotAModel(str(path), "a GGUF file with no tensors: no weights, not a model to run")


def _gguf_info(path: Path, name: str, source: str) -> ModelInfo:
    try:
        hd = gguf.read(path)
    except gguf.GGUFError as exc:
        raise ModelHeaderError(str(path), f"{exc}; not a model llama.cpp can load (re-download or re-convert it)") \
            from None
    arch = hd.arch
    _not_a_model(path, hd)
    shards = _shards(path)
    size = 0
    n_params = hd.n_params
    for i, s in enumerate(shards):
        try:
            size += s.stat().st_size
        except OSError:
            raise ModelHeaderError(str(path), f"shard {s.name} of this split model is missing") from None
        if i:  # the other shards' tensor tables (their metadata is a few keys)
            try:
                n_params += gguf.read(s).n_params
            except (gguf.GGUFError, OSError) as exc:
                raise ModelHeaderError(str(path), f"shard {s.name} cannot be read ({exc})") from None
    kind, target, width = _drafter(hd)
    nextn = hd.arch_int("nextn_predict_layers") or 0
    layers = hd.get(f"{arch}.target_layers")
    title = hd.get("general.name") if isinstance(hd.get("general.name"), str) else None
    basename = hd.get("general.basename") if isinstance(hd.get("general.basename"), str) else None
    tok_model = hd.get("tokenizer.ggml.model")
    vocab = VocabPrint(hd.n_tokens, hd.vocab_digest or "", hd.vocab_texts or "", hd.vocab_blocks,
                       tok_model if isinstance(tok_model, str) else "") if hd.n_tokens is not None else None
    return ModelInfo(
        path=str(path), kind="gguf", name=name, source=source,
        # a head belongs to its target's family
        family=family_of(None, None, target) if kind and target else family_of(title, basename, path.name),
        arch=arch, n_params=n_params or None, size=size,
        quant=hd.quant, n_ctx=hd.arch_int("context_length"), vocab=vocab, mtp=nextn > 0,
        drafter_kind=kind, drafter_for=target, header_hash=hd.header_hash,
        n_embd=width if kind else hd.arch_int("embedding_length"), n_layer=hd.arch_int("block_count"),
        target_layers=tuple(int(x) for x in layers if isinstance(x, int)) if isinstance(layers, list) else (),
        title=title)


def _folder_drafter(cfg: dict[str, Any]) -> str | None:
    words = " ".join(str(a) for a in cfg.get("architectures") or ()) + " " + str(cfg.get("model_type", ""))
    low = words.lower()
    return next((k for k in ("eagle3", "dspark", "dflash") if k in low.replace("-", "")), None)


def _folder_info(path: Path, name: str, source: str) -> ModelInfo:
    try:
        fh = mfolder.read(path)
    except mfolder.FolderError as exc:
        raise ModelHeaderError(str(path), f"{exc}; not a model folder mlx-lm can load") from None
    cfg = fh.config
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg

    def num(*keys: str) -> int | None:
        for k in keys:
            v = text.get(k, cfg.get(k))
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return None

    kind = _folder_drafter(cfg)
    vocab = VocabPrint(fh.n_tokens, fh.vocab_digest or "", fh.vocab_texts or "", fh.vocab_blocks,
                       fh.vocab_model) if fh.n_tokens is not None else None
    arch = cfg.get("model_type") if isinstance(cfg.get("model_type"), str) else None
    target = cfg.get("target_model") or cfg.get("base_model") if kind else None
    layers = cfg.get("target_layer_ids") or cfg.get("target_layers")
    return ModelInfo(
        path=str(path), kind="folder", name=name, source=source,
        family=family_of(None, None, path.name if path.name not in ("", ".") else str(path)), arch=arch,
        n_params=fh.n_params, size=fh.size, quant=fh.quant, n_ctx=num("max_position_embeddings"), vocab=vocab,
        mtp=(num("num_nextn_predict_layers", "mtp_num_hidden_layers") or 0) > 0, drafter_kind=kind,
        drafter_for=str(target) if target else None, header_hash=fh.header_hash,
        n_embd=num("hidden_size"), n_layer=num("num_hidden_layers"),
        target_layers=tuple(x for x in layers if isinstance(x, int)) if isinstance(layers, list) else ())


def _read(path: Path, name: str, source: str) -> ModelInfo:
    try:
        if path.is_dir():
            return _folder_info(path, name, source)
        return _gguf_info(path, name, source)
    except NotRegular as exc:
        raise NotAModel(str(path), exc.strerror) from None
    except OSError as exc:
        raise ModelHeaderError(str(path), f"cannot be read ({exc.strerror or exc})") from None
    except (ValueError, KeyError, TypeError, RecursionError, OverflowError, MemoryError, struct.error) as exc:
        # a header that parses but holds nonsense (a shape that is not a list, a name that is not text)
        raise ModelHeaderError(str(path), f"its header is corrupt ({type(exc).__name__}: {exc})") from None


def stamp(path: Path) -> tuple[int, int]:
    """(size, mtime_ns) a cached read is keyed by: a folder's is its config.json's and newest weight file's."""
    if path.is_dir():
        size, mtime = 0, 0
        for e in os.scandir(path):
            if e.is_file():
                st = e.stat()
                size += st.st_size
                mtime = max(mtime, st.st_mtime_ns)
        return size, mtime
    st = path.stat()
    return st.st_size, st.st_mtime_ns


class HeaderCache:
    """Header reads by path, size and mtime, kept in a JSON file (written atomically, only when it changed).

    A failed read is cached too (its reason), so a corrupt file is not read again on every scan.  What a scan
    has read is saved every :data:`SAVE_EVERY` new reads (and by :meth:`save` at its end, or when it is
    interrupted), so a scan stopped half-way does not read those headers again.
    """

    #: new reads between two saves of the file
    SAVE_EVERY = 64
    #: the largest cache file read back (some 100,000 models)
    MAX_FILE = 256 << 20

    def __init__(self, file: Path | None):
        self.file = file
        self.entries: dict[str, dict[str, Any]] = {}
        self.dirty = 0
        if file is not None:
            try:
                doc = json.loads(read_text(file, self.MAX_FILE))
                if isinstance(doc, dict) and doc.get("version") == CACHE_VERSION and isinstance(doc.get("entries"),
                                                                                                  dict):
                    self.entries = doc["entries"]
            except (OSError, ValueError, RecursionError):
                pass  # no cache yet, a damaged one or not a file: start afresh (it is only a cache)

    def _put(self, key: str, entry: dict[str, Any]) -> None:
        self.entries[key] = entry
        self.dirty += 1
        if self.dirty >= self.SAVE_EVERY:
            self.save(prune=False)

    def lookup(self, path: Path, name: str, source: str) -> tuple[tuple[int, int], ModelInfo | None]:
        """``path``'s (size, mtime) and its cached header (None: not cached, it must be read); raises
        ModelHeaderError when it cannot be stat-ed or its cached read failed."""
        key = str(path)
        try:
            st = stamp(path)
        except OSError as exc:
            raise ModelHeaderError(key, f"cannot be read ({exc.strerror or exc})") from None
        e = self.entries.get(key)
        if isinstance(e, dict) and e.get("size") == st[0] and e.get("mtime") == st[1]:
            try:
                if "error" in e:
                    raise ModelHeaderError(key, str(e["error"]))
                return st, replace(ModelInfo.from_dict(e["info"]), name=name, source=source)
            except (TypeError, KeyError, AttributeError):
                pass  # an entry of another shape: read again
        return st, None

    def record(self, path: Path, st: tuple[int, int], info: ModelInfo | None = None, why: str | None = None) -> None:
        """Remember the read of ``path`` at stamp ``st``: its header ``info``, or ``why`` it failed."""
        entry: dict[str, Any] = {"size": st[0], "mtime": st[1]}
        if info is not None:
            entry["info"] = info.to_dict()
        else:
            entry["error"] = why
        self._put(str(path), entry)

    def read(self, path: Path, name: str, source: str) -> ModelInfo:
        """The header of ``path`` (cached when its size and mtime are unchanged); raises ModelHeaderError."""
        st, info = self.lookup(path, name, source)
        if info is not None:
            return info
        try:
            info = _read(path, name, source)
        except ModelHeaderError as exc:
            self.record(path, st, why=exc.why)
            raise
        self.record(path, st, info)
        return info

    def save(self, *, prune: bool = True) -> None:
        """Write the reads made so far; ``prune`` (at a scan's end) drops the reads of files that are gone
        (deleted models, old temporary homes)."""
        if self.file is None or not self.dirty:
            return
        if prune:
            self.entries = {k: v for k, v in self.entries.items() if os.path.exists(k)}
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.file, json.dumps({"version": CACHE_VERSION, "entries": self.entries}))
            self.dirty = 0
        except (OSError, SpecviewError):
            pass  # an unwritable cache folder costs a cold scan next time, nothing else


_memo: dict[tuple[str, int, int], ModelInfo] = {}
_memo_lock = threading.Lock()


def read_header(path: str | os.PathLike[str], *, name: str | None = None, source: str = "folder") -> ModelInfo:
    """What the header of the GGUF file or model folder at ``path`` says (no weights read).

    ``name`` and ``source`` are what the scan found it as (the path and
    "folder" by default).  A file that is not a model, truncated or corrupt
    raises :class:`~specview.core.models.info.ModelHeaderError` naming the
    file.  Reads are remembered in this process by path, size and mtime.
    """
    p = Path(path).expanduser()
    try:
        size, mtime = stamp(p)
    except OSError as exc:
        raise ModelHeaderError(str(p), f"cannot be read ({exc.strerror or exc})") from None
    key = (str(p), size, mtime)
    with _memo_lock:
        hit = _memo.get(key)
    if hit is None:
        hit = _read(p, str(p), "folder")
        with _memo_lock:
            _memo[key] = hit
    return replace(hit, name=name or str(p), source=source)
