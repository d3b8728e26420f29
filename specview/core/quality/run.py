"""Running a suite through both arms: each item one run on the engine's runner, scored, and diagnosed where the
answer changed.

Every item is one :meth:`Runner.run` of the base config with the item's prompt
(so every engine and every setting a run takes, a quality run takes too); the
vanilla arm's answer and the speculative arm's are scored (once, when the arms
are identical), and an item whose answer changed (one arm passes, the other
fails) has its fork diagnosed by the runner's own diagnosis (near-tie / state /
nondeterministic).  Each item also records, from its trace, each arm's steps
and near-tie steps and the margin at its fork (:mod:`.near_ties`), which the
result sums into the suite's near-tie density.  With an ``out_dir`` the result
is rewritten atomically to ``out_dir/quality.json`` after every item and each
item's trace is saved under ``out_dir/traces/``, so an interrupted run keeps
every finished item and ``resume=True`` runs only the rest (the same rules as
a matrix's ``--resume``: the same suite and settings, the same machine, build
and thread count).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ..config import RunConfig
from ..errors import EngineCrashed, SpecviewError
from ..eta import duration_text
from ..kernels.evidence import environment_differences
from ..registry import Runner
from ..resolve import Resolved, record_decisions
from ..trace import Trace
from .near_ties import ItemTies
from .result import ItemOutcome, QualityResult
from .score import Score, prompt_for, score
from .suites import Item, QualityError, Suite

#: the result file in a quality run's folder, and the folder of its traces
RESULT_FILE = "quality.json"
TRACES_DIR = "traces"
#: the key of a trace's config block that says which suite item its prompt is
QUALITY_KEY = "quality"
#: which forks are diagnosed: those of items whose answer changed (the default), every fork, or none
DIAGNOSE_CHOICES = ("discordant", "forks", "none")
#: tokens of shared text shown before a fork
CONTEXT_TOKENS = 8
#: a config's keys that differ item by item (each item's prompt), left out of the result's config
PER_ITEM = ("prompt", "prompt_tokens")


@dataclass(frozen=True)
class QualityProgress:
    """Where a quality run is: ``done`` of ``total`` items (kept ones included), seconds spent, seconds left."""

    done: int
    total: int
    elapsed: float
    eta: float | None
    line: str


ProgressFn = Callable[[str], None]
ItemFn = Callable[[ItemOutcome, QualityProgress], None]


class _Interrupted(Exception):
    """The caller cancelled: the item in hand is not recorded."""


def base_dict(cfg: RunConfig) -> dict[str, Any]:
    """The run's settings as a quality result records them: the config without the per-item prompt."""
    d = cfg.to_dict()
    for k in PER_ITEM:
        d.pop(k, None)
    return d


def _sandbox(execute: bool, given: dict[str, Any] | None, limits: Any) -> dict[str, Any]:
    if not execute:
        return {}
    if given is not None:
        return given
    from .execute import sandbox_report
    return sandbox_report(limits).to_dict()


