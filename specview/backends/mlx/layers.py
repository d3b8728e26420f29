"""Looking inside an MLX forward pass, layer by layer: what ``specview locate --engine mlx`` observes.

mlx-lm builds no per-op graph a callback could walk (MLX's graph is lazy and
fused per call), so an MLX pass is observed at the boundaries the model itself
has: the token embedding, the output of each transformer block, the final norm
and the logits.  :class:`LayerEngine` taps those modules of the model's own
``__call__`` (the inner model's ``embed_tokens``, each entry of its ``layers``
list and its ``norm``) for the duration of one pass, keeps a reference to each
module's output, evaluates them with the logits, and puts the modules back.
Nothing is recomputed: the values are the ones the pass hands on, so observing
cannot change the numbers (and :func:`specview.core.locate.find.locate` checks the
logits against an unobserved engine anyway, bit for bit).

The nodes are reported as :class:`~specview.core.locate.graphdiff.GraphNode` in
ggml's shape order (``[features, n_tokens, 1, 1]``), so the core compares them
exactly as it compares llama.cpp's: ``embd`` (op ``embedding``), ``blk.N``
(op ``layer``: the block's output, the residual stream it hands on), ``norm``
and ``logits``.  A node's weight source says what can be said of the block's
weights: their dtype, or the bits and group size of mlx-lm's quantized layers,
and the device that computed them.  What cannot be said is which kernel ran
inside the block: MLX is located per layer, not per op.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np

from ...core.config import EngineSettings
from ...core.errors import EvalError
from ...core.locate.graphdiff import GraphEngine, GraphNode, MicroBatch, NodeSource
from ...core.locate.find import NotObservable
from .engine import MLXEngine, MLXModel
from .lib import _mx

#: what a locate on MLX says about how finely it looked
PER_LAYER_NOTE = ("MLX is located per layer, not per op: mlx-lm has no per-op graph to observe, so the "
                  "embedding, each transformer block's output, the final norm and the logits are compared; the "
                  "first differing block is where the batched pass departs, not which kernel inside it")


class NotLayered(NotObservable):
    """The model has no ``model.layers`` / ``embed_tokens`` / ``norm`` that the pass goes through."""


class _Tap:
    """Stands in for one module during an observed pass: calls it and keeps what it returned."""

    def __init__(self, module: Any, name: str, sink: list[tuple[str, Any, Any]]):
        self._module, self._name, self._sink = module, name, sink

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._module(*args, **kwargs)
        self._sink.append((self._name, self._module, out[0] if isinstance(out, tuple) else out))
        return out

    def __getattr__(self, key: str) -> Any:  # as_linear of a tied embedding, a block's use_sliding ...
        return getattr(self._module, key)


def _inner(model: Any) -> Any:
    inner = getattr(model, "model", None)
    if inner is None or not isinstance(getattr(inner, "layers", None), list) \
            or getattr(inner, "embed_tokens", None) is None or getattr(inner, "norm", None) is None:
        raise NotLayered(f"{type(model).__name__}: mlx-lm model without model.embed_tokens, model.layers and "
                         "model.norm; locate cannot tell its layers apart")
    return inner


def device_name() -> str:
    mx = _mx()
    return "MLX gpu" if mx.default_device() == mx.gpu else "MLX cpu"


def weight_type(module: Any) -> str:
    """What can be said of a module's weights: ``4-bit (group 64)``, ``bfloat16``, or both when mixed."""
    kinds: list[str] = []
    for _, m in module.named_modules():
        if "weight" not in m or any(True for _ in m.children()):
            continue
        bits = getattr(m, "bits", None)
        if bits is not None and "scales" in m:
            mode = getattr(m, "mode", "affine")
            k = f"{bits}-bit (group {getattr(m, 'group_size', '?')}{'' if mode == 'affine' else ', ' + str(mode)})"
        else:
            k = str(m["weight"].dtype).replace("mlx.core.", "")
        if k not in kinds:
            kinds.append(k)
    return " + ".join(kinds) or "no weights"


def _largest_weight(module: Any) -> tuple[int, ...]:
    from mlx.utils import tree_flatten

    shapes = [tuple(int(x) for x in v.shape) for k, v in tree_flatten(module.parameters()) if k.endswith("weight")]
    if not shapes:
        return ()
    return tuple(reversed(max(shapes, key=lambda s: int(np.prod(s)))))  # ggml order: the input axis first


def _copy_cache(cache: list[Any]) -> list[Any]:
    """A copy of a prompt cache whose arrays are new array objects (MLX writes into a cache's arrays in place)."""
    mx = _mx()
    out = []
    for c in cache:
        new = copy.copy(c)
        for k, v in list(vars(new).items()):
            if isinstance(v, mx.array):
                setattr(new, k, mx.array(v))
            elif isinstance(v, (tuple, list)) and v and all(isinstance(x, mx.array) for x in v):
                setattr(new, k, type(v)(mx.array(x) for x in v))
        out.append(new)
    return out


