"""What the machine and the model decide for the settings a user left unset: asked of the backend once.

A setting declared with a ``plain`` value (``setting(None, plain=False)``)
may be left unset (``None``).  Before a run, a matrix cell or a job touches an
engine, :func:`resolve` asks the run's backend what this machine (and this
model) needs for each unset setting (:meth:`specview.core.registry.Backend.decide`);
what the backend decides is applied with its reason, and what it leaves
undecided takes its plain value.  Today's decisions:

* ``no_repack``: on where a multi-token decode of repacked weights crashed this
  llama.cpp build on this CPU (the AMX probe);
* ``target``: the demo quantization that can fork on this build, when the user
  named no target (asked for with ``default_target=True``).

The reasons travel with the resolved config (:class:`Resolved`) into the
trace's ``config.decided`` block, never on the settings dataclasses: a
config read back from a trace carries the values, and an explicit value always
wins over a decision.  Resolving a resolved config changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from .config import EngineSettings, RunConfig, fill_plain, get_setting, unset, with_setting
from .models.record import record_models

#: the trace's ``config`` key that holds the decisions
DECIDED_KEY = "decided"


@dataclass(frozen=True)
class Decision:
    """One setting the machine or the model decided, with the one line that says why."""

    setting: str
    value: Any
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "why": self.why}


@dataclass(frozen=True)
class Resolved:
    """A run's config with every unset setting decided, and the decisions that were not llama.cpp's plain ones."""

    config: RunConfig
    decisions: tuple[Decision, ...] = ()

    def why(self, setting: str) -> str:
        """The reason a setting has its value ("" where the user, or the plain default, set it)."""
        return next((d.why for d in self.decisions if d.setting == setting), "")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The trace's ``config.decided`` block: {setting: {"value": ..., "why": ...}}."""
        return {d.setting: d.to_dict() for d in self.decisions}

    def record(self, trace: Any) -> Any:
        """``trace`` (or None) with these decisions in its ``config.decided`` block, beside any it has, and its
        models' names with the files they resolved to in ``config.models``."""
        if trace is not None and self.decisions:
            trace.config[DECIDED_KEY] = {**(trace.config.get(DECIDED_KEY) or {}), **self.to_dict()}
        return record_models(trace)


def _backend(name: str) -> Any:
    from .registry import get_backend

    return get_backend(name)


def resolve(cfg: RunConfig | Resolved, *, default_target: bool = False, measure: bool = True,
            progress: Callable[[str], None] | None = None) -> Resolved:
    """``cfg`` with what its backend decides for the settings it leaves unset (see the module docstring).

    ``default_target``: the user named no target, so the backend may pick the
    demo quantization that can fork here; ``measure=False`` takes only what is
    already known (cached probes), for a front end that must not wait.
    """
    decisions: list[Decision] = []
    if isinstance(cfg, Resolved):  # decided already, in part (a matrix decides its axes once): decide the rest
        if not (unset(cfg.config.engine) or unset(cfg.config)):
            return cfg
        decisions, cfg = list(cfg.decisions), cfg.config
    be = _backend(cfg.backend)
    if unset(cfg.engine) or unset(cfg):
        for d in be.decide(cfg, measure=measure):
            if get_setting(cfg, d.setting) is None:
                cfg = with_setting(cfg, d.setting, d.value)
                decisions.append(d)
    cfg = replace(cfg, engine=fill_plain(cfg.engine))
    if default_target:  # on the engine settings the run will have
        d = be.default_target(cfg.engine, default=cfg.target, progress=progress, measure=measure)
        if d is not None:
            decisions.append(d)
            cfg = replace(cfg, target=d.value)
    return Resolved(cfg, tuple(decisions))


def resolve_engine(settings: EngineSettings, *, backend: str, measure: bool = True) -> tuple[EngineSettings,
                                                                                              tuple[Decision, ...]]:
    """Engine settings alone (a job's: the kernel map, locate, the backend check) resolved for ``backend``."""
    if not unset(settings):
        return settings, ()
    decisions = [d for d in _backend(backend).decide_engine(settings, measure=measure)
                 if getattr(settings, d.setting, None) is None]
    out = replace(settings, **{d.setting: d.value for d in decisions})
    return fill_plain(out), tuple(decisions)


def as_decided(settings: EngineSettings, *, backend: str) -> EngineSettings:
    """``settings`` as a run of ``backend`` here would have them, from what is already known (no probe runs):
    for comparing a query with recorded (resolved) settings; an engine not available here gives plain values."""
    from .errors import SpecviewError

    try:
        return resolve_engine(settings, backend=backend, measure=False)[0]
    except SpecviewError:
        return fill_plain(settings)


def resolve_settings(value: Any, *, backend: str) -> Any:
    """A job's ``settings=`` argument resolved: one EngineSettings, a sequence of them, or anything else as is."""
    if isinstance(value, EngineSettings):
        return _resolved_or_plain(value, backend)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, EngineSettings) for v in value):
        return type(value)(_resolved_or_plain(v, backend) for v in value)
    return value


def _resolved_or_plain(settings: EngineSettings, backend: str) -> EngineSettings:
    from .errors import BackendUnavailable

    try:
        return resolve_engine(settings, backend=backend)[0]
    except BackendUnavailable:  # an engine the registry does not know (a test's own session): nothing decides
        return fill_plain(settings)


def decided(config: dict[str, Any] | None, setting: str) -> str:
    """The reason a trace's ``config`` block gives for ``setting``'s value ("" when none).

    Reads ``config.decided`` and, for traces written before it existed, the
    engine block's old ``no_repack_reason``.
    """
    config = config if isinstance(config, dict) else {}
    block = config.get(DECIDED_KEY)
    if isinstance(block, dict) and isinstance(block.get(setting), dict):
        return str(block[setting].get("why") or "")
    eng = config.get("engine") if isinstance(config.get("engine"), dict) else {}
    if setting == "no_repack" and eng.get("no_repack") is True:
        return str(eng.get("no_repack_reason") or "")
    return ""
