"""One local server process: started, health-checked, asked, streamed from, stopped -- and never orphaned.

:class:`LocalServer` is engine-neutral.  An engine names its program and flags
and, in a subclass, says how the server announces its port
(:attr:`LocalServer.listening_pattern`) and how to read its log when it dies
(:meth:`LocalServer.exit_cause`).

No server outlives specview:

* each runs in its own process group (``start_new_session``), so stopping it
  stops anything it spawned too (SIGTERM, then SIGKILL after a grace period);
* every live server is stopped at interpreter exit (``atexit``) and on
  SIGTERM, SIGINT and SIGHUP (the previous handler then runs as before);
* on Linux the child asks the kernel for ``PR_SET_PDEATHSIG`` = SIGKILL, so it
  dies with the thread that started it even when specview is SIGKILLed;
* a request notices within 50 ms when its server has died or the caller
  cancelled; a cancel stops the server (a one-slot server busy with an
  abandoned request is of no use to anyone).

Requests use :mod:`http.client` straight to 127.0.0.1, so no proxy settings
apply.  The server's output goes to a temporary log file whose tail is quoted
in errors and can be kept in a trace.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ...core.errors import Cancelled, SpecviewError
from ...core.paths import sweep_orphans_once, temp_prefix

__all__ = ["LocalServer", "ServerError", "Cancelled", "start_all", "stop_all", "live_servers", "port_in_use",
           "program_path", "rc_text", "tail_text", "HOST"]

HOST = "127.0.0.1"
#: seconds to wait for a server to say it is ready (loading a large model can take minutes)
START_TIMEOUT = float(os.environ.get("SPECVIEW_SERVER_START_TIMEOUT", "300"))
#: how often a waiting request looks at the cancel check and the process
POLL = 0.05

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]


class ServerError(SpecviewError):
    """A local server could not be found, started, or kept running, or it answered with an error."""


def rc_text(rc: int | None) -> str:
    """An exit status in words: ``status 1``, ``signal SIGKILL``."""
    if rc is None:
        return "no exit status"
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"status {rc}"


def tail_text(text: str, n: int) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join("    " + ln for ln in lines[-n:])


def program_path(value: str, what: str, source: str) -> Path:
    """The program ``value`` names (a path, or a bare name looked up on PATH), or a :class:`ServerError` saying
    why it cannot be run; ``what`` names the program in that message, ``source`` where ``value`` came from."""
    p = Path(value).expanduser()
    if os.sep not in value and not p.exists():
        found = shutil.which(value)
        if found:
            p = Path(found)
    if not p.exists():
        raise ServerError(f"{what} {value} (from {source}) does not exist")
    if p.is_dir():
        raise ServerError(f"{what} {value} (from {source}) is a directory, not a program")
    if not os.access(p, os.X_OK):
        raise ServerError(f"{what} {value} (from {source}) is not executable (chmod +x it)")
    return p


def port_in_use(port: int, host: str = HOST) -> bool:
    """True when ``port`` cannot be bound on ``host`` (checked the way servers bind: with SO_REUSEADDR)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    except OSError:
        return True
    finally:
        s.close()
    return False


def free_port(host: str = HOST) -> int:
    """A port that was free a moment ago (for servers that cannot pick their own and say which)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# -- no orphans ---------------------------------------------------------------------------
_LIVE: "weakref.WeakSet[LocalServer]" = weakref.WeakSet()
_HANDLERS_INSTALLED = False
_PREV_HANDLERS: dict[int, Any] = {}


def live_servers() -> list["LocalServer"]:
    """Every server started in this process and not yet stopped."""
    return [s for s in list(_LIVE) if s.proc is not None]


def stop_all() -> None:
    """Stop every live server (what exit and the signal handlers do)."""
    for srv in list(_LIVE):
        try:
            srv.stop(grace=1.0)
        except Exception:  # pragma: no cover - best effort at exit
            pass


def _on_signal(signum: int, frame: Any) -> None:
    stop_all()
    prev = _PREV_HANDLERS.get(signum)
    if callable(prev):
        prev(signum, frame)
    elif prev == signal.SIG_IGN:
        return
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    atexit.register(stop_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)):
            if sig is None:
                continue
            try:
                prev = signal.getsignal(sig)
                if prev == signal.SIG_IGN:  # whoever started us wants it ignored: leave it so
                    continue
                _PREV_HANDLERS[sig] = prev
                signal.signal(sig, _on_signal)
            except (ValueError, OSError):  # pragma: no cover - not allowed here
                pass
    _HANDLERS_INSTALLED = True


def pdeathsig_preexec() -> Callable[[], None] | None:
    """On Linux: a ``preexec_fn`` that has the kernel SIGKILL the child when the thread that started it dies."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:  # runs in the child between fork and exec: nothing allocation-heavy
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


