"""Name the op: which graph node of the real model first differs between the single-token and the batched pass.

A speculative verify computes token ``P`` as row ``j`` of a width-``T`` pass;
plain decoding computes it as a single-token pass.  :func:`locate` runs both
from the same teacher-forced KV prefix on an engine whose passes can be
observed node by node (:class:`GraphEngine`), and compares the two graphs in
graph order, row ``j`` of each batched node against the single-token node:

* the sequence is the target's own greedy continuation of the prompt (or, for
  a trace, the tokens its fork's verify pass was fed), walked one token per
  pass as plain decoding walks it;
* the width-``T`` pass feeds tokens ``P-1-j .. P-2-j+T`` on the prefix that
  ends at token ``P-1-j``; the single-token pass feeds token ``P-1`` on the
  prefix that ends at token ``P-1``; both prefixes are the walk's own KV
  entries, copied bit for bit into the observed context;
* a node's token axis is found by shape: the one axis where the single-token
  node has 1 and the batched node has ``T``, wherever it sits (``kq-*`` is
  ``[n_kv, n_tokens, n_head]``).  A node with no such axis (the KV cache's
  views hold every position) is skipped and counted, never compared whole;
* both observed passes are checked against the same passes run on a context
  without the observer: if observing every node changed the logits, fewer
  nodes are observed (each layer's output and the logits) and the result says
  so.

The result (:class:`Located`) names the first differing node with its op, the
types, shapes and buffers of its inputs (the weight's buffer says CPU,
CPU_REPACK, AMX, Vulkan0 ...), the size of the difference, how it grows layer
by layer and how many of the vocabulary's logits differ.  JSON schema
``specview.locate/1``; the text form is :func:`specview.core.locate.text.text`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import EngineSettings
from ..config import fill_plain
from ..errors import BackendUnavailable, Cancelled, ConfigError, SpecviewError
from ..arms.generate import ban_rows, banned, prefill
from .graphdiff import (  # noqa: F401  (re-exported: what an observing engine reports, and the diff)
    VIEW_OPS,
    GraphEngine,
    GraphNode,
    MicroBatch,
    NodeDiff,
    NodeSource,
    compare_graphs,
    compare_values,
    layer_of,
    token_axis,
    trim,
)
from ..jsonfile import json_safe, read_json, schema_of, write_atomic
from ..arms.topk import topk
from ..registry import Runner

SCHEMA = "specview.locate/1"
#: node selections an engine may observe, widest first
SELECTIONS = ("all", "layers")

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]


class LocateError(SpecviewError):
    """A locate that cannot be run as asked, or a locate file that cannot be read."""


class NotObservable(BackendUnavailable):
    """The engine computes its passes where specview cannot look inside them."""


# -- the result ---------------------------------------------------------------------------
@dataclass
class LogitsDiff:
    n_vocab: int
    n_diff: int
    max_abs: float
    argmax_single: int
    argmax_batched: int
    margin_single: float  # top-1 minus top-2 logit of the single-token row

    @property
    def flips(self) -> bool:
        return self.argmax_single != self.argmax_batched


@dataclass
class Located:
    """One locate: where row ``row`` of a width-``width`` pass first departs from the single-token pass."""

    target: str
    backend: str
    settings: EngineSettings
    model: dict[str, Any]
    position: int  # index of the compared token in the continuation: its row feeds token position-1
    width: int
    row: int
    n_prompt: int
    single_tokens: list[int]
    batch_tokens: list[int]
    selection: str
    observer_exact: bool  # both observed passes gave the logits an unobserved context gives, bit for bit
    nodes: list[NodeDiff]
    logits: LogitsDiff
    notes: list[str] = field(default_factory=list)
    source: str = "position"  # "position" or "trace"
    threads_used: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    granularity: str = "op"  # "op": a node per graph op (llama.cpp); "layer": per layer output (MLX)

    @property
    def first(self) -> NodeDiff | None:
        return next((d for d in self.nodes if d.status == "differs"), None)

    @property
    def identical(self) -> bool:
        """No compared node and no logit differs."""
        return self.first is None and self.logits.n_diff == 0

    def count(self, status: str) -> int:
        return sum(1 for d in self.nodes if d.status == status)

    def per_layer(self) -> list[dict[str, Any]]:
        """Per part of the graph (input, blk.N, output) in graph order: how far the difference has grown.

        ``out`` is the |Δ| of the part's last compared node (a layer's ``l_out-N``,
        the residual stream it hands on), ``max`` the largest in it, ``first`` its
        first differing node, ``differ`` how many of its compared nodes differ.
        """
        acc: dict[str, dict[str, Any]] = {}
        for d in self.nodes:
            a = acc.setdefault(d.part or "?", {"part": d.part or "?", "out": 0.0, "max": 0.0, "first": None,
                                               "differ": 0, "compared": 0})
            if d.status == "skipped":
                continue
            a["compared"] += 1
            a["out"] = d.max_abs
            if d.status == "differs":
                a["max"] = max(a["max"], d.max_abs)
                a["first"] = a["first"] or d.name
                a["differ"] += 1
        return list(acc.values())

    def where(self) -> str:
        """One line: where the batched pass first departs ("blk.0 Qcur-0: MUL_MAT on f16 weights in CPU, 576 of 576")."""
        from .text import where

        return where(self)

    def text(self) -> str:
        from .text import text

        return text(self)

    def summary(self) -> dict[str, Any]:
        """The few facts a verdict, a report or a kernel map carries (the whole locate is :meth:`to_json`)."""
        d = self.first
        w = d.weight if d is not None else None
        return json_safe({
            "where": self.where(), "width": self.width, "row": self.row, "position": self.position,
            "identical": self.identical, "observer_exact": self.observer_exact, "selection": self.selection,
            "granularity": self.granularity,
            "node": None if d is None else d.name, "op": None if d is None else d.op,
            "part": None if d is None else d.part, "max_abs": None if d is None else d.max_abs,
            "weight_type": None if w is None else w.type, "weight_buffer": None if w is None else w.buffer,
            "computed_in": None if d is None else d.buffer, "logits_differ": self.logits.n_diff,
            "n_vocab": self.logits.n_vocab,
            "recurrent": [{"node": r.name, "op": r.op, "part": r.part, "status": r.status, "max_abs": r.max_abs}
                          for r in self.recurrent()],
        })

    def recurrent(self) -> list[NodeDiff]:
        """The nodes that carry a recurrent state (a hybrid's gated delta net, short convolution, SSM scan ...)."""
        from .text import recurrent

        return recurrent(self)

    # -- JSON ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        first = self.first
        return json_safe({
            "schema": SCHEMA, "target": self.target, "backend": self.backend, "settings": self.settings.to_dict(),
            "model": self.model, "source": self.source, "position": self.position, "width": self.width,
            "row": self.row, "n_prompt": self.n_prompt, "single_tokens": self.single_tokens,
            "batch_tokens": self.batch_tokens, "selection": self.selection, "observer_exact": self.observer_exact,
            "threads_used": self.threads_used, "granularity": self.granularity, "identical": self.identical,
            "first": None if first is None else first.index, "where": self.where(),
            "logits": asdict(self.logits), "notes": list(self.notes), "seconds": self.seconds,
            "nodes": [d.to_json() for d in self.nodes],
        })

    @classmethod
    def from_json(cls, d: Any, *, source: str = "<locate>") -> Located:
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise LocateError(f"{source}: not a specview locate ({schema_of(d)}; a locate's schema is {SCHEMA!r}); "
                              "write one with `specview locate --json FILE`")
        try:
            lg = dict(d["logits"])
            lg["max_abs"] = float("inf") if lg.get("max_abs") is None else float(lg["max_abs"])
            lg["margin_single"] = float("inf") if lg.get("margin_single") is None else float(lg["margin_single"])
            return cls(
                target=str(d["target"]), backend=str(d["backend"]),
                settings=fill_plain(EngineSettings.from_dict(d.get("settings") or {})), model=dict(d.get("model") or {}),
                position=int(d["position"]), width=int(d["width"]), row=int(d["row"]), n_prompt=int(d["n_prompt"]),
                single_tokens=[int(t) for t in d["single_tokens"]], batch_tokens=[int(t) for t in d["batch_tokens"]],
                selection=str(d["selection"]), observer_exact=bool(d["observer_exact"]),
                nodes=[NodeDiff.from_json(n) for n in d["nodes"]], logits=LogitsDiff(**lg),
                notes=[str(x) for x in d.get("notes", [])], source=str(d.get("source", "position")),
                threads_used=d.get("threads_used"), granularity=str(d.get("granularity", "op")), seconds={str(k): float(v) for k, v in (d.get("seconds") or {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LocateError(f"{source}: malformed locate ({type(exc).__name__}: {exc})") from None

    def save(self, path: str | Path) -> Path:
        import json

        return write_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Located:
        return cls.from_json(read_json(path, LocateError), source=str(path))


# -- running it ---------------------------------------------------------------------------
def _observed(model: Any, settings: EngineSettings, n_ctx: int, selection: str, backend: str) -> Any:
    opener = getattr(model, "observed_engine", None)
    if opener is None:
        raise NotObservable(f"the {backend} engine cannot show the nodes of its forward passes; locate runs on "
                            "llama.cpp in-process (per op) and on MLX in-process (per layer)")
    return opener(settings, n_ctx, selection)


def _checked_position(width: int, row: int, position: int | None) -> int:
    """The token the compared row computes (``row + 1`` by default), refusing a row or position no pass has."""
    if width < 1:
        raise ConfigError(f"width must be at least 1, the verify pass's one row per token (got {width})",
                          setting="width")
    if not 0 <= row < width:
        raise ConfigError(f"row must be between 0 and width - 1 = {width - 1} (got row {row}, width {width})",
                          setting="row")
    position = row + 1 if position is None else int(position)
    if position < row + 1:
        raise ConfigError(f"position {position} is too early for row {row}: the pass would start before the first "
                          f"generated token; use a position >= {row + 1}", setting="position")
    return position


def _walk(plain: Any, ids: list[int], n_batch: int, teacher: Sequence[int] | None, steps: int, position: int,
          cancel: CancelFn, ignore_eos: bool = False) -> tuple[list[int], list[str]]:
    """The continuation fed ``steps`` tokens one per pass, as plain decoding walks it: the teacher's tokens, then
    the target's greedy ones (with ``ignore_eos``, as the arms pick them: every end-of-generation token banned);
    (the continuation, a note where the walk's greedy token is not the teacher's)."""
    pre = prefill(plain, ids, n_batch, cancel)
    if pre is None:
        raise Cancelled("locate cancelled")
    seq = [int(t) for t in (teacher or [])]
    notes: list[str] = []
    ban = banned(plain, ignore_eos)
    row_logits = ban_rows(pre[0], ban)
    replay_ok = True
    for k in range(steps):  # feed c[k]; the row gives c[k+1]
        if k >= len(seq):
            seq.append(int(np.argmax(row_logits)))
        elif replay_ok and k <= position - 1 and int(np.argmax(row_logits)) != seq[k]:
            replay_ok = False
            notes.append(f"the single-token replay's greedy token {k} is {int(np.argmax(row_logits))}, the trace's "
                         f"is {seq[k]}: this machine or build computes the walk differently from the trace's")
        if k == steps - 1:
            break
        if cancel():
            raise Cancelled("locate cancelled")
        row_logits = ban_rows(plain.eval([seq[k]], rows=[0])[0], ban)
    return seq, notes


@dataclass
class _Passes:
    """The two compared passes' place in the walk: the batched one feeds ``batch``, the single-token one ``single``."""

    n_prompt: int
    start: int  # continuation index of the batch's first row
    position: int
    width: int
    row: int
    seq: list[int]
    batch: list[int]
    single: list[int]


def _observe(model: Any, settings: EngineSettings, n_ctx: int, backend: str, plain: Any, ps: _Passes,
             notes: list[str]) -> tuple[dict[str, Any], list[str], str]:
    """Both passes observed, widest selection first, down to fewer nodes while observing moves the logits;
    (the last :func:`_pair`, the selections tried, the nodes' granularity)."""
    tried: list[str] = []
    granularity = "op"
    for sel in SELECTIONS:
        obs = _observed(model, settings, n_ctx, sel, backend)
        got = getattr(obs, "selection", sel)  # an engine with no finer nodes observes fewer than asked
        granularity = getattr(obs, "granularity", "op")
        if getattr(obs, "note", None) and obs.note not in notes:
            notes.append(obs.note)
        try:
            res = _pair(plain, obs, ps.n_prompt, ps.start, ps.position, ps.batch, ps.single, ps.seq, ps.width, ps.row)
        finally:
            obs.close()
        tried.append(got)
        if res["exact"]:
            break
        last = got == SELECTIONS[-1]
        notes.append(f"observing {'every node' if got == 'all' else 'the layer outputs'} changed the logits "
                     + ("(the scheduler splits the graph at every observed node, and fused kernels do not fuse)"
                        if granularity == "op" else "")
                     + ("; observing fewer nodes" if not last else "; the nodes below may not be the "
                        "ones an unobserved pass computes"))
        if last:
            break
    return res, tried, granularity


def _compared_nodes(res: dict[str, Any], plain: Any, width: int, row: int, notes: list[str]) -> list[NodeDiff]:
    """The observed graphs compared node by node: row ``row``'s micro-batch against the single-token pass."""
    mb: MicroBatch = res["micro"]
    nodes, cmp_notes = compare_graphs(res["single_nodes"], mb.nodes, mb.width, row - mb.first_row)
    notes += cmp_notes
    if res["n_micro"] > 1:
        notes.append(f"llama.cpp computed the width-{width} pass as {res['n_micro']} micro-batches (n_ubatch "
                     f"{getattr(plain, 'n_ubatch', '?')}); row {row} is row {row - mb.first_row} of the "
                     f"{mb.width}-token one, and that is what was compared")
    if row > 0:
        earlier = "row 0" if row == 1 else f"rows 0-{row - 1}"
        notes.append(f"row {row} also attends to the K/V entries the same pass wrote for {earlier}, in the "
                     "batched shape")
    return nodes


def _logits_diff(res: dict[str, Any], row: int, source: str, notes: list[str]) -> LogitsDiff:
    """How the unobserved passes' logits differ at the compared row."""
    ls, lb = res["single_ref"][0], res["batch_ref"][row]
    n_diff, mx, _ = compare_values(ls, lb)
    ids_s, vals_s = topk(ls, 2)
    margin = float(vals_s[0] - vals_s[1]) if len(vals_s) > 1 else float("inf")
    logits = LogitsDiff(n_vocab=int(ls.size), n_diff=n_diff, max_abs=mx, argmax_single=int(np.argmax(ls)),
                        argmax_batched=int(np.argmax(lb)), margin_single=margin)
    if source == "trace" and not logits.flips:
        notes.append(NO_FLIP_ON_A_SHARED_PREFIX)
    return logits


#: why a trace's fork need not flip where it is located: the locate's passes share the single-token prefix
NO_FLIP_ON_A_SHARED_PREFIX = ("the argmax does not flip here as it did in the trace: the speculative arm's earlier KV "
                              "entries were written by its own verify passes, in the batched shape, and this locate "
                              "gives both passes the single-token prefix, to name the op of this pass alone")


def locate(session: Any, target: str, *, width: int, row: int = 0, position: int | None = None,
           prompt_tokens: Sequence[int] | None = None, prompt: str | None = None, chat: bool = True,
           settings: EngineSettings | None = None, backend: str = "llama.cpp", teacher: Sequence[int] | None = None,
           source: str = "position", ignore_eos: bool = False, progress: ProgressFn | None = None,
           cancel: CancelFn | None = None) -> Located:
    """Locate where row ``row`` of a width-``width`` pass computing token ``position`` first departs.

    A job for a runner: it gets its model and contexts from ``session`` and
    returns a picklable :class:`Located`.  ``teacher`` gives the continuation to
    feed (a trace's tokens); without it the target's own greedy continuation
    is walked (``ignore_eos``: as a run with ``--ignore-eos`` walks it, every
    end-of-generation token banned).  ``position`` defaults to ``row + 1``, the
    first token a width-``width`` pass can compute at row ``row``.
    """
    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    # decided (Runner.job resolved them; a direct call gets the same door), as the locate records it
    settings = Runner.resolve_settings(settings or EngineSettings(), backend=backend, target=target)[0]
    position = _checked_position(width, row, position)
    t0 = time.perf_counter()
    model = session.model(backend, target, settings)
    t_load = time.perf_counter()
    ids = list(prompt_tokens) if prompt_tokens else model.tokenize(prompt or "", chat=chat)
    if not ids:
        raise LocateError("the prompt is empty")
    start = position - row  # continuation index of the batch's first row
    need = start - 1 + width  # continuation tokens the batch feeds: c[start-1 .. start-2+width]
    n = len(ids)
    n_ctx = ((n + max(need, position) + 2 + 255) // 256) * 256
    plain = session.engine("locate", model, settings, n_ctx)
    if width > plain.n_batch:
        raise ConfigError(f"width {width} is wider than the batch size {plain.n_batch}; raise --n-batch",
                          setting="n_batch")
    say(f"locate: walking {target} to token {max(need, position)} ({n} prompt tokens)")
    seq, notes = _walk(plain, ids, settings.n_batch, teacher, max(need, position), position, cancel, ignore_eos)
    ps = _Passes(n_prompt=n, start=start, position=position, width=width, row=row, seq=seq,
                 batch=seq[start - 1:start - 1 + width], single=[seq[position - 1]])
    t_walk = time.perf_counter()
    res, tried, granularity = _observe(model, settings, n_ctx, backend, plain, ps, notes)
    nodes = _compared_nodes(res, plain, width, row, notes)
    logits = _logits_diff(res, row, source, notes)
    t1 = time.perf_counter()
    return Located(
        target=target, backend=backend, settings=settings, model=model.facts(), position=position, width=width,
        row=row, n_prompt=n, single_tokens=ps.single, batch_tokens=[int(t) for t in ps.batch], selection=tried[-1],
        observer_exact=bool(res["exact"]), nodes=nodes, logits=logits, notes=notes, source=source,
        threads_used=getattr(plain, "threads", None), granularity=granularity,
        seconds={"total": round(t1 - t0, 3), "load": round(t_load - t0, 3), "walk": round(t_walk - t_load, 3),
                 "observed": round(res["observed_s"], 3), "plain": round(res["plain_s"], 3),
                 "compare": round(t1 - t_walk - res["observed_s"] - res["plain_s"], 3)},
    )


def _pair(plain: Any, obs: Any, n: int, start: int, position: int, batch: list[int], single: list[int],
          seq: list[int], width: int, row: int) -> dict[str, Any]:
    """The batched and the single-token pass, each observed and unobserved on the same prefix."""
    plain_s = observed_s = 0.0
    # the batched pass, on the prefix that ends at token start-1 (fed: c[0..start-2])
    plain.truncate(n + start - 1)
    obs.take_state(plain)
    t = time.perf_counter()
    batch_ref = plain.eval(batch, rows=range(width))
    t2 = time.perf_counter()
    batch_obs, micro = obs.observe(batch, range(width))
    mb = next(m for m in micro if m.first_row <= row < m.first_row + m.width)
    observed_s += time.perf_counter() - t2
    plain_s += t2 - t
    # the single-token pass, on the prefix that ends at token position-1
    plain.truncate(n + start - 1)
    for k in range(start - 1, position - 1):
        plain.eval([seq[k]], rows=[0])
    obs.take_state(plain)
    t = time.perf_counter()
    single_ref = plain.eval(single, rows=[0])
    t2 = time.perf_counter()
    single_obs, (one,) = obs.observe(single, [0])
    observed_s += time.perf_counter() - t2
    plain_s += t2 - t
    exact = (np.array_equal(batch_ref.view(np.uint32), batch_obs.view(np.uint32))
             and np.array_equal(single_ref.view(np.uint32), single_obs.view(np.uint32)))
    return {"exact": exact, "batch_ref": batch_ref, "single_ref": single_ref, "micro": mb, "n_micro": len(micro),
            "single_nodes": one.nodes, "observed_s": observed_s, "plain_s": plain_s}


def departure(session: Any, trace: Any, *, progress: ProgressFn | None = None,
              cancel: CancelFn | None = None) -> dict[str, Any]:
    """Where the trace's fork pass first departs from the single-token pass: :meth:`Located.summary` and its
    compared nodes' |Δ| (``graph``, :func:`~specview.core.locate.plot.graph_record`), or ``{"skipped": why}``
    when it cannot be located (an engine that cannot be observed, a fork no verify pass chose)."""
    from .plot import graph_record

    try:
        loc = locate(session, progress=progress, cancel=cancel, **fork_of(trace))
        return {**loc.summary(), "graph": graph_record(loc)}
    except Cancelled:
        raise
    except SpecviewError as exc:
        return {"skipped": str(exc)}


def fork_of(trace: Any) -> dict[str, Any]:
    """What a trace's first fork asks :func:`locate` for: target, settings, prompt, position, width, row, teacher.

    The width and row are those of the verify pass whose row chose the
    speculative arm's first differing token; the teacher tokens are the shared
    prefix and that pass's draft tokens.
    """
    from ..config import RunConfig

    fm = trace.comparison.first_mismatch
    if fm is None:
        raise LocateError("the trace's arms are identical: there is no fork to locate; give --position instead")
    k = fm.index
    spec = trace.speculative
    if k >= len(spec.steps):
        raise LocateError(f"the speculative arm stopped before token {k}: no verify pass chose it")
    step = spec.steps[k]
    if step.batch_size is None or step.batch_index is None:
        raise LocateError("the trace does not say which verify pass chose the fork's token (its engine reports no "
                          "per-round data): locate it with --position, --width and --row")
    cfg = RunConfig.from_dict(trace.config)
    width, row = int(step.batch_size), int(step.batch_index)
    teacher = list(trace.vanilla.tokens[:k])
    rnd = next((r for r in spec.rounds if r.first_step == k - row and r.batch_size == width), None)
    replayed = next((r for r in spec.rounds if r.first_step == k - row and r.replay == width
                     and r.rollback == "checkpoint"), None)
    if replayed is not None:  # a replay after a checkpoint restore chose it: that pass carried the arm's own tokens
        teacher = teacher[:k - row] + [int(t) for t in spec.tokens[k - row:k - row + width - 1]]
    elif rnd is not None and len(rnd.draft_tokens) == width - 1:
        teacher = teacher[:k - row] + [int(t) for t in rnd.draft_tokens]
    return {"target": cfg.target, "settings": cfg.engine, "backend": cfg.backend,
            "prompt_tokens": [int(t) for t in trace.prompt["tokens"]], "position": k, "width": width, "row": row,
            "teacher": teacher, "source": "trace", "ignore_eos": bool(cfg.ignore_eos)}


__all__ = ["SCHEMA", "SELECTIONS", "departure", "GraphEngine", "GraphNode", "Located", "LocateError", "LogitsDiff", "MicroBatch",
           "NodeDiff",
           "NodeSource", "NotObservable", "compare_graphs", "compare_values", "fork_of", "layer_of", "locate",
           "token_axis"]
