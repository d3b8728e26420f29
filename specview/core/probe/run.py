"""The whole probe of one target: the in-process half as a job of its engine, the llama-server half on the
registry's llama-server runner; one :class:`~.result.ProbeReport` with every row."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

from ..config import EngineSettings, RunConfig
from ..errors import SpecviewError
from ..registry import Runner, get_backend
from .result import ProbeReport, TriggerResult
from .runner import probe_in_session
from .scenarios import check_triggers
from .server import probe_server

ProgressFn = Callable[[str], None]


def server_rollback(target: str, draft: str | None, settings: EngineSettings) -> str | None:
    """What llama-server does for draft-simple on ``target``: the llama.cpp engine's rollback decision."""
    try:
        cfg = RunConfig(target=target, draft=draft or target, prompt="x", backend="llama.cpp",
                        engine=replace(settings, rollback=None, server_bin="", server_args=""))
        return Runner.resolve(cfg, measure=False).config.engine.rollback
    except SpecviewError:
        return None


def run_probe(target: str, *, backend: str = "llama.cpp", settings: EngineSettings | None = None,
              in_process: bool = True, server: bool = False, triggers: Sequence[str] | None = None,
              prompt: str = "the cat and the dog", n: int = 48, long_n: int = 2048, n_max: int = 3,
              accept_draft: str | None = None, reject_draft: str | None = None, chat: bool = False,
              progress: ProgressFn | None = None, cancel: Callable[[], bool] | None = None,
              on_row: Callable[[TriggerResult], None] | None = None, runner: Any = None) -> ProbeReport:
    """Probe ``target`` in-process (on ``backend``; on ``runner``, that engine's runner, when given) and/or on
    llama-server (``settings.server_bin``)."""
    names = check_triggers(triggers)
    if n < 8 or long_n < n or n_max < 1:
        raise SpecviewError(f"the probe needs n >= 8, long_n >= n and n_max >= 1 (got {n}, {long_n}, {n_max})")
    if not in_process and not server:
        raise SpecviewError("nothing to probe: ask for the in-process engine, llama-server, or both")
    settings = settings or EngineSettings()
    say = progress or (lambda m: None)
    report = ProbeReport(target=target, config={"prompt": prompt, "n": n, "long_n": long_n, "n_max": n_max,
                                                "triggers": list(names)})
    if in_process:
        be = get_backend(backend)
        if not be.in_process:
            raise SpecviewError(f"the {backend} engine runs its own passes: probe it with --server (llama-server), "
                                "and the in-process half with --engine llama.cpp")
        r = runner if runner is not None else be.runner(progress=say)
        try:
            half = r.job(probe_in_session, target=target, settings=settings, backend=backend, triggers=names,
                         prompt=prompt, n=n, long_n=long_n, n_max=n_max, chat=chat, progress=say, cancel=cancel,
                         on_row=on_row)
        finally:
            if runner is None:
                r.close()
        report.extend(half)
        report.config.update({k: v for k, v in half.config.items() if k not in report.config})
    if server:
        sbe = get_backend("llama-server")
        ssettings = replace(settings, rollback=None)
        mode = server_rollback(target, accept_draft, settings)
        with sbe.runner(progress=say) as r:
            half = probe_server(r, target=target, settings=ssettings, triggers=names, prompt=prompt, n=n,
                                long_n=long_n, n_max=n_max, accept_draft=accept_draft, reject_draft=reject_draft,
                                chat=chat, rollback=mode, progress=say, cancel=cancel, on_row=on_row)
        report.extend(half)
        report.config.update(half.config)
    return report


__all__ = ["run_probe", "server_rollback"]
