"""Runs on the user's own llama-server: both arms, one server per model pair, and the trace.

:class:`ServerRunner` (the runner of :class:`~specview.backends.llama_server.backend.ServerBackend`, registered
as ``llama-server``) runs a config like this (``docs/llama-server.md`` has the
user's version):

* **One server per (target, drafter, server flags).**  The speculative arm is
  one streamed request (``timings_per_token``), from which each verify round is
  rebuilt.  The vanilla arm runs on the *same* server as one-token requests:
  llama-server drafts at most ``n_predict - 1`` tokens, so a request that may
  predict one token is plain decoding, with the prompt evaluated once and then
  exactly one new token per request (the server's own counters are checked).
  The tests prove, against a real server, that this equals the vanilla arm of a
  server with no drafter, token for token.
* **Two servers** (the vanilla arm as one request on a server without a drafter)
  when asked for, or when a one-token request on the drafter's server does not
  evaluate what plain decoding evaluates; the trace says which and why.
* Servers stay up across runs that change only the prompt or request
  settings (the matrix), at most one target's at a time; vanilla arms are
  cached per target, prompt and flags, like the in-process session's.
* ``serial_verify`` runs both arms on the same server with ``-ub 1``: every pass
  one token, so verify rows are computed exactly as plain decoding computes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ... import __version__
from ...core.arms.compare import compare_arms
from ...core.arms.generate import context_needed
from ...core.config import RunConfig
from ...core.errors import Cancelled, ConfigError, ModelFileError
from ...core.llama_flags import server_argv, split_server_args, uses_draft_file
from ...core.models.record import record_models
from ...core.registry import EventFn, ProgressFn, Runner, get_backend
from ...core.resolve import Resolved
from ...core.session import host_environment, prompt_record, round_up
from ...core.trace import ArmResult, Trace
from .binary import find_server_bin, server_info
from .pool import ServerPool, argv_key, with_ubatch
from .process import LlamaServer
from .protocol import (TokenByToken, arm_from_response, arm_from_stream, completion_body, held_back_ids, make_step,
                       reads_request_speculation, stream_completion, vanilla_by_requests, wait_idle,
                       without_banned)

MARGIN_MEANING = ("log-probability difference top-1 minus top-2 of the target's pre-sampling distribution "
                  "(equal to the logit difference: log-softmax shifts a row by one constant); "
                  "null where llama-server reported no top-k")
TOP_LOGITS_MEANING = "log-probabilities (logits minus the row's log-sum-exp), from llama-server's n_probs"
#: what a llama-server trace leaves null, and why (docs/llama-server.md lists the same)
NOT_REPORTED = {
    "top-k of tokens its speculative verify step emits": "llama-server fills completion_probabilities only for "
    "tokens sampled from a one-token pass; verify-step tokens get none",
    "top-k of tokens whose text is an incomplete UTF-8 sequence": "llama-server holds such a token back until its "
    "character is complete and reports no probabilities for it",
    "eval_ms (time inside forward passes)": "llama-server reports prompt and generation wall times only",
    "rounds' draft_ms and verify_ms": "llama-server times a whole step (draft and verify together); each round's "
    "step time is in extra.server.speculative.rounds.step_ms",
    "rounds' draft_tokens": "llama-server does not report the draft; the accepted draft tokens are the round's "
    "from_draft steps, the rejected ones are unknown",
}
#: spec types whose drafter changes the target's own passes, so the vanilla arm needs its own server
TWO_SERVER_TYPES: dict[str, str] = {}
#: how many servers of one target stay up at once (least recently used goes first), on the CPU and with a GPU
CPU_SERVERS, GPU_SERVERS = 8, 2


def _never() -> bool:
    return False


@dataclass
class Plan:
    """Everything a run needs before any server starts."""

    binary: str
    info: dict[str, Any]
    target: str
    draft: str | None
    tokens: list[int]
    n_ctx: int
    threads: int
    config: dict[str, Any]
    vanilla_argv: list[str]
    spec_argv: list[str]
    protocol: str  # "single-server" or "two-servers"
    protocol_reason: str | None
    ubatch: int | None  # 1 for a serial-verify run
    check_key: tuple = ()  # what the single-server premise is checked for: binary, target, drafter, type, flags


class ServerRunner(Runner):
    """Runs and diagnoses on llama-servers it starts and keeps (see the module docstring).

    ``loads`` counts server starts.  ``single_server=False, keep_servers=False``
    is the two-servers-per-run protocol (the benchmark's baseline).
    ``server_bin``/``server_args`` fill a config's empty engine settings.
    """

    def __init__(self, *, progress: ProgressFn | None = None, single_server: bool = True, keep_servers: bool = True,
                 server_bin: str | None = None, server_args: str | None = None, check_single_server: bool = True):
        self.progress = progress or (lambda msg: None)
        self.single_server = single_server
        self.keep_servers = keep_servers
        self.server_bin = server_bin or ""
        self.server_args = server_args or ""
        self.pool = ServerPool(progress=self.progress)
        self.vanilla_runs = 0
        self.speculative_runs = 0
        self._vocab: dict[str, Any] = {}
        self._vanilla: dict[tuple, tuple[ArmResult, dict[str, Any]]] = {}
        #: the single-server premise per Plan.check_key: None = checked and held, text = how it broke
        self._checked: dict[tuple, str | None] = {}
        self.check_single_server = check_single_server

    @property
    def loads(self) -> int:  # type: ignore[override]
        return self.pool.starts

    # -- what a run needs ------------------------------------------------------------
    def _with_binary(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` (resolved) with this runner's binary and flags where it names none."""
        from dataclasses import replace

        eng = cfg.engine
        if (not eng.server_bin and self.server_bin) or (not eng.server_args and self.server_args):
            eng = replace(eng, server_bin=eng.server_bin or self.server_bin,
                          server_args=eng.server_args or self.server_args)
            cfg = replace(cfg, engine=eng)
        return cfg

    def vocab(self, path: str) -> Any:
        """The vocabulary-only llama.cpp model of ``path`` (kept for the runner's life)."""
        m = self._vocab.get(path)
        if m is None:
            from ..llama_cpp import vocab_model

            m = self._vocab[path] = vocab_model(path)
        return m

    def plan(self, cfg: RunConfig) -> Plan:
        be = get_backend("llama-server")
        be.check(cfg)
        binary = find_server_bin(cfg.engine.server_bin or None)
        info = server_info(binary)
        target = be.resolve(cfg.target, progress=self.progress)
        draft = be.resolve(cfg.draft, progress=self.progress) if uses_draft_file(cfg.spec_type) and cfg.draft else None
        for role, p in (("target", target), ("draft", draft)):
            if p is not None and not Path(p).is_file():
                raise ModelFileError(f"{p}: the {role} model file does not exist")
        vm = self.vocab(target)
        tokens = cfg.prompt_ids(vm.n_vocab)
        if tokens is None:
            tokens = vm.tokenize(cfg.prompt or "", chat=cfg.chat)
        if not tokens:
            raise ConfigError("the prompt is empty after tokenization", setting="prompt")
        hint = cfg.ngram_size_m if cfg.spec_type.startswith("ngram") else max(cfg.n_max, 16)
        n_ctx = cfg.engine.n_ctx or round_up(context_needed(len(tokens), cfg.max_tokens, hint))
        from ..llama_cpp import resolve_threads

        threads = resolve_threads(cfg.engine.threads)
        config = cfg.to_dict()
        config.update(draft=draft, n_ctx_used=n_ctx, threads_used=threads)
        ubatch = 1 if cfg.serial_verify else None
        vanilla_argv = server_argv(config, target=target, speculative=False, ubatch=ubatch)
        spec_argv = server_argv(config, target=target, draft=draft, speculative=True, ubatch=ubatch)
        if "--cache-ram" in info["help_flags"]:
            vanilla_argv += ["--cache-ram", "0"]
            spec_argv += ["--cache-ram", "0"]
        if not self.single_server:
            protocol, reason = "two-servers", "asked for: the vanilla arm on a server without the drafter"
        elif cfg.spec_type in TWO_SERVER_TYPES:
            protocol, reason = "two-servers", TWO_SERVER_TYPES[cfg.spec_type]
        else:
            protocol, reason = "single-server", None
        check_key = (binary, target, draft, cfg.spec_type, argv_key(vanilla_argv),
                     tuple(split_server_args(cfg.engine.server_args)[1]))
        if protocol == "single-server" and self._checked.get(check_key):
            protocol, reason = "two-servers", self._checked[check_key]
        return Plan(binary, info, target, draft, tokens, n_ctx, threads, config, vanilla_argv, spec_argv,
                    protocol, reason, ubatch, check_key)

    def server(self, plan: Plan, role: str, *, cancel: Callable[[], bool] = _never,
               ubatch: int | None = None) -> tuple[LlamaServer, bool]:
        """The live server for ``role`` ("speculative" or "vanilla") of ``plan``; (server, started now)."""
        argv = plan.spec_argv if role == "speculative" else plan.vanilla_argv
        if ubatch is not None:
            argv = with_ubatch(argv, ubatch)
        return self.pool.get(plan.binary, argv, target=plan.target, label=self._label(plan, role, ubatch),
                             cancel=cancel)

    @staticmethod
    def _label(plan: Plan, role: str, ubatch: int | None = None) -> str:
        ub = ubatch if ubatch is not None else plan.ubatch
        return role if ub is None else f"{role} -ub {ub}"

    # -- a run ---------------------------------------------------------------------------
    def run_resolved(self, resolved: Resolved, *, on_event: EventFn | None = None,
                     cancel: Callable[[], bool] | None = None, reuse_vanilla: bool = True) -> Trace:
        cancel = cancel or _never
        cfg = self._with_binary(resolved.config)
        plan = self.plan(cfg)
        # on the CPU the servers of one target share its weights through the page cache (mmap); each GPU
        # server holds its own copy, so fewer stay up there
        self.pool.limit = CPU_SERVERS if not plan.info["devices"] or cfg.engine.gpu_layers == 0 else GPU_SERVERS
        starts0 = self.pool.starts
        say = self.progress
        record: dict[str, Any] = {
            "protocol": plan.protocol,
            "protocol_reason": plan.protocol_reason,
            "margin": MARGIN_MEANING,
            "top_logits": TOP_LOGITS_MEANING,
            "not_reported": dict(NOT_REPORTED),
            "request": {k: v for k, v in completion_body([], cfg.max_tokens, n_probs=max(cfg.top_k, 2),
                                                         ignore_eos=cfg.ignore_eos).items() if k != "prompt"},
        }
        if plan.ubatch == 1:
            record["serial_verify"] = {"form": "ub1-server", "description": "both arms on the same server with -ub 1: "
                                       "every pass (prompt, plain decoding, verify) computes one token"}
        try:
            if plan.protocol == "two-servers":  # both at once: they load in parallel
                self.pool.ensure(plan.binary, [(plan.spec_argv, self._label(plan, "speculative")),
                                               (plan.vanilla_argv, self._label(plan, "vanilla"))],
                                 target=plan.target, cancel=cancel)
            sserver, _ = self.server(plan, "speculative", cancel=cancel)
            vanilla, record["vanilla"] = self._vanilla_arm(plan, cfg, sserver, on_event, cancel, reuse_vanilla)
            if record["vanilla"].get("fallback"):
                record["protocol"] = "two-servers"
                record["protocol_reason"] = record["vanilla"]["fallback"]
            if vanilla.stop_reason == "cancelled":
                speculative = ArmResult(name="speculative", stop_reason="cancelled", drafter=cfg.spec_type)
            else:
                say(f"speculative arm: {cfg.max_tokens} tokens on llama-server pid {sserver.pid}")
                speculative, record["speculative"] = self._speculative_arm(plan, cfg, sserver, on_event, cancel)
                self.speculative_runs += 1
        except Cancelled:  # while a server was starting
            say("cancelled")
            trace = self._trace(plan, cfg, ArmResult(name="vanilla", stop_reason="cancelled"),
                                ArmResult(name="speculative", stop_reason="cancelled", drafter=cfg.spec_type))
            trace.extra["server"] = record
            self.pool.drop_dead()
            return trace
        except BaseException:
            self.pool.stop_all()  # a server that died or refused: start clean next time
            raise
        if "cancelled" in (vanilla.stop_reason, speculative.stop_reason):
            say("cancelled")
        elif on_event:
            for r in speculative.rounds:
                on_event("speculative", r)
        record["servers_started"] = self.pool.starts - starts0
        trace = self._trace(plan, cfg, vanilla, speculative)
        if plan.ubatch == 1:
            for st in speculative.steps:
                st.serial = True  # type: ignore[attr-defined]
            for r in speculative.rounds:
                r.serial = r.index > 0  # type: ignore[attr-defined]
        trace.extra["server"] = record
        if not self.keep_servers:
            self.pool.stop_all()
        return trace

    def _vanilla_arm(self, plan: Plan, cfg: RunConfig, sserver: LlamaServer, on_event: EventFn | None,
                     cancel: Callable[[], bool], reuse: bool) -> tuple[ArmResult, dict[str, Any]]:
        key = (plan.binary, plan.target, tuple(plan.tokens), cfg.max_tokens, cfg.ignore_eos, cfg.top_k,
               argv_key(plan.vanilla_argv))
        cached = self._vanilla.get(key) if reuse else None
        if cached is not None:
            arm, rec = cached
            if on_event:
                for st in arm.steps:
                    on_event("vanilla", st)
            return arm, dict(rec, reused=True)
        emit = (lambda st: on_event("vanilla", st)) if on_event else None
        vm = self.vocab(plan.target)
        n_probs = max(cfg.top_k, 2)
        rec: dict[str, Any]
        if plan.protocol == "single-server":
            self.progress(f"vanilla arm: {cfg.max_tokens} one-token requests on llama-server pid {sserver.pid}")
            arm, tbt = vanilla_by_requests(sserver, plan.tokens, cfg.max_tokens, n_probs=n_probs,
                                           ignore_eos=cfg.ignore_eos, n_batch=cfg.engine.n_batch, piece=vm.piece,
                                           cancel=cancel, on_step=emit)
            rec = {"form": "token-by-token", "server": _server_record(sserver), **_tbt_record(tbt, len(plan.tokens))}
            problem = _chain_problem(tbt, len(plan.tokens))
            if problem is None and arm.stop_reason == "cancelled":
                return arm, rec
            ref = None
            if problem is None and self.check_single_server and plan.check_key not in self._checked:
                # once per (binary, target, drafter, spec type, flags): the premise, against a server without the drafter
                self.progress("checking the one-token requests against a server without the drafter")
                ref, ref_rec = self._one_request_vanilla(plan, cfg, None, cancel)
                diff = arm_difference(arm, ref)
                rec["check"] = {"against": "the vanilla arm of a server without the drafter (one request)",
                                "server": ref_rec["server"], "identical": diff is None, "difference": diff}
                if diff is not None:
                    problem = f"the one-token requests gave another vanilla arm than a server without the drafter ({diff})"
                self._checked[plan.check_key] = None if diff is None else (
                    f"on the drafter's server {problem}, so the vanilla arm ran on a server without the drafter")
            elif problem is None and plan.check_key in self._checked:
                rec["check"] = {"identical": True, "earlier": True}
            if problem is None:
                self.vanilla_runs += 1 + (ref is not None)
                self._vanilla[key] = (arm, rec)
                return arm, rec
            fallback = f"on the drafter's server {problem}, so the vanilla arm ran on a server without the drafter"
            self._checked[plan.check_key] = fallback
            self.progress(f"the one-token requests did not run plain decoding ({problem}): using the vanilla arm of "
                          "a server without the drafter")
            if ref is not None:
                arm, rec = ref, dict(ref_rec, fallback=fallback, check=rec.get("check"))
                if emit:
                    for st in arm.steps:
                        emit(st)
                self.vanilla_runs += 2
                self._vanilla[key] = (arm, rec)
                return arm, rec
        else:
            fallback = None
        arm, rec = self._one_request_vanilla(plan, cfg, emit, cancel)
        if fallback:
            rec["fallback"] = fallback
        self.vanilla_runs += 1
        self._vanilla[key] = (arm, rec)
        return arm, rec

    def _one_request_vanilla(self, plan: Plan, cfg: RunConfig, emit: Callable[[Any], None] | None,
                             cancel: Callable[[], bool]) -> tuple[ArmResult, dict[str, Any]]:
        """The vanilla arm as one request on a server without the drafter."""
        vm = self.vocab(plan.target)
        vserver, _ = self.server(plan, "vanilla", cancel=cancel)
        self.progress(f"vanilla arm: {cfg.max_tokens} tokens on llama-server pid {vserver.pid}")
        body = completion_body(plan.tokens, cfg.max_tokens, n_probs=max(cfg.top_k, 2), ignore_eos=cfg.ignore_eos)
        resp = vserver.post("/completion", body, cancel=cancel)
        arm = arm_from_response("vanilla", resp, prompt_len=len(plan.tokens), piece=vm.piece)
        last = ((len(plan.tokens) - 1) % cfg.engine.n_batch) + 1
        for st in arm.steps:  # a server without a drafter: the prompt in -b chunks, then one token per pass
            st.round, st.from_draft = 0, False
            st.batch_size, st.batch_index = (1, 0) if st.index > 0 else (last, last - 1)
        if emit:
            for st in arm.steps:
                emit(st)
        return arm, {"form": "one-request", "server": _server_record(vserver), "timings": resp.get("timings")}

    def _speculative_arm(self, plan: Plan, cfg: RunConfig, server: LlamaServer, on_event: EventFn | None,
                         cancel: Callable[[], bool]) -> tuple[ArmResult, dict[str, Any]]:
        vm = self.vocab(plan.target)
        per_request = {"n_max": cfg.n_max, "n_min": cfg.n_min, "p_min": cfg.p_min}
        body = completion_body(plan.tokens, cfg.max_tokens, n_probs=max(cfg.top_k, 2), ignore_eos=cfg.ignore_eos,
                               stream=True, speculative=per_request)

        def live(ch: Any) -> None:  # each token as it arrives; its round is known once its step is complete
            if on_event is not None:
                on_event("speculative", make_step(ch.n - 1, ch.token, ch.entry, prompt_len=len(plan.tokens),
                                                  piece=vm.piece))

        sr = stream_completion(server, body, cancel=cancel, on_chunk=live, stop_on_cancel=False)
        if sr.cancelled and not wait_idle(server):
            server.stop()  # it did not drop the abandoned task: do not hand it out again
        rec: dict[str, Any] = {"form": "one-request, streamed", "server": _server_record(server),
                               "timings": sr.final.get("timings"),
                               "per_request_speculation": reads_request_speculation(sr.final)}
        if sr.cancelled:
            arm, rr = arm_from_stream("speculative", sr, prompt_len=len(plan.tokens), n_batch=cfg.engine.n_batch,
                                      piece=vm.piece)
            arm.drafter = cfg.spec_type
            rec["rounds"] = {"available": rr.rounds is not None, "reason": rr.reason, "step_ms": rr.step_ms}
            return arm, rec
        tokens = held_back_ids(server, sr, body, cancel=cancel)
        if tokens is not None:
            streamed = {c.n - 1: c.token for c in sr.chunks}
            agree = all(j < len(tokens) and tokens[j] == t for j, t in streamed.items())
            rec["form"] = "one-request, streamed, and again unstreamed for the ids of held-back tokens"
            rec["repeat_agrees"] = agree
        arm, rr = arm_from_stream("speculative", sr, prompt_len=len(plan.tokens), n_batch=cfg.engine.n_batch,
                                  piece=vm.piece, tokens=tokens)
        t = sr.final.get("timings") or {}
        arm.drafter = cfg.spec_type
        arm.reported_drafted = int(t.get("draft_n", 0) or 0)
        arm.reported_accepted = int(t.get("draft_n_accepted", 0) or 0)
        rec["rounds"] = {"available": rr.rounds is not None, "reason": rr.reason, "step_ms": rr.step_ms}
        if rr.rounds is not None and (sum(r.drafted for r in rr.rounds) != arm.reported_drafted
                                      or sum(r.accepted for r in rr.rounds) > arm.reported_accepted):
            rec["rounds"]["note"] = "the rounds' counts differ from the server's totals"
        return arm, rec

    def _trace(self, plan: Plan, cfg: RunConfig, vanilla: ArmResult, speculative: ArmResult) -> Trace:
        info = plan.info
        env = {
            "specview": __version__,
            "backend": "llama-server",
            "engine": "llama-server",
            "llama_server": {"binary": info["binary"], "version": info["version"], "devices": info["devices"],
                             "list_devices": info["devices_raw"], "spec_types": info["spec_types"]},
            **host_environment(get_backend("llama-server"), cfg.engine),
        }
        srv = self.pool.find(plan.binary, plan.spec_argv)
        n_ctx = plan.n_ctx
        if srv is not None and "-c" in srv.args:
            n_ctx = int(srv.args[srv.args.index("-c") + 1])  # a reused server may have a larger context
        config = dict(plan.config, n_ctx_used=n_ctx)
        if cfg.ignore_eos:  # the top-k the sampler picked from, as the in-process arms record it
            eog = self.vocab(plan.target).vocab.eog
            vanilla, speculative = without_banned(vanilla, eog), without_banned(speculative, eog)
        # the models' names as given and the files they resolved to (config.models)
        return record_models(Trace(config=config, environment=env,
                                   models={"target": _facts(self.vocab(plan.target)),
                                           "draft": _facts(self.vocab(plan.draft)) if plan.draft else None},
                                   prompt=prompt_record(cfg, plan.tokens), vanilla=vanilla, speculative=speculative,
                                   comparison=compare_arms(vanilla, speculative)))

    # -- diagnosis ---------------------------------------------------------------------
    def diagnose(self, trace: Trace, cfg: RunConfig, *, controls: bool = False, progress: ProgressFn | None = None,
                 cancel: Callable[[], bool] | None = None) -> dict[str, Any]:
        from .diagnose import diagnose_run

        return diagnose_run(self, trace, self._with_binary(self.resolve(cfg).config), progress=progress or self.progress,
                            cancel=cancel or _never)

    def neighbours(self, cfg: RunConfig, **kw: Any) -> dict[str, Any]:
        """My answer alone and beside a neighbour request on a two-slot server (:mod:`.neighbours`)."""
        from .neighbours import alone_and_beside

        return alone_and_beside(self, self._with_binary(self.resolve(cfg).config), **kw)

    def close(self) -> None:
        self.pool.stop_all()
        for m in self._vocab.values():
            try:
                m.close()
            except Exception:  # pragma: no cover - best effort
                pass
        self._vocab.clear()
        self._vanilla.clear()


# -- helpers ------------------------------------------------------------------------------------
def _server_record(s: LlamaServer) -> dict[str, Any]:
    return {"args": s.command()[1:], "pid": s.pid, "label": s.label,
            "ready_seconds": None if s.ready_seconds is None else round(s.ready_seconds, 3)}


def _tbt_record(tbt: TokenByToken, prompt_len: int) -> dict[str, Any]:
    return {"requests": len(tbt.evaluated), "evaluated_first": tbt.evaluated[0] if tbt.evaluated else None,
            "off_shape": tbt.off_shape(prompt_len), "drafted": tbt.drafted,
            "timings": {"prompt_ms": round(tbt.prompt_ms, 3), "gen_ms": round(tbt.gen_ms, 3)}}


def _chain_problem(tbt: TokenByToken, prompt_len: int) -> str | None:
    """Why the one-token requests were not plain decoding (None when they were)."""
    if tbt.drafted:
        return f"the one-token requests drafted {tbt.drafted} tokens"
    off = tbt.off_shape(prompt_len)
    if off:
        j = off[0]
        return (f"request {j} evaluated {tbt.evaluated[j]} tokens where plain decoding evaluates "
                f"{prompt_len if j == 0 else 1}")
    return None


def arm_difference(a: ArmResult, b: ArmResult) -> str | None:
    """Where two vanilla arms differ: a token, or a log-probability where both report the row (None: they agree)."""
    for x, y in zip(a.steps, b.steps):
        if x.token != y.token:
            return f"token {x.index}: {x.token} against {y.token}"
        if x.top_ids and y.top_ids and (x.top_ids != y.top_ids or x.top_logits != y.top_logits):
            return f"the log-probabilities of token {x.index}"
    if len(a.tokens) != len(b.tokens):
        return f"{len(a.tokens)} tokens against {len(b.tokens)}"
    return None


def _facts(vm: Any) -> dict[str, Any]:
    f = dict(vm.facts())
    f["backend"] = "llama-server"
    for k in ("gpu_layers", "load_seconds", "n_params", "description"):
        f.pop(k, None)  # facts of the vocabulary-only copy, not of the model the server loaded
    return f


def run_server_trace(cfg: RunConfig, *, server_bin: str | None = None, server_args: str | None = "",
                     progress: ProgressFn | None = None, cancel: Callable[[], bool] | None = None,
                     on_event: EventFn | None = None, diagnose: bool = True, start_timeout: float | None = None) -> Trace:
    """One run on its own runner, diagnosed from the outside when it forks; every server stopped on return."""
    with ServerRunner(progress=progress, server_bin=server_bin, server_args=server_args) as r:
        trace = r.run(cfg, on_event=on_event, cancel=cancel)
        cancelled = "cancelled" in (trace.vanilla.stop_reason, trace.speculative.stop_reason)
        if diagnose and not cancelled and not trace.comparison.identical:
            try:
                trace.diagnosis = r.diagnose(trace, cfg, cancel=cancel)
            except Cancelled:
                (progress or (lambda m: None))("diagnosis cancelled; the arms are kept")
        return trace
