"""A session: loaded models, cached arms, and whole runs -- what the CLI and the GUI drive.

One session belongs to one thread (the CLI's main thread, or the GUI's model
worker thread): llama.cpp contexts and MLX streams must not cross threads.

* Models are loaded once per (backend, file, GPU layers) and shared by every
  arm, drafter and replay; ``loads`` counts real loads.
* The vanilla arm is cached per target, prompt tokens and settings, so
  changing n_max, p_min or the drafter re-runs only the speculative arm.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any, Callable

from .. import __version__
from . import activity
from .arms.compare import compare_arms
from .arms.reuse import replay
from .arms.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter
from .config import RunConfig
from .engine import Engine, EngineSettings, check_draft_compatible
from .arms.generate import Event, GenOptions, check_fits, context_needed, run_to_end, speculative_greedy, vanilla_greedy
from .doctor import cpu_name, environment_facts, machine_facts
from .engine import LoadedModel
from .registry import Backend, Runner, get_backend
from .resolve import DecidedSettings, Resolved, require_decided
from .trace import ArmResult, Trace

ProgressFn = Callable[[str], None]
EventFn = Callable[[str, Event], None]  # (arm name, event)


def round_up(n: int, to: int = 256) -> int:
    return ((n + to - 1) // to) * to


class Session(Runner):
    """Loaded models and cached arms for one owner thread: the runner of every in-process engine."""

    def __init__(self, progress: ProgressFn | None = None):
        self.progress = progress or (lambda msg: None)
        self._models: dict[tuple, LoadedModel] = {}
        self._engines: dict[tuple, Engine] = {}
        self._vanilla: dict[tuple, tuple[ArmResult, int]] = {}
        self.draft_why = ""  # why the last run's draft context rolls back otherwise than the target's
        self.loads = 0
        self.vanilla_runs = 0
        self.speculative_runs = 0

    # -- models ----------------------------------------------------------------
    def model(self, backend: str, name: str, settings: DecidedSettings) -> LoadedModel:
        """``name`` loaded once on ``settings`` (decided: :meth:`Runner.resolve`, or a job's, resolved by
        :meth:`Runner.job`), shared by every arm, drafter and replay."""
        settings = require_decided(settings, "Session.model")
        be = get_backend(backend)
        resolved = be.resolve(name, progress=self.progress)
        key = (backend, *be.model_key(resolved, settings))
        m = self._models.get(key)
        if m is None:
            self.progress(f"loading {resolved}")
            activity.doing(f"loading {resolved}")
            m = be.load(resolved, settings)
            self._models[key] = m
            self.loads += 1
        return m

    def engine(self, role: str, model: LoadedModel, settings: DecidedSettings, n_ctx: int) -> Engine:
        """A context for ``role`` ("vanilla", "speculative", "draft", ...) on ``model``, reused when it fits."""
        # an explicit --n-ctx stays in the key: llama.cpp clamps n_batch to it, so it changes the prefill chunks
        key = (role, id(model), settings)
        e = self._engines.get(key)
        if e is not None and e.n_ctx >= n_ctx:
            return e
        if e is not None:
            e.close()
        e = model.new_engine(settings, n_ctx)
        self._engines[key] = e
        return e

    def close(self) -> None:
        for e in self._engines.values():
            e.close()
        self._engines.clear()
        for m in self._models.values():
            m.close()
        self._models.clear()
        self._vanilla.clear()

    # -- a run ---------------------------------------------------------------------
    def prompt_tokens(self, cfg: RunConfig, target: LoadedModel) -> list[int]:
        ids = cfg.prompt_ids(target.vocab.n_vocab)
        return ids if ids is not None else target.tokenize(cfg.prompt or "", chat=cfg.chat)

    def context_size(self, cfg: RunConfig, n_prompt: int, target: LoadedModel) -> int:
        n_max = cfg.n_max if cfg.uses_draft_model else (cfg.ngram_size_m if cfg.spec_type == "ngram-simple" else 0)
        need = context_needed(n_prompt, cfg.max_tokens, n_max)
        if cfg.engine.n_ctx:
            return cfg.engine.n_ctx
        return round_up(need)

    def make_drafter(self, cfg: RunConfig, target: LoadedModel, n_ctx: int) -> tuple[Drafter, LoadedModel | None]:
        if cfg.spec_type == "none":
            return NoDrafter(), None
        if cfg.spec_type == "ngram-simple":
            return NgramDrafter(size_n=cfg.ngram_size_n, size_m=cfg.ngram_size_m), None
        dmodel = self.model(cfg.backend, cfg.draft or "", cfg.engine)
        check_draft_compatible(target.vocab, dmodel.vocab, draft_name=f"draft {dmodel.path}")
        dsettings, self.draft_why = dmodel.draft_settings(cfg.engine)
        deng = self.engine("draft", dmodel, dsettings, n_ctx)
        return ModelDrafter(deng, n_max=cfg.n_max, n_min=cfg.n_min, p_min=cfg.p_min, n_batch=cfg.engine.n_batch), dmodel

    def preload(self, cfg: RunConfig | Resolved) -> None:
        """Load the target (and the draft model, if the run has one) now, on the settings a run of ``cfg`` has."""
        cfg = self.resolve(cfg).config
        self.model(cfg.backend, cfg.target, cfg.engine)
        if cfg.uses_draft_model and cfg.draft:
            self.model(cfg.backend, cfg.draft, cfg.engine)

    def run_job(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """``fn(self, *args, **kwargs)``: this Session is where the models live (its ``settings=`` resolved by
        :meth:`Runner.job`)."""
        return fn(self, *args, **kwargs)

    def diagnose(self, trace: Trace, cfg: RunConfig, *, controls: bool = False,
                 progress: ProgressFn | None = None, cancel: Callable[[], bool] | None = None) -> dict[str, Any]:
        from .diagnose import diagnose

        cfg = self.resolve(cfg).config  # a trace's config: every setting it recorded, decided as it ran
        return diagnose(self, cfg, trace, controls=controls, progress=progress or self.progress, cancel=cancel)

    def run_resolved(
        self,
        resolved: Resolved,
        *,
        on_event: EventFn | None = None,
        cancel: Callable[[], bool] | None = None,
        reuse_vanilla: bool = True,
        on_record: Callable[[str, Any], None] | None = None,
    ) -> Trace:
        """Run (or reuse) the vanilla arm and run the speculative arm; return the trace.

        ``resolved`` is the config :meth:`Runner.run` resolved (settings left unset took what this machine
        decides, and the trace's ``config.decided`` says why).

        ``on_record("head", trace)`` gets the trace's config, models and prompt (its arms still empty)
        before the first token, and ``on_record("arm", arm)`` each arm when it ends: what a caller needs
        to keep a run whose engine dies half-way (:mod:`specview.core.worker`).
        """
        cancel = cancel or (lambda: False)
        cfg = resolved.config
        get_backend(cfg.backend).check(cfg)
        target = self.model(cfg.backend, cfg.target, cfg.engine)
        tokens = self.prompt_tokens(cfg, target)
        n_ctx = self.context_size(cfg, len(tokens), target)
        self._past_training(target, context_needed(len(tokens), cfg.max_tokens, cfg.draft_width))
        opts = GenOptions(max_tokens=cfg.max_tokens, ignore_eos=cfg.ignore_eos, n_batch=cfg.engine.n_batch,
                          top_k=cfg.top_k)
        drafter, dmodel = self.make_drafter(cfg, target, n_ctx)
        # the trace's config, environment, models and prompt, once: the arms fill in as they end
        trace = self.build_trace(cfg, target, dmodel, tokens, n_ctx, ArmResult(name="vanilla"),
                                 ArmResult(name="speculative", drafter=drafter.spec_type))
        resolved.record(trace)
        if on_record is not None:
            on_record("head", trace)

        vkey = (cfg.backend, target.path, tuple(tokens), cfg.max_tokens, cfg.ignore_eos, cfg.top_k,
                cfg.engine)
        cached = self._vanilla.get(vkey) if reuse_vanilla else None
        used: Engine | None = None  # the target context whose settings the trace reports
        if cached is not None:
            vanilla = replay(cached[0], on_event)
        else:
            veng = used = self.engine("vanilla", target, cfg.engine, n_ctx)
            # the whole run's need before either arm: the vanilla arm alone fits where a verify pass may not
            check_fits(veng, len(tokens), cfg.max_tokens, cfg.draft_width)
            vanilla = run_to_end(vanilla_greedy(veng, tokens, opts, cancel=cancel),
                                 (lambda ev: on_event("vanilla", ev)) if on_event else None)
            self.vanilla_runs += 1
            if vanilla.stop_reason != "cancelled":
                self._vanilla[vkey] = (vanilla, n_ctx)
        if on_record is not None:
            on_record("arm", vanilla)
        if vanilla.stop_reason == "cancelled":
            speculative = ArmResult(name="speculative", drafter=drafter.spec_type, stop_reason="cancelled")
        else:
            seng = used = self.engine("speculative", target, cfg.engine, n_ctx)
            n_max_hint = cfg.draft_width
            speculative = run_to_end(
                speculative_greedy(seng, drafter, tokens, opts, n_max_hint=n_max_hint,
                                   serial_verify=cfg.serial_verify, cancel=cancel),
                (lambda ev: on_event("speculative", ev)) if on_event else None,
            )
            self.speculative_runs += 1
        trace.vanilla, trace.speculative = vanilla, speculative
        trace.comparison = compare_arms(vanilla, speculative)
        # the effective thread count: with threads=0 it comes from the machine, and ggml's CPU
        # kernels split work by thread, so the same settings can give different logits elsewhere
        trace.config["threads_used"] = getattr(used, "threads", None)
        if used is not None:  # what llama.cpp made of n_ctx/n_batch/n_ubatch (it pads and clamps them)
            trace.config["context_used"] = {"n_ctx": used.n_ctx, "n_batch": used.n_batch,
                                            "n_ubatch": getattr(used, "n_ubatch", None),
                                            # how its memory rolled back (auto decided by the context itself)
                                            "rollback": getattr(used, "rollback", None)}
            if getattr(drafter, "engine", None) is not None:  # the draft context's own (as llama-server opens it)
                trace.config["context_used"]["draft_rollback"] = getattr(drafter.engine, "rollback", None)
                if self.draft_why:
                    trace.config["context_used"]["draft_rollback_why"] = self.draft_why
        return trace

    def _past_training(self, target: LoadedModel, need: int) -> None:
        """Say so when the run reaches past the context the target was trained on: its text may degrade (a loop,
        nonsense), in both arms alike, so the comparison still holds but the text is no sample of the model."""
        trained = getattr(target, "n_ctx_train", None)
        if isinstance(trained, int) and 0 < trained < need:
            self.progress(f"warning: this run reaches position {need:,}, past the {trained:,} tokens "
                          f"{os.path.basename(str(target.path))} was trained on; its text may degrade there, in both "
                          "arms alike")

    def build_trace(self, cfg: RunConfig, target: LoadedModel, dmodel: LoadedModel | None, tokens: list[int],
                    n_ctx: int, vanilla: ArmResult, speculative: ArmResult) -> Trace:
        be = get_backend(cfg.backend)
        config = cfg.to_dict()
        config["n_ctx_used"] = n_ctx
        env = {"specview": __version__, "backend": cfg.backend, **be.environment(), **host_environment(be, cfg.engine)}
        return Trace(
            config=config,
            environment=env,
            models={"target": target.facts(), "draft": dmodel.facts() if dmodel is not None else None},
            prompt=prompt_record(cfg, tokens, chat_note=target.chat_note),
            vanilla=vanilla,
            speculative=speculative,
            comparison=compare_arms(vanilla, speculative),
        )


def host_environment(backend: Backend | None = None, settings: EngineSettings | None = None) -> dict[str, Any]:
    """The machine half of a trace's ``environment``, shared by every engine.

    With the run's ``backend`` it also carries ``setup``: what ``specview doctor``
    says of that engine and this machine, without its slow checks, so a report
    shows the devices, CPU features and thread count a run had.
    """
    env: dict[str, Any] = {
        "os": f"{platform.system()} {platform.release()}",
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    facts = list(machine_facts())
    if backend is not None:
        try:
            facts = list(backend.setup_facts(settings or EngineSettings(), deep=False)) + facts
        except Exception as exc:  # a setup fact that cannot be read must not lose the run
            env["setup_error"] = f"{type(exc).__name__}: {exc}"
    env["setup"] = environment_facts(facts)
    return env


def prompt_record(cfg: RunConfig, tokens: list[int], *, chat_note: str | None = None) -> dict[str, Any]:
    """A trace's ``prompt`` block: the text (or none for raw ids) and the ids both arms were fed.

    ``chat_note`` (the target's one line on a missing chat template) is kept when the prompt was a chat.
    """
    d = {
        "text": cfg.prompt if not cfg.prompt_tokens else None,
        "chat": cfg.chat if not cfg.prompt_tokens else False,
        "raw_tokens": bool(cfg.prompt_tokens),
        "tokens": list(tokens),
    }
    if d["chat"] and chat_note:
        d["chat_note"] = chat_note
    return d
