"""The worker's side: one real :class:`~specview.core.arms.session.Session`, requests in, events out.

It runs in a process of its own, started by spawn (never fork: the parent may
hold Qt, OpenMP or a GPU driver), and owns every native handle: models,
contexts, the GPU device.  It starts with the environment the engine asked for (``GGML_VK_*``,
``OMP_*``, which ggml reads once at start-up), and it
* writes stdout and stderr to a log file the parent reads after a death
  (llama.cpp's own messages, a ``GGML_ASSERT`` line, the Python and native
  frames :mod:`faulthandler` and :mod:`.native` print);
* makes sure it dies with its parent: on Linux the kernel sends SIGKILL when
  the parent goes (``PR_SET_PDEATHSIG``), everywhere a thread that reads the
  pipe exits the process when the parent's end closes; it leaves the
  terminal's process group, so Ctrl+C reaches only the parent, which decides.

What it is doing (loading which file, a T-token pass at position P of which
model) is written before each step to a small file the parent maps
(:mod:`specview.core.activity`), with a counter the parent's deadline watches.
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import queue
import signal
import struct
import sys
import threading
import time
import traceback
from typing import Any

from .wire import CANCEL, Callback, function_at, portable_error

ACTIVITY_SIZE = 4096
EVENT_BATCH_S = 0.02  # a streamed token reaches the parent at most this late (a frame is 16 ms)
EVENT_BATCH_N = 256
_HEADER = struct.Struct("<QI")  # counter, text length


class ActivityFile:
    """The shared record of what the worker is doing: a counter and a line of text, in a mapped file."""

    def __init__(self, path: str, *, create: bool = False):
        if create:
            with open(path, "wb") as fh:
                fh.write(b"\0" * ACTIVITY_SIZE)
        self._fh = open(path, "r+b")
        self._map = mmap.mmap(self._fh.fileno(), ACTIVITY_SIZE)
        self.count = 0

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")[: ACTIVITY_SIZE - _HEADER.size]
        self.count += 1
        self._map[_HEADER.size:_HEADER.size + len(data)] = data
        self._map[:_HEADER.size] = _HEADER.pack(self.count, len(data))

    def read(self) -> tuple[int, str]:
        count, n = _HEADER.unpack(self._map[:_HEADER.size])
        n = min(n, ACTIVITY_SIZE - _HEADER.size)
        return count, self._map[_HEADER.size:_HEADER.size + n].decode("utf-8", "replace")

    def close(self) -> None:
        try:
            self._map.close()
            self._fh.close()
        except (OSError, ValueError):
            pass


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
    """The reader thread: queues calls for the main thread, flags cancels, exits the process on EOF."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.calls: "queue.Queue[tuple]" = queue.Queue()
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
            if msg[0] == "cancel":
                self.cancelled.add(msg[1])
            else:
                self.calls.put(msg)
                if msg[0] == "close":
                    return

    def send(self, msg: tuple) -> None:
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
            self.conn.send(("events", self._held_cid, self._held))
            self._held = []
        self._sent = time.perf_counter() if now is None else now


FROZEN_ARG = "--specview-engine-worker"  # the frozen app's first argument that makes it a worker


def main(conn: Any, parent_pid: int, activity_path: str, registrations: dict[str, str],
         progress_wanted: bool) -> None:
    """The worker's loop: requests in, events and results out, until ``close`` or the parent goes."""
    _die_with_parent(parent_pid)
    _watch_crashes()
    act = ActivityFile(activity_path)
    from .. import activity
    from ..registry import register_backend
    from ..arms.session import Session

    activity.set_sink(act.write)
    for name, path in registrations.items():
        register_backend(name, path)
    calls = _Calls(conn)
    current = {"id": 0}

    def progress(msg: str) -> None:
        if progress_wanted:
            calls.send(("event", current["id"], "__progress__", (msg,)))

    session = Session(progress=progress)
    calls.send(("ready", os.getpid()))
    while True:
        msg = calls.calls.get()
        if msg[0] == "close":
            break
        _, cid, method, args, kwargs = msg
        current["id"] = cid
        try:
            kwargs = _bind(kwargs, cid, calls)
            value = _dispatch(session, method, args, kwargs, cid, calls)
            out: tuple = ("result", cid, value, _counters(session))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if not hasattr(exc, "__notes__") or not any("worker traceback" in n for n in exc.__notes__):
                try:
                    exc.add_note("worker traceback:\n" + "".join(traceback.format_exception(exc)))
                except Exception:
                    pass
            out = ("error", cid, portable_error(exc), _counters(session))
        activity.doing("idle, between requests")
        try:
            calls.send(out)
        except Exception as exc:  # a result that cannot be pickled: say so instead of hanging the parent
            calls.send(("error", cid, portable_error(TypeError(f"the worker's result cannot be sent: {exc}")),
                        _counters(session)))
    session.close()
    act.close()


def _counters(session: Any) -> dict[str, int]:
    return {k: int(getattr(session, k, 0)) for k in ("loads", "vanilla_runs", "speculative_runs")}


def _bind(kwargs: dict[str, Any], cid: int, calls: _Calls) -> dict[str, Any]:
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


def _dispatch(session: Any, method: str, args: tuple, kwargs: dict[str, Any], cid: int, calls: _Calls) -> Any:
    if method == "run":
        (cfg,) = args
        return session.run(cfg, on_record=lambda kind, value: calls.send(("record", cid, kind, value)), **kwargs)
    if method == "diagnose":
        trace, cfg = args
        result = session.diagnose(trace, cfg, **kwargs)
        return result, trace
    if method == "preload":
        (cfg,) = args
        session.preload(cfg)
        return None
    if method in ("job", "call"):
        module, qualname, *rest = args
        fn = function_at(module, qualname)
        return fn(session, *rest, **kwargs) if method == "job" else fn(*rest, **kwargs)
    raise ValueError(f"unknown worker request {method!r}")


def entry(argv: list[str]) -> None:
    """``python -m specview.core.worker.child FD SETUP``: FD is the socket to the parent, SETUP a JSON object."""
    import json
    import multiprocessing.connection

    fd, setup = int(argv[0]), json.loads(argv[1])
    conn = multiprocessing.connection.Connection(fd)
    main(conn, int(setup["parent"]), setup["activity"], dict(setup.get("registrations") or {}),
         bool(setup.get("progress", True)))


if __name__ == "__main__":
    entry(sys.argv[1:])
