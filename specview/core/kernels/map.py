"""The kernel map: which verify widths compute exactly what single-token passes compute.

A speculative verify pass runs the target on ``T = 1 + n_drafted`` tokens at
once; plain decoding runs it on one.  Backends pick different kernels by batch
width, so row ``i`` of a width-``T`` pass may round differently from the
single-token pass that computes the same position.  The map measures that
directly, before any generation, for every width asked:

1. **The sequence.**  Per target and prompt, the prompt is prefilled in
   ``n_batch`` chunks (as both arms prefill it) and continued greedily one
   token per forward pass, past end-of-generation tokens.  That one walk gives
   the teacher-forced token sequence *and* the single-token row of every
   position: token ``j``'s row is the pass that fed token ``j - 1``.
2. **The verify passes.**  For each width ``T`` the positions ``1, 2, ...``
   are cut into consecutive blocks of ``T``; the block starting at ``s`` is one
   forward pass over ``tokens[s-1 : s-1+T]`` (the last emitted token plus
   ``T - 1`` correct draft tokens), exactly what a verify pass whose drafts are
   all right feeds.  Its row ``i`` is compared with token ``s + i``'s
   single-token row.
3. **The prefix.**  Every verify pass sees the KV state the walk built, in the
   single-token shape: the walk's context is rolled back (``truncate``) to the
   block's prefix, the pass runs, and the next block rolls back again.  Blocks
   run from the last to the first, so each rollback only removes entries
   (nothing is recomputed): one walk serves every width.  So a row differs
   from its single-token row only through the verify pass's own kernels, on
   identical KV entries; rows ``1..T-1`` of a pass also read the K/V entries
   that the same pass wrote for its earlier rows, in the batched shape, as a
   verify pass does.
4. **Width 1 is the control.**  A width-1 block is the walk's own pass run
   again after a rollback; on a deterministic backend with an exact rollback
   it is bit-identical.  If it is not, nothing in the map proves anything and
   the target is marked nondeterministic.

The figures per target and width, the cost and what a "proven lossless" claim
rests on are described in ``docs/kernels.md``.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import EngineSettings, check_value
from ..errors import BackendUnavailable, Cancelled, ConfigError, SpecviewError
from ..eta import WorkEta
from ..arms.generate import prefill
from ..prompts import PromptError, PromptSpec, builtin_names, builtin_prompts
from .text import heatmap, parse_widths, ranges, settings_label, table
from ..arms.topk import topk
from ..trace import json_safe, read_json, write_atomic

SCHEMA = "specview.kernels/1"
DEFAULT_WIDTHS = tuple(range(1, 17))
DEFAULT_POSITIONS = 128
DEFAULT_TOP_K = 8

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]


class KernelMapError(SpecviewError):
    """A kernel map file that cannot be read, or a map that cannot be computed as asked."""


# -- inputs ------------------------------------------------------------------------------
def as_prompts(items: Iterable[Any]) -> list[PromptSpec]:
    """Prompts from :class:`PromptSpec`s, built-in names, texts or token-id lists."""
    out: list[PromptSpec] = []
    builtin = set(builtin_names())
    for i, it in enumerate(items):
        if isinstance(it, PromptSpec):
            out.append(it)
        elif isinstance(it, str):
            out.append(builtin_prompts([it])[0] if it in builtin else PromptSpec(name=f"prompt{i + 1}", text=it))
        elif isinstance(it, (list, tuple)) and it and all(isinstance(t, int) and t >= 0 for t in it):
            out.append(PromptSpec(name=f"tokens{i + 1}", tokens=tuple(int(t) for t in it), chat=False))
        else:
            raise KernelMapError(f"prompt {i + 1}: {it!r} is neither a prompt, a built-in name, a text nor token ids")
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise KernelMapError(f"prompt names must differ (got {', '.join(names)})")
    if not out:
        raise KernelMapError("the kernel map needs at least one prompt")
    return out


# -- results -----------------------------------------------------------------------------
@dataclass
class WidthStats:
    """One width's figures for one target (over every prompt)."""

    width: int
    rows: int = 0
    identical: int = 0
    max_delta: float = 0.0
    p95_delta: float = 0.0
    flips: int = 0
    below_shift: int = 0
    #: per row index of the pass: rows that were not bit-identical
    differing_by_row: list[int] = field(default_factory=list)
    #: (prompt, token index) of every argmax flip
    flip_at: list[tuple[str, int]] = field(default_factory=list)
    #: the first row that was not bit-identical: (prompt, token index, row of the pass), or None
    first_difference: tuple[str, int, int] | None = None
    #: measuring stopped at the first differing row (the figures cover the rows measured)
    stopped: bool = False
    #: where its first differing row first departs (a locate's summary, ``specview kernels --locate``), or None
    cause: dict[str, Any] | None = None

    @property
    def bit_identical(self) -> bool:
        return self.rows > 0 and self.identical == self.rows

    @property
    def identical_share(self) -> float:
        return self.identical / self.rows if self.rows else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "width": self.width, "rows": self.rows, "identical": self.identical,
            "bit_identical": self.bit_identical,
            "max_delta": self.max_delta, "p95_delta": self.p95_delta, "flips": self.flips,
            "below_shift": self.below_shift, "differing_by_row": list(self.differing_by_row),
            "flip_at": [list(x) for x in self.flip_at],
            "first_difference": list(self.first_difference) if self.first_difference else None,
            "stopped": self.stopped, **({"cause": self.cause} if self.cause is not None else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WidthStats:
        fd = d.get("first_difference")
        return cls(
            width=int(d["width"]), rows=int(d["rows"]), identical=int(d["identical"]),
            max_delta=float(d["max_delta"]) if d.get("max_delta") is not None else math.nan,
            p95_delta=float(d["p95_delta"]) if d.get("p95_delta") is not None else math.nan,
            flips=int(d["flips"]), below_shift=int(d.get("below_shift", 0)),
            differing_by_row=[int(x) for x in d.get("differing_by_row", [])],
            flip_at=[(str(p), int(j)) for p, j in d.get("flip_at", [])],
            first_difference=(str(fd[0]), int(fd[1]), int(fd[2])) if fd else None,
            stopped=bool(d.get("stopped", False)),
            cause=dict(d["cause"]) if isinstance(d.get("cause"), dict) else None,
        )


@dataclass
class PromptSequence:
    """The teacher-forced sequence of one prompt on one target, and the positions measured on it."""

    name: str
    prompt_tokens: list[int]
    tokens: list[int]  # the greedy single-token continuation, token 0 onwards
    positions: int  # tokens 1..positions are measured at every width (wider widths reach a little further)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "prompt_tokens": list(self.prompt_tokens), "tokens": list(self.tokens),
                "positions": self.positions}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PromptSequence:
        return cls(name=str(d["name"]), prompt_tokens=[int(t) for t in d["prompt_tokens"]],
                   tokens=[int(t) for t in d["tokens"]], positions=int(d["positions"]))


