"""Running a matrix: every cell on the engine's runner, streamed to the matrix file after each one.

The cells run through the :class:`~specview.core.registry.Runner` of the
spec's engine (``get_backend(spec.backend).runner()``), so an in-process
engine loads each model once and computes the vanilla arm once per target,
prompt and settings, and an engine that is a separate process keeps its
servers for the cells that share them.  Results are rewritten atomically to
the JSON file after every cell (schema ``specview.matrix/1``, see
``docs/matrix.md``), so an interrupted matrix keeps every finished cell.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ... import __version__
from ..config import RunConfig, get_setting
from ..errors import EngineCrashed, SpecviewError
from ..kernels.evidence import environment_differences
from ..registry import Runner, get_backend
from ..resolve import Decision, record_decisions
from ..trace import Trace, json_safe, write_atomic
from ..verdicts import cell_label
from .cells import CellParams, cell_config, cell_record, describe, error_record, expand
from .document import SCHEMA, validate_matrix
from .summary import cell_label as summary_label
from .evidence import predict_cell, predict_record
from .quality import cell_mark, score_cell, task_suite
from .spec import MatrixError, MatrixSpec

#: the speculative arm's stop reason when it was stopped ``stop_after_fork`` tokens after its fork
STOPPED_AFTER_FORK = "after-fork"


@dataclass
class MatrixRun:
    """A matrix in progress or finished: the JSON document and where it is written."""

    spec: MatrixSpec
    cells: list[CellParams]
    records: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"  # running, complete, interrupted
    out: Path | None = None
    started: float = field(default_factory=time.time)
    environment: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    #: the kernel map the matrix cites (spec.kernel_map, read), or None
    kernel_map: Any = None

    def to_json(self) -> dict[str, Any]:
        from .rates import rates
        from .summary import summarize

        doc = {
            "schema": SCHEMA,
            "status": self.status,
            "specview": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
            "elapsed_s": round(time.time() - self.started, 3),
            "n_cells": len(self.cells),
            "spec": self.spec.to_json(),
            "environment": self.environment,
            "counters": self.counters,
            "cells": self.records,
        }
        if self.kernel_map is not None:
            from ..kernels.evidence import citation

            doc["kernel_map"] = citation(self.kernel_map, self.spec.kernel_map)
        doc["summary"] = summarize(doc)
        if self.spec.parts:
            from .preset import findings

            doc["findings"] = findings(doc)
        doc["rates"] = rates(doc)
        return doc

    def write(self) -> None:
        if self.out is not None:
            write_atomic(self.out, json.dumps(json_safe(self.to_json()), ensure_ascii=False, indent=1))


def fmt_seconds(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


class _StopAfterFork:
    """Watches both arms' tokens as they stream and asks the speculative arm to stop ``n`` tokens after the fork.

    The vanilla arm runs (or is replayed from the cache) first; the speculative
    arm is compared with it token by token, and once they differ the cancel
    check turns true ``n`` tokens later.  Only the speculative arm is ever
    stopped, so a cached vanilla arm stays whole.
    """

    def __init__(self, n: int, cancel: Callable[[], bool]):
        self.n, self.user_cancel = n, cancel
        self.tokens: dict[str, dict[int, int]] = {"vanilla": {}, "speculative": {}}
        self.fork: int | None = None
        self.arm = ""
        self.stopped = False

    def on_event(self, arm: str, ev: Any) -> None:
        self.arm = arm
        idx, tok = getattr(ev, "index", None), getattr(ev, "token", None)
        if arm not in self.tokens or not isinstance(idx, int) or not isinstance(tok, int) or hasattr(ev, "drafted"):
            return
        self.tokens[arm][idx] = tok
        other = self.tokens["vanilla" if arm == "speculative" else "speculative"]
        if idx in other and other[idx] != tok and (self.fork is None or idx < self.fork):
            self.fork = idx

    def cancel(self) -> bool:
        if self.user_cancel():
            return True
        if self.fork is not None and self.arm == "speculative" and len(self.tokens["speculative"]) > self.fork + self.n:
            self.stopped = True
            return True
        return False


#: what a matrix cell keeps of an engine crash (the whole account is in the cell's trace)
CRASH_KEYS = ("signal", "exitcode", "hung", "activity", "native_function", "known_cause", "log")


def cell_decisions(spec: MatrixSpec, cfg: RunConfig) -> tuple[Decision, ...]:
    """The matrix's own decisions (:meth:`MatrixSpec.decide`) that a cell's config kept."""
    return tuple(d for d in spec.decided if get_setting(cfg, d.setting) == d.value)


def run_cell(runner: Runner, cfg: RunConfig, *, cancel: Callable[[], bool] | None = None) -> Trace:
    """One run on ``runner``; with ``cfg.stop_after_fork`` set, the speculative arm stops that many tokens after
    its fork (its stop reason is then ``"after-fork"``)."""
    cancel = cancel or (lambda: False)
    if cfg.stop_after_fork is None:
        return runner.run(cfg, cancel=cancel)
    watch = _StopAfterFork(cfg.stop_after_fork, cancel)
    trace = runner.run(cfg, on_event=watch.on_event, cancel=watch.cancel)
    if watch.stopped and not cancel() and trace.speculative.stop_reason == "cancelled":
        trace.speculative.stop_reason = STOPPED_AFTER_FORK
    return trace


def _comparable_spec(d: dict[str, Any], source: str) -> dict[str, Any]:
    """A spec as JSON with its defaults filled in, without what may change between a run and its resumption."""
    d = json.loads(json.dumps(json_safe(MatrixSpec.from_json(d, source=source).to_json())))
    d.pop("diagnose", None)
    d.pop("kernel_map", None)  # the map a matrix cites changes its predictions, not what its cells compute
    return d


def _relative(p: Path, out: Path | None) -> str:
    if out is None:
        return str(p)
    try:
        return os.path.relpath(p, out.parent if str(out.parent) else ".")
    except ValueError:
        return str(p)


class _Resumed:
    """What the cells kept by ``--resume`` were computed with, checked against the first cell run now.

    A fork depends on the CPU's kernels, the llama.cpp build and the thread split, so cells
    computed on another machine, build or thread count must not be mixed into one matrix: the
    resumption is refused, naming what differs, before any result computed here is recorded.
    """

    def __init__(self, resume: dict[str, Any], kept: list[dict[str, Any]]):
        env = resume.get("environment")
        self.environment: dict[str, Any] = dict(env) if isinstance(env, dict) else {}
        self.threads = {t for r in kept for t in [(r.get("config") or {}).get("threads_used")]
                        if isinstance(t, int) and not isinstance(t, bool)}

    def differences(self, trace: Trace) -> list[str]:
        out = [d.replace("(map)", "(kept cells)").replace("(run)", "(now)")
               for d in environment_differences(self.environment, trace.environment)]
        now = trace.config.get("threads_used")
        if isinstance(now, int) and self.threads and self.threads != {now}:
            out.append(f"threads_used: {', '.join(map(str, sorted(self.threads)))} (kept cells) vs {now} (now)")
        return out

    def check(self, trace: Trace) -> None:
        diffs = self.differences(trace)
        if diffs:
            raise MatrixError("cannot resume: the kept cells were computed on another machine, build or thread "
                              f"count ({'; '.join(diffs)}), and a fork depends on all three; run the matrix "
                              "without --resume, or write to another file")


def _cancelled(trace: Trace) -> bool:
    return trace.vanilla.stop_reason == "cancelled" or trace.speculative.stop_reason == "cancelled"


def run_matrix(
    spec: MatrixSpec,
    runner: Runner | None = None,
    *,
    out: str | os.PathLike[str] | None = None,
    traces_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    on_cell: Callable[[dict[str, Any]], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    resume: dict[str, Any] | None = None,
) -> MatrixRun:
    """Run every cell of ``spec``; stream results to ``out``; return the finished run.

    ``runner`` is the engine's runner to use (kept open afterwards); without one
    the spec's engine makes its own (``get_backend(spec.backend).runner()``) and
    it is closed at the end.  ``cancel`` is checked between cells and inside
    each run; a cell cut short is not recorded.  KeyboardInterrupt is caught the
    same way: the finished cells are written with ``status = "interrupted"`` and
    the run is returned.  ``resume`` is an earlier (interrupted) matrix document
    of the same spec: its finished cells are kept and only the others run.

    With ``spec.kernel_map`` set, the map is read first (a MatrixError naming the
    file if it cannot be) and every finished cell records the map's prediction for
    it (``kernel_prediction``); kept cells predicted from another map, or none,
    are predicted again from their recorded settings.
    """
    spec.validate()
    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    for d in spec.decide():  # this machine's decisions for the axes left unset, said once
        say(d.why)
    cells = expand(spec)
    run = MatrixRun(spec=spec, cells=cells, out=Path(out) if out is not None else None,
                    kernel_map=spec.load_kernel_map() if spec.kernel_map else None)
    done_before: set[int] = set()
    resumed: _Resumed | None = None
    if resume is not None:
        validate_matrix(resume, source="--resume")
        if _comparable_spec(resume["spec"], "--resume") != _comparable_spec(spec.to_json(), "the matrix"):
            raise MatrixError("cannot resume: the matrix file was made with other axes or settings; "
                              "give the same definition, or write to another file")
        run.records = [r for r in resume["cells"] if r.get("status") == "ok"
                       and 0 <= r["index"] < len(cells) and r["params"] == cells[r["index"]].to_json()]
        done_before = {int(r["index"]) for r in run.records}
        if run.records:
            resumed = _Resumed(resume, run.records)
            run.environment = dict(resumed.environment)
        if run.kernel_map is not None:
            _predict_kept(run, resume.get("environment"))
        if done_before:
            say(f"resuming: {len(done_before)} of {len(cells)} cells already done")
    tdir = Path(traces_dir) if traces_dir is not None else None
    if tdir is not None:
        try:
            tdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MatrixError(f"--traces {tdir}: cannot create the folder ({exc.strerror or exc})") from None
    own = runner is None
    if runner is None:
        runner = get_backend(spec.backend).runner(progress=progress)
    try:
        _run_cells(spec, runner, run, cells, done_before, tdir, say, on_cell, cancel, resumed)
    finally:
        if own:
            runner.close()
    return run


def _predict_kept(run: MatrixRun, environment: Any) -> None:
    """Kept cells whose prediction came from another map (or none) are predicted again from their settings."""
    for r in run.records:
        p = r.get("kernel_prediction")
        if isinstance(p, dict) and p.get("map_file") == run.spec.kernel_map:
            continue
        new = predict_record(run.kernel_map, r, run.spec.kernel_map,
                             environment if isinstance(environment, dict) else None)
        if new is None:
            r.pop("kernel_prediction", None)
        else:
            r["kernel_prediction"] = new.to_json()


def _run_cells(spec: MatrixSpec, runner: Runner, run: MatrixRun, cells: list[CellParams], done_before: set[int],
               tdir: Path | None, say: Callable[[str], None], on_cell: Callable[[dict[str, Any]], None] | None,
               cancel: Callable[[], bool], resumed: _Resumed | None = None) -> None:
    def counters() -> dict[str, int]:
        return {k: int(getattr(runner, k, 0)) for k in ("loads", "vanilla_runs", "speculative_runs")}

    suite = task_suite(spec)  # over a task suite, each cell's answers are scored against its item
    items = {it.id: it for it in suite.items} if suite is not None else {}
    run.counters = counters()
    if resumed is None:  # a resumed file is rewritten only once its environment is known to be this one
        run.write()
    t_start = time.perf_counter()
    n_run = 0
    todo = len(cells) - len(done_before)
    try:
        for i, params in enumerate(cells):
            if i in done_before:
                continue
            if cancel():
                run.status = "interrupted"
                break
            t0 = time.perf_counter()
            cfg = None
            category = spec.prompt_named(params.prompt).category
            try:
                cfg = cell_config(spec, params)
                trace = record_decisions(run_cell(runner, cfg, cancel=cancel), cell_decisions(spec, cfg))
                if _cancelled(trace):
                    run.status = "interrupted"
                    break
                if resumed is not None:
                    resumed.check(trace)  # a MatrixError: not this cell's error, the whole resumption's
                    resumed = None
                diag, derr = None, None
                if spec.diagnose and not trace.comparison.identical:
                    try:
                        diag = runner.diagnose(trace, cfg, controls=False, cancel=cancel)
                    except SpecviewError as exc:
                        derr = str(exc)
                    if cancel():
                        run.status = "interrupted"
                        break
                if items:  # before the record and the saved trace: both carry the answers' block
                    scores = score_cell(items[params.prompt], trace, spec.quality, suite.name)
                rec = cell_record(i, params, trace, time.perf_counter() - t0, diag, derr, category)
                if items:
                    rec["quality"] = scores
                if run.kernel_map is not None:
                    rec["kernel_prediction"] = predict_cell(run.kernel_map, cfg, trace, spec.kernel_map).to_json()
                if not run.environment:
                    run.environment = dict(trace.environment)
                if tdir is not None:
                    p = trace.save(tdir / f"cell-{i:03d}.json")
                    rec["trace"] = _relative(p, run.out)
            except MatrixError:
                raise
            except SpecviewError as exc:
                if cancel():  # a cell cut short by a cancel is not an error, and is not recorded
                    run.status = "interrupted"
                    break
                rec = error_record(i, params, str(exc), time.perf_counter() - t0,
                                   cfg.to_dict() if cfg is not None else None, category)
                if isinstance(exc, EngineCrashed):  # the engine died in this cell: the next cell gets a fresh one
                    rec["crash"] = {k: exc.crash.get(k) for k in CRASH_KEYS}
                    if tdir is not None and exc.trace is not None:
                        rec["trace"] = _relative(exc.trace.save(tdir / f"cell-{i:03d}.json"), run.out)
            run.records.append(rec)
            run.records.sort(key=lambda r: r["index"])
            run.counters = counters()
            run.write()
            if on_cell is not None:
                on_cell(rec)
            n_run += 1
            elapsed = time.perf_counter() - t_start
            eta = elapsed / n_run * (todo - n_run)
            outcome = "error: " + rec["error"] if rec["status"] == "error" else (
                summary_label(rec) if rec["identical"] else f"fork at token {rec['first_mismatch']} ({cell_label(rec)})")
            if cell_mark(rec):
                outcome += f", {cell_mark(rec)}"
            say(f"[{len(run.records)}/{len(cells)}] {describe(params)}: {outcome} "
                f"({rec['seconds']:.1f} s; ETA {fmt_seconds(eta)})")
        else:
            run.status = "complete"
    except KeyboardInterrupt:
        run.status = "interrupted"
    run.counters = counters()
    run.write()
