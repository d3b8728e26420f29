"""Backends by name.  Built-in engines, plug-ins and test fakes register through the same door.

The registry knows names and an interface, nothing else: it imports no backend.
Built-in backends are listed by dotted path in :data:`BUILTIN_BACKENDS` and
imported only when asked for; third-party ones come from the entry-point group
``specview.backends`` (``name = "package.module:BackendClass"``); tests call
:func:`register_backend` with a factory, exactly as a plug-in's module would.

A backend answers two questions:

* **in-process engines** (llama.cpp, MLX): :meth:`Backend.resolve` turns a
  model name into something :meth:`Backend.load` accepts, and a loaded model
  opens engines (contexts) on its shared weights.  Their runner is the
  :class:`~specview.core.session.Session`.
* **every engine**: :meth:`Backend.runner` returns the :class:`Runner` that
  the CLI, the matrix and the app drive: ``run(cfg)`` gives a trace,
  ``diagnose(trace)`` explains a fork.  An engine that is a separate process
  (llama-server) implements only this part.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable

from .config import LLAMA_SPEC_TYPES, SPEC_TYPES_IN_PROCESS, EngineSettings, RunConfig
from .engine import LoadedModel
from .errors import BackendUnavailable, ConfigError
from .facts import Fact

if TYPE_CHECKING:
    from .resolve import DecidedSettings, Decision, Resolved
    from .trace import Trace

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]
EventFn = Callable[[str, Any], None]  # (arm name, Step or Round)

#: the engines specview ships, by dotted path; none is imported until it is used
BUILTIN_BACKENDS: dict[str, str] = {
    "llama.cpp": "specview.backends.llama_cpp:LlamaBackend",
    "mlx": "specview.backends.mlx:MLXBackend",
    "llama-server": "specview.backends.llama_server:ServerBackend",
    "mlx-server": "specview.backends.mlx_server:MLXServerBackend",
}
ENTRY_POINT_GROUP = "specview.backends"


class Runner(ABC):
    """What the CLI, the matrix and the app drive: runs and diagnoses on one engine.

    A runner belongs to one thread (llama.cpp contexts and MLX streams must not
    cross threads) and keeps what it can reuse between runs: loaded models,
    cached vanilla arms, running servers.  ``loads`` counts real model loads
    (or server starts), so a caller can show and test reuse.

    This base is the one door to what the machine decides (:mod:`specview.core.resolve`):
    :meth:`run` and :meth:`job` resolve what they are given exactly once, then hand an engine
    only decided settings (:meth:`run_resolved`, :meth:`run_job`), and a front end that must show
    a decision before it runs asks :meth:`resolve`.
    """

    loads: int = 0
    vanilla_runs: int = 0
    speculative_runs: int = 0

    # -- what the machine decides, asked here alone -------------------------------------------------
    @staticmethod
    def resolve(cfg: "RunConfig | Resolved", *, default_target: bool = False, measure: bool = True,
                progress: ProgressFn | None = None) -> "Resolved":
        """``cfg`` with what its backend's one ``decide`` says for the settings it leaves unset, with why.

        ``default_target``: the user named no target (the demo pick may run); ``measure=False``: only what
        is known already (a cached probe), for a front end that must not wait.
        """
        from .resolve import Resolved, resolve

        name = cfg.config.backend if isinstance(cfg, Resolved) else cfg.backend
        return resolve(cfg, get_backend(name), default_target=default_target, measure=measure, progress=progress)

    @staticmethod
    def resolve_settings(settings: EngineSettings, *, backend: str, target: str | None = None,
                         measure: bool = True) -> "tuple[DecidedSettings, tuple[Decision, ...]]":
        """Engine settings alone (a job's, a matrix's free axes) decided for ``backend`` (and ``target``)."""
        from .resolve import resolve_engine

        return resolve_engine(settings, _deciding(backend), target=target, measure=measure)

    @staticmethod
    def as_decided(settings: EngineSettings, *, backend: str) -> EngineSettings:
        """``settings`` as a run of ``backend`` here would have them, from what is already known (no probe runs):
        for comparing a query with recorded (resolved) settings; an engine not available here gives plain values."""
        from .config import fill_plain
        from .errors import SpecviewError

        try:
            return Runner.resolve_settings(settings, backend=backend, measure=False)[0]
        except SpecviewError:
            return fill_plain(settings)

    # -- runs ----------------------------------------------------------------------------------------
    def run(self, cfg: "RunConfig | Resolved", *, on_event: EventFn | None = None, cancel: CancelFn | None = None,
            reuse_vanilla: bool = True, **kw: Any) -> "Trace":
        """Run (or reuse) the vanilla arm and run the speculative arm; return the trace.  ``cfg`` is resolved
        here, once; the trace's ``config.decided`` says why each decided setting has its value."""
        resolved = self.resolve(cfg)
        return resolved.record(self.run_resolved(resolved, on_event=on_event, cancel=cancel,
                                                 reuse_vanilla=reuse_vanilla, **kw))

    def run_resolved(self, resolved: "Resolved", *, on_event: EventFn | None = None, cancel: CancelFn | None = None,
                     reuse_vanilla: bool = True, **kw: Any) -> "Trace":
        """:meth:`run` on a config already resolved: what each engine's runner implements."""
        raise NotImplementedError(f"{type(self).__name__} runs nothing")

    @abstractmethod
    def diagnose(self, trace: "Trace", cfg: RunConfig, *, controls: bool = False,
                 progress: ProgressFn | None = None, cancel: CancelFn | None = None) -> dict[str, Any]:
        """Explain the trace's fork (or confirm it has none); the result goes into ``trace.diagnosis``."""

    def preload(self, cfg: RunConfig) -> None:
        """Load the models of ``cfg`` now (an engine that loads them when it starts does nothing)."""

    def job(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(session, *args, **kwargs)`` where this engine's models live: the kernel map, the backend
        check, the prescription.  ``fn`` is a module-level function; keyword arguments that are callables
        (``progress=``, ``on_pass=`` ...) are called back here, ``cancel=`` is polled.  A ``settings=``
        argument (one EngineSettings or a list) is resolved here, once, for ``backend=`` (and ``target=``,
        where the job names one).  Only in-process engines have a Session to give it."""
        if "settings" in kwargs and kwargs.get("backend"):
            from .resolve import resolve_settings

            target = kwargs.get("target") if isinstance(kwargs.get("target"), str) else None
            kwargs["settings"] = resolve_settings(kwargs["settings"], _deciding(kwargs["backend"]), target=target)
        return self.run_job(fn, args, kwargs)

    def run_job(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """:meth:`job` with its settings resolved: what a runner with a Session implements."""
        raise BackendUnavailable(f"{getattr(fn, '__name__', 'this')} needs an engine whose forward passes specview "
                                 "runs itself (llama.cpp, mlx)")

    def close(self) -> None:
        """Free models, contexts and processes."""

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _deciding(name: str) -> Any:
    """The backend that decides for ``name``: the registry's, or one that decides nothing for an engine the registry
    does not know (a test's own Session)."""
    from .resolve import NothingDecides

    try:
        return get_backend(name)
    except BackendUnavailable:
        return NothingDecides()


class Backend(ABC):
    """One engine: its name, what it can run, and the runner that runs it."""

    #: the name users type (``--engine``) and traces record
    name: str = "abstract"
    #: the app's label for it
    label: str = ""
    #: what a model is for this engine: "gguf" (a file) or "folder" (an MLX model folder)
    model_kind: str = "gguf"
    #: the app needs a binary and extra flags for it (the settings declared ``only_for`` this engine)
    in_process: bool = True

    # -- what it can run ---------------------------------------------------------------
    def spec_types(self, settings: EngineSettings | None = None) -> list[str]:
        """The ``--spec-type`` values this engine runs (a server asks its binary)."""
        return list(SPEC_TYPES_IN_PROCESS)

    def check(self, cfg: RunConfig) -> None:
        """Refuse a config this engine cannot run, saying what to do instead."""
        types = self.spec_types(cfg.engine)
        if cfg.spec_type not in types:
            hint = (f"; {cfg.spec_type} runs inside llama-server: add --engine llama-server"
                    if self.in_process and cfg.spec_type in LLAMA_SPEC_TYPES and self.name == "llama.cpp" else "")
            raise ConfigError(
                f"spec_type must be one of {', '.join(types)} with the {self.name} engine (got {cfg.spec_type!r})"
                + hint, setting="spec_type")

    # -- in-process engines --------------------------------------------------------------
    def resolve(self, name: str, *, progress: ProgressFn | None = None) -> str:
        """Turn a user-given model name into something :meth:`load` accepts."""
        return name

    def load(self, name: str, settings: "DecidedSettings") -> LoadedModel:
        """Load ``name`` on decided settings (an EngineSettings with a setting left unset never gets here)."""
        raise BackendUnavailable(f"the {self.name} engine does not load models in-process")

    def model_key(self, name: str, settings: EngineSettings) -> tuple:
        """Two names with the same key share one loaded model."""
        return (name, settings.gpu_layers)

    # -- what this machine decides (Runner.resolve asks, once per run, cell or job) -------------------
    def decide(self, cfg: RunConfig, *, measure: bool = True, default_target: bool = False,
               progress: ProgressFn | None = None) -> "list[Decision]":
        """Every decision for the settings ``cfg`` leaves unset, on this machine and for this run's models, each
        with its reason: the one place an engine decides (no repack, rollback, the demo pick ...).

        ``measure=False``: only what is known without running anything new (a cached probe).
        ``default_target``: the user named no target, so a ``target`` decision may pick one.
        None by default.
        """
        return []

    # -- what the front ends ask of a model (they import no backend) ---------------------------
    def has_mtp_heads(self, target: str) -> bool:
        """Whether ``target`` carries multi-token-prediction heads (``draft-mtp`` can draft from it)."""
        return False

    def demo_models(self, *, derive: list[str] | None = None, progress: ProgressFn | None = None
                    ) -> tuple[str, list[dict[str, Any]]]:
        """(the demo cache folder, one row per demo name) after deriving the quantizations in ``derive``."""
        raise BackendUnavailable(f"the {self.name} engine has no demo models of its own")

    def model_variants(self, path: str) -> tuple[list[Any], list[Any]]:
        """(the precisions of this model the user has, those it can derive): for the app's quantization flip."""
        return [], []

    def derive_variant(self, source: str, quant: str, *, dest: str | None = None,
                       progress: ProgressFn | None = None) -> str:
        """Write the ``quant`` copy of ``source`` (to ``dest`` where the model kind takes one); return its path."""
        raise BackendUnavailable(f"the {self.name} engine derives no quantizations")

    def environment(self) -> dict[str, Any]:
        """Versions and devices, merged into every trace's ``environment`` block."""
        return {}

    def worker_env(self, settings: EngineSettings) -> dict[str, str]:
        """Environment variables the engine's worker process must have before the engine's library loads
        (knobs ggml reads once at start-up); a change starts a new worker."""
        return {}

    def death_causes(self, settings: EngineSettings | None) -> Any:
        """What this engine knows of how its worker dies, for the account of a dead one: a
        :class:`specview.core.worker.death.DeathCauses` (its known causes, and the settings they read), or None
        (only the causes every engine shares: the OOM killer)."""
        return None

    def setup_facts(self, settings: EngineSettings, *, deep: bool = True) -> list[Fact]:
        """What ``specview doctor`` says of this engine: a list of :class:`specview.core.facts.Fact`.

        ``deep`` allows slower checks (loading a small model).  The default
        reports the engine usable, with its :meth:`environment`.
        """
        env = self.environment()
        return [Fact(self.name, "usable", True, f"{self.label or self.name}: usable", "ok", extra=env)]

    # -- every engine ----------------------------------------------------------------------
    @abstractmethod
    def runner(self, *, progress: ProgressFn | None = None) -> Runner:
        """A runner for this engine (in-process engines subclass
        :class:`~specview.core.session.InProcessBackend`, whose runner is a Session)."""


_FACTORIES: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}
_PATHS: dict[str, str] = {}  # engines known by dotted path: another process can make them too
_discovered = False


def register_backend(name: str, factory: Callable[[], Backend] | str) -> None:
    """Make ``name`` an engine.  ``factory`` is a callable, or a dotted ``"module:Class"`` imported on first use.

    An in-process engine registered by dotted path runs in a worker process
    (:class:`specview.core.inprocess.InProcessBackend`); one registered with a
    Python callable, which no other process can call, runs in this one.
    """
    _PATHS.pop(name, None)
    if isinstance(factory, str):
        _PATHS[name] = factory
        factory = _by_path(factory)
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def unregister_backend(name: str) -> None:
    _FACTORIES.pop(name, None)
    _INSTANCES.pop(name, None)
    _PATHS.pop(name, None)


def dotted_paths() -> dict[str, str]:
    """Engines known by dotted path (built-in, plug-ins, and ``register_backend(name, "module:Class")``):
    another process can make each of them too."""
    _discover()
    return dict(_PATHS)


def _by_path(path: str) -> Callable[[], Backend]:
    def factory() -> Backend:
        module, _, attr = path.partition(":")
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise BackendUnavailable(f"the engine module {module} cannot be imported ({exc})") from exc
        return getattr(mod, attr)()

    factory.__qualname__ = f"load {path}"
    return factory


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for name, path in BUILTIN_BACKENDS.items():
        if name not in _FACTORIES:
            _FACTORIES[name] = _by_path(path)
            _PATHS[name] = path
    try:
        from importlib.metadata import entry_points

        eps = entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken distribution's metadata must not take the built-in engines down
        eps = ()
    for ep in eps:
        if ep.name not in _FACTORIES:
            _FACTORIES[ep.name] = _by_path(ep.value)
            _PATHS[ep.name] = ep.value


def backend_names() -> list[str]:
    """Every engine name, built-in ones first in their fixed order, then plug-ins and fakes sorted."""
    _discover()
    builtin = [n for n in BUILTIN_BACKENDS if n in _FACTORIES]
    return builtin + sorted(n for n in _FACTORIES if n not in BUILTIN_BACKENDS)


def get_backend(name: str) -> Backend:
    """The backend called ``name``; :class:`BackendUnavailable` if unknown or not installed."""
    _discover()
    if name not in _FACTORIES:
        raise BackendUnavailable(f"unknown engine {name!r}; available: {', '.join(backend_names())}")
    b = _INSTANCES.get(name)
    if b is None:
        b = _FACTORIES[name]()
        _INSTANCES[name] = b
    return b


def backend_for_models(model_kind: str) -> Backend:
    """The first built-in in-process engine whose models are of ``model_kind`` ("gguf" files, MLX "folder"s):
    the one that lists and derives their quantizations."""
    _discover()
    for name in backend_names():
        try:
            be = get_backend(name)
        except BackendUnavailable:
            continue
        if be.in_process and be.model_kind == model_kind:
            return be
    raise BackendUnavailable(f"no engine here reads {model_kind} models")


def backend_problem(name: str) -> str | None:
    """Why the engine cannot be used here, in one line; None when it can."""
    try:
        get_backend(name)
    except BackendUnavailable as exc:
        return str(exc)
    return None
