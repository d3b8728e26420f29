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
3. **The prefix.**  Every verify pass sees the state the walk built, in the
   single-token shape.  On a memory that drops positions (a KV cache:
   ``rollback_mode`` ``seq-rm``) the walk's context is rolled back
   (``truncate``) to the block's prefix, the pass runs, and the next block
   rolls back again; blocks run from the last to the first, so each rollback
   only removes entries (nothing is recomputed): one walk serves every width.
   A hybrid or recurrent memory cannot drop positions: there a rollback would
   recompute the prefix (llama.cpp's replay of the context's passes from an
   empty state, for every block).  So on such a memory the walk's tokens are
   fed again one per pass and, at each block's start, the state is kept
   (``prepare_rollback``: a checkpoint), the block's pass runs, and the
   checkpoint is restored (``truncate`` back to it replays nothing); the
   engine's own rollback counts say what each restore did.  Either way a row
   differs from its single-token row only through the verify pass's own
   kernels, on an identical state; rows ``1..T-1`` of a pass also read the
   K/V entries (and the recurrent state) that the same pass wrote for its
   earlier rows, in the batched shape, as a verify pass does.
4. **Width 1 is the control.**  A width-1 block is the walk's own pass run
   again after a rollback (on a hybrid: on a restored checkpoint); on a
   deterministic backend with an exact rollback it is bit-identical.  If it
   is not, nothing in the map proves anything and the target is marked
   nondeterministic.

The figures per target and width, the cost and what a "proven lossless" claim
rests on are described in ``docs/kernels.md``.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import fields, replace
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..arms.generate import prefill
from ..arms.topk import topk
from ..config import EngineSettings, check_value
from ..errors import BackendUnavailable, Cancelled, ConfigError, SpecviewError
from ..eta import WorkEta
from ..prompts import PromptSpec
from ..registry import Runner
from ..resolve import DecidedSettings
from .text import parse_widths, ranges, settings_label
from .records import (DEFAULT_POSITIONS, DEFAULT_TOP_K, DEFAULT_WIDTHS, SCHEMA, CancelFn, KernelMap,
                      KernelMapError, ProgressFn, PromptSequence, TargetMap, WidthStats, as_prompts)

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
        blocks = sorted(((s, w) for w in widths for s in block_starts(w, positions)), key=lambda b: (-b[0], b[1]))
        # a line with an estimate per width (on a slow backend the first pass of a width can take minutes)
        eta = WorkEta({"walk": n_tok - 1, **Counter(w for _, w in blocks)}, label=f"kernel map: {target}, {p.name}")
        rows, seq = _walk(eng, toks, n_tok, model.vocab.n_vocab, settings.n_batch, cancel, on_pass, eta, say)
        tops: dict[int, np.ndarray] = {}
        margins = np.empty(n_tok)
        for j in range(n_tok):
            ids, vals = topk(rows[j], top_k)
            tops[j] = ids
            margins[j] = float(vals[0]) - float(vals[1]) if len(vals) > 1 else math.inf
        # 2. the verify blocks, each on the walk's single-token prefix
        blk = _Blocks(eng, p.name, order, len(toks), seq, rows, tops, margins, top_k, accs, stopped,
                      stop_at_difference, cancel, on_pass, eta, say)
        if eng.rollback_mode(max(widths)) == "seq-rm":
            blk.last_first(blocks)
        else:
            blk.by_checkpoint(blocks, toks, settings.n_batch)
        out_prompts.append(PromptSequence(name=p.name, prompt_tokens=toks, tokens=seq, positions=positions))
        del rows
    stats = {w: acc.finish() for w, acc in accs.items()}
    for st in stats.values():  # flips in token order, whatever order the blocks ran in
        st.flip_at.sort(key=lambda x: ([q.name for q in prompts].index(x[0]), x[1]))
    return TargetMap(target=target, settings=settings, model=model.facts(), threads_used=getattr(eng, "threads", None),
                     prompts=out_prompts, widths=stats, seconds=time.perf_counter() - t0)


