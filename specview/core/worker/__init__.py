"""The process boundary: every in-process engine's Session runs in a worker process of its own.

``proxy`` is the parent's Runner, ``child`` the worker's loop, ``wire`` the
typed messages that cross the pipe, ``shared`` what else both sides know (the
worker's first argument, the activity file), ``death`` the account of a worker
that died, ``native`` the dying worker's own account of its native frames.
The parent never imports ``child``, nor the child ``proxy``.
:class:`specview.core.inprocess.InProcessBackend` decides where a runner
lives; nothing above it knows a process is there.

Importing this package imports none of its modules: ``specview.cli`` reads
:data:`.shared.WORKER_ARG` on every start, and a worker starts without the
proxy's imports.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing would cost the CLI's start more than all the rest
if TYPE_CHECKING:
    from typing import Any, Callable

    from .proxy import CRASHED, WorkerRunner, live_workers, worker_timeout

__all__ = ["CRASHED", "WorkerRunner", "live_workers", "run_isolated", "worker_timeout"]


def __getattr__(name: str) -> Any:
    if name in ("CRASHED", "WorkerRunner", "live_workers", "worker_timeout"):
        from . import proxy

        return getattr(proxy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_isolated(fn: Callable[..., Any], *args: Any, timeout: float | None = None, env: dict[str, str] | None = None,
                 **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a fresh worker process started with ``env``, stopped afterwards.

    For probes of native code that may crash (the AMX probe): the result comes
    back, or :class:`~specview.core.errors.EngineCrashed` says how the worker
    died, with the known causes of the engine whose package holds ``fn``.
    ``fn`` must be a module-level function; its arguments and result must pickle.
    """
    from .proxy import WorkerRunner, engine_of

    runner = WorkerRunner(engine_of(fn), timeout=timeout)
    try:
        return runner.call(fn, args, kwargs, env=dict(env or {}))
    finally:
        runner.close()
