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
    from specview.backends.llama_cpp.model import LlamaModel, vocab_model

    if vocab_only:  # the vocabulary and metadata alone: no weights, so nothing to repack and nothing to decode
        return vocab_model(path)
    nr = (decided if decided is not None else settings()).no_repack
    return LlamaModel(path, gpu_layers=gpu_layers, no_repack=bool(nr))


def store() -> Any:
    """specview's :class:`~specview.backends.llama_cpp.model.ModelStore`, whose ``get`` loads with this machine's
    ``no_repack`` unless the caller names one."""
    import functools

    from specview.backends.llama_cpp.model import ModelStore

    s = ModelStore()
    s.get = functools.partial(s.get, no_repack=no_repack())  # type: ignore[method-assign]
    return s


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


def llama(path: str | os.PathLike[str], **kwargs: Any) -> Any:
    """llama-cpp-python's own ``llama_cpp.Llama`` of ``path`` (``kwargs`` as it takes them), its weights loaded as
    this machine loads them: ``Llama`` has no repack option, so while it loads, the model parameters its constructor
    starts from (``llama_cpp.llama_cpp.llama_model_default_params``) have repacking off where a run here turns it
    off, as :func:`c_model_params` does.  For a benchmark's baseline, which must run the kernels specview runs."""
    import llama_cpp
    from llama_cpp import llama_cpp as c

    nr = no_repack()
    plain = c.llama_model_default_params

    def params() -> Any:
        mp = plain()
        mp.use_extra_bufts = not nr
        return mp

    c.llama_model_default_params = params
    try:
        ref = llama_cpp.Llama(str(path), **kwargs)
    finally:
        c.llama_model_default_params = plain
    if bool(ref.model_params.use_extra_bufts) == nr:  # a llama-cpp-python that reads its params elsewhere
        raise RuntimeError(f"llama_cpp.Llama({Path(path).name}) did not take this machine's no_repack")
    return ref


def server_flags(decided: Any = None) -> list[str]:
    """llama-server's flags for this machine's load decisions, for a test that starts one on its own command line:
    ``--no-repack`` where a run here turns repacking off (``decided``: the settings to take it from), as
    :func:`specview.core.llama_flags.engine_flags` gives a run's server."""
    return ["--no-repack"] if (decided if decided is not None else settings()).no_repack else []


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
