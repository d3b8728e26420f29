"""A bounded, pure-Python reader of a GGUF file's header: metadata and tensor table, never the weights.

The file is memory-mapped and only the header's pages are touched, so a
30 GB model costs what its header costs (a few MB for a large vocabulary).
Every length read from the file is checked against the file's size and
against limits no real model comes near, so a truncated, corrupt or hostile
file raises :class:`GGUFError` (a ValueError) and never allocates or reads
without bound.  The vocabulary is not kept: its token strings and types are
hashed as they are read (:class:`Header.vocab_digest`).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from .files import opened

GGUF_MAGIC = b"GGUF"
#: limits far beyond any real model, below what a corrupt count could make us allocate
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 17
MAX_ARRAY = 1 << 24
MAX_STRING = 1 << 26
MAX_DIMS = 8
MAX_NESTING = 8
#: the work one header may cost, whatever it claims: bytes of metadata and tensor table (a 262k-token vocabulary
#: with its merges is under 20 MB), strings walked one by one (tokens and merges: under a million in any real
#: model), and elements of nested arrays (which no llama.cpp writer makes)
MAX_HEADER = 64 << 20
MAX_STRINGS = 1 << 22
MAX_NESTED = 1 << 16
#: tokens per block of the vocabulary's block digests
BLOCK = 256
#: arrays of numbers kept as values (longer ones are skipped, or hashed for the vocabulary; arrays of strings
#: are always skipped: their length is the value)
KEEP_ARRAY = 4096

# GGUF value types
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

#: llama.cpp's ``llama_ftype`` names (``general.file_type``)
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}


#: ggml tensor types: (elements per block, bytes per block), as ggml.c's type traits (F32, F16, Q4_0 ... MXFP4)
TYPE_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
}
DEFAULT_ALIGNMENT = 32


class GGUFError(ValueError):
    """The bytes are not a readable GGUF header; the message says where and what."""


@dataclass
class Header:
    """What a GGUF header holds, minus the weights and the vocabulary's strings."""

    version: int
    meta: dict[str, Any] = field(default_factory=dict)
    #: tensor name -> number of elements
    tensors: dict[str, int] = field(default_factory=dict)
    n_tokens: int | None = None
    #: sha256 of the token strings and token types (16 hex digits), and of the strings alone
    vocab_digest: str | None = None
    vocab_texts: str | None = None
    vocab_blocks: tuple[str, ...] = ()
    #: sha256 of the header's bytes (metadata and tensor table), 16 hex digits
    header_hash: str = ""
    header_bytes: int = 0
    #: where the last tensor's data ends (None when a tensor's type is one this reader does not know)
    data_end: int | None = None

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key, default)

    @property
    def arch(self) -> str | None:
        a = self.meta.get("general.architecture")
        return a if isinstance(a, str) and a else None

    def arch_int(self, key: str) -> int | None:
        """``{arch}.{key}`` as an int (None when absent or not a number)."""
        v = self.meta.get(f"{self.arch}.{key}")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        return int(v)

    @property
    def quant(self) -> str | None:
        ft = self.meta.get("general.file_type")
        if isinstance(ft, bool) or not isinstance(ft, int):
            return None
        return FILE_TYPES.get(ft, f"ftype {ft}")

    @property
    def n_params(self) -> int:
        return sum(self.tensors.values())