@dataclass
class TargetMap:
    """One row of the map: a target under one set of engine settings."""

    target: str
    settings: EngineSettings
    model: dict[str, Any]
    threads_used: int | None
    prompts: list[PromptSequence]
    widths: dict[int, WidthStats]
    seconds: float = 0.0
    locate_seconds: float | None = None  # the locates of its differing widths (--locate), included in seconds

    @property
    def label(self) -> str:
        extra = settings_label(self.settings)
        return f"{self.target} [{extra}]" if extra else self.target

    @property
    def deterministic(self) -> bool:
        """The width-1 control: the same single-token pass after a rollback gave the same bits."""
        w1 = self.widths.get(1)
        return w1 is not None and w1.bit_identical

    def safe_widths(self) -> list[int]:
        """Widths whose every row was bit-identical to the single-token row (none if the control failed)."""
        if not self.deterministic:
            return []
        return [w for w, s in sorted(self.widths.items()) if s.bit_identical]

    def safe_n_max(self) -> int | None:
        """The largest n_max whose verify widths 1..n_max+1 were all measured and bit-identical.

        None when even width 2 is not (no draft length is proven lossless), or the control failed.
        """
        safe = set(self.safe_widths())
        n = 0
        while n + 2 in safe:
            n += 1
        return n if n >= 1 else None

    def evidence(self, widths: Iterable[int] | None = None) -> str:
        """What a claim about this target rests on: prompts, positions and rows per width."""
        ws = sorted(self.widths) if widths is None else sorted(widths)
        rows = sum(self.widths[w].rows for w in ws if w in self.widths)
        ps = ", ".join(f"{p.name} tokens 1-{p.positions}" for p in self.prompts)
        return f"{rows} rows at widths {ranges(ws)} on {ps}"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target, "label": self.label, "settings": self.settings.to_dict(),
            "model": self.model, "threads_used": self.threads_used, "seconds": round(self.seconds, 3),
            "deterministic": self.deterministic, "safe_widths": self.safe_widths(), "safe_n_max": self.safe_n_max(),
            "prompts": [p.to_json() for p in self.prompts],
            "widths": [self.widths[w].to_json() for w in sorted(self.widths)],
            **({"locate_seconds": self.locate_seconds} if self.locate_seconds is not None else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TargetMap:
        return cls(
            target=str(d["target"]), settings=EngineSettings.from_dict(d.get("settings") or {}),
            model=dict(d.get("model") or {}), threads_used=d.get("threads_used"),
            prompts=[PromptSequence.from_json(p) for p in d["prompts"]],
            widths={int(w["width"]): WidthStats.from_json(w) for w in d["widths"]},
            seconds=float(d.get("seconds") or 0.0),
            locate_seconds=float(d["locate_seconds"]) if d.get("locate_seconds") is not None else None,
        )


@dataclass
class KernelMap:
    """The map of every target and width; what ``specview kernels`` prints and saves."""

    backend: str
    widths: tuple[int, ...]
    positions: int
    top_k: int
    prompts: list[PromptSpec]
    targets: list[TargetMap]
    environment: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def target(self, name: str, settings: EngineSettings | None = None) -> TargetMap:
        """The row for a target name or label (and settings, where one target was mapped under several)."""
        rows = [t for t in self.targets if t.label == name] or [t for t in self.targets if t.target == name]
        if settings is not None:
            rows = [t for t in rows if t.settings.context_key == settings.context_key]
        if not rows:
            raise KeyError(f"{name!r} is not in this kernel map (it has {', '.join(t.label for t in self.targets)})")
        if len(rows) > 1:
            raise KeyError(f"{name!r} was mapped under several settings; name one of "
                           f"{', '.join(t.label for t in rows)}")
        return rows[0]

    def safe_widths(self, target: str | TargetMap, settings: EngineSettings | None = None) -> list[int]:
        t = target if isinstance(target, TargetMap) else self.target(target, settings)
        return t.safe_widths()

    def safe_n_max(self, target: str | TargetMap, settings: EngineSettings | None = None) -> int | None:
        t = target if isinstance(target, TargetMap) else self.target(target, settings)
        return t.safe_n_max()

    # -- JSON --------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return json_safe({
            "schema": SCHEMA, "backend": self.backend, "widths": list(self.widths), "positions": self.positions,
            "top_k": self.top_k, "prompts": [p.to_json() for p in self.prompts],
            "environment": self.environment, "seconds": round(self.seconds, 3),
            "targets": [t.to_json() for t in self.targets],
        })

    def save(self, path: str | Path) -> Path:
        import json

        return write_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def from_json(cls, d: Any, *, source: str = "<kernel map>") -> KernelMap:
        _validate(d, source)
        try:
            return cls(
                backend=str(d["backend"]), widths=tuple(int(w) for w in d["widths"]), positions=int(d["positions"]),
                top_k=int(d["top_k"]),
                prompts=[PromptSpec.from_json(p, where=f"{source}: prompts[{i}]") for i, p in enumerate(d["prompts"])],
                targets=[TargetMap.from_json(t) for t in d["targets"]],
                environment=dict(d.get("environment") or {}), seconds=float(d.get("seconds") or 0.0),
            )
        except PromptError as exc:
            raise KernelMapError(str(exc)) from None
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:  # int(inf): OverflowError
            raise KernelMapError(f"{source}: malformed kernel map ({type(exc).__name__}: {exc})") from None

    @classmethod
    def load(cls, path: str | Path) -> KernelMap:
        return cls.from_json(read_json(path, KernelMapError), source=str(path))

    # -- text --------------------------------------------------------------------------------
    def table(self) -> str:
        """Per target: the per-width table, what it proves, and its widths grouped by cause where located."""
        from .causes import groups_line

        return table(self, groups_line)

    def heatmap(self) -> str:
        """Target x width, ASCII."""
        return heatmap(self)

    def grid(self, metric: str = "identical_share") -> tuple[list[str], list[int], list[list[float | None]]]:
        """(row labels, widths, values) for a heatmap: any numeric :class:`WidthStats` field or property."""
        rows = []
        for t in self.targets:
            rows.append([float(getattr(t.widths[w], metric)) if w in t.widths else None for w in self.widths])
        return [t.label for t in self.targets], list(self.widths), rows