def _walk(eng: Any, toks: list[int], n_tok: int, n_vocab: int, n_batch: int, cancel: CancelFn,
          on_pass: Callable[[int], None] | None, eta: WorkEta, say: ProgressFn) -> tuple[np.ndarray, list[int]]:
    """The prompt prefilled, then ``n_tok - 1`` greedy single-token passes: every row, and the sequence."""
    pre = prefill(eng, toks, n_batch, cancel)
    if pre is None:
        raise Cancelled("kernel map cancelled")
    rows = np.empty((n_tok, n_vocab), dtype=np.float32)
    rows[0] = pre[0]
    seq = [int(np.argmax(rows[0]))]
    for j in range(1, n_tok):
        if cancel():
            raise Cancelled("kernel map cancelled")
        rows[j] = eng.eval([seq[j - 1]], rows=[0])[0]
        seq.append(int(np.argmax(rows[j])))
        if on_pass:
            on_pass(1)
        if (line := eta.done("walk", what="single-token rows")):
            say(line)
    return rows, seq


class _Blocks:
    """The verify blocks of one prompt, compared with the walk's rows as they run."""

    def __init__(self, eng: Any, name: str, order: int, n_prompt: int, seq: list[int], rows: np.ndarray,
                 tops: dict, margins: np.ndarray, top_k: int, accs: dict[int, _Acc], stopped: set[int],
                 stop_at_difference: bool, cancel: CancelFn, on_pass: Callable[[int], None] | None, eta: WorkEta,
                 say: ProgressFn):
        self.eng, self.name, self.order, self.n_prompt, self.seq, self.rows = eng, name, order, n_prompt, seq, rows
        self.tops, self.margins, self.top_k, self.accs, self.stopped = tops, margins, top_k, accs, stopped
        self.stop_at_difference, self.cancel, self.on_pass, self.eta, self.say = (stop_at_difference, cancel,
                                                                                   on_pass, eta, say)

    def _skip(self, w: int) -> bool:
        if self.cancel():
            raise Cancelled("kernel map cancelled")
        if w not in self.stopped:
            return False
        if self.on_pass:
            self.on_pass(1)
        self.eta.done(w)  # nothing computed: it only shortens the estimate
        return True

    def _run(self, s: int, w: int) -> None:
        """The block's pass on the context, which holds the walk's prefix up to token ``s - 1``."""
        out = self.eng.eval(self.seq[s - 1:s - 1 + w], rows=range(w))
        acc = self.accs[w]
        for i in range(w):
            j = s + i
            acc.see(self.name, self.order, j, i, self.rows[j], out[i], self.tops, self.top_k, self.margins[j])
        if self.stop_at_difference and acc.stats.identical < acc.stats.rows:
            self.stopped.add(w)
            acc.stats.stopped = True
        if self.on_pass:
            self.on_pass(1)
        if (line := self.eta.done(w, what=f"width {w}")):
            self.say(line)

    def last_first(self, blocks: Sequence[tuple[int, int]]) -> None:
        """A memory that drops positions: the walk's context rolled back to each block's prefix, last block first."""
        for s, w in blocks:
            if self._skip(w):
                continue
            self.eng.truncate(self.n_prompt + s - 1)
            self._run(s, w)

    def by_checkpoint(self, blocks: Sequence[tuple[int, int]], toks: list[int], n_batch: int) -> int:
        """A memory that cannot drop positions: the walk fed again, a checkpoint kept at each block's start, the
        block run on it and the checkpoint restored.  A restore that decoded tokens again (a snapshot context
        falling back to an older checkpoint, whose replay is one pass of another width) leaves a prefix the walk
        did not compute, so the walk is fed again from the prompt; returns how often that was needed."""
        eng, n = self.eng, self.n_prompt
        fed, rebuilt = 0, 0  # fed: walk tokens the context holds (0: it must be prefilled first)
        for s, w in sorted(blocks):
            if fed == 0:
                if prefill(eng, toks, n_batch, self.cancel) is None:
                    raise Cancelled("kernel map cancelled")
                fed = 1  # the context holds the prompt, and token 0 is next to feed
            while fed < s:  # the walk's own single-token passes, up to the block's prefix
                if self.cancel():
                    raise Cancelled("kernel map cancelled")
                eng.eval([self.seq[fed - 1]], rows=[0])
                fed += 1
            if self._skip(w):
                continue
            eng.prepare_rollback(w)
            self._run(s, w)
            done = eng.truncate(n + s - 1)
            if done is not None and done.replay:
                fed, rebuilt = 0, rebuilt + 1
        return rebuilt