def run_quality(
    runner: Runner,
    base_config: Any,
    suite: Suite,
    *,
    execute: bool = False,
    out_dir: str | Path | None = None,
    resume: bool = False,
    progress: ProgressFn | None = None,
    cancel: Callable[[], bool] | None = None,
    on_item: ItemFn | None = None,
    diagnose: str = "discordant",
    limits: Any = None,
    sandbox: dict[str, Any] | None = None,
) -> QualityResult:
    """Run every item of ``suite`` through both arms of ``base_config`` on ``runner``; return the result.

    ``base_config`` is a :class:`RunConfig` (or a :class:`~specview.core.resolve.Resolved`, whose decisions
    each trace records); each item runs it with the item's prompt.  ``execute`` allows running model-written
    code (a suite that needs it is refused without, naming ``--execute``).  ``progress`` gets one line per item
    with the ETA; ``on_item`` the outcome and a :class:`QualityProgress`.  ``cancel`` is checked between items
    and inside each run: an item cut short is not recorded and the result's status is ``interrupted``
    (KeyboardInterrupt likewise).  ``resume`` keeps the finished items of ``out_dir/quality.json`` (refused,
    naming what differs, for another suite, other settings, or another machine, build or thread count).
    ``diagnose``: one of :data:`DIAGNOSE_CHOICES`.  ``sandbox``: what the sandbox enforces
    (``SandboxReport.to_dict``), recorded with ``execute`` (asked here where not given).
    """
    resolved = base_config if isinstance(base_config, Resolved) else Runner.resolve(base_config)
    cfg0 = resolved.config
    if diagnose not in DIAGNOSE_CHOICES:
        raise QualityError(f"--diagnose must be one of {', '.join(DIAGNOSE_CHOICES)} (got {diagnose!r})")
    if not suite.items:
        raise QualityError(f"the suite {suite.name} has no items")
    if suite.needs_execute and not execute:
        raise QualityError(f"the suite {suite.name} is code: scoring it runs what the model wrote; pass --execute "
                           "to allow that (docs/quality.md says how it is confined)")
    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    out = Path(out_dir) if out_dir is not None else None
    result = QualityResult(suite=suite, config=base_dict(cfg0), execute=execute,
                           created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), sandbox=_sandbox(execute, sandbox, limits))
    kept: dict[str, ItemOutcome] = {}
    check_env: _SameMachine | None = None
    if resume:
        kept, check_env = _resume(result, out, say)
    tdir = None
    if out is not None:
        tdir = out / TRACES_DIR
        try:
            tdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise QualityError(f"-o {out}: cannot create the folder ({exc.strerror or exc})") from None
    result.items = [kept[it.id] for it in suite.items if it.id in kept]
    spent_before = result.elapsed
    t_start = time.perf_counter()
    todo = len(suite.items) - len(result.items)
    n_run = 0
    if out is not None and check_env is None:  # a resumed file is rewritten only once its machine is known to be this
        result.save(out / RESULT_FILE)
    try:
        for pos, item in enumerate(suite.items):
            if item.id in kept:
                continue
            if cancel():
                raise _Interrupted
            o = _run_item(runner, resolved, cfg0, item, pos, result, execute, limits, diagnose, tdir, out,
                          cancel, check_env)
            check_env = None
            result.items.append(o)
            result.elapsed = spent_before + time.perf_counter() - t_start
            if out is not None:
                result.save(out / RESULT_FILE)
            n_run += 1
            eta = (time.perf_counter() - t_start) / n_run * (todo - n_run)
            line = (f"[{len(result.items)}/{len(suite.items)}] {item.id}: {outcome_words(o)} "
                    f"({o.seconds:.1f} s; ETA {duration_text(eta)})")
            say(line)
            if on_item is not None:
                on_item(o, QualityProgress(len(result.items), len(suite.items), result.elapsed, eta, line))
        result.status = "complete"
    except (_Interrupted, KeyboardInterrupt):
        result.status = "interrupted"
    result.elapsed = spent_before + time.perf_counter() - t_start
    result.refresh()
    if out is not None:
        result.save(out / RESULT_FILE)
    return result


