"""Looking inside a llama.cpp forward pass: the ``cb_eval`` observer and the ggml bindings it needs.

llama.cpp's scheduler calls ``llama_context_params.cb_eval`` twice per graph
node: first asking whether the node is wanted (``ask = true``), then, once its
data is ready, with the tensor itself.  llama-cpp-python declares the callback
type but binds no ggml function, so this module binds what it reads from
``libggml-base``: ``ggml_get_name``, ``ggml_op_desc``, ``ggml_type_name``,
``ggml_nbytes``, ``ggml_nelements``, ``ggml_backend_tensor_get`` and
``ggml_backend_buffer_name``, and lays out ``struct ggml_tensor`` as the
vendored ``ggml/include/ggml.h`` of llama-cpp-python 0.3.36 declares it.  The
layout is checked against the running build on every node it reads: the name
ggml returns must sit where the struct says, and ggml's own element and byte
counts must match the shape and strides read from the struct; a build whose
layout differs raises :class:`GraphLayoutError` instead of reading garbage.

Every node's output is copied whole (``ggml_backend_tensor_get`` of its byte
span, so it works for any buffer, host or device) and viewed through its real
shape and strides: a permuted view such as ``kq-*`` (``[n_kv, n_tokens,
n_head]``) is read as the tensor it is, so the token axis can be found by shape
later, never assumed to be the outermost one.  Nodes of a type with no float
form (quantized KV views, integer ids) are recorded without values, and said
so.

Observing can change what runs: the scheduler splits the graph at every wanted
node and synchronises, so fused kernels may not fuse.  :class:`ObservedEngine`
therefore observes a *selection* of nodes (``all``, or only each layer's output
and the logits) and the tests check that the logits of an observed pass equal
those of an unobserved one, bit for bit.
"""

from __future__ import annotations

import ctypes
import math
import re
from typing import Any, Sequence

import numpy as np

from ...core.config import EngineSettings
from ...core.errors import EvalError, SpecviewError
from ...core.locate.find import SELECTIONS, GraphEngine, GraphNode, MicroBatch, NodeSource
from .engine import LlamaEngine
from .lib import _init, lib_dir

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64

# ggml_type values that have a float form here (enum ggml_type in ggml.h)
_F32, _F16, _BF16, _I32 = 0, 1, 30, 26


class GraphLayoutError(SpecviewError):
    """The running ggml's ``struct ggml_tensor`` is not laid out as this specview reads it."""


class GgmlTensor(ctypes.Structure):
    """``struct ggml_tensor`` of ggml/include/ggml.h (llama-cpp-python 0.3.36's vendored llama.cpp)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


_NAME_OFFSET = GgmlTensor.name.offset
_GGML: Any = None


def ggml_base() -> Any:
    """libggml-base of the libllama this process runs (``$LLAMA_CPP_LIB_PATH``'s build when set: the package's own
    copy may be another build), with the signatures the observer uses."""
    global _GGML
    if _GGML is not None:
        return _GGML
    _init()
    libdir = lib_dir()
    lib = None
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll", "libggml.so", "libggml.dylib"):
        p = libdir / name
        if p.exists():
            try:
                lib = ctypes.CDLL(str(p))
            except OSError:
                continue
            if hasattr(lib, "ggml_get_name"):
                break
            lib = None
    if lib is None:
        raise SpecviewError(f"libggml-base was not found in {libdir}: this llama-cpp-python cannot be observed")
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for fn, res, args in (
        ("ggml_get_name", vp, [vp]),  # the address, to check the struct layout against it
        ("ggml_op_desc", ctypes.c_char_p, [vp]),
        ("ggml_type_name", ctypes.c_char_p, [ctypes.c_int]),
        ("ggml_nbytes", sz, [vp]),
        ("ggml_nelements", ctypes.c_int64, [vp]),
        ("ggml_backend_tensor_get", None, [vp, vp, sz, sz]),
        ("ggml_backend_buffer_name", ctypes.c_char_p, [vp]),
        ("ggml_backend_buffer_is_host", ctypes.c_bool, [vp]),
        ("ggml_backend_buffer_get_usage", ctypes.c_int, [vp]),
    ):
        f = getattr(lib, fn)
        f.restype = res
        f.argtypes = args
    _GGML = lib
    return lib


_TYPE_NAMES: dict[int, str] = {}


def type_name(t: int) -> str:
    n = _TYPE_NAMES.get(t)
    if n is None:
        raw = ggml_base().ggml_type_name(t)
        n = _TYPE_NAMES[t] = raw.decode() if raw else f"type{t}"
    return n


def buffer_name(buf: int | None) -> str | None:
    """``ggml_backend_buffer_name`` of a buffer (CPU, CPU_REPACK, AMX, Vulkan0, ...), None for no buffer."""
    if not buf:
        return None
    raw = ggml_base().ggml_backend_buffer_name(buf)
    return raw.decode("utf-8", "replace") if raw else None


def _shape(t: GgmlTensor) -> tuple[int, ...]:
    """ggml's ne with trailing 1s dropped (ggml order: ne[0] is the innermost, contiguous axis)."""
    ne = [int(x) for x in t.ne]
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(ne)


