"""In-process engines (llama.cpp, MLX), and the one place that decides where their runner lives.

An in-process engine's models load into a :class:`~specview.core.session.Session`.
That Session runs in a worker process of its own (:mod:`specview.core.worker`)
whenever the engine can be made there, that is, when it is known by dotted
path (built-in engines, plug-ins, ``register_backend(name, "module:Class")``),
so a native crash in llama.cpp or a GPU driver costs the worker, never the CLI
or the app.  ``SPECVIEW_WORKER=0`` keeps it in this process (to put a debugger
on the engine); an engine registered with a Python callable, which no other
process can call, runs in this one too.
"""

from __future__ import annotations

import os

from .registry import BUILTIN_BACKENDS, Backend, ProgressFn, Runner, dotted_paths
from .session import Session


def worker_enabled() -> bool:
    """False when ``SPECVIEW_WORKER`` is 0 / no / off / false."""
    return os.environ.get("SPECVIEW_WORKER", "1").strip().lower() not in ("0", "no", "off", "false")


class InProcessBackend(Backend):
    """A backend whose models load into a Session: in a worker process, or here (see the module docstring)."""

    def runner(self, *, progress: ProgressFn | None = None) -> Runner:
        paths = dotted_paths()
        if not worker_enabled() or self.name not in paths:
            return Session(progress=progress)
        from .worker import WorkerRunner

        regs = {n: p for n, p in paths.items() if BUILTIN_BACKENDS.get(n) != p}
        return WorkerRunner(self.name, progress=progress, registrations=regs, env_for=self.worker_env)