def _run_item(runner: Runner, resolved: Resolved, cfg0: RunConfig, item: Item, pos: int, result: QualityResult,
              execute: bool, limits: Any, diagnose: str, tdir: Path | None, out: Path | None,
              cancel: Callable[[], bool], check_env: "_SameMachine | None") -> ItemOutcome:
    t0 = time.perf_counter()
    cfg = replace(cfg0, prompt=prompt_for(item, cfg0.chat), prompt_tokens=None)
    tpath = tdir / f"{pos + 1:03d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', item.id)}.json" if tdir is not None else None
    try:
        trace = record_decisions(runner.run(cfg, cancel=cancel), resolved.decisions)
    except SpecviewError as exc:
        if cancel():
            raise _Interrupted from None
        saved = None
        if isinstance(exc, EngineCrashed) and exc.trace is not None and tpath is not None:
            saved = _relative(exc.trace.save(tpath), out)
        failed = Score(False, None, f"not run: {exc}")
        return ItemOutcome(item.id, failed, failed, identical=False, trace_path=saved, error=str(exc),
                           seconds=round(time.perf_counter() - t0, 3))
    if "cancelled" in (trace.vanilla.stop_reason, trace.speculative.stop_reason):
        raise _Interrupted
    if check_env is not None:
        check_env.check(trace)
    if not result.environment:
        result.environment = dict(trace.environment)
    v_text, s_text = trace.vanilla.text, trace.speculative.text
    identical = trace.comparison.identical
    vs = score(item, v_text, execute=execute, limits=limits)
    ss = vs if identical or s_text == v_text else score(item, s_text, execute=execute, limits=limits)
    fm = trace.comparison.first_mismatch
    fork = fm.index if fm is not None and not identical else None
    o = ItemOutcome(item.id, vs, ss, identical=identical, fork_index=fork,
                    fork_context=fork_context(trace) if fork is not None else None,
                    vanilla_piece=fm.vanilla_piece if fork is not None else None,
                    speculative_piece=fm.speculative_piece if fork is not None else None, ties=ItemTies.of(trace))
    unjudged = vs.error or ss.error
    if unjudged:  # no verdict on an answer is no failed answer: the item is an error, out of the paired table
        o = replace(o, error=f"the answer could not be judged: {unjudged}")
    trace.config[QUALITY_KEY] = {"suite": result.suite.name, "item": item.id, "expected": item.expected,
                                 "vanilla_pass": vs.passed, "speculative_pass": ss.passed,
                                 "vanilla_got": vs.got, "speculative_got": ss.got}
    if not unjudged and fork is not None and (diagnose == "forks" or (diagnose == "discordant" and o.discordant)):
        try:
            diag = runner.diagnose(trace, cfg, controls=False, cancel=cancel)
            gap = diag.get("gap")
            o = replace(o, verdict=diag.get("verdict"), rule=diag.get("rule"),
                        gap=float(gap) if isinstance(gap, (int, float)) else None)
        except SpecviewError as exc:
            if cancel():
                raise _Interrupted from None
            o = replace(o, diagnosis_error=str(exc))
    if tpath is not None:
        o = replace(o, trace_path=_relative(trace.save(tpath), out))
    return replace(o, seconds=round(time.perf_counter() - t0, 3))


def outcome_words(o: ItemOutcome) -> str:
    """An item's outcome in words: ``both pass (identical)``, ``only vanilla passes (fork at token 12: state)``."""
    if o.error is not None:
        return f"error: {o.error.splitlines()[0]}"
    head = {"both-pass": "both pass", "both-fail": "both fail", "only-vanilla": "only vanilla passes",
            "only-speculative": "only speculative passes"}[o.outcome]
    if o.fork_index is None:
        return f"{head} (identical)"
    tail = f": {o.verdict}" if o.verdict else (", not diagnosed" if o.diagnosis_error is None else
                                               ", diagnosis failed")
    return f"{head} (fork at token {o.fork_index}{tail})"


def fork_context(trace: Trace, n: int = CONTEXT_TOKENS) -> str | None:
    """The shared text before the fork and the two tokens there: ``…the sum is[[' 945' | ' 954']]``."""
    fm = trace.comparison.first_mismatch
    if fm is None:
        return None
    before = "".join(st.piece for st in trace.vanilla.steps[max(0, fm.index - n):fm.index])
    lead = "…" if fm.index > n else ""
    return (f"{lead}{before}[[{fm.vanilla_piece!r} | {fm.speculative_piece!r}]]").replace("\n", "⏎")


def _relative(p: Path, out: Path | None) -> str:
    if out is None:
        return str(p)
    try:
        return p.resolve().relative_to(out.resolve()).as_posix()
    except ValueError:
        return str(p)


def item_trace(result_file: str | Path, outcome: ItemOutcome) -> Path | None:
    """Where an item's saved trace is, given the result file it was read from (None when none was saved)."""
    if not outcome.trace_path:
        return None
    p = Path(outcome.trace_path)
    return p if p.is_absolute() else Path(result_file).parent / p


