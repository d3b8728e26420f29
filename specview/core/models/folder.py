"""A model folder's header (``config.json``, the tokenizer, the safetensors headers): what mlx-lm would load.

Only small files are read whole (``config.json``, ``tokenizer.json``, each
bounded); of a ``.safetensors`` file only its JSON header (the 8-byte length
and the table of tensor shapes), never the weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import NotRegular, TooLarge, kind_of, open_regular, read_small

MAX_JSON = 64 << 20  # a tokenizer.json of a 256k vocabulary is ~20 MB
MAX_ST_HEADER = 100 << 20
#: token ids a tokenizer.json may give (the largest real vocabularies are some 262,000 tokens)
MAX_VOCAB = 1 << 22
#: a folder is a model folder when it holds both of these kinds of file
CONFIG = "config.json"
WEIGHTS_SUFFIX = ".safetensors"
#: tokens per block of the vocabulary's block digests (as for GGUF files)
BLOCK = 256
_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


class FolderError(ValueError):
    """The folder's files are not a readable model; the message says which file and why."""


@dataclass
class FolderHeader:
    config: dict[str, Any]
    n_params: int | None
    size: int
    quant: str | None
    n_tokens: int | None
    vocab_digest: str | None
    vocab_texts: str | None
    header_hash: str
    vocab_blocks: tuple[str, ...] = ()
    vocab_model: str = ""


def is_model_folder(names: set[str]) -> bool:
    """Whether a folder whose file names are ``names`` is a model folder (a config and safetensors weights)."""
    return CONFIG in names and any(n.endswith(WEIGHTS_SUFFIX) for n in names)


def _json(path: Path) -> Any:
    try:
        raw = read_small(path, MAX_JSON)
    except NotRegular as exc:
        raise FolderError(f"{path.name} is {exc.what}, not a file") from None
    except TooLarge:
        raise FolderError(f"{path.name} is more than {MAX_JSON} bytes, more than a model's {path.name} ever is") \
            from None
    try:
        return json.loads(raw), raw
    except (ValueError, RecursionError) as exc:
        raise FolderError(f"{path.name} is not valid JSON ({exc})") from None


def _st_header(path: Path, size: int) -> tuple[dict[str, Any], bytes]:
    try:
        fd = open_regular(path)
    except NotRegular as exc:
        raise FolderError(f"{path.name} is {exc.what}, not a file") from None
    with os.fdopen(fd, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise FolderError(f"{path.name}: truncated ({size} bytes), no safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_ST_HEADER or n + 8 > size:
            raise FolderError(f"{path.name}: its header claims {n} bytes, the file has {size}: corrupt or truncated")
        raw = fh.read(n)
    try:
        table = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise FolderError(f"{path.name}: its safetensors header is not valid JSON") from None
    if not isinstance(table, dict):
        raise FolderError(f"{path.name}: its safetensors header is not a table of tensors")
    return table, raw


def _count(table: dict[str, Any], bits: int | None) -> int:
    n = 0
    for name, t in table.items():
        if name == "__metadata__" or not isinstance(t, dict):
            continue
        if bits and (name.endswith(".scales") or name.endswith(".biases")):
            continue  # a quantized layer's group scales and biases are not parameters
        shape = t.get("shape") or []
        k = 1
        for d in shape:
            k *= int(d) if isinstance(d, int) and d >= 0 else 0
        if bits and t.get("dtype") == "U32":
            k *= 32 // bits  # packed quantized weights: 32 / bits values per uint32
        n += k
    return n


def _vocab(folder: Path) -> tuple[int | None, str | None, str | None, tuple[str, ...], str]:
    """(size, digest of strings and special flags, digest of strings, block digests, tokenizer kind) from
    ``tokenizer.json``."""
    p = folder / "tokenizer.json"
    if not p.is_file():
        return None, None, None, (), ""
    tok, _ = _json(p)
    model = tok.get("model") if isinstance(tok, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, list):  # unigram: [[piece, score], ...]
        by_id = {i: (v[0] if isinstance(v, list) and v else str(v)) for i, v in enumerate(vocab)}
    elif isinstance(vocab, dict):
        by_id = {int(i): str(t) for t, i in vocab.items() if isinstance(i, int)}
    else:
        raise FolderError("tokenizer.json has no model.vocab")
    special = set()
    for a in tok.get("added_tokens") or ():
        if isinstance(a, dict) and isinstance(a.get("id"), int):
            by_id[a["id"]] = str(a.get("content", ""))
            if a.get("special"):
                special.add(a["id"])
    n = max(by_id) + 1 if by_id else 0
    if n > MAX_VOCAB or (by_id and min(by_id) < 0):
        raise FolderError(f"tokenizer.json gives token id {max(by_id) if n > MAX_VOCAB else min(by_id)}, "
                          f"beyond any real vocabulary (0 to {MAX_VOCAB - 1})")
    full, texts, block, blocks = hashlib.sha256(), hashlib.sha256(), hashlib.sha256(), []
    for i in range(n):
        piece = by_id.get(i, "").encode("utf-8", "surrogatepass")
        for h in (full, texts, block):
            h.update(piece)
            h.update(b"\0")
        if (i + 1) % BLOCK == 0:
            blocks.append(block.hexdigest()[:8])
            block = hashlib.sha256()
    full.update(b"\1special\1" + ",".join(map(str, sorted(special))).encode())
    kind = str(model.get("type") or "").lower()
    return n, full.hexdigest()[:16], texts.hexdigest()[:16], tuple(blocks), kind


def read(folder: str | os.PathLike[str]) -> FolderHeader:
    """The header of the model folder ``folder``; OSError when it cannot be read, FolderError when its files
    are not a model."""
    folder = Path(folder)
    config, raw_config = _json(folder / CONFIG)
    if not isinstance(config, dict):
        raise FolderError("config.json is not a JSON object")
    h = hashlib.sha256(raw_config)
    q = config.get("quantization") if isinstance(config.get("quantization"), dict) else None
    bits = q.get("bits") if q and isinstance(q.get("bits"), int) and 0 < q.get("bits") <= 32 else None
    size, n_params, weights = 0, 0, 0
    for e in sorted(os.scandir(folder), key=lambda e: e.name):
        if not e.is_file():
            try:
                what = kind_of(e.stat().st_mode)
            except OSError:
                what = None
            if what and e.name.endswith(WEIGHTS_SUFFIX):
                raise FolderError(f"{e.name} is {what}, not a file")
            continue
        st = e.stat()
        size += st.st_size
        if e.name.endswith(WEIGHTS_SUFFIX):
            table, raw = _st_header(Path(e.path), st.st_size)
            h.update(raw)
            n_params += _count(table, bits)
            weights += 1
    if not weights:
        raise FolderError("no .safetensors weights in it")
    if bits:
        quant = f"{bits}bit"
    else:
        dt = config.get("torch_dtype") or config.get("dtype")
        quant = _DTYPES.get(str(dt), str(dt).upper()) if dt else None
    n_tokens, digest, texts, blocks, kind = _vocab(folder)
    return FolderHeader(config=config, n_params=n_params or None, size=size, quant=quant, n_tokens=n_tokens,
                        vocab_digest=digest, vocab_texts=texts, header_hash=h.hexdigest()[:16], vocab_blocks=blocks,
                        vocab_model=kind)
