"""The process boundary: every in-process engine's Session runs in a worker process of its own.

``proxy`` is the parent's Runner, ``child`` the worker's loop, ``wire`` what
crosses the pipe, ``death`` the account of a worker that died, ``native`` the
dying worker's own account of its native frames.  The registry decides where a
runner lives (:func:`specview.core.registry.runner_for`); nothing above it
knows a process is there.
"""

from __future__ import annotations

from typing import Any, Callable

from .proxy import CRASHED, WorkerRunner, live_workers, worker_timeout

__all__ = ["CRASHED", "WorkerRunner", "live_workers", "run_isolated", "worker_timeout"]


def run_isolated(fn: Callable[..., Any], *args: Any, timeout: float | None = None, env: dict[str, str] | None = None,
                 **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a fresh worker process that is stopped afterwards.

    For probes of native code that may crash (the AMX probe): the result comes
    back, or :class:`~specview.core.errors.EngineCrashed` says how the worker died.
    ``fn`` must be a module-level function; its arguments and result must pickle.
    """
    env = dict(env or {})
    runner = WorkerRunner(None, timeout=timeout, env_for=lambda _s: env)
    try:
        # any settings value makes the runner ask env_for, which gives ``env`` whatever it is handed
        return runner._call("call", (fn.__module__, fn.__qualname__, *args), kwargs, during=f"running {fn.__name__}",
                            settings=env)
    finally:
        runner.close()

