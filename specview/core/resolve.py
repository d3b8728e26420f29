"""What the machine and the model decide for the settings a user left unset: asked of the backend once.

A setting declared with a ``plain`` value (``setting(None, plain=False)``)
may be left unset (``None``).  Before a run, a matrix cell or a job touches an
engine, the runner (:meth:`specview.core.registry.Runner.resolve`, the one
caller of this module's :func:`resolve`) asks the run's backend, once, what this
machine (and this model) needs for each unset setting
(:meth:`specview.core.registry.Backend.decide`); what the backend decides is
applied with its reason, and what it leaves undecided takes its plain value.
Today's decisions:

* ``no_repack``: on where a multi-token decode of repacked weights crashed this
  llama.cpp build on this CPU (the AMX probe);
* ``rollback``: how a hybrid or recurrent target's memory drops a rejected
  draft, as llama-server does for its architecture and spec type;
* ``target``: the demo quantization that can fork on this build, when the user
  named no target (asked for with ``default_target=True``).

"Resolved" is a type, not a convention: :class:`DecidedSettings` are engine
settings with no setting left unset, made only here, and the only settings
``Backend.load``, ``LoadedModel.new_engine`` and a Session accept; a
:class:`Resolved` is a run's config whose engine settings are decided.  The
reasons travel with it into the trace's ``config.decided`` block, never on the
settings dataclasses: a config read back from a trace carries the values, and
an explicit value always wins over a decision.  Resolving a resolved config
changes nothing.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, replace
from typing import Any, Callable, Sequence

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

    def __post_init__(self) -> None:
        if not (isinstance(self.why, str) and self.why.strip()):
            raise ValueError(f"a decision of {self.setting} = {self.value!r} needs its one line of why: a value kept "
                             "as given is no decision")

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "why": self.why}


@dataclass(frozen=True, eq=False)
class DecidedSettings(EngineSettings):
    """Engine settings with every setting decided: what a load, a context and a Session accept.

    Made by :func:`settle` (from :func:`resolve` and :func:`resolve_engine`); a setting left unset
    cannot be in one.  It compares and hashes as the same values in an :class:`EngineSettings` do.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        left = unset(self)
        if left:
            raise TypeError(f"settings with {', '.join(left)} unset are not decided: resolve them first "
                            "(Runner.resolve)")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EngineSettings):
            return astuple(self) == astuple(other)
        return NotImplemented

    __hash__ = EngineSettings.__hash__


def _settle(settings: EngineSettings) -> DecidedSettings:
    """``settings`` as :class:`DecidedSettings`, every setting still unset at its plain value."""
    if isinstance(settings, DecidedSettings):
        return settings
    plain = fill_plain(settings)
    return DecidedSettings(**{k: getattr(plain, k) for k in plain.__dataclass_fields__})


def require_decided(settings: Any, what: str) -> DecidedSettings:
    """``settings`` if they are decided; a TypeError naming ``what`` if not (an undecided setting never loads)."""
    if not isinstance(settings, DecidedSettings):
        raise TypeError(f"{what} takes DecidedSettings (engine settings after Runner.resolve), "
                        f"not {type(settings).__name__}")
    return settings


@dataclass(frozen=True)
class Resolved:
    """A run's config with every unset setting decided, and the decisions that were not llama.cpp's plain ones."""

    config: RunConfig
    decisions: tuple[Decision, ...] = ()

    def __post_init__(self) -> None:
        require_decided(self.config.engine, "Resolved")

    @property
    def settings(self) -> DecidedSettings:
        """The run's engine settings, decided."""
        return self.config.engine  # type: ignore[return-value]

    def why(self, setting: str) -> str:
        """The reason a setting has its value ("" where the user, or the plain default, set it)."""
        return next((d.why for d in self.decisions if d.setting == setting), "")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The trace's ``config.decided`` block: {setting: {"value": ..., "why": ...}}."""
        return {d.setting: d.to_dict() for d in self.decisions}

    def record(self, trace: Any) -> Any:
        """``trace`` (or None) with these decisions in its ``config.decided`` block (:func:`record_decisions`)."""
        return record_decisions(trace, self.decisions)


