"""Runs on the user's mlx_lm.server: both arms, the trace, and a diagnosis from the outside.

One runner keeps what it can reuse between runs (a matrix, the app's Run
button): the servers it started (by command line: the vanilla server without a
draft model, the speculative one with it; a change of n_max is only a request
field), the tokenizers, the vanilla arms, and, once a fork is diagnosed, the
models loaded in process.  At most the servers of the current run stay up;
``close()`` stops them all, and so do errors and cancels (see
:mod:`specview.backends.local_server.process` for the no-orphan guarantees).
"""

from __future__ import annotations

import shlex
from typing import Any, Callable

from ... import __version__
from ...core.arms.compare import compare_arms
from ...core.arms.reuse import replay
from ...core.config import RunConfig
from ...core.errors import Cancelled, ConfigError
from ...core.models.record import record_models
from ...core.registry import CancelFn, EventFn, ProgressFn, Runner
from ...core.resolve import Resolved
from ...core.trace import ArmResult, Trace
from ..local_server import openai
from ..local_server.process import ServerError
from . import protocol
from .process import MLXServer, find_server_program, kv_bits, kv_flags, server_args, split_server_args

#: how many times a server that lost the race for its port is started again on another one
PORT_RETRIES = 3


def _fingerprint_versions(fp: str | None) -> dict[str, str | None]:
    """mlx-lm's and mlx's versions from a ``system_fingerprint`` ("0.32.2-0.32.4-<platform>-<arch>")."""
    parts = (fp or "").split("-", 2)
    return {"mlx_lm": parts[0] if len(parts) > 1 else None, "mlx": parts[1] if len(parts) > 1 else None}


