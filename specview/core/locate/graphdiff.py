"""Two observed passes of the same model compared node by node: the data an observing engine reports and the diff.

Backend-free: an engine that can look inside its passes (llama.cpp's
``cb_eval``, :mod:`specview.backends.llama_cpp.graph`) reports each node as a
:class:`GraphNode`; :func:`compare_graphs` compares a single-token pass with
row ``j`` of a batched pass, finding each node's token axis by shape.

A hybrid or recurrent model's graph has two kinds of node no plain shape rule
reads.  Its recurrent ops pack the pass's per-token rows with a state:
``GATED_DELTA_NET`` (Qwen3.5, Qwen3-Next) writes ``[S_v * H, n_tokens +
K * S_v]``, the tokens' outputs first and the new state after them; the
short convolution's input (``CONCAT`` of the conv state and the tokens, LFM2
and the gated delta net's own conv) holds ``d_conv`` state columns and then
the tokens.  Those are compared on their per-token rows, the state left out.
And its recurrent state buffers (``cache_r_l*``: the conv state, ``cache_s_l*``:
the SSM / delta-net state) are the state each pass starts from and writes back,
not a row of this pass: both passes start from different positions, so they are
skipped and said to be the recurrent state (:func:`state_note`).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

VIEW_OPS = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT", "CPY", "SET_ROWS"})
#: ggml ops that carry a recurrent state from token to token (what a hybrid's rollback must restore)
RECURRENT_OPS = frozenset({"GATED_DELTA_NET", "SSM_CONV", "SSM_SCAN", "RWKV_WKV6", "RWKV_WKV7", "GATED_LINEAR_ATTN"})
#: ops whose output packs the pass's per-token rows with a state: where the tokens sit on the packed axis
PACKED_OPS = {"GATED_DELTA_NET": "first", "CONCAT": "last"}
_RECURRENT_CACHE = re.compile(r"cache_([rs])_l(\d+)")
_KV_CACHE = re.compile(r"cache_[kv]_l\d+")


# -- what an observing engine reports --------------------------------------------------
@dataclass
class NodeSource:
    """One input of a graph node."""

    name: str
    op: str
    type: str
    shape: tuple[int, ...]
    buffer: str | None
    weight: bool  # a model weight (in a weights buffer), not an activation

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeSource:
        return cls(name=str(d["name"]), op=str(d["op"]), type=str(d["type"]), shape=tuple(int(x) for x in d["shape"]),
                   buffer=d.get("buffer"), weight=bool(d.get("weight")))


@dataclass
class GraphNode:
    """One node of one observed pass.

    ``ne`` is ggml's shape (four dimensions, ``ne[0]`` innermost); ``values`` is
    the tensor in NumPy order (``ne`` reversed, read through its real strides),
    None when its type has no float form (``note`` says why).
    """

    index: int
    name: str
    op: str
    type: str
    ne: tuple[int, int, int, int]
    buffer: str | None
    sources: list[NodeSource] = field(default_factory=list)
    values: np.ndarray | None = field(default=None, repr=False)
    note: str | None = None
    #: its data is the context's memory (a view of the KV cache, which holds every position, or of a recurrent
    #: state), not this pass's output
    state: bool = False


@dataclass
class MicroBatch:
    """The graph of one micro-batch of an observed pass: rows ``first_row .. first_row + width - 1``.

    llama.cpp computes a pass of more than ``n_ubatch`` tokens as several graphs
    (``-ub 1``: one per token); row ``j`` of the pass is row ``j - first_row``
    of the micro-batch that holds it.
    """

    first_row: int
    width: int
    nodes: list[GraphNode]


class GraphEngine(ABC):
    """What :func:`locate` needs of an engine beyond :class:`~specview.core.engine.Engine`.

    A backend's loaded model offers one through ``observed_engine(settings,
    n_ctx, selection)``; a model without that method cannot be observed.
    """

    #: which nodes it observes: "all", or "layers" (each layer's output, the final norm and the logits)
    selection: str = "all"
    #: what its nodes are: "op" (a graph node per op, llama.cpp) or "layer" (a model's layer outputs, MLX)
    granularity: str = "op"
    #: a line a locate on this engine carries (how finely it looked), or None
    note: str | None = None

    @abstractmethod
    def observe(self, tokens: Sequence[int], rows: Sequence[int]) -> tuple[np.ndarray, list[MicroBatch]]:
        """One forward pass as ``eval`` runs it; its logits rows and the graph of each micro-batch it ran."""

    @abstractmethod
    def take_state(self, other: Any) -> None:
        """Make this context's KV state (and ``n_past``) a bit-for-bit copy of ``other``'s, on the same model."""


# -- comparing two passes ---------------------------------------------------------------
@dataclass
class NodeDiff:
    """One node of the single-token pass against row ``j`` of the same node of the batched pass."""

    index: int
    name: str
    op: str
    type: str
    shape: tuple[int, ...]  # the single-token node's ggml shape, trailing 1s dropped
    batched_shape: tuple[int, ...]
    layer: int | None
    status: str  # "identical", "differs", "skipped"
    part: str = ""  # "input" (before layer 0), "blk.N", "output" (the final norm and the logits)
    buffer: str | None = None
    sources: list[NodeSource] = field(default_factory=list)
    token_axis: int | None = None  # ggml axis the row was taken from
    max_abs: float = 0.0
    rel: float = 0.0
    n_diff: int = 0
    n_elems: int = 0
    note: str | None = None

    @property
    def weight(self) -> NodeSource | None:
        return next((s for s in self.sources if s.weight), None)

    @property
    def is_view(self) -> bool:
        return self.op in VIEW_OPS

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "sources"}
        d["shape"], d["batched_shape"] = list(self.shape), list(self.batched_shape)
        d["sources"] = [s.to_json() for s in self.sources]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeDiff:
        kw = dict(d)
        kw["shape"] = tuple(int(x) for x in d["shape"])
        kw["batched_shape"] = tuple(int(x) for x in d["batched_shape"])
        kw["sources"] = [NodeSource.from_json(s) for s in d.get("sources", [])]
        for k in ("max_abs", "rel"):
            kw[k] = float("inf") if kw.get(k) is None else float(kw[k])
        return cls(**kw)


_LAYER = (re.compile(r"-(\d+)(?:\s|$)"), re.compile(r"_l(\d+)(?:\s|$)"), re.compile(r"^blk\.(\d+)(?:\.|$)"))


def layer_of(name: str) -> int | None:
    """The layer a node name belongs to (``ffn_out-3``, ``cache_k_l3``, ``blk.3.``), else None."""
    for pat in _LAYER:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None


def trim(ne: Sequence[int]) -> tuple[int, ...]:
    out = list(int(x) for x in ne)
    while len(out) > 1 and out[-1] == 1:
        out.pop()
    return tuple(out)


def token_axis(single: Sequence[int], batched: Sequence[int], width: int) -> int | None:
    """The ggml axis that holds the pass's tokens: 1 in the single-token node, ``width`` in the batched one.

    None when no axis (or more than one) changes that way, or another axis changes too.
    """
    a = list(single) + [1] * (4 - len(single))
    b = list(batched) + [1] * (4 - len(batched))
    changed = [d for d in range(4) if a[d] != b[d]]
    if len(changed) == 1 and a[changed[0]] == 1 and b[changed[0]] == width:
        return changed[0]
    return None


def packed_rows(op: str, single: Sequence[int], batched: Sequence[int], width: int) -> tuple[int, int, int] | None:
    """(ggml axis, state rows, index of the first token row) of an output that packs the pass's tokens with a state.

    One axis differs, by exactly the width's extra tokens (``single[d] - 1 ==
    batched[d] - width``, the same number of state rows beside them), on an op
    of :data:`PACKED_OPS`; None otherwise.
    """
    where = PACKED_OPS.get(op)
    if where is None or width < 2:
        return None
    a = list(single) + [1] * (4 - len(single))
    b = list(batched) + [1] * (4 - len(batched))
    changed = [d for d in range(4) if a[d] != b[d]]
    if len(changed) != 1:
        return None
    d = changed[0]
    extra = a[d] - 1
    if extra < 1 or b[d] - width != extra:
        return None
    return d, extra, (0 if where == "first" else extra)


def flattened_rows(op: str, single: Sequence[int], batched: Sequence[int], width: int) -> int | None:
    """The ggml axis of a reshape that flattened the pass's token rows into one axis (``width`` times as long
    there, all else alike), or None.  A reshape is of contiguous data, so token ``j`` is the ``j``-th slice."""
    if op != "RESHAPE" or width < 2:
        return None
    a = list(single) + [1] * (4 - len(single))
    b = list(batched) + [1] * (4 - len(batched))
    changed = [d for d in range(4) if a[d] != b[d]]
    if len(changed) == 1 and a[changed[0]] * width == b[changed[0]]:
        return changed[0]
    return None


def state_note(node: GraphNode) -> str:
    """Why a node whose data is the context's memory is not compared, naming what memory it is."""
    names = [node.name, *(s.name for s in node.sources)]
    for n in names:
        m = _RECURRENT_CACHE.search(n)
        if m:
            what = "conv state" if m.group(1) == "r" else "SSM / delta-net state"
            return (f"recurrent state ({what} of layer {m.group(2)}, {m.group(0)}): the state a pass starts from "
                    "and writes back, not a row of this pass; the two passes start at different positions, so it "
                    "differs by design; the per-token rows the recurrent op computes are compared")
    if any(_KV_CACHE.search(n) for n in names):
        return ("KV cache view: it holds every position, and the two passes' caches differ past the prefix; the "
                "rows written into it are compared as Kcur/Vcur")
    if any("state" in n for n in names):
        return ("recurrent state: the state this pass writes back into the context's memory; the two passes end "
                "at different positions, so it differs by design")
    return "context state: a view of the context's memory, not this pass's output"


