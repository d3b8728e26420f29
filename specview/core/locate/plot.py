"""|Δ| along the graph: what the app's locate plot and a locate report's plot draw, from a locate or a departure.

Qt-free.  A :class:`GraphSeries` has one point per compared node, in graph
order: x is the node's index in the graph, y its max |Δ| (0 for a node whose
row is bit-identical), and what the hover says of it (name, op, types,
buffers).  It is built from a whole :class:`~specview.core.locate.find.Located`
or from the compact ``graph`` record a near-tie diagnosis' ``departure``
keeps (:func:`graph_record`), so a saved trace can draw its fork's plot
without running the locate again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..jsonfile import json_safe

#: the keys of a departure's ``graph`` record, one list (or one character per node for ``status``) each
GRAPH_KEYS = ("index", "name", "op", "type", "buffer", "weight", "part", "max_abs")


def graph_record(loc: Any) -> dict[str, Any]:
    """The compared nodes of a locate, compact: a list per field and a status string ("d" differs, "i" identical)."""
    nodes = [d for d in loc.nodes if d.status != "skipped"]
    rec: dict[str, Any] = {k: [] for k in GRAPH_KEYS}
    for d in nodes:
        w = d.weight
        rec["index"].append(d.index)
        rec["name"].append(d.name)
        rec["op"].append(d.op)
        rec["type"].append(d.type)
        rec["buffer"].append(d.buffer or "")
        rec["weight"].append(f"{w.name} {w.type} in {w.buffer}" if w is not None else "")
        rec["part"].append(d.part or "")
        rec["max_abs"].append(d.max_abs)
    rec["status"] = "".join("d" if d.status == "differs" else "i" for d in nodes)
    rec["n_nodes"] = len(loc.nodes)
    return json_safe(rec)


@dataclass
class GraphSeries:
    """One point per compared node of a locate, in graph order."""

    x: list[int]
    y: list[float]
    differs: list[bool]
    name: list[str]
    op: list[str]
    type: list[str]
    buffer: list[str]
    weight: list[str]
    part: list[str]
    where: str = ""
    title: str = ""
    n_nodes: int = 0
    logits: str = ""
    #: (x of the first node of each part, its label): layer boundaries
    boundaries: list[tuple[int, str]] = field(default_factory=list)

    @property
    def first(self) -> int | None:
        """The position in the series of the first differing node, or None."""
        return next((i for i, d in enumerate(self.differs) if d), None)

    def floor(self) -> float:
        """Where bit-identical nodes are drawn on a log axis: a decade below the smallest difference."""
        pos = [v for v, d in zip(self.y, self.differs) if d and v > 0 and math.isfinite(v)]
        return 10 ** math.floor(math.log10(min(pos)) - 1) if pos else 1e-9

    def hover(self, i: int) -> str:
        """What the plot says of point ``i``."""
        lines = [f"{self.name[i]}  (node {self.x[i]}, {self.part[i] or '?'})",
                 f"{self.op[i]} -> {self.type[i]}" + (f", written to {self.buffer[i]}" if self.buffer[i] else "")]
        if self.weight[i]:
            lines.append(f"weight {self.weight[i]}")
        lines.append(f"max |Δ| {self.y[i]:.3g}" if self.differs[i] else "bit-identical")
        if i == self.first:
            lines.append("the first node that differs")
        return "\n".join(lines)


def _boundaries(parts: list[str], xs: list[int]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for p, x in zip(parts, xs):
        if not out or out[-1][1] != p:
            out.append((x, p))
    return out


def series_of(src: Any) -> GraphSeries | None:
    """The series of a Located, of a departure record with a ``graph``, or None (a departure without one)."""
    if isinstance(src, dict):
        g = src.get("graph")
        if not isinstance(g, dict) or not isinstance(g.get("status"), str):
            return None
        n = len(g["status"])
        if any(not isinstance(g.get(k), list) or len(g[k]) != n for k in GRAPH_KEYS):
            return None
        ys = [float("inf") if v is None else float(v) for v in g["max_abs"]]
        title = f"row {src.get('row')} of the width-{src.get('width')} pass, token {src.get('position')}"
        logits = (f"{src['logits_differ']} of {src['n_vocab']} logits differ"
                  if src.get("logits_differ") is not None and src.get("n_vocab") else "")
        s = GraphSeries(x=[int(v) for v in g["index"]], y=ys, differs=[c == "d" for c in g["status"]],
                        name=list(g["name"]), op=list(g["op"]), type=list(g["type"]), buffer=list(g["buffer"]),
                        weight=list(g["weight"]), part=list(g["part"]), where=str(src.get("where") or ""),
                        title=title, n_nodes=int(g.get("n_nodes") or n), logits=logits)
    else:
        rec = graph_record(src)
        s = series_of({"graph": rec, "where": src.where(), "row": src.row, "width": src.width,
                       "position": src.position, "logits_differ": src.logits.n_diff, "n_vocab": src.logits.n_vocab})
        if s is None:
            return None
        s.title = f"{src.target}: {s.title}"
    s.boundaries = _boundaries(s.part, s.x)
    return s


__all__ = ["GRAPH_KEYS", "GraphSeries", "graph_record", "series_of"]
