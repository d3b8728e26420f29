"""What crosses between specview and an engine's worker: the messages on the pipe, and the worker's setup.

Both sides import this module (and :mod:`.shared`), never each other's.  Every message is a
small dataclass of picklable values: the Step / Round / Trace dataclasses,
settings, plain results and SpecviewErrors, never a live engine object.
Callables cannot cross, so a call's callback arguments are replaced by
:class:`Callback` markers: the child calls a stub that sends the arguments
back in an :class:`Events` batch and the parent calls the real callback with
them.  The ``cancel`` argument is the exception: the parent polls it and sends
:class:`Cancel` once it turns true; the child's stub reads the flag that sets.

Parent to child: a request (:class:`Run`, :class:`Diagnose`, :class:`Preload`,
:class:`Job` a function of the Session, :class:`Call` a plain function: a
probe), :class:`Cancel`, :class:`Close`.  Child to parent: :class:`Ready`
once, then for each request :class:`Events` (callbacks, batched), :class:`Progress`
(the Session's progress lines), :class:`Record` (a run's head and each finished
arm) and one :class:`Result` or :class:`Error`.  Every message of a request
carries its ``cid``, so a late message of an earlier request is recognised.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict, dataclass, field
from typing import Any, Union

#: the keyword argument the child polls instead of calling back
CANCEL = "cancel"


class _Message:
    """A message pickles as its class and its fields' values in order: smaller and faster than a dataclass's default."""

    __slots__ = ()

    def __reduce__(self) -> tuple:
        return type(self), tuple([getattr(self, name) for name in self.__slots__])  # type: ignore[attr-defined]


# -- parent to child -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Run(_Message):
    """``Session.run_resolved(cfg, **kwargs)`` (``cfg`` a :class:`~specview.core.resolve.Resolved`, decided in the
    parent); the head and each finished arm come back as :class:`Record`."""

    cid: int
    cfg: Any
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Diagnose(_Message):
    """``Session.diagnose(trace, cfg, **kwargs)``; the result comes back with the trace it annotated."""

    cid: int
    trace: Any
    cfg: Any
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Preload(_Message):
    """``Session.preload(cfg)``."""

    cid: int
    cfg: Any


@dataclass(frozen=True, slots=True)
class Job(_Message):
    """``fn(session, *args, **kwargs)`` for the module-level function ``module:qualname``."""

    cid: int
    module: str
    qualname: str
    args: tuple
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Call(_Message):
    """``fn(*args, **kwargs)`` for the module-level function ``module:qualname``, with no Session (a probe)."""

    cid: int
    module: str
    qualname: str
    args: tuple
    kwargs: dict[str, Any]


Request = Union[Run, Diagnose, Preload, Job, Call]


@dataclass(frozen=True, slots=True)
class Cancel(_Message):
    """The request ``cid``'s ``cancel()`` turned true."""

    cid: int


@dataclass(frozen=True, slots=True)
class Close(_Message):
    """Free the models and exit."""


# -- child to parent -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ready(_Message):
    """The worker has started and waits for requests."""

    pid: int


@dataclass(frozen=True, slots=True)
class Events(_Message):
    """Callback calls, in order: ``(keyword of the callback, its arguments)`` each, sent every ~20 ms."""

    cid: int
    events: list[tuple[str, tuple]]


@dataclass(frozen=True, slots=True)
class Progress(_Message):
    """One of the Session's progress lines (loading a model, a replay's step)."""

    cid: int
    text: str


@dataclass(frozen=True, slots=True)
class Record(_Message):
    """What a run has finished so far: its ``head`` (config, models, prompt) or an ``arm``."""

    cid: int
    kind: str
    value: Any


@dataclass(frozen=True, slots=True)
class Result(_Message):
    """The request's return value, and the Session's counters after it."""

    cid: int
    value: Any
    counters: dict[str, int]


@dataclass(frozen=True, slots=True)
class Error(_Message):
    """The request's exception (one that pickles: :func:`portable_error`), and the Session's counters."""

    cid: int
    error: BaseException
    counters: dict[str, int]


Reply = Union[Ready, Events, Progress, Record, Result, Error]


# -- how a worker starts -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    """What the parent tells a new worker, on its command line (one JSON argument after the socket's fd)."""

    parent: int  # the parent's pid: the worker exits when it goes
    activity: str  # the path of the activity file (:class:`~.shared.ActivityFile`)
    log: str  # where the worker's stdout and stderr go
    registrations: dict[str, str] = field(default_factory=dict)  # engines by dotted path the child must register
    progress: bool = True  # send the Session's progress lines

    def to_arg(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_arg(cls, arg: str) -> "Setup":
        d = json.loads(arg)
        return cls(parent=int(d["parent"]), activity=d["activity"], log=d.get("log", ""),
                   registrations=dict(d.get("registrations") or {}), progress=bool(d.get("progress", True)))


# -- callables and errors across the pipe ------------------------------------------------------------
@dataclass(frozen=True)
class Callback:
    """Stands in, in a call's keyword arguments, for a callable that stays in the parent."""

    name: str


def split_callbacks(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """``(kwargs to send, {name: callable kept here}, cancel callable or None)``."""
    send: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    cancel = None
    for k, v in kwargs.items():
        if k == CANCEL:
            cancel = v
            send[k] = Callback(CANCEL) if v is not None else None
        elif callable(v) and not isinstance(v, type):
            kept[k] = v
            send[k] = Callback(k)
        else:
            send[k] = v
    return send, kept, cancel


def portable_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling as itself, else a SpecviewError with the same words and class name."""
    from ..errors import SpecviewError

    try:
        back = pickle.loads(pickle.dumps(exc))
        if type(back) is type(exc) and str(back) == str(exc):
            return exc
    except Exception:
        pass
    if isinstance(exc, SpecviewError):
        return SpecviewError(str(exc))
    return SpecviewError(f"{type(exc).__name__} in the engine's worker process: {exc}")


def function_at(module: str, qualname: str) -> Any:
    """The module-level function a :class:`Job` or :class:`Call` names (it crosses as its module and name)."""
    import importlib

    fn: Any = importlib.import_module(module)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    return fn
