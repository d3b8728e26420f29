"""The header reads of a scan (:func:`read_all`): each file the header cache lacks is read once, one by one or,
when there are many, in processes of their own.

A header read is pure-Python work (a 32,000-token vocabulary and its merges cost some 20 ms), so a cold scan
of hundreds of models is bound by one core.  With more than one usable core and at least :data:`THRESHOLD`
files to read, they are read in a pool of *spawned* processes (never forked: the app has Qt threads), and
each read goes into the header cache as it arrives, so an interrupted scan keeps what it read.  A frozen app
reads one by one (its executable does not start as a Python child), as does ``$SPECVIEW_SCAN_PROCESSES=1``.
A pool that breaks (a child killed, no process can be started) leaves the rest to be read one by one in
this process: no model is lost to it.

What a read gives is the same either way: the header, or the :class:`Problem` that says why not.  A child
runs :func:`read_one` alone; this module imports nothing of the scan, so a child loads no more than the
header reader needs.
"""

from __future__ import annotations

import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Mapping

from ..config import usable_cores
from . import header
from .info import ModelHeaderError, ModelInfo, Problem, ProgressFn

#: the fewest files to read that start a pool (starting a process costs about a dozen reads)
THRESHOLD = 24
#: the fewest files each process of a pool gets to read
SHARE = 12
#: the most processes a pool has, however many cores there are
MAX_PROCESSES = 8
#: the number of processes to read in (1: one by one in the scan's process; unset or 0: specview decides)
PROCESSES_VARIABLE = "SPECVIEW_SCAN_PROCESSES"
#: reads between two progress lines (the app cancels a scan at a progress line)
REPORT_EVERY = 16

#: a file to read: (its path, the name and source the scan found it as)
Item = tuple[Path, str, str]
Result = ModelInfo | Problem


def read_one(path: Path, name: str, source: str) -> tuple[Any, ...]:
    """One read, as plain data (an exception of ours does not survive pickling): ``("info", ModelInfo)``,
    ``("error", path, why)`` for a file that is not a readable model, ``("unexpected", type, text)``."""
    try:
        return ("info", header._read(path, name, source))
    except ModelHeaderError as exc:
        return ("error", exc.path, exc.why)
    except Exception as exc:  # noqa: BLE001 - a scan never stops on one file
        return ("unexpected", type(exc).__name__, str(exc))


def wanted_processes(env: Mapping[str, str]) -> tuple[int | None, Problem | None]:
    """``$SPECVIEW_SCAN_PROCESSES`` as a number of processes (None: unset or 0, specview decides), and the
    problem of a value that is not a whole number (then the reads are made one by one)."""
    raw = env.get(PROCESSES_VARIABLE, "").strip()
    if not raw:
        return None, None
    if not raw.isdigit():
        return 1, Problem(f"${PROCESSES_VARIABLE}", f"{raw!r} is not a whole number of processes, so the headers "
                                                    "were read one by one; set it to 1 (one by one), to a number "
                                                    "such as 4, or to 0 (specview decides), or unset it")
    n = int(raw)
    return (n or None), None


def processes_for(n_reads: int, want: int | None = None) -> int:
    """How many processes read ``n_reads`` headers: ``want`` when given (never more than the reads), else
    a pool only for :data:`THRESHOLD` reads or more and more than one core, of at most :data:`MAX_PROCESSES`
    processes that each get :data:`SHARE` reads or more; 1 (no pool) in a frozen app."""
    if getattr(sys, "frozen", False) or n_reads < 2:
        return 1
    if want is not None:
        return max(1, min(want, n_reads))
    if n_reads < THRESHOLD:
        return 1
    return max(1, min(usable_cores(), MAX_PROCESSES, n_reads // SHARE))


class _Reads:
    """The reads of one scan: the cache they go into, and the progress lines they make."""

    def __init__(self, hc: header.HeaderCache, items: list[Item], stamps: dict[int, tuple[int, int]],
                 say: ProgressFn):
        self.hc, self.items, self.stamps, self.say = hc, items, stamps, say
        self.results: dict[int, Result] = {}

    def settle(self, i: int, got: tuple[Any, ...]) -> None:
        """Read ``i`` done: its result kept, and cached (an unexpected error is not: it is read again)."""
        path = self.items[i][0]
        if got[0] == "info":
            self.hc.record(path, self.stamps[i], info=got[1])
            self.results[i] = got[1]
        elif got[0] == "error":
            self.hc.record(path, self.stamps[i], why=got[2])
            self.results[i] = Problem(got[1], got[2])
        else:
            self.results[i] = Problem(str(path), f"unexpected error reading it ({got[1]}: {got[2]}); please report it")
        done = len(self.results)
        if done % REPORT_EVERY == 0:
            self.say(f"read {done} of {len(self.stamps)} headers")

    def serially(self, todo: list[int]) -> None:
        for i in todo:
            self.settle(i, read_one(*self.items[i]))

    def in_pool(self, todo: list[int], processes: int) -> list[int]:
        """Read ``todo`` in a pool of ``processes``; what is left unread when the pool breaks."""
        import multiprocessing

        try:
            pool = ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn"))
        except (OSError, ValueError):
            return todo
        finished = False
        pending: dict[Future[tuple[Any, ...]], int] = {}
        try:
            try:
                for i in todo:
                    pending[pool.submit(read_one, *self.items[i])] = i
            except (OSError, BrokenProcessPool, RuntimeError):
                pass  # what was not submitted is read one by one below
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    i = pending.pop(fut)
                    try:
                        got = fut.result()
                    except Exception:  # noqa: BLE001 - a child died (the pool is broken), or its answer was lost
                        continue  # read here, below
                    self.settle(i, got)
            finished = True
        finally:
            pool.shutdown(wait=finished, cancel_futures=True)
        return [i for i in todo if i not in self.results]


def read_all(items: list[Item], hc: header.HeaderCache, say: ProgressFn, want: int | None = None) -> list[Result]:
    """The header of each of ``items`` (the cache's, or read), or the problem that says why it has none, in
    their order; the reads go into ``hc`` as they are made.  ``want``: the processes asked for (None: as
    :func:`processes_for` decides)."""
    out: dict[int, Result] = {}
    stamps: dict[int, tuple[int, int]] = {}
    for i, (path, name, source) in enumerate(items):
        try:
            st, info = hc.lookup(path, name, source)
        except ModelHeaderError as exc:
            out[i] = Problem(exc.path, exc.why)
            continue
        if info is not None:
            out[i] = info
        else:
            stamps[i] = st
    reads = _Reads(hc, items, stamps, say)
    todo = list(stamps)
    processes = processes_for(len(todo), want)
    if todo:
        say(f"reading {len(todo)} headers" + (f" in {processes} processes" if processes > 1 else ""))
    if processes > 1:
        todo = reads.in_pool(todo, processes)
    reads.serially(todo)
    out.update(reads.results)
    return [out[i] for i in range(len(items))]
