"""What every tiny drafter writer shares: the target's facts, its tokenizer, seeded weights, an atomic write.

A drafter llama-server loads next to a target must speak the target's
vocabulary (llama.cpp refuses a draft whose tokens differ), so each writer
copies the target's ``tokenizer.*`` metadata verbatim.  The weights are random
from a seeded generator: such a drafter proposes tokens the target almost
always rejects, which is what exercising a speculative path needs (every verify
pass is still 1 + n_drafted tokens wide).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ....core.errors import ModelFileError


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ModelFileError("writing a tiny drafter needs the gguf package: pip install gguf "
                             "(or pip install 'specview[demo]')") from None
    return gguf


@dataclass(frozen=True)
class TargetFacts:
    """The numbers of a target a drafter is shaped by, read from its GGUF header."""

    path: Path
    arch: str
    n_embd: int
    n_layer: int
    n_vocab: int
    n_head: int
    n_head_kv: int
    n_ctx_train: int
    rope_freq_base: float
    rms_eps: float
    #: the target's ``tokenizer.*`` fields: name -> (value, gguf value type, element type or None)
    tokenizer: tuple[tuple[str, Any, Any, Any], ...]


def read_target(path: "str | os.PathLike[str] | TargetFacts") -> TargetFacts:
    """The target's shape and tokenizer; a clear error when the file is not a GGUF a drafter can pair with.

    Facts already read pass through, so a caller writing several drafters reads the target once (reading a
    49k-token tokenizer takes a second or two).
    """
    if isinstance(path, TargetFacts):
        return path
    gguf = _gguf()
    p = Path(path)
    try:
        r = gguf.GGUFReader(str(p))
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{p}: cannot read it as a GGUF file ({exc})") from None
    fields = r.fields

    def val(key: str, default: Any = None) -> Any:
        f = fields.get(key)
        if f is None:
            return default
        return f.contents()

    arch = val("general.architecture")
    if not arch:
        raise ModelFileError(f"{p}: no general.architecture in its header; not a llama.cpp model file")
    n_embd, n_layer = val(f"{arch}.embedding_length"), val(f"{arch}.block_count")
    if not n_embd or not n_layer:
        raise ModelFileError(f"{p}: its header has no {arch}.embedding_length or {arch}.block_count")
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelFileError(f"{p}: it carries no tokenizer (tokenizer.ggml.tokens); a drafter needs the "
                             "target's vocabulary")
    tok: list[tuple[str, Any, Any, Any]] = []
    for name, f in fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        tok.append((name, f.contents(), vtype, sub))
    n_head = int(val(f"{arch}.attention.head_count", 1) or 1)
    return TargetFacts(path=p, arch=str(arch), n_embd=int(n_embd), n_layer=int(n_layer),
                       n_vocab=int(val(f"{arch}.vocab_size", len(tokens.data))), n_head=n_head,
                       n_head_kv=int(val(f"{arch}.attention.head_count_kv", n_head) or n_head),
                       n_ctx_train=int(val(f"{arch}.context_length", 2048)),
                       rope_freq_base=float(val(f"{arch}.rope.freq_base", 10000.0)),
                       rms_eps=float(val(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
                       tokenizer=tuple(tok))


def copy_tokenizer(w: Any, target: TargetFacts) -> None:
    """Write the target's tokenizer fields into a drafter's writer, each with its own type."""
    gguf = _gguf()
    for name, value, vtype, sub in target.tokenizer:
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, list(value), vtype, sub_type=sub)
        else:
            w.add_key_value(name, value, vtype)


class Weights:
    """Seeded random weights, scaled by fan-in so activations stay of order one through the few layers."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def mat(self, rows: int, cols: int, *, scale: float = 1.0) -> np.ndarray:
        """A (rows, cols) matrix, which gguf stores as a tensor of ggml shape {cols, rows}."""
        return (self.rng.standard_normal((rows, cols)) * (scale / np.sqrt(cols))).astype(np.float32)

    @staticmethod
    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)


def write_atomically(out: str | os.PathLike[str], arch: str, fill: Callable[[Any], None]) -> Path:
    """Write a GGUF through ``fill(writer)`` into a temporary name beside ``out`` and move it into place.

    An interrupted write never leaves a half-written model under ``out``'s name.
    """
    gguf = _gguf()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        w = gguf.GGUFWriter(str(tmp), arch)
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def spread_layers(n_layer: int) -> list[int]:
    """The three target layers (low, middle, high) EAGLE-3 checkpoints read hidden states from.

    EAGLE-3's trainers take layers 2, n/2 and n-3 of an n-layer target (2, 16 and 29 of Llama 3.1 8B).
    """
    if n_layer < 6:
        return [0, n_layer // 2, n_layer - 1]
    return [2, n_layer // 2, n_layer - 3]