def passes_needed(widths: Sequence[int], positions: int, n_prompts: int) -> int:
    """Forward passes one target's map costs (the prompts' prefills not counted)."""
    per = tokens_needed(widths, positions) - 1 + sum(len(block_starts(w, positions)) for w in widths)
    return per * n_prompts


def kernel_map(session_or_runner: Any, targets: Sequence[str], prompts: Sequence[Any],
               widths: Sequence[int] = DEFAULT_WIDTHS, positions: int = DEFAULT_POSITIONS,
               settings: EngineSettings | Sequence[EngineSettings] | None = None, *, backend: str = "llama.cpp",
               **options: Any) -> KernelMap:
    """Map every target (under every settings given) over ``prompts`` at ``widths``: :func:`map_in_session`
    (which says what ``options`` are) run as a job of ``session_or_runner``.

    ``session_or_runner`` is the runner whose models to use (a Session, or a
    runner whose Session lives in its worker process: the map runs there), or
    None (a new runner for ``backend``, closed afterwards).
    """
    from ..registry import get_backend

    try:
        in_process: bool | None = get_backend(backend).in_process
    except SpecviewError:
        in_process = None  # not an engine of the registry's: the runner given says what it can do
    if in_process is False or (in_process is None and session_or_runner is None):
        raise BackendUnavailable(_not_in_process(backend))
    runner = session_or_runner if session_or_runner is not None else get_backend(backend).runner()
    try:
        return runner.job(map_in_session, targets, prompts, widths, positions, settings=settings, backend=backend,
                          **options)
    except BackendUnavailable as exc:  # a runner that runs no jobs: its engine computes passes specview cannot split
        raise BackendUnavailable(_not_in_process(backend)) from exc
    finally:
        if session_or_runner is None:
            runner.close()


def map_in_session(
    session: Any,
    targets: Sequence[str],
    prompts: Sequence[Any],
    widths: Sequence[int] = DEFAULT_WIDTHS,
    positions: int = DEFAULT_POSITIONS,
    *,
    settings: EngineSettings | Sequence[EngineSettings] | None = None,
    backend: str = "llama.cpp",
    top_k: int = DEFAULT_TOP_K,
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
    on_fraction: Callable[[float], None] | None = None,
    stop_at_difference: bool = False,
) -> KernelMap:
    """The kernel map, as a job: ``session`` is the Session where the models live.

    ``progress`` gets one line per target and prompt; ``on_fraction`` the share of
    forward passes done; ``cancel`` is checked between forward passes and raises
    :class:`~specview.core.errors.Cancelled`.  ``stop_at_difference`` stops
    measuring a width at its first differing row: the safe widths are answered
    as fully, for less (see :func:`map_target`).
    """
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
            st = for_target(st, target, backend)
            rows.append(map_target(session, target, kprompts, widths, positions, st, backend=backend,
                                   top_k=top_k, progress=progress, cancel=cancel, on_pass=tick,
                                   stop_at_difference=stop_at_difference))
    env = _environment(backend)
    return KernelMap(backend=backend, widths=widths, positions=positions, top_k=top_k, prompts=kprompts,
                     targets=rows, environment=env, seconds=time.perf_counter() - t0)


def for_target(settings: EngineSettings, target: str, backend: str) -> EngineSettings:
    """``settings`` decided for ``target``, as the map records them.  A job's settings are decided before the map
    knows its targets, so a ``seq-rm`` rollback there may be what a model with a KV cache would take; it is
    decided again for this target (a hybrid's memory cannot drop positions).  Any other given value stays."""
    if isinstance(settings, DecidedSettings):
        if settings.rollback != "seq-rm":
            return settings
        settings = EngineSettings(**{f.name: getattr(settings, f.name) for f in fields(EngineSettings)})
        settings = replace(settings, rollback=None)
    return Runner.resolve_settings(settings, backend=backend, target=target)[0]


def _environment(backend: str) -> dict[str, Any]:
    from ... import __version__
    from ..registry import get_backend
    from ..session import host_environment

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