# -- one server -------------------------------------------------------------------------------
class LocalServer:
    """One server process on 127.0.0.1.

    ``port=0`` lets a server that announces its port (:attr:`listening_pattern`)
    pick a free one itself, so there is no race for it; a server that cannot
    gets a port that was free a moment before it starts.
    """

    #: what the server is, in messages ("llama-server", "mlx_lm.server")
    kind = "server"
    #: a regex whose group 1 is the port, found in the server's output once it listens (None: it says nothing)
    listening_pattern: str | None = None
    #: the path that answers 200 once the model is loaded (503 while loading)
    ready_path = "/health"
    host_flag = "--host"
    port_flag = "--port"

    def __init__(self, program: str | Sequence[str], args: Sequence[str], *, label: str, port: int = 0,
                 progress: ProgressFn | None = None, env: dict[str, str] | None = None):
        self.program = [program] if isinstance(program, str) else [str(p) for p in program]
        self.args = [str(a) for a in args]
        self.label = label
        self.port = int(port)
        self.progress = progress or (lambda msg: None)
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self.log_path: Path | None = None
        self._log_fh: Any = None
        self._final_log: str | None = None
        self.started_at: float | None = None
        self.ready_seconds: float | None = None

    # -- what it is ----------------------------------------------------------------
    @property
    def binary(self) -> str:
        return self.program[0]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def name(self) -> str:
        return f"{self.kind} ({self.label})"

    def command(self) -> list[str]:
        return [*self.program, *self.args, self.host_flag, HOST, self.port_flag, str(self.port)]

    def exit_cause(self, log: str) -> str:
        """Why the server exited, read from its output ("" when its output does not say)."""
        if "Address already in use" in log or "address already in use" in log:
            return f": port {self.port} on {HOST} is already in use"
        return ""

    # -- lifetime ------------------------------------------------------------------
    def start(self) -> "LocalServer":
        if self.proc is not None:
            raise ServerError(f"{self.name} was already started")
        if self.port and port_in_use(self.port):
            raise ServerError(f"cannot start {self.name}: port {self.port} on {HOST} is already in use by "
                              "another program")
        if not self.port and self.listening_pattern is None:
            self.port = free_port()
        _install_handlers()
        sweep_orphans_once()  # what a process killed before its cleanup left behind
        fd, name = tempfile.mkstemp(prefix=temp_prefix(f"{self.kind}-{self.label}"), suffix=".log")
        self.log_path = Path(name)
        self._log_fh = os.fdopen(fd, "wb")
        try:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=self._log_fh, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=pdeathsig_preexec(), close_fds=True, env=self.env,
            )
        except OSError as exc:
            self._cleanup_log()
            raise ServerError(f"cannot start {self.kind} {self.binary}: {exc.strerror or exc}") from None
        self.started_at = time.monotonic()
        _LIVE.add(self)
        self.progress(f"started {self.name} pid {self.proc.pid}")
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.returncode is None and self.proc.poll() is None

    def log_text(self) -> str:
        """The server's output so far (its last 256 KiB), kept after it stops."""
        if self._final_log is not None:
            return self._final_log
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 256 * 1024))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 12) -> str:
        return tail_text(self.log_text(), n)

    def died(self, when: str) -> ServerError:
        """The error for a server that exited ``when`` ("while starting", "during a request"), quoting its log."""
        rc = self.proc.poll() if self.proc else None
        log = self.log_text()
        tail = self.log_tail(14)
        return ServerError(
            f"{self.kind} ({self.label}, pid {self.pid}) exited {when} with {rc_text(rc)}{self.exit_cause(log)}.\n"
            f"  command: {shlex.join(self.command())}\n"
            + (f"  last lines of its output:\n{tail}" if tail else "  it printed nothing")
        )

    def wait_ready(self, timeout: float = START_TIMEOUT, cancel: CancelFn | None = None) -> None:
        """Poll :attr:`ready_path` until it answers 200, the process exits, or ``timeout`` passes."""
        cancel = cancel or (lambda: False)
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            if not self.alive():
                raise self.died("while starting")
            if cancel():
                self.stop(grace=1.0)
                raise Cancelled(f"cancelled while {self.name} was starting")
            if self.port == 0 and self.listening_pattern:
                m = re.search(self.listening_pattern, self.log_text())
                if m:
                    self.port = int(m.group(1))
            if self.port:
                status = self._probe()
                if status == 200:
                    if self.started_at is not None:
                        self.ready_seconds = time.monotonic() - self.started_at
                    self.progress(f"{self.name} ready on {HOST}:{self.port}")
                    return
                if status is not None and status != 503:
                    self.stop(grace=1.0)
                    raise ServerError(f"{self.name} answered {self.ready_path} with HTTP {status}")
            if time.monotonic() > deadline:
                tail = self.log_tail(10)
                self.stop()
                raise ServerError(f"{self.name} was not ready within {timeout:.0f} s"
                                  + (f"; last lines of its output:\n{tail}" if tail else ""))
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def _probe(self) -> int | None:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=2.0)
        try:
            conn.request("GET", self.ready_path)
            r = conn.getresponse()
            r.read()
            return r.status
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``grace`` seconds; keep its log's text."""
        proc = self.proc
        if proc is not None and self.returncode is None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    pass
            try:  # whatever is left of the group: the server itself or anything it spawned
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
                pass
            self.returncode = proc.returncode
        _LIVE.discard(self)
        if self._final_log is None and self.log_path is not None:
            self._final_log = self.log_text()
        self._cleanup_log()

    def _cleanup_log(self) -> None:
        if self._log_fh is not None:
            with contextlib.suppress(OSError):
                self._log_fh.close()
            self._log_fh = None
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
            self.log_path = None

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests ------------------------------------------------------------------
    def get(self, path: str, *, timeout: float = 30.0, cancel: CancelFn | None = None) -> Any:
        return self.request("GET", path, None, timeout=timeout, cancel=cancel)

    def post(self, path: str, body: dict[str, Any], *, timeout: float = 3600.0,
             cancel: CancelFn | None = None) -> Any:
        return self.request("POST", path, body, timeout=timeout, cancel=cancel)

    def request(self, method: str, path: str, body: dict[str, Any] | None, *, timeout: float = 3600.0,
                cancel: CancelFn | None = None) -> Any:
        """One JSON request; its answer as JSON.  HTTP errors, death and cancel are :class:`ServerError`/`Cancelled`."""
        for kind, item in self._exchange(method, path, body, stream=False, timeout=timeout, cancel=cancel):
            status, raw = item
            out = _json_or_text(raw)
            if status >= 400:
                raise self._refused(method, path, status, out)
            return out
        raise ServerError(f"{self.name} sent no answer to {method} {path}")  # pragma: no cover

    def stream(self, path: str, body: dict[str, Any], *, timeout: float = 3600.0, cancel: CancelFn | None = None,
               stop_on_cancel: bool = True) -> Iterator[dict[str, Any]]:
        """POST ``body`` and yield each server-sent event's JSON (``data: {...}`` lines) as it arrives.

        With ``stop_on_cancel=False`` a cancel closes the connection (a server
        that, like llama-server, drops a streamed task whose client went away
        then stays usable) instead of stopping the server.
        """
        for kind, item in self._exchange("POST", path, body, stream=True, timeout=timeout, cancel=cancel,
                                         stop_on_cancel=stop_on_cancel):
            if kind == "status":
                status, raw = item
                if status >= 400:
                    raise self._refused("POST", path, status, _json_or_text(raw))
                continue
            line = item.strip()
            if not line or line.startswith(b":"):
                continue
            if line.startswith(b"error:"):
                raise self._refused("POST", path, 500, _json_or_text(line[6:]))
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            ev = _json_or_text(data)
            if isinstance(ev, dict) and "error" in ev and len(ev) <= 2:
                raise self._refused("POST", path, 500, ev)
            yield ev

    def _refused(self, method: str, path: str, status: int, out: Any) -> ServerError:
        err = out.get("error") if isinstance(out, dict) else None
        msg = err.get("message") if isinstance(err, dict) else (err or out)
        return ServerError(f"{self.name} refused {method} {path} with HTTP {status}: {msg}")

    def _exchange(self, method: str, path: str, body: dict[str, Any] | None, *, stream: bool, timeout: float,
                  cancel: CancelFn | None, stop_on_cancel: bool = True) -> Iterator[tuple[str, Any]]:
        """Run the HTTP exchange on a thread; yield ("status", (code, body)) then, streaming, ("line", bytes).

        The calling thread waits on a queue in :data:`POLL` steps, so a dead
        server or a cancel is noticed at once whatever the socket is doing.
        """
        if not self.alive():
            raise self.died("before a request")
        cancel = cancel or (lambda: False)
        q: "queue.Queue[tuple[str, Any]]" = queue.Queue()
        data = None if body is None else json.dumps(body).encode("utf-8")
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)

        def work() -> None:
            try:
                conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                if not stream or r.status >= 400:
                    q.put(("status", (r.status, r.read())))
                else:
                    q.put(("status", (r.status, b"")))
                    while True:
                        line = r.readline()
                        if not line:
                            break
                        q.put(("line", line))
                q.put(("end", None))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                q.put(("error", exc))
            finally:
                conn.close()

        t = threading.Thread(target=work, name=f"{self.kind}-{self.label}-request", daemon=True)
        t.start()
        try:
            while True:
                try:
                    kind, item = q.get(timeout=POLL)
                except queue.Empty:
                    if cancel():
                        if stop_on_cancel:
                            self.stop(grace=1.0)
                        raise Cancelled(f"cancelled during a request to {self.name}") from None
                    if not self.alive():
                        t.join(1.0)
                        raise self.died("during a request") from None
                    continue
                if kind == "end":
                    return
                if kind == "error":
                    if self.proc is not None:
                        try:
                            self.proc.wait(timeout=2.0)
                        except subprocess.TimeoutExpired:
                            pass
                    if not self.alive():
                        raise self.died("during a request")
                    raise ServerError(f"request {method} {path} to {self.name} failed: {item}")
                yield kind, item
                if cancel():
                    if stop_on_cancel:
                        self.stop(grace=1.0)
                    raise Cancelled(f"cancelled during a request to {self.name}")
        finally:
            if t.is_alive():  # wake the reading thread (close alone does not interrupt a blocked read) and let go
                try:
                    if conn.sock is not None:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    conn.close()
                except Exception:  # pragma: no cover - already closed
                    pass


def _json_or_text(raw: bytes) -> Any:
    if not raw:
        return {}
    try:
        return json.loads(raw.decode("utf-8", "replace"))
    except json.JSONDecodeError:
        return {"raw": raw.decode("utf-8", "replace")[:500]}


def start_all(servers: Sequence[LocalServer], *, timeout: float = START_TIMEOUT,
              cancel: CancelFn | None = None) -> None:
    """Start every server (they load in parallel) and wait until all are ready; on failure stop them all."""
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait_ready(timeout=timeout, cancel=cancel)
    except BaseException:
        for s in servers:
            s.stop(grace=1.0)
        raise