def checked_tensor(ptr: int) -> GgmlTensor:
    """The struct at ``ptr``, after checking its layout against what ggml itself reports."""
    lib = ggml_base()
    t = GgmlTensor.from_address(ptr)
    if lib.ggml_get_name(ptr) != ptr + _NAME_OFFSET:
        raise GraphLayoutError("ggml_get_name does not point where struct ggml_tensor's name is read: this ggml "
                               "build lays the tensor out differently from llama-cpp-python 0.3.36; locate cannot "
                               "read its graph")
    n = math.prod(int(x) for x in t.ne)
    if lib.ggml_nelements(ptr) != n:
        raise GraphLayoutError(f"ggml_nelements says {lib.ggml_nelements(ptr)} but the shape read is "
                               f"{list(t.ne)}: struct ggml_tensor is laid out differently in this build")
    return t


_USAGE_ANY, _USAGE_WEIGHTS = 0, 1  # enum ggml_backend_buffer_usage


def _source(ptr: int) -> NodeSource:
    lib = ggml_base()
    t = checked_tensor(ptr)
    op = (lib.ggml_op_desc(ptr) or b"").decode()
    weight = bool(t.buffer) and op == "NONE" and lib.ggml_backend_buffer_get_usage(t.buffer) == _USAGE_WEIGHTS
    return NodeSource(name=t.name.decode("utf-8", "replace"), op=op, type=type_name(t.type), shape=_shape(t),
                      buffer=buffer_name(t.buffer), weight=weight)