def record_decisions(trace: Any, decisions: Sequence[Decision]) -> Any:
    """``trace`` (or None) with ``decisions`` in its ``config.decided`` block, beside any it has, and its models'
    names with the files they resolved to in ``config.models``."""
    if trace is not None and decisions:
        trace.config[DECIDED_KEY] = {**(trace.config.get(DECIDED_KEY) or {}), **{d.setting: d.to_dict()
                                                                                 for d in decisions}}
    return record_models(trace)


def resolve(cfg: RunConfig | Resolved, backend: Any, *, default_target: bool = False, measure: bool = True,
            progress: Callable[[str], None] | None = None) -> Resolved:
    """``cfg`` with what ``backend`` decides for the settings it leaves unset (see the module docstring).

    ``default_target``: the user named no target, so the backend may pick the
    demo quantization that can fork here; ``measure=False`` takes only what is
    already known (cached probes), for a front end that must not wait.  The
    backend's one :meth:`~specview.core.registry.Backend.decide` makes every decision.
    """
    decisions: list[Decision] = []
    if isinstance(cfg, Resolved):  # decided already, in part (a matrix decides its axes once): decide the rest
        if not (unset(cfg.config.engine) or unset(cfg.config) or default_target):
            return cfg
        decisions, cfg = list(cfg.decisions), cfg.config
    elif not isinstance(cfg.engine, DecidedSettings):
        cfg = replace(cfg, engine=_asking(cfg.engine))
    if unset(cfg.engine) or unset(cfg) or default_target:
        for d in backend.decide(cfg, measure=measure, default_target=default_target, progress=progress):
            if d.setting == "target":
                cfg = replace(cfg, target=d.value)
                decisions.append(d)
            elif get_setting(cfg, d.setting) is None:
                cfg = with_setting(cfg, d.setting, d.value)
                decisions.append(d)
    return Resolved(replace(cfg, engine=_settle(cfg.engine)), tuple(decisions))


def resolve_engine(settings: EngineSettings, backend: Any, *, target: str | None = None,
                   measure: bool = True) -> tuple[DecidedSettings, tuple[Decision, ...]]:
    """Engine settings alone (a job's: the kernel map, locate, the backend check) resolved for ``backend``, by the
    same :meth:`~specview.core.registry.Backend.decide` as a run's (with the job's ``target`` where it has one, so
    a decision that reads the model, the rollback, is made for it too)."""
    if isinstance(settings, DecidedSettings):
        return settings, ()
    settings = _asking(settings)
    if not unset(settings):
        return _settle(settings), ()
    cfg = RunConfig(backend=backend.name or RunConfig.backend, target=target or RunConfig.target, spec_type="none",
                    prompt="", prompt_tokens=(0,), engine=settings)  # a job: no run, only its settings and model
    decisions = tuple(d for d in backend.decide(cfg, measure=measure)
                      if d.setting != "target" and getattr(settings, d.setting, None) is None)
    return _settle(replace(settings, **{d.setting: d.value for d in decisions})), decisions


def _asking(settings: EngineSettings) -> EngineSettings:
    """``settings`` with a value that asks for the decision (``--rollback auto``: what llama-server does) unset, so
    that the backend decides it, with its reason, as it does a setting nobody gave."""
    if settings.rollback == AUTO_WORD:
        return replace(settings, rollback=None)
    return settings


#: the word a user gives a setting for "what the machine and the model decide"
AUTO_WORD = "auto"


class NothingDecides:
    """The backend of an engine the registry does not know (a test's own Session): it decides nothing, so every
    unset setting takes its plain value."""

    name = ""

    def decide(self, cfg: RunConfig, **kw: Any) -> list[Decision]:
        return []


def resolve_settings(value: Any, backend: Any, *, target: str | None = None) -> Any:
    """A job's ``settings=`` argument resolved: one EngineSettings, a sequence of them, or anything else as is."""
    if isinstance(value, EngineSettings):
        return resolve_engine(value, backend, target=target)[0]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, EngineSettings) for v in value):
        return type(value)(resolve_engine(v, backend, target=target)[0] for v in value)
    return value


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