def _validate(d: Any, source: str) -> None:
    if not isinstance(d, dict):
        raise KernelMapError(f"{source}: not a specview kernel map (the top level is {type(d).__name__})")
    schema = d.get("schema")
    if not isinstance(schema, str) or not schema.startswith("specview.kernels/"):
        raise KernelMapError(f"{source}: not a specview kernel map (schema is {schema!r}, expected {SCHEMA!r}); "
                             "write one with `specview kernels -o FILE`")
    if schema != SCHEMA:
        raise KernelMapError(f"{source}: kernel map schema {schema!r} is not supported (this specview reads {SCHEMA!r})")
    for key, typ in (("backend", str), ("widths", list), ("positions", int), ("top_k", int), ("prompts", list),
                     ("targets", list)):
        if not isinstance(d.get(key), typ):
            raise KernelMapError(f"{source}: malformed kernel map: {key!r} must be a {typ.__name__}")
    for i, t in enumerate(d["targets"]):
        if not isinstance(t, dict) or not isinstance(t.get("widths"), list) or not isinstance(t.get("prompts"), list):
            raise KernelMapError(f"{source}: malformed kernel map: target {i + 1} needs 'widths' and 'prompts' lists")
        for w in t["widths"]:
            if not isinstance(w, dict) or any(not isinstance(w.get(k), int) or isinstance(w.get(k), bool)
                                              for k in ("width", "rows", "identical", "flips")):
                raise KernelMapError(f"{source}: malformed kernel map: target {i + 1} has a width entry without "
                                     "integer 'width', 'rows', 'identical' and 'flips'")
            if not 0 <= w["identical"] <= w["rows"]:
                raise KernelMapError(f"{source}: malformed kernel map: target {i + 1} width {w['width']} has "
                                     f"{w['identical']} identical rows of {w['rows']}")