def read_values(ptr: int, t: GgmlTensor) -> tuple[np.ndarray | None, str | None]:
    """The tensor's values as float32 in its logical shape, or (None, why)."""
    lib = ggml_base()
    if t.type not in (_F32, _F16, _BF16, _I32):
        return None, f"{type_name(t.type)} values are not compared"
    nbytes = int(lib.ggml_nbytes(ptr))
    if nbytes == 0:
        return np.zeros(0, np.float32), None
    raw = np.empty(nbytes, dtype=np.uint8)
    lib.ggml_backend_tensor_get(ptr, raw.ctypes.data, 0, nbytes)
    item = {_F32: 4, _F16: 2, _BF16: 2, _I32: 4}[t.type]
    ne = [int(x) for x in t.ne][::-1]
    nb = [int(x) for x in t.nb][::-1]
    if any(s % item for s in nb):
        return None, "strides are not whole elements"
    span = sum((n - 1) * s for n, s in zip(ne, nb)) + item
    if span > nbytes:
        return None, f"shape and strides span {span} bytes, ggml_nbytes says {nbytes}"
    if t.type == _BF16:
        u16 = np.lib.stride_tricks.as_strided(raw.view(np.uint16)[: nbytes // 2], shape=ne,
                                              strides=nb).copy()
        return (u16.astype(np.uint32) << 16).view(np.float32), None
    dt = {_F32: np.float32, _F16: np.float16, _I32: np.int32}[t.type]
    arr = np.lib.stride_tricks.as_strided(raw.view(dt)[: nbytes // item], shape=ne, strides=nb)
    return arr.astype(np.float32) if t.type != _F32 else arr.copy(), None


_LAYER_OUT = re.compile(r"^(l_out-\d+|result_norm|result_output)$")


class Observer:
    """A ``cb_eval`` callback that records the nodes of the passes it is armed for.

    ``selection`` "all" asks for every node; "layers" only for each layer's
    output (``l_out-N``), the final norm and the logits (fewer splits of the
    graph, for a backend whose fused kernels observing every node would undo).
    While not armed it asks for nothing, and the scheduler computes each split
    whole, as without a callback.
    """

    def __init__(self, selection: str = "all"):
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)} (got {selection!r})")
        self.selection = selection
        self.armed = False
        self.nodes: list[GraphNode] = []
        self.error: BaseException | None = None
        self.asked = 0
        import llama_cpp

        # kept on the observer, which the engine keeps for the context's life
        self.c_callback = llama_cpp.ggml_backend_sched_eval_callback(self._callback)

    def arm(self) -> None:
        self.nodes = []
        self.error = None
        self.armed = True

    def disarm(self) -> list[GraphNode]:
        self.armed = False
        if self.error is not None:
            err, self.error = self.error, None
            raise err
        return self.nodes

    def _wanted(self, ptr: int) -> bool:
        if self.selection == "all":
            return True
        name = GgmlTensor.from_address(ptr).name.decode("utf-8", "replace")
        return bool(_LAYER_OUT.match(name))

    def _callback(self, ptr: int, ask: bool, user_data: int) -> bool:
        if not self.armed:
            return False
        try:
            if ask:
                self.asked += 1
                return self._wanted(ptr)
            self.nodes.append(self._node(ptr))
            return True
        except BaseException as exc:  # never raise into C: stop the graph and re-raise on disarm
            self.error = exc
            self.armed = False
            return False

    def _node(self, ptr: int) -> GraphNode:
        lib = ggml_base()
        t = checked_tensor(ptr)
        srcs = [_source(s) for s in t.src if s]
        ne = tuple(int(x) for x in t.ne)
        # the context's memory (a KV cache; a hybrid's recurrent state, cache_r_l* / cache_s_l*) lives in a buffer of
        # no particular usage, a pass's outputs in the scheduler's compute buffers
        state = bool(t.buffer) and lib.ggml_backend_buffer_get_usage(t.buffer) == _USAGE_ANY
        values, note = (None, None) if state else read_values(ptr, t)  # the memory is never compared whole
        return GraphNode(index=len(self.nodes), name=t.name.decode("utf-8", "replace"),
                         op=(lib.ggml_op_desc(ptr) or b"").decode(), type=type_name(t.type), ne=ne,  # type: ignore[arg-type]
                         buffer=buffer_name(t.buffer), sources=srcs, values=values, note=note, state=state)


class ObservedEngine(LlamaEngine, GraphEngine):
    """A llama.cpp context whose passes can be observed node by node (:meth:`observe`).

    Between observed passes it is an ordinary engine: the callback asks for no
    node, so the scheduler computes each split whole.
    """

    def __init__(self, model: Any, settings: EngineSettings, *, n_ctx: int | None = None,
                 selection: str = "all"):
        self.observer = Observer(selection)  # before the context exists, and for as long as it does
        super().__init__(model, settings, n_ctx=n_ctx)

    def _context_params(self, cp: Any) -> None:
        cp.cb_eval = self.observer.c_callback
        cp.cb_eval_user_data = None

    @property
    def selection(self) -> str:
        return self.observer.selection

    def observe(self, tokens: Sequence[int], rows: Sequence[int]) -> tuple[np.ndarray, list[MicroBatch]]:
        """One forward pass like :meth:`eval`: its logits rows, and the observed graph of each micro-batch.

        llama.cpp splits a pass into micro-batches of ``n_ubatch`` tokens, one
        graph each, all of the same topology; the nodes are cut into graphs by
        that count and each graph's nodes numbered from 0.
        """
        self.observer.arm()
        try:
            logits = self.eval(tokens, rows)
        finally:
            nodes = self.observer.disarm()
        n, u = len(tokens), max(1, self.n_ubatch)
        widths = [min(u, n - s) for s in range(0, n, u)]
        if len(nodes) % len(widths):
            raise EvalError(f"the observer saw {len(nodes)} nodes for {len(widths)} micro-batches of a "
                            f"{n}-token pass: they cannot be told apart")
        per = len(nodes) // len(widths)
        out = []
        for g, w in enumerate(widths):
            part = nodes[g * per:(g + 1) * per]
            for i, node in enumerate(part):
                node.index = i
            out.append(MicroBatch(first_row=g * u, width=w, nodes=part))
        return logits, out

    def take_state(self, other: Any) -> None:
        """This context's KV state becomes a bit-for-bit copy of ``other``'s (a context on the same model)."""
        ll = self._ll
        size = int(ll.llama_state_seq_get_size(other.ctx, 0))
        buf = (ctypes.c_uint8 * max(size, 1))()
        got = int(ll.llama_state_seq_get_data(other.ctx, buf, size, 0))
        if got != size or int(ll.llama_state_seq_set_data(self.ctx, buf, size, 0)) != size:
            raise EvalError("llama.cpp could not copy the KV state into the observed context")
        self.n_past = other.n_past
        self.memory.copy_from(other.memory)  # what the copied state holds, for a later rollback
