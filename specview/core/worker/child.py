"""The worker's side: one real :class:`~specview.core.session.Session`, requests in, replies out.

It is a fresh interpreter the parent starts with :class:`subprocess.Popen`
(``python -m specview.core.worker.child FD SETUP``, or the frozen app with
:data:`~.shared.WORKER_ARG` first), never a fork (the parent may hold Qt,
OpenMP or a GPU driver), and it owns every native handle: models, contexts,
the GPU device.  It starts with the environment the engine asked for
(``GGML_VK_*``, ``OMP_*``, which ggml reads once at start-up), and it
* writes stdout and stderr to a log file the parent reads after a death
  (llama.cpp's own messages, a ``GGML_ASSERT`` line, the Python and native
  frames :mod:`faulthandler` and :mod:`.native` print);
* makes sure it dies with its parent: on Linux the kernel sends SIGKILL when
  the parent goes (``PR_SET_PDEATHSIG``), everywhere a thread that reads the
  pipe exits the process when the parent's end closes; it leaves the
  terminal's process group, so Ctrl+C reaches only the parent, which decides.

What it is doing (loading which file, a T-token pass at position P of which
model) is written before each step to the :class:`~.shared.ActivityFile` the
parent maps (:mod:`specview.core.activity`), with a counter the parent's
deadline watches.  What crosses the pipe is :mod:`.wire`'s messages.
"""

from __future__ import annotations

import faulthandler
import os
import queue
import signal
import sys
import threading
import time
import traceback
from typing import Any

from .shared import ActivityFile
from .wire import (CANCEL, Call, Callback, Cancel, Close, Diagnose, Error, Events, Job, Preload,
                   Progress, Ready, Record, Request, Result, Run, Setup, function_at, portable_error)

EVENT_BATCH_S = 0.02  # a streamed token reaches the parent at most this late (a frame is 16 ms)
EVENT_BATCH_N = 256


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent_pid:  # the parent went before prctl took effect
            os._exit(1)
    try:
        os.setpgid(0, 0)  # Ctrl+C in a terminal goes to the parent only
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _watch_crashes() -> None:
    """Python and native frames of a fatal signal go to stderr, which is the worker's log."""
    faulthandler.enable(file=sys.stderr, all_threads=True)
    from .native import install_native_backtrace

    install_native_backtrace(2)


class _Calls:
    """The reader thread: queues requests for the main thread, flags cancels, exits the process on EOF."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.calls: "queue.Queue[Request | Close]" = queue.Queue()
        self.cancelled: set[int] = set()
        self.lock = threading.Lock()
        self._held: list[tuple[str, tuple]] = []
        self._held_cid = 0
        self._sent = time.perf_counter()
        threading.Thread(target=self._read, name="specview-worker-reader", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the parent is gone: so are we, whatever the main thread is doing
            except Exception:  # a message that cannot be unpickled here
                traceback.print_exc()
                continue
            if type(msg) is Cancel:
                self.cancelled.add(msg.cid)
            else:
                self.calls.put(msg)
                if type(msg) is Close:
                    return

    def send(self, msg: Any) -> None:
        """Send ``msg`` after the events still held back, so the parent sees everything in order."""
        with self.lock:
            self._flush()
            self.conn.send(msg)

    def event(self, cid: int, name: str, args: tuple) -> None:
        """A callback's arguments, sent in batches (at most EVENT_BATCH_S late): one message per token would
        cost the parent a wake-up and the pipe a write for every Step."""
        with self.lock:
            self._held.append((name, args))
            self._held_cid = cid
            now = time.perf_counter()
            if now - self._sent >= EVENT_BATCH_S or len(self._held) >= EVENT_BATCH_N:
                self._flush(now)

    def _flush(self, now: float | None = None) -> None:
        if self._held:
            self.conn.send(Events(self._held_cid, self._held))
            self._held = []
        self._sent = time.perf_counter() if now is None else now


def main(conn: Any, setup: Setup) -> None:
    """The worker's loop: requests in, replies out, until :class:`~.wire.Close` or the parent goes."""
    _die_with_parent(setup.parent)
    _watch_crashes()
    act = ActivityFile(setup.activity)
    from .. import activity
    from ..registry import register_backend
    from ..session import Session

    activity.set_sink(act.write)
    for name, path in setup.registrations.items():
        register_backend(name, path)
    calls = _Calls(conn)
    current = {"id": 0}

    def progress(msg: str) -> None:
        if setup.progress:
            calls.send(Progress(current["id"], msg))

    session = Session(progress=progress)
    calls.send(Ready(os.getpid()))
    while True:
        req = calls.calls.get()
        if type(req) is Close:
            break
        cid = req.cid
        current["id"] = cid
        out: Result | Error
        try:
            out = Result(cid, _perform(session, req, calls), _counters(session))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if not hasattr(exc, "__notes__") or not any("worker traceback" in n for n in exc.__notes__):
                try:
                    exc.add_note("worker traceback:\n" + "".join(traceback.format_exception(exc)))
                except Exception:
                    pass
            out = Error(cid, portable_error(exc), _counters(session))
        activity.doing("idle, between requests")
        try:
            calls.send(out)
        except Exception as exc:  # a result that cannot be pickled: say so instead of hanging the parent
            calls.send(Error(cid, portable_error(TypeError(f"the worker's result cannot be sent: {exc}")),
                             _counters(session)))
    session.close()
    act.close()


def _counters(session: Any) -> dict[str, int]:
    return {k: int(getattr(session, k, 0)) for k in ("loads", "vanilla_runs", "speculative_runs")}


def _bind(kwargs: dict[str, Any], cid: int, calls: _Calls) -> dict[str, Any]:
    """The request's keyword arguments with each :class:`~.wire.Callback` marker made a stub that sends back."""
    out = {}
    for k, v in kwargs.items():
        if isinstance(v, Callback):
            if v.name == CANCEL:
                out[k] = (lambda: cid in calls.cancelled)
            else:
                out[k] = (lambda *a, _n=v.name: calls.event(cid, _n, a))
        else:
            out[k] = v
    return out


def _perform(session: Any, req: Request, calls: _Calls) -> Any:
    """What ``req`` asks of the Session (or, for a :class:`~.wire.Call`, of a plain function)."""
    cid = req.cid
    if isinstance(req, Run):
        return session.run_resolved(req.cfg, on_record=lambda kind, value: calls.send(Record(cid, kind, value)),
                           **_bind(req.kwargs, cid, calls))
    if isinstance(req, Diagnose):
        result = session.diagnose(req.trace, req.cfg, **_bind(req.kwargs, cid, calls))
        return result, req.trace
    if isinstance(req, Preload):
        session.preload(req.cfg)
        return None
    if isinstance(req, Job):
        return session.run_job(function_at(req.module, req.qualname), req.args, _bind(req.kwargs, cid, calls))
    if isinstance(req, Call):
        return function_at(req.module, req.qualname)(*req.args, **_bind(req.kwargs, cid, calls))
    raise TypeError(f"unknown worker request {type(req).__name__}")


def entry(argv: list[str]) -> None:
    """``python -m specview.core.worker.child FD SETUP``: FD is the socket to the parent, SETUP a
    :class:`~.wire.Setup` as JSON."""
    import multiprocessing.connection

    fd, setup = int(argv[0]), Setup.from_arg(argv[1])
    main(multiprocessing.connection.Connection(fd), setup)


if __name__ == "__main__":
    entry(sys.argv[1:])
