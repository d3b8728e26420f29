"""A llama.cpp engine that dies on purpose, for the worker-process tests.

It is registered by dotted path (``register_backend("planted-llama",
"plants_worker:PlantedLlama")``), so it runs in a real worker process exactly as
the real engine does.  ``SPECVIEW_PLANT=KIND:AFTER:WIDTH`` (read in the worker)
makes the forward pass of at least WIDTH tokens that follows AFTER such passes die (the passes of every
engine in the worker count: the target's, the drafter's, both arms'):

* ``segv``  a read of address 0 through ctypes (a real segmentation fault),
* ``abort`` ``os.abort()`` (what a failed GGML_ASSERT does),
* ``exit``  ``os._exit(3)`` (a library that exits the process),
* ``hang``  a pass that never returns,
* ``slow``  a pass that takes 50 ms more (the worker still streams what it computes).

With ``SPECVIEW_PLANT_GATE=PATH`` only the passes made while the file PATH exists count: a test makes the runs
it needs whole, then creates the file, and the plant strikes that many passes into the next run, on any CPU.

It also holds module-level functions the tests send to a worker as a job or
a probe: being in the planted engine's module, a probe's death is read with
that engine's known causes (llama.cpp's, which it inherits).
"""

from __future__ import annotations

import ctypes
import os
import time

from specview.backends.llama_cpp import LlamaBackend
from specview.backends.llama_cpp.backend import LlamaLoaded
from specview.backends.llama_cpp.engine import LlamaEngine

NAME = "planted-llama"
PATH = "plants_worker:PlantedLlama"


def _plant() -> tuple[str, int, int] | None:
    raw = os.environ.get("SPECVIEW_PLANT", "")
    if not raw:
        return None
    kind, after, width = raw.split(":")
    return kind, int(after), int(width)


class PlantedEngine(LlamaEngine):
    passes = 0  # forward passes of the planted width, of every planted engine in this process

    def eval(self, tokens, rows):
        plant = _plant()
        if plant is not None:
            kind, after, width = plant
            gate = os.environ.get("SPECVIEW_PLANT_GATE")
            if len(tokens) >= width and (not gate or os.path.exists(gate)):
                PlantedEngine.passes += 1
            if PlantedEngine.passes > after and len(tokens) >= width:
                from specview.core import activity

                activity.doing(f"a {len(tokens)}-token pass at position {self.n_past} of {self.model.path.name}")
                if kind == "segv":
                    ctypes.string_at(0)
                elif kind == "abort":
                    os.abort()
                elif kind == "exit":
                    os._exit(3)
                elif kind == "hang":
                    time.sleep(3600)
                elif kind == "slow":
                    time.sleep(0.05)
        return super().eval(tokens, rows)


class PlantedLoaded(LlamaLoaded):
    def new_engine(self, settings, n_ctx):
        return PlantedEngine(self.model, settings, n_ctx=n_ctx)


class PlantedLlama(LlamaBackend):
    name = NAME
    label = "planted llama.cpp"

    def load(self, name, settings):
        return PlantedLoaded(super().load(name, settings).model)


def environ_of(session, name, *, settings=None):
    """A job: the worker's value of the environment variable ``name`` (its environment comes from ``settings``)."""
    return os.environ.get(name)


def environ_of_positional(session, settings, name):
    """The same job, with its settings passed by position: they do not choose the worker's environment."""
    return os.environ.get(name)


def probe_crash():
    """A probe of this engine's native code that dies by SIGSEGV."""
    ctypes.string_at(0)
