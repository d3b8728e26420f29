"""The parent's side: a :class:`~specview.core.registry.Runner` whose engine lives in a child process.

:class:`WorkerRunner` forwards ``run``, ``diagnose``, ``job`` and ``preload``
(and :meth:`~WorkerRunner.call`, a plain function: a probe) to a worker
(:mod:`.child`) as :mod:`.wire`'s messages, and turns what streams back into
the same Step / Round / progress callbacks, Trace and errors a
:class:`Session` gives, so nothing above the registry knows a process is
there.  It survives every death of the worker: a signal (SIGSEGV, SIGABRT,
SIGKILL), an early exit, or a worker that stops making progress for
``SPECVIEW_WORKER_TIMEOUT`` seconds (default 600: a GPU driver may compile
shaders for minutes on its first pass).  The death becomes one
:class:`~specview.core.errors.EngineCrashed` that says what happened
(:mod:`.death`, read with the known causes the engine contributes:
:meth:`~specview.core.registry.Backend.death_causes`) and carries the run
computed so far, its arms stopped with reason ``"crashed"``.  The next
request starts a fresh worker.
"""

from __future__ import annotations

import atexit
import multiprocessing.connection
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from ..config import EngineSettings
from ..errors import EngineCrashed
from ..paths import KEEP_FILE, sweep_orphans_once, temp_prefix
from ..trace import CRASHED
from ..registry import Runner, dotted_paths, get_backend
from .death import DeathCauses, account, message
from .shared import CHILD_MODULE, WORKER_ARG, ActivityFile
from .wire import (Call, Cancel, Close, Diagnose, Error, Events, Job, Preload,
                   Progress, Ready, Record, Request, Result, Run, Setup, split_callbacks)

DEFAULT_TIMEOUT_S = 600.0
START_TIMEOUT_S = 120.0
POLL_S = 0.05

_LIVE: "weakref.WeakSet[_Worker]" = weakref.WeakSet()


def worker_timeout() -> float:
    raw = os.environ.get("SPECVIEW_WORKER_TIMEOUT", "")
    try:
        v = float(raw)
        return v if v > 0 else DEFAULT_TIMEOUT_S
    except ValueError:
        return DEFAULT_TIMEOUT_S


@dataclass
class _Died(Exception):
    """Raised inside the wait loop; the runner turns it into EngineCrashed."""

    exitcode: int | None
    hung_s: float | None = None
    killed: bool = False