class MLXServerRunner(Runner):
    """The runner of the ``mlx-server`` engine (see the module docstring)."""

    def __init__(self, backend: Any, *, progress: ProgressFn | None = None):
        self.backend = backend
        self.progress = progress or (lambda msg: None)
        self._servers: dict[tuple, MLXServer] = {}
        self._vocab: dict[str, Any] = {}
        self._vanilla: dict[tuple, tuple[ArmResult, dict[str, Any]]] = {}
        self._caps: dict[tuple, tuple[int | None, str]] = {}
        self._session: Any = None
        self.loads = 0
        self.vanilla_runs = 0
        self.speculative_runs = 0

    # -- models --------------------------------------------------------------------
    def folder(self, name: str) -> str:
        """An MLX folder for ``name`` (a folder, a Hugging Face id, a ``demo:QUANT`` name), checked."""
        from ..mlx.folders import check_model_folder
        from pathlib import Path

        folder = self.backend.mlx.resolve(name, progress=self.progress)
        check_model_folder(Path(folder))
        return folder

    def vocab_model(self, folder: str) -> Any:
        """The folder's tokenizer and facts (weights mapped lazily, never evaluated)."""
        m = self._vocab.get(folder)
        if m is None:
            from ..mlx.engine import MLXModel

            m = MLXModel(folder, lazy=True)
            self._vocab[folder] = m
        return m

    def _prompt(self, cfg: RunConfig, vm: Any) -> tuple[list[int], str]:
        """The prompt's token ids and the text the server is sent (it reads text, never ids)."""
        ids = cfg.prompt_ids(vm.n_vocab)
        if ids is not None:
            text = vm.detokenize(ids)
            if vm.tokenize(text) != ids:
                raise ConfigError("prompt_tokens: mlx_lm.server takes text prompts, and these ids are not what the "
                                  "target's tokenizer makes of their own text; give the prompt as text, or use the "
                                  "mlx engine, which feeds ids as they are", setting="prompt_tokens")
            return ids, text
        text = cfg.prompt or ""
        return vm.tokenize(text, chat=cfg.chat), text

    # -- servers -------------------------------------------------------------------
    def _server(self, program: list[str], args: list[str], label: str) -> MLXServer:
        key = (*program, *args)
        srv = self._servers.get(key)
        if srv is None or not srv.alive():
            srv = MLXServer(program, args, label=label, progress=self.progress)
            self._servers[key] = srv
        return srv

    def _start(self, servers: list[MLXServer], cancel: CancelFn) -> None:
        """Start the servers not running yet (they load in parallel); wait until each has its model loaded."""
        todo = [s for s in servers if s.proc is None]
        for s in todo:
            s.start()
            self.loads += 1
        for s in todo:
            srv = s
            for attempt in range(PORT_RETRIES + 1):
                try:
                    srv.wait_loaded(cancel=cancel)
                    break
                except ServerError as exc:
                    lost_port = "already in use" in str(exc) and attempt < PORT_RETRIES
                    if not lost_port:
                        raise
                    self.progress(f"{srv.name} lost its port to another program: starting it on another")
                    srv.stop(grace=1.0)
                    srv = MLXServer(srv.program, srv.args, label=srv.label, progress=self.progress)
                    key = (*srv.program, *srv.args)
                    self._servers[key] = srv
                    srv.start()
                    self.loads += 1

    def _keep_only(self, keys: set[tuple]) -> None:
        for key in [k for k in self._servers if k not in keys]:
            self._servers.pop(key).stop()

    def stop_servers(self) -> None:
        for srv in self._servers.values():
            srv.stop()
        self._servers.clear()

    def _cap(self, program: list[str], srv: MLXServer) -> tuple[int | None, str]:
        key = tuple(program)
        if key not in self._caps:
            self._caps[key] = protocol.probe_top_logprobs_cap(srv)
        return self._caps[key]

    # -- a run ---------------------------------------------------------------------
    def run_resolved(self, resolved: Resolved, *, on_event: EventFn | None = None, cancel: CancelFn | None = None,
                     reuse_vanilla: bool = True) -> Trace:
        cancel = cancel or (lambda: False)
        cfg = resolved.config  # settings left unset took their plain values (nothing here is machine-decided)
        self.backend.check(cfg)
        say = self.progress
        target = self.folder(cfg.target)
        draft = self.folder(cfg.draft) if cfg.spec_type == "draft-simple" and cfg.draft else None
        vm = self.vocab_model(target)
        dm = self.vocab_model(draft) if draft else None
        if dm is not None:
            from ...core.engine import check_draft_compatible

            check_draft_compatible(vm.vocab, dm.vocab, draft_name=f"draft {draft}")
        tokens, text = self._prompt(cfg, vm)
        if not tokens:
            raise ConfigError("the prompt is empty after tokenization", setting="prompt")
        chat = bool(cfg.chat and not cfg.prompt_tokens)
        eng = cfg.engine
        program = find_server_program(eng.server_bin or None)
        group = self.backend.kv_group_size(vm.config) if kv_bits(eng.kv_type) else 64
        kv = kv_flags(eng.kv_type, group)
        extra = split_server_args(eng.server_args)
        v_args = server_args(target, draft=None, n_batch=eng.n_batch, kv=kv, extra=extra)
        s_args = server_args(target, draft=draft, n_batch=eng.n_batch, kv=kv, extra=extra) if draft else v_args
        num_draft = self.backend.num_draft_tokens(cfg) if draft else None
        vkey = (*program, *v_args, tuple(tokens), text, chat, cfg.max_tokens, cfg.top_k)
        cached = self._vanilla.get(vkey) if reuse_vanilla else None

        vsrv = self._server(program, v_args, "vanilla")
        ssrv = self._server(program, s_args, "speculative") if draft else vsrv
        self._keep_only({(*program, *v_args), (*program, *s_args)})  # a matrix reuses them; others go
        try:
            needed = [ssrv] if cached else list(dict.fromkeys([vsrv, ssrv]))
            starting = [srv.label for srv in needed if srv.proc is None]
            if starting:
                say(f"starting mlx_lm.server ({' and '.join(starting)})")
            self._start(needed, cancel)
            vsrv = self._servers.get((*program, *v_args), vsrv)
            ssrv = self._servers.get((*program, *s_args), ssrv)
            cap, cap_words = self._cap(program, ssrv)
            k = max(2, cfg.top_k) if cap is None else min(max(2, cfg.top_k), cap)
            if cached is not None:
                vanilla, vmeta = cached
                replay(vanilla, on_event)
            else:
                vanilla, vmeta = self._arm("vanilla", vsrv, text, tokens, chat, cfg, k, None, vm, cancel, on_event)
                self.vanilla_runs += 1
                self._vanilla[vkey] = (vanilla, vmeta)
            speculative, smeta = self._arm("speculative", ssrv, text, tokens, chat, cfg, k, num_draft, vm, cancel,
                                           on_event)
            speculative.drafter = cfg.spec_type
            self.speculative_runs += 1
        except Cancelled:
            say("cancelled")
            self._keep_only(set(k_ for k_, s in self._servers.items() if s.alive()))
            vanilla = ArmResult(name="vanilla", stop_reason="cancelled")
            speculative = ArmResult(name="speculative", stop_reason="cancelled", drafter=cfg.spec_type)
            return self._trace(cfg, program, target, draft, vm, dm, tokens, vanilla, speculative, None)
        except BaseException:
            self.stop_servers()  # a dead, refused or broken run leaves no server behind
            raise
        info = {
            "kind": "mlx_lm.server",
            "program": program,
            "margin": protocol.MARGIN_MEANING,
            "top_logits": protocol.TOP_LOGITS_MEANING,
            "top_logprobs_cap": cap,
            "top_logprobs_cap_source": cap_words,
            "top_logprobs_requested": k,
            "not_reported": dict(protocol.NOT_REPORTED),
            "vanilla_path": "single-request generation (stream_generate); the request's seed keeps a server "
                            "without a draft model off its batch generator, as a draft model always does",
            "vanilla": vmeta,
            "speculative": smeta,
        }
        return self._trace(cfg, program, target, draft, vm, dm, tokens, vanilla, speculative, info)

    def _arm(self, name: str, srv: MLXServer, text: str, tokens: list[int], chat: bool, cfg: RunConfig, k: int,
             num_draft: int | None, vm: Any, cancel: Callable[[], bool],
             on_event: EventFn | None) -> tuple[ArmResult, dict[str, Any]]:
        import time

        path, body = protocol.arm_request(text, chat=chat, max_tokens=cfg.max_tokens, top_logprobs=k,
                                          num_draft_tokens=num_draft,
                                          ban=vm.vocab.eog if cfg.ignore_eos else ())
        self.progress(f"{name} arm: {cfg.max_tokens} tokens from {srv.name} pid {srv.pid}")
        t0 = time.perf_counter()
        choice, resp = openai.complete(srv, path, body, cancel=cancel)
        wall = (time.perf_counter() - t0) * 1000.0
        usage = resp.get("usage") or {}
        if usage.get("prompt_tokens") not in (None, len(tokens)):
            raise ServerError(
                f"{srv.name} read the prompt as {usage['prompt_tokens']} tokens, specview's tokenizer as "
                f"{len(tokens)}: the trace's prompt would be wrong (chat template arguments in --server-args? "
                "another tokenizer?)")
        arm = protocol.arm_from_answer(name, choice, resp, prompt_len=len(tokens), piece=vm.piece, top_k=k)
        arm.gen_ms = wall
        if on_event:
            for st in arm.steps:
                on_event(name, st)
        shown = {key: val for key, val in body.items() if key not in ("prompt", "messages")}
        meta = {"endpoint": path, "request": shown, "args": srv.command()[len(srv.program):-4],
                "command": shlex.join(srv.command()), "pid": srv.pid,
                "usage": usage, "fingerprint": srv.fingerprint, "request_ms": round(wall, 3),
                "log_tail": srv.log_text().splitlines()[-20:]}
        return arm, meta

    def _trace(self, cfg: RunConfig, program: list[str], target: str, draft: str | None, vm: Any, dm: Any,
               tokens: list[int], vanilla: ArmResult, speculative: ArmResult, info: dict[str, Any] | None) -> Trace:
        from ...core.session import host_environment, prompt_record

        fp = None
        for s in self._servers.values():
            fp = fp or s.fingerprint
        server_env = {"program": program, "fingerprint": fp, **_fingerprint_versions(fp)}
        env = {"specview": __version__, "backend": self.backend.name, **self.backend.environment(),
               "mlx_server": server_env, **host_environment(self.backend, cfg.engine)}

        def facts(m: Any) -> dict[str, Any]:
            f = m.facts()
            f["backend"] = self.backend.name
            f.pop("load_seconds", None)
            return f

        trace = Trace(config=cfg.to_dict(), environment=env,
                      models={"target": facts(vm), "draft": facts(dm) if dm is not None else None},
                      prompt=prompt_record(cfg, tokens), vanilla=vanilla, speculative=speculative,
                      comparison=compare_arms(vanilla, speculative))
        trace.config["target_folder"] = target
        trace.config["draft_folder"] = draft
        if info is not None:
            trace.extra["server"] = info
        return record_models(trace)  # the models' names as given and the folders they resolved to

    # -- diagnosis -----------------------------------------------------------------
    def diagnose(self, trace: Trace, cfg: RunConfig, *, controls: bool = False, progress: ProgressFn | None = None,
                 cancel: CancelFn | None = None) -> dict[str, Any]:
        from .diagnose import diagnose_from_outside

        say = progress or self.progress
        d: dict[str, Any]
        if trace.comparison.identical:
            d = diagnose_from_outside(None, None, trace, self.loop_settings(cfg, None), progress=say, cancel=cancel)
        else:
            target = trace.config.get("target_folder") or self.folder(cfg.target)
            draft = trace.config.get("draft_folder")
            if draft is None and cfg.spec_type == "draft-simple" and cfg.draft:
                draft = self.folder(cfg.draft)
            # the teacher-forced replays load the folders into MLX: in its worker process, like every in-process run
            d = self._inprocess().job(replay_fork, target, draft, self.resolve(cfg).config,
                                      trace, progress=say, cancel=cancel)
        if controls:
            d.setdefault("not_measured", []).append(
                "the control matrix (--controls): it runs on the in-process engines (--engine mlx); the "
                "serial-verify control above is the one that decides")
        trace.diagnosis = d
        return d

    def loop_settings(self, cfg: RunConfig, model_config: dict[str, Any] | None, ban: Any = ()) -> Any:
        """mlx-lm's loop settings of the run (``ban``: the target's end-of-generation ids, banned with
        ``ignore_eos`` as the server's requests ban them)."""
        from .diagnose import LoopSettings

        group = self.backend.kv_group_size(model_config) if model_config and kv_bits(cfg.engine.kv_type) else 64
        return LoopSettings(max_tokens=cfg.max_tokens, prefill_step_size=cfg.engine.n_batch,
                            num_draft_tokens=self.backend.num_draft_tokens(cfg) if cfg.draft else 0,
                            kv_bits=kv_bits(cfg.engine.kv_type), kv_group_size=group,
                            ban=tuple(sorted(ban)) if cfg.ignore_eos else ())

    def _inprocess(self) -> Any:
        if self._session is None:
            from ...core.registry import get_backend

            self._session = get_backend("mlx").runner(progress=self.progress)
        return self._session

    def close(self) -> None:
        self.stop_servers()
        if self._session is not None:
            self._session.close()
            self._session = None
        self._vocab.clear()


def replay_fork(session: Any, target: str, draft: str | None, cfg: RunConfig, trace: Trace, *,
                progress: ProgressFn | None = None, cancel: CancelFn | None = None) -> dict[str, Any]:
    """The outside diagnosis of a server run's fork, on ``session``'s MLX copies of the server's folders."""
    from ...core.registry import get_backend
    from .diagnose import diagnose_from_outside

    tm = session.model("mlx", target, cfg.engine)
    dmodel = session.model("mlx", draft, cfg.engine) if draft else None
    runner = get_backend("mlx-server").runner()
    ls = runner.loop_settings(cfg, tm.model.config, tm.vocab.eog)
    return diagnose_from_outside(tm.model.model, dmodel.model.model if dmodel else None, trace, ls,
                                 progress=progress, cancel=cancel)