# -- computing it ------------------------------------------------------------------------
def block_starts(width: int, positions: int) -> list[int]:
    """First token index of each width-``width`` verify block covering tokens 1..positions."""
    return list(range(1, positions + 1, width))


def tokens_needed(widths: Sequence[int], positions: int) -> int:
    """How many tokens the sequence needs (token 0 .. the last single-token row any block reads)."""
    return 1 + max(len(block_starts(w, positions)) * w for w in widths)


class _Acc:
    """Running figures of one width."""

    def __init__(self, width: int):
        self.stats = WidthStats(width=width, differing_by_row=[0] * width)
        self.deltas: list[float] = []
        self.margins: list[float] = []  # single-token margin of every row's position
        self.first: tuple[int, int] | None = None  # (prompt order, token) of the earliest differing row

    def see(self, prompt: str, order: int, j: int, i: int, single: np.ndarray, row: np.ndarray, tops: dict,
            k: int, margin: float) -> None:
        st = self.stats
        st.rows += 1
        self.margins.append(margin)
        if np.array_equal(single.view(np.uint32), row.view(np.uint32)):
            st.identical += 1
            self.deltas.append(0.0)
            return
        ids_s = tops[j]
        ids_b, _ = topk(row, k)
        u = np.union1d(ids_s, ids_b)
        self.deltas.append(float(np.max(np.abs(single[u].astype(np.float64) - row[u].astype(np.float64)))))
        st.differing_by_row[i] += 1
        if self.first is None or (order, j) < self.first:  # blocks run last-first: keep the earliest
            self.first = (order, j)
            st.first_difference = (prompt, j, i)
        if int(np.argmax(single)) != int(np.argmax(row)):
            st.flips += 1
            st.flip_at.append((prompt, j))

    def finish(self) -> WidthStats:
        st = self.stats
        if self.deltas:
            a = np.asarray(self.deltas, dtype=np.float64)
            st.max_delta = float(a.max())
            st.p95_delta = float(np.percentile(a, 95))
            st.below_shift = int(sum(1 for m in self.margins if m < st.max_delta))
        return st