def recurrent_state_note(node: GraphNode, stateful: set[str] = frozenset()) -> str | None:  # type: ignore[assignment]
    """Why a node of the same shape at both widths that holds a recurrent state is not compared (None: not one).

    ``stateful``: the names of earlier nodes found to hold one (a reshape of a state is a state)."""
    if node.name.startswith("rs_s_copy"):
        return "recurrent state slot index: an input that says which cell holds the sequence's state"
    for src in node.sources:
        if src.name in stateful:
            return f"recurrent state: {src.name} reshaped or viewed, the state the passes start or end with"
        m = _RECURRENT_CACHE.search(src.name)
        if m:
            return (f"recurrent state read from {m.group(0)}: the state the pass starts from; the two passes start "
                    "at different positions, so it differs by design")
        if src.op in PACKED_OPS or src.op in RECURRENT_OPS:
            return (f"recurrent state: the state {src.name} ({src.op}) leaves after the pass, beside its per-token "
                    "rows; the two passes end at different positions, so it differs by design")
    return None


def compare_values(a: np.ndarray, b: np.ndarray) -> tuple[int, float, float]:
    """(elements whose bits differ, max |a - b|, that relative to max |a|) of two float32 arrays."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    ne = a.view(np.uint32) != b.view(np.uint32)
    n = int(ne.sum())
    if n == 0:
        return 0, 0.0, 0.0
    da, db = a[ne].astype(np.float64), b[ne].astype(np.float64)
    with np.errstate(invalid="ignore"):
        d = np.abs(da - db)
    d = np.where(np.isnan(da) & np.isnan(db), 0.0, d)  # two NaNs: different bits, no size
    d = np.where(np.isnan(d), np.inf, d)
    mx = float(d.max())
    fin = np.abs(a[np.isfinite(a)])
    scale = float(fin.max()) if fin.size else 0.0
    return n, mx, (mx / scale if scale > 0 else float("inf"))


def compare_graphs(single: Sequence[GraphNode], batched: Sequence[GraphNode], width: int, row: int
                   ) -> tuple[list[NodeDiff], list[str]]:
    """Every node of the single-token pass against row ``row`` of the batched pass, in graph order."""
    notes: list[str] = []
    out: list[NodeDiff] = []
    if len(single) != len(batched):
        notes.append(f"the passes have {len(single)} and {len(batched)} observed nodes; compared the first "
                     f"{min(len(single), len(batched))} while their names agree")
    layer, part = None, "input"
    stateful: set[str] = set()  # nodes holding a recurrent state, so their views are said to hold it too
    for a, b in zip(single, batched):
        if (a.name, a.op) != (b.name, b.op):
            notes.append(f"the graphs part at node {a.index} ({a.name} {a.op} against {b.name} {b.op}); "
                         "nodes from there on are not compared")
            break
        got = layer_of(a.name)
        if got is not None:
            layer, part = got, f"blk.{got}"
        elif a.name in ("norm", "logits") or a.name.startswith("result"):
            layer, part = None, "output"  # the final norm and the logits
        d = NodeDiff(index=a.index, name=a.name, op=a.op, type=a.type, shape=trim(a.ne), batched_shape=trim(b.ne),
                     layer=layer, part=part, status="skipped", buffer=a.buffer, sources=list(a.sources))
        out.append(d)
        if a.state or b.state:
            d.note = state_note(a)
            if d.note.startswith("recurrent"):
                stateful.add(a.name)
            continue
        if a.values is None or b.values is None:
            d.note = a.note or b.note or "no values"
            continue
        packed = packed_rows(a.op, a.ne, b.ne, width)
        if packed is not None:
            _compare_packed(d, a, b, packed, row)
            continue
        ax = token_axis(a.ne, b.ne, width) if width > 1 else None
        flat = flattened_rows(a.op, a.ne, b.ne, width) if width > 1 and ax is None else None
        if flat is not None:
            _compare_flat(d, a, b, flat, row)
            continue
        if width > 1 and ax is None:
            same = tuple(a.ne) == tuple(b.ne)
            d.note = ((recurrent_state_note(a, stateful) or "no token axis: the same shape at both widths")
                      if same else
                      f"shapes differ beyond the token axis ({list(d.shape)} against {list(d.batched_shape)})")
            if same and d.note.startswith("recurrent"):
                stateful.add(a.name)
            continue
        bv = b.values.reshape(tuple(reversed(b.ne)))
        if ax is not None:
            bv = np.take(bv, [row], axis=3 - ax)
            d.token_axis = ax
        av = a.values.reshape(tuple(reversed(a.ne)))
        n, mx, rel = compare_values(av, bv)
        d.n_elems, d.n_diff, d.max_abs, d.rel = int(av.size), n, mx, rel
        d.status = "differs" if n else "identical"
    return out, notes


def _compare_flat(d: NodeDiff, a: GraphNode, b: GraphNode, ax: int, row: int) -> None:
    """A reshape that flattened the token rows into axis ``ax``: the batched node's ``row``-th slice there."""
    n_a = int(list(a.ne)[ax])
    av = a.values.reshape(tuple(reversed(a.ne)))
    bv = np.take(b.values.reshape(tuple(reversed(b.ne))), range(row * n_a, (row + 1) * n_a), axis=3 - ax)
    n, mx, rel = compare_values(av, bv)
    d.token_axis = ax
    d.n_elems, d.n_diff, d.max_abs, d.rel = int(av.size), n, mx, rel
    d.status = "differs" if n else "identical"
    d.note = f"the token rows flattened into one axis: compared the token's {n_a} elements"


def _compare_packed(d: NodeDiff, a: GraphNode, b: GraphNode, packed: tuple[int, int, int], row: int) -> None:
    """A packed output (:func:`packed_rows`) compared on its token rows: row ``row`` of the batched pass's tokens
    against the single-token pass's one token, the state rows beside them left out."""
    ax, extra, first = packed
    av = np.take(a.values.reshape(tuple(reversed(a.ne))), [first], axis=3 - ax)
    bv = np.take(b.values.reshape(tuple(reversed(b.ne))), [first + row], axis=3 - ax)
    n, mx, rel = compare_values(av, bv)
    d.token_axis = ax
    d.n_elems, d.n_diff, d.max_abs, d.rel = int(av.size), n, mx, rel
    d.status = "differs" if n else "identical"
    where = "after" if first else "before"
    d.note = (f"per-token rows packed with {extra} state rows (the tokens {where} them): compared the token's row, "
              "the state left out")
