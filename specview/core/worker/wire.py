"""What crosses the pipe between specview and an engine's worker process.

Everything is a small tuple of picklable values: the Step / Round / Trace
dataclasses, settings, plain results and SpecviewErrors, never a live engine
object.  Callables cannot cross, so a call's callback arguments are replaced by
:class:`Callback` markers: the child calls a stub that sends the arguments
back as an ``event`` and the parent calls the real callback with them.  The
``cancel`` argument is the exception: the parent polls it and sends ``cancel``
once it turns true; the child's stub reads the flag that message sets.

Parent to child::

    ("call", call_id, method, args, kwargs)   method: "run", "diagnose", "preload", "job" (a function of the
                                              Session), "call" (a plain function: a probe)
    ("cancel", call_id)
    ("close",)

Child to parent::

    ("ready", pid)
    ("event", call_id, callback_name, args)
    ("events", call_id, [(callback_name, args), ...])   the same, batched (tokens, every ~20 ms)
    ("record", call_id, kind, value)          a run's head (config, models, prompt) and each finished arm
    ("result", call_id, value, counters)
    ("error", call_id, exception, counters)
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

#: the keyword argument the child polls instead of calling back
CANCEL = "cancel"


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
    """The module-level function a ``job`` or ``call`` request names (it crosses as its module and name)."""
    import importlib

    fn: Any = importlib.import_module(module)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    return fn