class _Worker:
    """One child process, its pipe, its activity file and its log.

    The child is a fresh interpreter started by :class:`subprocess.Popen`
    (``python -m specview.core.worker.child``, or the frozen app with
    :data:`~.shared.WORKER_ARG` first), never a fork, and never a
    re-import of the caller's main module: a script without a ``__main__``
    guard, the app and the test runner all start it the same way.  It runs in
    its own session (Ctrl+C reaches only the parent) with the environment the
    engine asked for, set before the interpreter starts.
    """

    def __init__(self, env: dict[str, str], registrations: dict[str, str], progress_wanted: bool):
        sweep_orphans_once()  # what a process killed before its cleanup left behind
        self.env = dict(env)
        self.dir = tempfile.mkdtemp(prefix=temp_prefix("worker"))
        self.log_path = os.path.join(self.dir, "worker.log")
        self.activity = ActivityFile(self.activity_path, create=True)
        ours, theirs = socket.socketpair()
        self.conn = multiprocessing.connection.Connection(ours.detach())
        setup = Setup(parent=os.getpid(), activity=self.activity_path, log=self.log_path,
                      registrations=dict(registrations), progress=progress_wanted)
        if getattr(sys, "frozen", False):
            cmd = [sys.executable, WORKER_ARG]
        else:
            cmd = [sys.executable, "-m", CHILD_MODULE]
        cmd += [str(theirs.fileno()), setup.to_arg()]
        full_env = {**os.environ, **self.env}
        # the child imports what this process can: specview itself, and an engine registered by dotted path
        # from a folder only this process put on sys.path (a plug-in under development, a test's planted engine)
        paths = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]
        full_env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        self.keep_dir = False
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), env=full_env, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=log, start_new_session=True, close_fds=True)
        finally:
            theirs.close()
        _LIVE.add(self)

    @property
    def activity_path(self) -> str:
        return os.path.join(self.dir, "activity")

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    @property
    def exitcode(self) -> int | None:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def read_log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 64_000))
                return fh.read()
        except OSError:
            return ""

    def join(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.alive():
            try:
                self.proc.kill()
            except OSError:
                pass
        self.join(5)

    def stop(self, grace: float = 5.0) -> None:
        """Ask the worker to free its models and exit; kill it if it does not within ``grace`` seconds."""
        if self.alive():
            try:
                self.conn.send(Close())
            except (OSError, EOFError, ValueError):
                pass
            self.join(grace)
        self.kill()
        self.dispose()

    def dispose(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        self.activity.close()
        _LIVE.discard(self)
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def _kill_all() -> None:
    for w in list(_LIVE):
        try:
            w.kill()
            w.dispose()
        except Exception:  # pragma: no cover - best effort at exit
            pass


atexit.register(_kill_all)


def live_workers() -> list[int]:
    """The process ids of every worker this process started and has not stopped."""
    return [w.pid for w in list(_LIVE) if w.pid is not None and w.alive()]


class WorkerRunner(Runner):
    """A Runner whose Session lives in a worker process (see the module docstring)."""

    def __init__(self, backend: str | None, *, progress: Callable[[str], None] | None = None,
                 registrations: dict[str, str] | None = None, env_for: Callable[[Any], dict[str, str]] | None = None,
                 timeout: float | None = None):
        self.backend = backend
        self.progress = progress or (lambda msg: None)
        self.registrations = dict(registrations or {})
        self.env_for = env_for or (lambda settings: {})
        self.timeout = timeout
        self._worker: _Worker | None = None
        self._ids = 0
        self.loads = 0
        self.vanilla_runs = 0
        self.speculative_runs = 0
        self.starts = 0  # workers started (the first, and one after each death or environment change)
        self.last_start_s: float | None = None

    # -- the process ---------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The live worker's process id (None before the first request and after a death)."""
        w = self._worker
        return w.pid if w is not None and w.alive() else None

    def _ensure(self, env: dict[str, str]) -> _Worker:
        w = self._worker
        if w is not None and (not w.alive() or w.env != env):
            if not w.alive():
                self.progress(f"the engine's worker process had ended ({_how(w.exitcode)}); starting a new one")
            w.stop()
            self._worker = w = None
        if w is None:
            t0 = time.perf_counter()
            w = _Worker(env, self.registrations, progress_wanted=True)
            self._worker = w
            self.starts += 1
            self._wait_ready(w)
            self.last_start_s = time.perf_counter() - t0
        return w

    def _wait_ready(self, w: _Worker) -> None:
        t_end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < t_end:
            if multiprocessing.connection.wait([w.conn], timeout=POLL_S):
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):
                    w.join(5)
                    break
                if type(msg) is Ready:
                    return
            elif not w.alive():
                break
        if w.alive():
            w.kill()
        self._worker = None
        crash = self._account(w, _Died(w.exitcode, None, False), "starting the engine's worker process", None)
        raise EngineCrashed(message(crash), crash=crash)

    def close(self) -> None:
        w, self._worker = self._worker, None
        if w is not None:
            w.stop()

    # -- one request -----------------------------------------------------------------------
    def _env(self, settings: EngineSettings | None) -> dict[str, str]:
        """The worker environment for a request with these settings (none given: the live worker's)."""
        if settings is not None:
            return self.env_for(settings)
        return self._worker.env if self._worker is not None else {}

    def _request(self, make: Callable[[int, dict[str, Any]], Request], kwargs: dict[str, Any], *, during: str,
                 env: dict[str, str], settings: EngineSettings | None = None,
                 on_record: Callable[[str, Any], None] | None = None,
                 crash_trace: Callable[[dict], Any] | None = None) -> Any:
        """Send ``make(cid, kwargs without callables)`` to a worker with ``env``; its result, or how it died."""
        w = self._ensure(env)
        send, kept, cancel = split_callbacks(kwargs)
        self._ids += 1
        cid = self._ids
        try:
            w.conn.send(make(cid, send))
            return self._wait(w, cid, kept, cancel, on_record)
        except _Died as died:
            self._worker = None
            crash = self._account(w, died, during, settings)
            trace = crash_trace(crash) if crash_trace is not None else None
            raise EngineCrashed(message(crash), crash=crash, trace=trace) from None
        except (OSError, EOFError) as exc:  # the pipe broke without a death we could see yet
            w.join(2)
            self._worker = None
            crash = self._account(w, _Died(w.exitcode), during, settings)
            raise EngineCrashed(message(crash) + f"\n  (the pipe to it broke: {exc})", crash=crash,
                                trace=crash_trace(crash) if crash_trace is not None else None) from None
        except BaseException:  # Ctrl+C, or a callback of the caller's that raised: the worker's request is lost
            self._worker = None
            w.kill()
            w.dispose()
            raise

    def _wait(self, w: _Worker, cid: int, kept: dict[str, Callable], cancel: Callable[[], bool] | None,
              on_record: Callable[[str, Any], None] | None) -> Any:
        limit = self.timeout if self.timeout is not None else worker_timeout()
        last = time.monotonic()
        last_count = w.activity.read()[0]
        cancel_sent = False
        while True:
            if cancel is not None and not cancel_sent and cancel():  # checked between messages too: a run
                cancel_sent = True                                  # streams them without a pause
                w.conn.send(Cancel(cid))
            if multiprocessing.connection.wait([w.conn], timeout=POLL_S):
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):
                    w.join(5)
                    raise _Died(w.exitcode) from None
                last = time.monotonic()
                kind = type(msg)
                if getattr(msg, "cid", cid) != cid:
                    continue  # a late message of an earlier request
                if kind is Events:
                    self._deliver(kept, msg.events)
                elif kind is Progress:
                    self.progress(msg.text)
                elif kind is Record:
                    if on_record is not None:
                        on_record(msg.kind, msg.value)
                elif kind is Result:
                    self._count(msg.counters)
                    return msg.value
                elif kind is Error:
                    self._count(msg.counters)
                    raise msg.error
                continue
            if not w.alive():  # gone, and nothing left in the pipe (a message would have been read above)
                raise _Died(w.exitcode)
            count = w.activity.read()[0]
            now = time.monotonic()
            if count != last_count:
                last_count, last = count, now
            elif now - last > limit:
                w.kill()
                raise _Died(w.exitcode, hung_s=now - last, killed=True)

    def _deliver(self, kept: dict[str, Callable], events: list[tuple[str, tuple]]) -> None:
        for name, a in events:
            fn = kept.get(name)
            if fn is not None:
                fn(*a)

    def _count(self, counters: dict[str, int]) -> None:
        for k, v in counters.items():
            setattr(self, k, v)

    def _account(self, w: _Worker, died: _Died, during: str, settings: Any) -> dict[str, Any]:
        w.keep_dir = True  # the log stays for the bug report, and no later sweep takes it
        try:
            with open(os.path.join(w.dir, KEEP_FILE), "w", encoding="utf-8") as fh:
                fh.write("the worker's log is named in a crash's account; remove this folder when it is read\n")
        except OSError:
            pass
        try:
            activity = w.activity.read()[1]
        except (OSError, ValueError):
            activity = ""
        w.dispose()
        return account(exitcode=died.exitcode, activity=activity, log=w.read_log(), log_path=w.log_path,
                       hung_s=died.hung_s, during=during, killed_by_specview=died.killed,
                       engine=self._death_causes(settings))

    def _death_causes(self, settings: EngineSettings | None) -> DeathCauses | None:
        """What this runner's engine knows of how its worker dies (:meth:`Backend.death_causes`)."""
        if self.backend is None:
            return None
        try:
            return get_backend(self.backend).death_causes(settings)
        except Exception:  # an engine that cannot say (gone from the registry, a bug in its hook) hides no death
            return None

    # -- the Runner interface ---------------------------------------------------------------------
    def run_resolved(self, resolved: Any, *, on_event: Any = None, cancel: Any = None,
                     reuse_vanilla: bool = True) -> Any:
        # resolved here (Runner.run), where a probe can run in a worker of its own: the Session gets it decided
        cfg = resolved.config
        got = _Partial(cfg)

        def events(arm: str, ev: Any) -> None:
            got.event(arm, ev)
            if on_event is not None:
                on_event(arm, ev)

        def partial(crash: dict[str, Any]) -> Any:
            return resolved.record(got.trace(crash))

        return resolved.record(self._request(lambda cid, kw: Run(cid, resolved, kw),
                                             {"on_event": events, "cancel": cancel, "reuse_vanilla": reuse_vanilla},
                                             during=f"running {cfg.target}", env=self._env(cfg.engine),
                                             settings=cfg.engine, on_record=got.record, crash_trace=partial))

    def diagnose(self, trace: Any, cfg: Any, *, controls: bool = False, progress: Any = None,
                 cancel: Any = None) -> dict[str, Any]:
        result, back = self._request(lambda cid, kw: Diagnose(cid, trace, cfg, kw),
                                     {"controls": controls, "progress": progress, "cancel": cancel},
                                     during=f"diagnosing the run of {cfg.target}", env=self._env(cfg.engine),
                                     settings=cfg.engine)
        trace.diagnosis = back.diagnosis
        return result

    def preload(self, cfg: Any) -> None:
        cfg = self.resolve(cfg).config
        self._request(lambda cid, kw: Preload(cid, cfg), {}, during=f"loading {cfg.target}",
                      env=self._env(cfg.engine), settings=cfg.engine)

    def run_job(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """``fn(session, *args, **kwargs)`` in the worker; the engine settings it runs on are passed by name,
        ``settings=`` (resolved by :meth:`Runner.job`; one, or a list: the first decides the worker's environment)."""
        module, qualname = _named(fn)
        settings = _engine_settings(kwargs.get("settings"))
        return self._request(lambda cid, kw: Job(cid, module, qualname, args, kw), kwargs,
                             during=f"{fn.__name__.replace('_', ' ')}", env=self._env(settings), settings=settings)

    def call(self, fn: Callable[..., Any], args: tuple = (), kwargs: dict[str, Any] | None = None, *,
             env: dict[str, str] | None = None) -> Any:
        """``fn(*args, **kwargs)`` in the worker, for a module-level function that needs no Session (a probe of
        native code that may crash); ``env`` is the worker's environment (None: the live worker's, if any)."""
        module, qualname = _named(fn)
        return self._request(lambda cid, kw: Call(cid, module, qualname, tuple(args), kw), dict(kwargs or {}),
                             during=f"running {fn.__name__}", env=self._env(None) if env is None else dict(env))


def _named(fn: Callable[..., Any]) -> tuple[str, str]:
    """``(module, qualname)``, the name a function crosses the pipe by: it must be a module-level one."""
    module, qualname = fn.__module__, fn.__qualname__
    if "<" in qualname:
        raise TypeError(f"{qualname} cannot run in the engine's worker: give a module-level function")
    return module, qualname


def _engine_settings(value: Any) -> EngineSettings | None:
    """The EngineSettings a job's ``settings=`` gives (the first of a list, as a kernel map takes them)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value if isinstance(value, EngineSettings) else None


def engine_of(fn: Callable[..., Any]) -> str | None:
    """The engine whose package holds ``fn`` (its probes of its own native code), by the registry's dotted paths."""
    module = fn.__module__
    best: tuple[int, str | None] = (0, None)
    for name, path in dotted_paths().items():
        package = path.partition(":")[0]
        if (module == package or module.startswith(package + ".")) and len(package) > best[0]:
            best = (len(package), name)
    return best[1]


def _how(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


class _Partial:
    """What a run streamed before its worker died, made into a trace whose arms stopped "crashed"."""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.head: Any = None
        self.arms: dict[str, Any] = {}
        self.steps: dict[str, list] = {"vanilla": [], "speculative": []}
        self.rounds: list = []

    def event(self, arm: str, ev: Any) -> None:
        from ..trace import Round

        if isinstance(ev, Round):
            self.rounds.append(ev)
        elif arm in self.steps:
            self.steps[arm].append(ev)

    def record(self, kind: str, value: Any) -> None:
        if kind == "head":
            self.head = value
        elif kind == "arm":
            self.arms[value.name] = value

    def trace(self, crash: dict[str, Any]) -> Any:
        from ..arms.compare import compare_arms
        from ..trace import ArmResult, Trace

        def arm(name: str) -> Any:
            if name in self.arms:
                return self.arms[name]
            steps = self.steps[name]
            a = ArmResult(name=name, tokens=[s.token for s in steps], text="".join(s.piece for s in steps),
                          steps=list(steps), stop_reason=CRASHED, eval_ms=None)
            if name == "speculative":
                a.rounds = list(self.rounds)
                a.drafter = self.cfg.spec_type
            return a

        v, s = arm("vanilla"), arm("speculative")
        comparison = compare_arms(v, s)  # on the tokens both arms have (an arm the crash cut short has not forked)
        if self.head is not None:
            t = self.head
            t.vanilla, t.speculative = v, s
            t.comparison = comparison
        else:
            from ..session import host_environment, prompt_record
            from ... import __version__

            t = Trace(config=self.cfg.to_dict(),
                      environment={"specview": __version__, "backend": self.cfg.backend, **host_environment()},
                      models={"target": {"file": os.path.basename(str(self.cfg.target)), "path": str(self.cfg.target)},
                              "draft": None},
                      prompt=prompt_record(self.cfg, list(self.cfg.prompt_tokens or [])),
                      vanilla=v, speculative=s, comparison=comparison)
        t.extra["crash"] = {k: v for k, v in crash.items() if k != "log_tail"} | {"log_tail": crash.get("log_tail")}
        return t

