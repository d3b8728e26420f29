"""The one door through which a test or a benchmark loads a llama.cpp model or opens a context.

Every model a test loads takes this machine's decisions from the same resolution
a run takes (:meth:`specview.core.registry.Runner.resolve_settings`): no repack
where the crash probe crashed (the AMX bug), or where ``$SPECVIEW_REPACK_PROBE``
plants that crash.  A test that built a ``llama_cpp.Llama``, a ``LlamaModel``, a
context or a ``llama_model_load_*`` call of its own would load repacked weights
on a CPU whose repacked kernels crash, and take its pytest lane down there;
``tests/contracts/test_door.py`` refuses any such construction outside this file.

Benchmarks import it too (``bench/`` puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specview.core.config import EngineSettings
from specview.core.registry import Runner

BACKEND = "llama.cpp"


def settings(base: EngineSettings | None = None, *, backend: str = BACKEND, target: str | os.PathLike[str] | None = None,
             **changes: Any) -> Any:
    """Engine settings decided for this machine (a :class:`~specview.core.resolve.DecidedSettings`): ``base`` (or
    the defaults) with ``changes``, every setting they leave unset decided as a run's would be."""
    from dataclasses import replace

    s = replace(base or EngineSettings(), **changes) if changes else (base or EngineSettings())
    return Runner.resolve_settings(s, backend=backend, target=str(target) if target is not None else None)[0]


def no_repack() -> bool:
    """Whether this machine loads llama.cpp weights without repacking (what a run here decides)."""
    return bool(settings().no_repack)


def model(path: str | os.PathLike[str], *, gpu_layers: int = -1, vocab_only: bool = False,
          decided: Any = None) -> Any:
    """specview's :class:`~specview.backends.llama_cpp.model.LlamaModel` of ``path``, loaded as a run here loads it
    (``decided``: the settings to take ``no_repack`` from; this machine's by default)."""
    from specview.backends.llama_cpp.model import LlamaModel

    if vocab_only:
        return LlamaModel(path, vocab_only=True)
    nr = (decided if decided is not None else settings()).no_repack
    return LlamaModel(path, gpu_layers=gpu_layers, no_repack=bool(nr))


def context(m: Any, decided: Any = None, *, n_ctx: int | None = None, observed: bool = False,
            selection: str = "all", **changes: Any) -> Any:
    """A llama.cpp context on the loaded model ``m``: ``decided`` settings, or this machine's with ``changes``
    (``threads=1``, ``n_ubatch=4`` ...).  ``observed``: one whose passes ``specview locate`` can observe."""
    s = decided if decided is not None else settings(**changes)
    if observed:
        from specview.backends.llama_cpp.graph import ObservedEngine

        return ObservedEngine(m, s, n_ctx=n_ctx, selection=selection)
    from specview.backends.llama_cpp.engine import LlamaEngine

    return LlamaEngine(m, s, n_ctx=n_ctx)


def c_model_params(ll: Any) -> Any:
    """``llama_model_default_params()`` as this machine loads weights: repacking off where a run turns it off.
    For a test's own C-API reference, which shares nothing else with specview."""
    mp = ll.llama_model_default_params()
    mp.use_extra_bufts = not no_repack()
    return mp


def c_load(ll: Any, path: str | Path, params: Any = None) -> Any:
    """``llama_model_load_from_file`` of ``path`` with :func:`c_model_params` (or ``params``, which must come from
    :func:`c_model_params`)."""
    return ll.llama_model_load_from_file(str(path).encode(), params if params is not None else c_model_params(ll))


def c_context(ll: Any, c_model: Any, params: Any) -> Any:
    """``llama_init_from_model``: a context of the test's own on a model :func:`c_load` loaded."""
    return ll.llama_init_from_model(c_model, params)