class _Reader:
    def __init__(self, buf: Any, size: int):
        self.buf, self.size, self.pos = buf, size, 0
        #: where the header may end: the file's end, or the work bound
        self.end = min(size, MAX_HEADER)
        self.strings_left, self.nested_left = MAX_STRINGS, MAX_NESTED

    def past_end(self, n: int, what: str) -> GGUFError:
        if self.pos + n > self.size:
            return GGUFError(f"truncated: {what} at byte {self.pos} needs {n} bytes, the file has {self.size}")
        return GGUFError(f"{what} at byte {self.pos} takes the header past {MAX_HEADER >> 20} MB, beyond any real "
                         "model's: refused unread")

    def need(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.end:
            raise self.past_end(max(n, 0), what)
        p = self.pos
        self.pos += n
        return p

    def spend(self, n: int, budget: str, what: str) -> None:
        """Take ``n`` elements walked one by one from ``budget`` ("strings_left" or "nested_left")."""
        left = getattr(self, budget)
        if n > left:
            limit = MAX_STRINGS if budget == "strings_left" else MAX_NESTED
            kind = "strings" if budget == "strings_left" else "nested arrays"
            raise GGUFError(f"{what} at byte {self.pos} takes the header past {limit} {kind}, beyond any real "
                            "model's: refused")
        setattr(self, budget, left - n)

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        return struct.unpack_from(fmt, self.buf, self.need(n, what))[0]

    def count(self, wide: bool, limit: int, what: str) -> int:
        n = self.scalar("<Q" if wide else "<I", what)
        if n > limit:
            raise GGUFError(f"{what} is {n} at byte {self.pos}, beyond any real model's ({limit})")
        return n

    def string_span(self, wide: bool, what: str) -> tuple[int, int]:
        n = self.count(wide, MAX_STRING, f"length of {what}")
        return self.need(n, what), n

    def string(self, wide: bool, what: str) -> str:
        p, n = self.string_span(wide, what)
        return bytes(self.buf[p:p + n]).decode("utf-8", "replace")


def _value(r: _Reader, vtype: int, wide: bool, key: str, hashers: tuple[Any, ...] | None = None,
           depth: int = 0) -> Any:
    """The value of ``key`` (an array past :data:`KEEP_ARRAY` elements, or one hashed into ``hashers``: its
    length)."""
    if vtype in _SCALARS:
        return r.scalar(_SCALARS[vtype], f"value of {key}")
    if vtype == _STRING:
        return r.string(wide, f"value of {key}")
    if vtype != _ARRAY:
        raise GGUFError(f"{key}: unknown value type {vtype} at byte {r.pos}")
    etype = r.scalar("<I", f"element type of {key}")
    n = r.count(wide, MAX_ARRAY, f"length of {key}")
    if etype == _STRING:  # merges, tags, languages: nothing discovery reads, walked at the fast loop's speed
        r.spend(n, "strings_left", f"{key}'s {n} strings")
        _strings(r, wide, n, f"an element of {key}")
        return n
    if etype in _SCALARS:
        size = struct.calcsize(_SCALARS[etype])
        p = r.need(n * size, f"elements of {key}")
        if hashers is not None:
            with memoryview(r.buf) as mv:  # no copy of the array
                for h in hashers:
                    h.update(mv[p:p + n * size])
            return n
        if n <= KEEP_ARRAY:
            return list(struct.unpack_from(f"<{n}{_SCALARS[etype][1]}", r.buf, p))
        return n
    if etype == _ARRAY:  # nested arrays: skipped, element by element (bounded by the file's size)
        if depth >= MAX_NESTING:
            raise GGUFError(f"{key}: arrays nested deeper than {MAX_NESTING} at byte {r.pos}")
        r.spend(n, "nested_left", f"{key}'s {n} nested arrays")
        for _ in range(n):
            _value(r, _ARRAY, wide, key, depth=depth + 1)
        return n
    raise GGUFError(f"{key}: unknown array element type {etype} at byte {r.pos}")


def _strings(r: _Reader, wide: bool, n: int, what: str, on_block: Any = None) -> None:
    """Walk ``n`` strings from the reader's position; ``on_block(bytes, full)`` gets each :data:`BLOCK` of them
    (and the last, shorter one: ``full`` False) joined as ``s0 NUL s1 NUL ...`` with a final NUL.

    The loop checks nothing per string (a vocabulary has 150,000 of them): a length past the end makes the
    next length unreadable or leaves the position past the end, and both are caught once."""
    buf, size, pos = r.buf, r.end, r.pos
    unpack = struct.Struct("<Q" if wide else "<I").unpack_from
    width = 8 if wide else 4
    try:
        if on_block is None:
            for _ in range(n):
                pos += width + unpack(buf, pos)[0]
        else:
            for k in range(0, n, BLOCK):  # one block at a time: memory for 256 strings, whatever n is
                pieces: list[bytes] = []
                keep = pieces.append
                for _ in range(min(BLOCK, n - k)):
                    ln = unpack(buf, pos)[0]
                    pos += width
                    keep(buf[pos:pos + ln])
                    pos += ln
                if pos > size:
                    break
                on_block(b"\0".join(pieces) + b"\0", len(pieces) == BLOCK)
    except (struct.error, OverflowError):  # a length read from the bytes took the position past any buffer
        pos = size + 1
    if pos > size:
        if size < r.size:
            raise r.past_end(pos - r.pos, f"the {n} strings of {what}")
        raise GGUFError(f"truncated or corrupt: the {n} strings of {what} from byte {r.pos} run past the "
                        f"file's end ({size})")
    r.pos = pos


def _tokens(r: _Reader, wide: bool, hashers: tuple[Any, ...]) -> tuple[int, tuple[str, ...]]:
    """The token strings hashed whole and per block of :data:`BLOCK` tokens (the blocks let two vocabularies
    that differ only in padding past the smaller one's end be recognised as one)."""
    etype = r.scalar("<I", "element type of tokenizer.ggml.tokens")
    if etype != _STRING:
        raise GGUFError(f"tokenizer.ggml.tokens holds type {etype}, not strings")
    n = r.count(wide, MAX_ARRAY, "length of tokenizer.ggml.tokens")
    r.spend(n, "strings_left", f"the {n} tokens")
    blocks: list[str] = []

    def block(data: bytes, full: bool) -> None:
        for h in hashers:
            h.update(data)
        if full:
            blocks.append(hashlib.sha256(data).hexdigest()[:8])

    _strings(r, wide, n, "token", block)
    return n, tuple(blocks)


def parse(buf: Any, size: int) -> Header:
    """The header in the first ``size`` bytes of ``buf`` (bytes, a memoryview or an mmap)."""
    r = _Reader(buf, size)
    if size < 4 or bytes(buf[0:4]) != GGUF_MAGIC:
        head = bytes(buf[0:min(size, 4)])
        raise GGUFError(f"not a GGUF file (it starts with {head!r}; a GGUF file starts with b'GGUF')")
    r.pos = 4
    version = r.scalar("<I", "the version")
    if version not in (1, 2, 3):
        raise GGUFError(f"GGUF version {version} is not one specview reads (1 to 3)")
    wide = version >= 2
    n_tensors = r.count(wide, MAX_TENSORS, "the tensor count")
    n_kv = r.count(wide, MAX_KV, "the metadata count")
    hd = Header(version=version)
    full, texts = hashlib.sha256(), hashlib.sha256()
    for _ in range(n_kv):
        key = r.string(wide, "a metadata key")
        vtype = r.scalar("<I", f"the type of {key}")
        if key == "tokenizer.ggml.tokens" and vtype == _ARRAY:
            hd.n_tokens, hd.vocab_blocks = _tokens(r, wide, (full, texts))
            hd.vocab_texts = texts.hexdigest()[:16]
        elif key == "tokenizer.ggml.token_type" and vtype == _ARRAY:
            full.update(b"\1types\1")
            _value(r, vtype, wide, key, hashers=(full,))
        else:
            hd.meta[key] = _value(r, vtype, wide, key)
    if hd.n_tokens is not None:
        hd.vocab_digest = full.hexdigest()[:16]
    spans: list[tuple[str, int, int, int]] = []
    for i in range(n_tensors):
        name = r.string(wide, f"tensor {i}'s name")
        n_dims = r.scalar("<I", f"tensor {name}'s dimension count")
        if n_dims > MAX_DIMS:
            raise GGUFError(f"tensor {name} has {n_dims} dimensions (GGUF allows {MAX_DIMS})")
        n = 1
        for _ in range(n_dims):
            n *= r.scalar("<Q" if wide else "<I", f"a dimension of {name}")
        ttype = r.scalar("<I", f"tensor {name}'s type")
        offset = r.scalar("<Q", f"tensor {name}'s offset")
        hd.tensors[name] = n
        spans.append((name, ttype, offset, n))
    hd.header_bytes = r.pos
    with memoryview(buf) as mv:
        hd.header_hash = hashlib.sha256(mv[0:r.pos]).hexdigest()[:16]
    hd.data_end = _data_end(hd, spans) if spans else r.pos  # a file of no tensors has no data to pad to
    if hd.data_end is not None and hd.data_end > size:
        raise GGUFError(f"truncated: its weights end at byte {hd.data_end} and the file has {size} "
                        "(an interrupted download?)")
    return hd


def _data_end(hd: Header, spans: list[tuple[str, int, int, int]]) -> int | None:
    """The byte the tensor data ends at: the aligned end of the header plus the furthest tensor's end."""
    align = hd.meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise GGUFError(f"general.alignment is {align!r}, not a power of two")
    start = -(-hd.header_bytes // align) * align
    end = start
    for name, ttype, offset, n in spans:
        if ttype not in TYPE_SIZES:
            return None
        block, nbytes = TYPE_SIZES[ttype]
        if n % block:
            raise GGUFError(f"tensor {name} has {n} elements, not a whole number of its type's {block}-blocks")
        end = max(end, start + offset + n // block * nbytes)
    return end


def read(path: str | os.PathLike[str]) -> Header:
    """The header of the GGUF file at ``path`` (memory-mapped; only the header's pages are read).

    Raises OSError when the file cannot be opened (:class:`~.files.NotRegular`
    for a FIFO, socket or device: never opened for reading, so never waited
    on) and :class:`GGUFError` when its bytes are not a readable GGUF header.
    """
    with opened(path) as fd:
        size = os.fstat(fd).st_size
        if size < 4:
            raise GGUFError(f"not a GGUF file ({size} bytes)")
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
            return parse(mm, size)