def _session_of(runner: Any, backend: str) -> Any:
    """The runner to map on: ``runner``, or a new one of ``backend`` (the caller closes it); refused for an engine
    whose forward passes specview does not run itself."""
    from ..registry import Runner, get_backend, holds_models

    if runner is None:
        be = get_backend(backend)
        if not be.in_process:
            raise BackendUnavailable(_not_in_process(backend))
        return be.runner()
    if holds_models(runner):
        return runner
    try:
        in_process = get_backend(backend).in_process
    except SpecviewError:
        in_process = False
    if not in_process or type(runner).job is Runner.job:
        raise BackendUnavailable(_not_in_process(backend))
    return runner


def _not_in_process(backend: str) -> str:
    return (f"the kernel map needs an engine whose forward passes specview runs itself (llama.cpp, mlx); "
            f"{backend} computes its verify passes where specview cannot split them. Map the same GGUF file "
            "with --engine llama.cpp.")


def map_target(session: Any, target: str, prompts: Sequence[PromptSpec], widths: Sequence[int], positions: int,
               settings: EngineSettings, *, backend: str = "llama.cpp", top_k: int = DEFAULT_TOP_K,
               progress: ProgressFn | None = None, cancel: CancelFn | None = None,
               on_pass: Callable[[int], None] | None = None, stop_at_difference: bool = False) -> TargetMap:
    """One row of the map (see the module docstring for the method).

    ``stop_at_difference``: a width is not measured further once one of its rows
    differs (which widths are bit-identical is still fully answered; a stopped
    width's figures cover only the rows measured).
    """
    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    t0 = time.perf_counter()
    model = session.model(backend, target, settings)
    seqs = []
    for p in prompts:
        toks = list(p.tokens) if p.tokens else model.tokenize(p.text or "", chat=p.chat)
        if not toks:
            raise KernelMapError(f"prompt {p.name!r} is empty for {target}")
        bad = [t for t in toks if not 0 <= t < model.vocab.n_vocab]
        if bad:
            raise KernelMapError(f"prompt {p.name!r}: token id {bad[0]} is outside {target}'s vocabulary")
        seqs.append(toks)
    n_tok = tokens_needed(widths, positions)
    n_ctx = max(len(s) for s in seqs) + n_tok + 1
    n_ctx = ((n_ctx + 255) // 256) * 256
    eng = session.engine("kernels", model, settings, n_ctx)
    if max(widths) > eng.n_batch:
        raise ConfigError(f"widths go up to {max(widths)} but the batch size is {eng.n_batch}: one verify pass "
                          f"cannot be wider than -b; raise --n-batch or narrow --widths", setting="n_batch")
    accs = {w: _Acc(w) for w in widths}
    stopped: set[int] = set()
    out_prompts = []
    for order, (p, toks) in enumerate(zip(prompts, seqs)):
        if cancel():
            raise Cancelled("kernel map cancelled")
        say(f"kernel map: {target} {settings_label(settings) or 'default settings'}, prompt {p.name}: "
            f"{n_tok} single-token rows, then widths {ranges(widths)}")
        # 1. the walk: the greedy sequence and every single-token row
        pre = prefill(eng, toks, settings.n_batch, cancel)
        if pre is None:
            raise Cancelled("kernel map cancelled")
        rows = np.empty((n_tok, model.vocab.n_vocab), dtype=np.float32)
        rows[0] = pre[0]
        seq = [int(np.argmax(rows[0]))]
        n_prompt = len(toks)
        blocks = sorted(((s, w) for w in widths for s in block_starts(w, positions)), key=lambda b: (-b[0], b[1]))
        # a line with an estimate per width (on a slow backend the first pass of a width can take minutes)
        eta = WorkEta({"walk": n_tok - 1, **Counter(w for _, w in blocks)}, label=f"kernel map: {target}, {p.name}")
        for j in range(1, n_tok):
            if cancel():
                raise Cancelled("kernel map cancelled")
            rows[j] = eng.eval([seq[j - 1]], rows=[0])[0]
            seq.append(int(np.argmax(rows[j])))
            if on_pass:
                on_pass(1)
            if (line := eta.done("walk", what="single-token rows")):
                say(line)
        tops: dict[int, np.ndarray] = {}
        margins = np.empty(n_tok)
        for j in range(n_tok):
            ids, vals = topk(rows[j], top_k)
            tops[j] = ids
            margins[j] = float(vals[0]) - float(vals[1]) if len(vals) > 1 else math.inf
        # 2. the verify blocks, last first, each on the walk's single-token prefix
        for s, w in blocks:
            if cancel():
                raise Cancelled("kernel map cancelled")
            if w in stopped:
                if on_pass:
                    on_pass(1)
                eta.done(w)  # nothing computed: it only shortens the estimate
                continue
            eng.truncate(n_prompt + s - 1)
            out = eng.eval(seq[s - 1:s - 1 + w], rows=range(w))
            for i in range(w):
                j = s + i
                accs[w].see(p.name, order, j, i, rows[j], out[i], tops, top_k, margins[j])
            if stop_at_difference and accs[w].stats.identical < accs[w].stats.rows:
                stopped.add(w)
                accs[w].stats.stopped = True
            if on_pass:
                on_pass(1)
            if (line := eta.done(w, what=f"width {w}")):
                say(line)
        out_prompts.append(PromptSequence(name=p.name, prompt_tokens=toks, tokens=seq, positions=positions))
        del rows
    stats = {w: acc.finish() for w, acc in accs.items()}
    for st in stats.values():  # flips in token order, whatever order the blocks ran in
        st.flip_at.sort(key=lambda x: ([q.name for q in prompts].index(x[0]), x[1]))
    return TargetMap(target=target, settings=settings, model=model.facts(), threads_used=getattr(eng, "threads", None),
                     prompts=out_prompts, widths=stats, seconds=time.perf_counter() - t0)


def passes_needed(widths: Sequence[int], positions: int, n_prompts: int) -> int:
    """Forward passes one target's map costs (the prompts' prefills not counted)."""
    per = tokens_needed(widths, positions) - 1 + sum(len(block_starts(w, positions)) for w in widths)
    return per * n_prompts


def kernel_map(
    session_or_runner: Any,
    targets: Sequence[str],
    prompts: Sequence[Any],
    widths: Sequence[int] = DEFAULT_WIDTHS,
    positions: int = DEFAULT_POSITIONS,
    settings: EngineSettings | Sequence[EngineSettings] | None = None,
    *,
    backend: str = "llama.cpp",
    top_k: int = DEFAULT_TOP_K,
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
    on_fraction: Callable[[float], None] | None = None,
    stop_at_difference: bool = False,
) -> KernelMap:
    """Map every target (under every settings given) over ``prompts`` at ``widths``.

    ``session_or_runner`` is the :class:`~specview.core.arms.session.Session` whose
    loaded models to use, or a runner whose Session lives in its worker process
    (the map then runs there), or None (a new runner for ``backend``, closed
    afterwards).
    ``progress`` gets one line per target and prompt; ``on_fraction`` the share of
    forward passes done; ``cancel`` is checked between forward passes and raises
    :class:`~specview.core.errors.Cancelled`.  ``stop_at_difference`` stops
    measuring a width at its first differing row: the safe widths are answered
    as fully, for less (see :func:`map_target`).
    """
    from ..registry import holds_models

    if not holds_models(session_or_runner):  # a runner whose models live in its worker: map there
        runner = _session_of(session_or_runner, backend)
        try:
            return runner.job(kernel_map, targets, prompts, widths, positions, settings, backend=backend,
                              top_k=top_k, progress=progress, cancel=cancel, on_fraction=on_fraction,
                              stop_at_difference=stop_at_difference)
        finally:
            if session_or_runner is None:
                runner.close()
    session = session_or_runner
    t0 = time.perf_counter()
    widths = tuple(sorted({int(w) for w in widths} | {1}))
    if widths[0] < 1:
        raise ConfigError(f"widths must be >= 1 (got {widths[0]})", setting="widths")
    if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
        raise ConfigError(f"positions must be an integer >= 1 (got {positions!r})", setting="positions")
    if top_k < 2:
        raise ConfigError(f"top_k must be >= 2 (got {top_k})", setting="top_k")
    if not targets:
        raise ConfigError("the kernel map needs at least one target", setting="target")
    if settings is None:
        settings_list = [EngineSettings()]
    elif isinstance(settings, EngineSettings):
        settings_list = [settings]
    else:
        settings_list = list(settings)
    for st in settings_list:
        check_value(EngineSettings, "n_batch", st.n_batch)
    kprompts = as_prompts(prompts)
    total = passes_needed(widths, positions, len(kprompts)) * len(targets) * len(settings_list)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if on_fraction:
            on_fraction(min(1.0, done / total))

    rows = []
    for target in targets:
        for st in settings_list:
            rows.append(map_target(session, target, kprompts, widths, positions, st, backend=backend,
                                   top_k=top_k, progress=progress, cancel=cancel, on_pass=tick,
                                   stop_at_difference=stop_at_difference))
    env = _environment(backend)
    return KernelMap(backend=backend, widths=widths, positions=positions, top_k=top_k, prompts=kprompts,
                     targets=rows, environment=env, seconds=time.perf_counter() - t0)


def _environment(backend: str) -> dict[str, Any]:
    from ... import __version__
    from ..registry import get_backend
    from ..arms.session import host_environment

    env: dict[str, Any] = {"specview": __version__, "backend": backend}
    try:
        env.update(get_backend(backend).environment())
    except SpecviewError:
        pass
    env.update(host_environment())
    return env


__all__ = ["DEFAULT_POSITIONS", "DEFAULT_WIDTHS", "SCHEMA", "KernelMap", "KernelMapError", "PromptSequence",
           "TargetMap", "WidthStats", "as_prompts", "block_starts", "kernel_map", "map_target", "parse_widths",
           "passes_needed", "settings_label", "tokens_needed"]