# -- resuming ------------------------------------------------------------------------------------
class _SameMachine:
    """What the kept items were computed with, checked against the first item run now (a fork depends on the
    CPU's kernels, the llama.cpp build and the thread split: items from elsewhere must not be mixed in)."""

    def __init__(self, environment: dict[str, Any], threads: set[int]):
        self.environment, self.threads = environment, threads

    def check(self, trace: Trace) -> None:
        diffs = [d.replace("(map)", "(kept items)").replace("(run)", "(now)")
                 for d in environment_differences(self.environment, trace.environment)]
        now = trace.config.get("threads_used")
        if isinstance(now, int) and self.threads and self.threads != {now}:
            diffs.append(f"threads_used: {', '.join(map(str, sorted(self.threads)))} (kept items) vs {now} (now)")
        if diffs:
            raise QualityError("cannot resume: the kept items were computed on another machine, build or thread "
                               f"count ({'; '.join(diffs)}), and a fork depends on all three; run without --resume, "
                               "or write to another folder")


def _resume(result: QualityResult, out: Path | None, say: ProgressFn) -> tuple[dict[str, ItemOutcome],
                                                                              "_SameMachine | None"]:
    if out is None:
        raise QualityError("--resume needs the folder of the interrupted run (-o DIR)")
    f = out / RESULT_FILE
    if not f.exists():
        say(f"nothing to resume in {out}: starting from the first item")
        return {}, None
    prev = QualityResult.load(f)
    suite = result.suite
    before, now = prev.suite.key(), suite.key()
    common = min(len(before), len(now))  # one suite a prefix of the other: a larger or smaller -n
    if (prev.suite.name, prev.suite.seed) != (suite.name, suite.seed) or before[:common] != now[:common]:
        raise QualityError(f"cannot resume {f}: it was made with another suite ({prev.suite.name}, "
                           f"{len(prev.suite.items)} items, seed {prev.suite.seed}); give the same suite and --seed "
                           "(a larger -n extends it), or write to another folder")
    if prev.execute != result.execute:
        raise QualityError(f"cannot resume {f}: it ran {'with' if prev.execute else 'without'} --execute")
    diffs = sorted(k for k in set(prev.config) | set(result.config) if prev.config.get(k) != result.config.get(k))
    if diffs:
        raise QualityError(f"cannot resume {f}: it was made with other settings ({', '.join(diffs)}); give the same "
                           "settings, or write to another folder")
    wanted = {it.id for it in suite.items}
    kept = {o.item_id: o for o in prev.items if o.error is None and o.item_id in wanted}
    result.environment = dict(prev.environment)
    result.elapsed = prev.elapsed
    result.created = prev.created or result.created
    threads = set()
    for o in kept.values():
        t = _threads_of(out, o)
        if t is not None:
            threads.add(t)
    if kept:
        say(f"resuming: {len(kept)} of {len(suite.items)} items already done")
    return kept, (_SameMachine(result.environment, threads) if kept else None)


def _threads_of(out: Path, o: ItemOutcome) -> int | None:
    p = item_trace(out / RESULT_FILE, o)
    if p is None or not p.is_file():
        return None
    try:
        t = Trace.load(p).config.get("threads_used")
    except (SpecviewError, OSError, ValueError):
        return None
    return t if isinstance(t, int) and not isinstance(t, bool) else None


# -- a trace's suite item ----------------------------------------------------------------------------
def quality_block(trace: Any) -> dict[str, Any] | None:
    """A trace's ``config.quality`` block (``{"suite", "item", "expected", "vanilla_pass", "speculative_pass",
    "vanilla_got", "speculative_got"}``) when its prompt came from a suite, else None."""
    config = getattr(trace, "config", None)
    if config is None and isinstance(trace, dict):
        config = trace.get("config")
    block = config.get(QUALITY_KEY) if isinstance(config, dict) else None
    return block if isinstance(block, dict) else None


def answer_changed(trace: Any) -> bool | None:
    """Whether one arm's answer passed and the other's failed, read from the trace's ``config.quality`` block
    (a :class:`~specview.core.trace.Trace` or its JSON); None when the prompt came from no suite."""
    block = quality_block(trace)
    if block is None:
        return None
    v, s = block.get("vanilla_pass"), block.get("speculative_pass")
    if not isinstance(v, bool) or not isinstance(s, bool):
        return None
    return v != s


__all__ = ["DIAGNOSE_CHOICES", "QUALITY_KEY", "RESULT_FILE", "TRACES_DIR", "QualityProgress", "answer_changed",
           "base_dict", "fork_context", "item_trace", "outcome_words", "quality_block", "run_quality"]
