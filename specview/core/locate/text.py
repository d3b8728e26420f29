"""The text form of a locate: the first differing node, its inputs, and how the difference grows."""

from __future__ import annotations

from typing import Any

from ..config import settings_label
from .graphdiff import PACKED_OPS, RECURRENT_OPS

# the objects are specview.core.locate.find's Located, NodeDiff and NodeSource (not imported: locate imports this)
Located = NodeDiff = NodeSource = Any


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(x) for x in shape) + "]"


def _src(s: "NodeSource") -> str:
    where = f" in {s.buffer}" if s.buffer else ""
    return f"{s.name} {s.type} {_shape(s.shape)}{where}"


def _g(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.3g}"


def where(loc: "Located") -> str:
    """One line: where the batched pass first departs, or that it does not."""
    d = loc.first
    if d is None:
        if loc.logits.n_diff:
            return (f"no observed node differs, but {loc.logits.n_diff} logits do (observed: {loc.selection} "
                    "nodes)")
        return f"row {loc.row} of the width-{loc.width} pass is bit-identical to the single-token pass at every node"
    w = d.weight
    on = f" on {w.type} weights in {w.buffer}" if w is not None else ""
    if getattr(loc, "granularity", "op") == "layer":  # a layer's output: no op inside it can be named
        what = {"embd": "the token embedding", "norm": "the final norm", "logits": "the logits"}.get(
            d.name, f"{d.name} (layer {d.layer} output)")
        return (f"first differs at {what}{on}, {d.n_diff} of {d.n_elems} elements, max |Δ| {_g(d.max_abs)} "
                "(located per layer, not per op)")
    blk = f"blk.{d.layer} " if d.layer is not None else ("input " if d.part == "input" else "output ")
    return (f"first differs at {blk}{d.name}: {d.op}{on}, {d.n_diff} of {d.n_elems} elements, "
            f"max |Δ| {_g(d.max_abs)}")


def describe(d: "NodeDiff") -> list[str]:
    lines = [f"{d.name} (node {d.index}, {'blk.' + str(d.layer) if d.layer is not None else 'output head'}): "
             f"{d.op} -> {d.type} {_shape(d.shape)} (batched {_shape(d.batched_shape)}), written to "
             f"{d.buffer or 'no buffer'}"]
    for s in d.sources:
        lines.append(f"  {'weight' if s.weight else 'input '} {_src(s)}")
    lines.append(f"  max |Δ| {_g(d.max_abs)}, relative {_g(d.rel)}, {d.n_diff} of {d.n_elems} elements differ")
    return lines


def text(loc: "Located") -> str:
    extra = settings_label(loc.settings)
    head = (f"locate: {loc.target}{f' [{extra}]' if extra else ''}, token {loc.position} "
            f"(KV position {loc.n_prompt + loc.position - 1}) as row {loc.row} of a width-{loc.width} pass "
            f"against the single-token pass" + (" (the trace's fork)" if loc.source == "trace" else ""))
    n = len(loc.nodes)
    lines = [head]
    sel = "every node" if loc.selection == "all" else "each layer's output, the final norm and the logits"
    if getattr(loc, "granularity", "op") == "layer":
        sel = "the embedding, each layer's output, the final norm and the logits: per layer, not per op"
    lines.append(f"  observed {n} nodes per pass ({sel}); "
                 + ("observing changed nothing: both passes' logits equal an unobserved context's, bit for bit"
                    if loc.observer_exact else "OBSERVING CHANGED THE LOGITS: the nodes may not be what an "
                    "unobserved pass computes"))
    lines.append(f"  compared {loc.count('identical') + loc.count('differs')} nodes, "
                 f"{loc.count('differs')} differ; skipped {loc.count('skipped')}"
                 + _skipped(loc))
    lines.append("  " + where(loc))
    first = loc.first
    if first is not None:
        lines += ["    " + x for x in describe(first)]
        lines.append("  growth: |Δ| of each part's output (largest inside it), differing / compared nodes, first:")
        parts = [a for a in loc.per_layer() if a["differ"]]
        if len(parts) > 9:  # the first parts, the largest, the last: how it starts, peaks and ends
            big = max(parts[4:-3], key=lambda a: a["out"])
            parts = parts[:4] + [None, big, None] + parts[-3:]
        for a in parts:
            if a is None:
                lines.append("         ...")
                continue
            if a["differ"]:
                lines.append(f"    {a['part']:>8}  {_g(a['out']):>9} ({_g(a['max'])})  {a['differ']:3d}/"
                             f"{a['compared']:<3d} {a['first']}")
    rec = recurrent(loc)
    if rec:
        lines.append("  recurrent ops (compared on their per-token rows): " + "; ".join(
            f"{d.name} {d.op}" + (f" blk.{d.layer}" if d.layer is not None else "")
            + (f" differs, max |Δ| {_g(d.max_abs)}" if d.status == "differs" else f" {d.status}")
            + (f" ({d.note})" if d.status == "skipped" and d.note else "") for d in rec))
    lg = loc.logits
    flip = (f"argmax flips ({lg.argmax_single} -> {lg.argmax_batched})" if lg.flips
            else f"argmax the same ({lg.argmax_single})")
    lines.append(f"  logits: {lg.n_diff} of {lg.n_vocab} differ, max |Δ| {_g(lg.max_abs)}; {flip}; single-token "
                 f"top-2 gap {_g(lg.margin_single)}")
    for note in loc.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def recurrent(loc: "Located") -> list["NodeDiff"]:
    """The nodes that carry a recurrent state from token to token (gated delta net, SSM conv and scan, RWKV, and a
    short convolution's input packed with its state), in graph order."""
    return [d for d in loc.nodes if d.op in RECURRENT_OPS or (d.op in PACKED_OPS and "state rows" in (d.note or ""))]


def _skipped(loc: "Located") -> str:
    reasons: dict[str, int] = {}
    for d in loc.nodes:
        if d.status == "skipped":
            key = (d.note or "").split(":")[0].split(" (")[0]
            reasons[key] = reasons.get(key, 0) + 1
    if not reasons:
        return ""
    return " (" + "; ".join(f"{k}: {v}" for k, v in sorted(reasons.items(), key=lambda x: -x[1])) + ")"