class LayerEngine(MLXEngine, GraphEngine):
    """An MLX engine whose passes can be observed layer by layer (:meth:`observe`).

    It never runs ahead (a queued greedy pass would put a position in the cache
    no observed pass asked for); between observed passes it is an ordinary
    :class:`MLXEngine`.
    """

    PREFETCH_AFTER = 1 << 30
    selection = "layers"
    granularity = "layer"
    note = PER_LAYER_NOTE

    def __init__(self, model: MLXModel, settings: EngineSettings = EngineSettings(), *, n_ctx: int | None = None):
        self._inner = _inner(model.model)
        super().__init__(model, settings, n_ctx=n_ctx)

    def observe(self, tokens: Sequence[int], rows: Sequence[int]) -> tuple[np.ndarray, list[MicroBatch]]:
        """One forward pass over ``tokens`` (every row's logits computed, as ``eval`` computes a full-width pass);
        the rows asked for, and the pass's layer outputs as one micro-batch."""
        mx = self._mxm
        toks, rows = self.checked(tokens, rows, batch_limit=False)
        n = len(toks)
        inner = self._inner
        sink: list[tuple[str, Any, Any]] = []
        saved = (inner.embed_tokens, list(inner.layers), inner.norm)
        pos0 = self.n_past
        try:
            inner.embed_tokens = _Tap(saved[0], "embd", sink)
            for i, layer in enumerate(saved[1]):
                inner.layers[i] = _Tap(layer, f"blk.{i}", sink)
            inner.norm = _Tap(saved[2], "norm", sink)
            with mx.stream(self._stream()):
                logits = self._forward(mx, toks, list(range(n)))
                outs = [o.astype(mx.float32) for _, _, o in sink]
                mx.eval(logits, *outs)
            host = [np.array(o, dtype=np.float32, copy=True) for o in outs]
            full = np.array(logits, dtype=np.float32, copy=True)
        except NotLayered:
            raise
        except Exception as exc:
            raise EvalError(f"the observed MLX pass failed at position {pos0} ({n} tokens): "
                            f"{type(exc).__name__}: {exc}") from exc
        finally:
            inner.embed_tokens = saved[0]
            inner.layers[:] = saved[1]
            inner.norm = saved[2]
        self.n_past = pos0 + n
        self.n_evals += 1
        dev = device_name()
        nodes: list[GraphNode] = []
        prev: NodeSource | None = None
        named = [(name, mod, val, str(o.dtype).replace("mlx.core.", "")) for (name, mod, o), val in zip(sink, host)]
        named.append(("logits", self._head(), full, "float32"))
        for name, mod, val, dtype in named:
            feat = int(val.shape[-1])
            ne = (feat, n, 1, 1)
            srcs = [prev] if prev is not None else []
            if mod is not None:
                srcs.append(NodeSource(name=f"{name} weights" if name != "logits" else "output head weights",
                                       op="NONE", type=weight_type(mod), shape=_largest_weight(mod), buffer=dev,
                                       weight=True))
            op = {"embd": "embedding", "norm": "norm", "logits": "head"}.get(name, "layer")
            nodes.append(GraphNode(index=len(nodes), name=name, op=op, type=dtype, ne=ne, buffer=dev, sources=srcs,
                                   values=val.reshape(1, 1, n, feat)))
            prev = NodeSource(name=name, op=op, type=dtype, shape=(feat, n), buffer=dev, weight=False)
        return full[list(rows)], [MicroBatch(first_row=0, width=n, nodes=nodes)]

    def _head(self) -> Any:
        m = self.model.model
        head = getattr(m, "lm_head", None)
        return head if head is not None else getattr(self._inner, "embed_tokens", None)

    def take_state(self, other: Any) -> None:
        """This engine's KV cache becomes a copy of ``other``'s (an :class:`MLXEngine` on the same model)."""
        if other.model is not self.model:
            raise EvalError("the observed MLX engine can only take the KV state of an engine on the same model")
        if getattr(other, "_pending", None) is not None:  # a greedy pass it ran ahead: not part of its state
            other._drop_prefetch()
        other._streak, other._next_greedy = 0, None
        self._pending = None
        self.cache = _copy_cache(other.cache)
        self.n_past = other.n_past


def observed_engine(model: MLXModel, settings: EngineSettings, n_ctx: int, selection: str = "all") -> LayerEngine:
    """The layer-by-layer engine, whatever ``selection`` asks: an MLX pass has no finer nodes to observe."""
    return LayerEngine(model, settings, n_ctx=n_ctx)
