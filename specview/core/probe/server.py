"""The llama-server half of a probe: each trigger forced with what the server takes, judged by ``-ub 1``.

A server cannot be given a scripted drafter, so each trigger is forced with its
own parameters (:data:`~.scenarios.TRIGGERS` says how): the spec type, a drafter
that agrees with the target (``accept_draft``, the target itself by default) or
one that disagrees (``reject_draft``), ``n_max``, ``p_min``, ``-c`` and ``-np 2``.
Each run is a whole specview run on the registry's llama-server runner (the
vanilla arm and the speculative arm on the same server, rounds rebuilt from the
server's streamed counters), so the trigger is counted from the rounds.

A fork is judged by the same run on a server with ``-ub 1`` (every token its own
micro-batch): that it reproduces its vanilla arm proves batched numerics; that
it does not, while its vanilla arm repeats itself on a second run, proves a
state bug.  The neighbour trigger compares my answer alone and beside a
neighbour request on a two-slot server, the ``-ub 1`` two-slot server its control.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from ..arms.compare import first_difference
from ..config import EngineSettings, RunConfig
from ..errors import SpecviewError
from ..trace import Trace
from .result import IDENTICAL, NEAR_TIE, SERVER, STATE, UNPROVEN, ProbeReport, TriggerResult
from .runner import count_rounds, long_prompt
from .scenarios import LOOP_PROMPT, check_triggers

ProgressFn = Callable[[str], None]
NGRAM_TYPES = ("ngram-map-k", "ngram-map-k4v", "ngram-mod")
#: each n-gram type's lookup shortened to one token (as in-process), so that a looping text keeps it drafting
NGRAM_FLAGS = {"ngram-map-k": "--spec-ngram-map-k-size-n 1 --spec-ngram-map-k-size-m {n_max}",
               "ngram-map-k4v": "--spec-ngram-map-k4v-size-n 1 --spec-ngram-map-k4v-size-m {n_max}",
               "ngram-mod": "--spec-ngram-mod-n-match 1 --spec-ngram-mod-n-min 1 --spec-ngram-mod-n-max {n_max}"}
#: p_min values tried, in turn, until accepted drafts are followed by a zero-draft round
P_MINS = (0.5, 0.8, 0.95, 0.2)
DEEP_N_MAX = 8


class ServerProbe:
    """One target's llama-server scenarios on one runner (see the module docstring)."""

    def __init__(self, runner: Any, *, target: str, settings: EngineSettings, prompt: str, n: int, long_n: int,
                 n_max: int, accept_draft: str | None = None, reject_draft: str | None = None, chat: bool = False,
                 rollback: str | None = None, progress: ProgressFn | None = None,
                 cancel: Callable[[], bool] | None = None):
        self.runner, self.target, self.settings = runner, target, settings
        self.prompt, self.n, self.long_n, self.n_max, self.chat = prompt, n, long_n, n_max, chat
        self.accept_draft = accept_draft or target
        self.reject_draft = reject_draft
        self.rollback = rollback  # what llama-server does for draft-simple on this target (the llama.cpp decision)
        self.say = progress or (lambda m: None)
        self.cancel = cancel or (lambda: False)

    def cfg(self, **kw: Any) -> RunConfig:
        base: dict[str, Any] = dict(target=self.target, backend="llama-server", prompt=self.prompt, chat=self.chat,
                                    ignore_eos=True, max_tokens=self.n, n_max=self.n_max, spec_type="draft-simple",
                                    draft=self.accept_draft, engine=self.settings)
        base.update(kw)
        if base["spec_type"] not in ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"):
            base["draft"] = None
        return RunConfig(**base)

    def spec_types(self) -> list[str]:
        try:
            from ..registry import get_backend

            return list(get_backend("llama-server").spec_types(self.settings))
        except SpecviewError:
            return []

    # -- one run and its control ---------------------------------------------------------------------
    def row(self, trigger: str, label: str, cfg: RunConfig,
            reached: Callable[[Trace, dict[str, Any]], tuple[bool, str]]) -> TriggerResult:
        t0 = time.perf_counter()
        self.say(f"llama-server: {trigger} ({label})")
        trace = self.runner.run(cfg, cancel=self.cancel)
        v, s, d, edge = compared(trace)
        counts = count_rounds(trace.speculative, upto=d)
        if not counts["rollbacks"] and self.rollback == "seq-rm":  # the server labels only its replays
            dropped = sum(1 for r in trace.speculative.rounds[1:] if r.drafted > r.accepted
                          and (d is None or r.first_step <= d))
            counts["rollbacks"] = {"seq-rm": dropped} if dropped else {}
        counts["server"] = ((trace.extra.get("server") or {}).get("speculative") or {}).get("server", {}).get("args")
        ok, what = reached(trace, counts)
        row = TriggerResult(trigger, label, SERVER, UNPROVEN, "", ok, len(s), d, counts=counts)
        what += edge
        if d is None:
            row.result = IDENTICAL if ok else UNPROVEN
            row.evidence = (f"{len(v)}/{len(v)} tokens equal plain greedy on the same server; {what}" if ok
                            else f"the trigger did not happen: {what}")
        else:
            self.control(row, cfg, d, what)
        row.seconds = time.perf_counter() - t0
        return row

    def control(self, row: TriggerResult, cfg: RunConfig, d: int, what: str) -> None:
        """A fork: the same run on a ``-ub 1`` server; where that forks too, once more for a vanilla that repeats."""
        self.say(f"{row.trigger} ({row.label}): fork at token {d}; the same run with -ub 1")
        ub1 = replace(cfg, serial_verify=True)
        ctl = self.runner.run(ub1, cancel=self.cancel)
        _, _, cd, _ = compared(ctl)
        row.control = {"form": "ub1-server", "identical": cd is None, "first_mismatch": cd,
                       "n_tokens": len(ctl.speculative.tokens), "rollbacks": count_rounds(ctl.speculative)["rollbacks"]}
        if cd is None:
            row.result = NEAR_TIE
            row.evidence = (f"fork at token {d}; with -ub 1 (every token its own micro-batch) the same run equals its "
                            f"plain greedy over {len(ctl.speculative.tokens)} tokens: batched numerics; {what}")
            return
        again = self.runner.run(ub1, cancel=self.cancel, reuse_vanilla=False)
        repeats = again.vanilla.tokens == ctl.vanilla.tokens
        row.control["vanilla_repeats"] = repeats
        if repeats:
            row.result = STATE
            row.evidence = (f"fork at token {d}; with -ub 1 it forks too, at token {cd}, and plain greedy repeats "
                            f"itself: the server's loop or its memory is wrong; {what}")
        else:
            row.evidence = f"fork at token {d}; plain greedy does not repeat itself on this server; {what}"

    # -- the triggers --------------------------------------------------------------------------------
    def zero_after_accept(self) -> TriggerResult:
        row = None
        for p in P_MINS:
            row = self.row("zero-after-accept", f"draft-simple, p_min {p:g}", self.cfg(p_min=p), _zero_after)
            if row.reached or row.result == STATE:
                break
        assert row is not None
        return row

    def whole_reject(self) -> TriggerResult:
        return self.row("whole-reject", "draft-simple, disagreeing drafter", self.cfg(draft=self.reject_draft),
                        lambda t, c: (c["whole_rejections"] > 0, f"{c['whole_rejections']} drafts rejected whole "
                                      f"({_rb(c)})"))

    def deep_rollback(self) -> TriggerResult:
        def deep(t: Trace, c: dict[str, Any]) -> tuple[bool, str]:
            k = sum(1 for r in t.speculative.rounds[1:] if r.drafted - r.accepted > 3)
            why = ("llama-server keeps n_rs_seq = n_max snapshots only for draft-mtp/eagle3/dflash/dspark, so for "
                   "draft-simple every rollback is the checkpoint fallback" if self.rollback == "checkpoint" else
                   "a KV cache drops them by seq_rm however deep")
            return k > 0, f"{k} rollbacks of more than 3 tokens, up to {c['deepest_drop']} ({_rb(c)}); {why}"
        return self.row("deep-rollback", f"draft-simple, n_max {DEEP_N_MAX}",
                        self.cfg(draft=self.reject_draft, n_max=DEEP_N_MAX), deep)

    def context_edge(self) -> TriggerResult:
        base = self.runner.plan(self.cfg()).tokens
        n_ctx = ((len(base) + self.n + self.n_max + 2 + 255) // 256) * 256
        tokens = long_prompt(base, n_ctx - self.n - 1)  # a long prompt: the run's tokens fill the rest
        n_prompt = len(tokens)
        n = n_ctx - n_prompt - 1
        eng = replace(self.settings, n_ctx=n_ctx)

        pool = getattr(self.runner, "pool", None)
        if pool is not None:  # a server kept from another run may have a larger context, and so no edge here
            pool.stop_all()

        def edge(t: Trace, c: dict[str, Any]) -> tuple[bool, str]:
            if int(t.config.get("n_ctx_used") or 0) != n_ctx:
                return False, f"the server's context was {t.config.get('n_ctx_used')} cells, not {n_ctx}"
            end = n_prompt + len(t.speculative.tokens)
            last = [r for r in t.speculative.rounds[1:] if r.first_step + self.n_max + 1 >= len(t.speculative.tokens)]
            cut = [r for r in last if r.drafted < self.n_max]
            return (end >= n_ctx - 1 and bool(t.speculative.n_drafted)), (
                f"the run filled {end} of {n_ctx} cells; the last {len(last)} rounds drafted "
                f"{[r.drafted for r in last]} (n_max {self.n_max}), {len(cut)} of them cut short")
        return self.row("context-edge", f"-c {n_ctx}", self.cfg(max_tokens=n, engine=eng, prompt=None,
                                                                prompt_tokens=tuple(tokens)), edge)

    def long_run(self) -> TriggerResult:
        def long(t: Trace, c: dict[str, Any]) -> tuple[bool, str]:
            _, _, d, _ = compared(t)
            n = min(len(t.vanilla.tokens), len(t.speculative.tokens)) if d is None else d
            full = "context" in (t.vanilla.stop_reason, t.speculative.stop_reason) and n >= 0.9 * self.long_n
            return n >= self.long_n or full, f"{n} tokens before any fork, {c['rounds']} rounds ({_rb(c)})"
        return self.row("long-run", f"{self.long_n} tokens", self.cfg(max_tokens=self.long_n), long)

    def ngram_loop(self, types: Sequence[str]) -> list[TriggerResult]:
        out = []
        for st in [t for t in NGRAM_TYPES if t in types]:
            flags = NGRAM_FLAGS[st].format(n_max=self.n_max)
            eng = replace(self.settings, server_args=f"{self.settings.server_args} {flags}".strip())
            out.append(self.row("ngram-loop", st, self.cfg(spec_type=st, prompt=LOOP_PROMPT, engine=eng),
                                lambda t, c: (c["drafted"] > 0, f"{c['drafted']} n-gram tokens drafted from the "
                                              f"looping text, {c['accepted']} accepted ({_rb(c)})")))
        return out

    def rollback_modes(self, types: Sequence[str]) -> tuple[list[TriggerResult], list[str]]:
        rows, notes = [], []
        mode = self.rollback or "seq-rm"
        if mode == "checkpoint":
            rows.append(self.row("rollback-modes", "checkpoint (draft-simple)", self.cfg(),
                                 lambda t, c: (c["replays"] > 0, f"{c['replays']} checkpoint restores and replays")))
        else:
            rows.append(self.row("rollback-modes", f"{mode} (draft-simple)", self.cfg(),
                                 lambda t, c: (c["drafted"] > c["accepted"],
                                               f"{c['drafted'] - c['accepted']} rejected draft tokens dropped")))
        from ..registry import get_backend

        if mode == "checkpoint":
            if "draft-mtp" in types and get_backend("llama-server").has_mtp_heads(self.target):
                rows.append(self.row("rollback-modes", "snapshots (draft-mtp)", self.cfg(spec_type="draft-mtp"),
                                     lambda t, c: (c["drafted"] > c["accepted"],
                                                   f"{c['drafted'] - c['accepted']} rejected draft tokens dropped "
                                                   "by n_rs_seq snapshots")))
            else:
                notes.append("llama-server: rollback snapshots not run: the server keeps n_rs_seq snapshots only for "
                             "draft-mtp, draft-eagle3, draft-dflash and draft-dspark, and this target has no MTP heads")
        return rows, notes

    def neighbour(self) -> TriggerResult:
        t0 = time.perf_counter()
        self.say("llama-server: neighbour (-np 2)")
        cfg = self.cfg(spec_type="none")
        other = self.runner.plan(replace(cfg, prompt=LOOP_PROMPT)).tokens
        for _ in range(3):  # the two requests' timing is the machine's: ask again until they overlapped
            res = self.runner.neighbours(cfg, other=other, cancel=self.cancel)
            ok = bool(res["neighbour_in_flight"]) and res["neighbour_tokens_during"] > 0
            if ok:
                break
        d = first_difference(res["alone"], res["beside"])
        what = (f"the neighbour streamed {res['neighbour_tokens_during']} tokens while mine ran"
                + ("" if res["neighbour_in_flight"] else " but was not in flight throughout")
                + f"; slots {res['slots']}")
        row = TriggerResult("neighbour", "-np 2", SERVER, UNPROVEN, "", ok, len(res["beside"]), d,
                            counts={"neighbour_tokens_during": res["neighbour_tokens_during"], "slots": res["slots"],
                                    "server": res["args"]})
        if d is None:
            row.result = IDENTICAL if ok else UNPROVEN
            row.evidence = (f"{len(res['alone'])}/{len(res['alone'])} tokens alone = beside the neighbour; {what}"
                            if ok else f"the trigger did not happen: {what}")
        else:
            self.say(f"neighbour: my answer forks at token {d} beside the neighbour; the same with -ub 1")
            ctl = self.runner.neighbours(cfg, other=other, ubatch=1, repeat_alone=True, cancel=self.cancel)
            cd = first_difference(ctl["alone"], ctl["beside"])
            repeats = ctl["alone_again"] == ctl["alone"]
            row.control = {"form": "ub1-server, -np 2", "identical": cd is None, "first_mismatch": cd,
                           "n_tokens": len(ctl["beside"]), "vanilla_repeats": repeats,
                           "in_flight": ctl["neighbour_in_flight"]}
            if cd is None:
                row.result = NEAR_TIE
                row.evidence = (f"fork at token {d} beside the neighbour; with -ub 1 alone = beside: the neighbour "
                                f"changes the batch composition (numerics), not my state; {what}")
            elif repeats and ctl["neighbour_in_flight"]:
                row.result = STATE
                row.evidence = (f"fork at token {d} beside the neighbour; with -ub 1 too (token {cd}) while my answer "
                                f"alone repeats itself: a cross-sequence leak; {what}")
            else:
                row.evidence = f"fork at token {d}; the -ub 1 control could not decide (alone repeats: {repeats})"
        row.seconds = time.perf_counter() - t0
        return row


def compared(t: Trace) -> tuple[list[int], list[int], int | None, str]:
    """(vanilla, speculative, first difference, a note): where an arm stopped because the server's context was
    full, the arms are compared on the tokens both have (a speculative arm needs room for its draft, so it may
    stop a few tokens before plain greedy does), and the note says so."""
    v, s = list(t.vanilla.tokens), list(t.speculative.tokens)
    if "context" in (t.vanilla.stop_reason, t.speculative.stop_reason) and len(v) != len(s):
        n = min(len(v), len(s))
        return v[:n], s[:n], first_difference(v[:n], s[:n]), (
            f"; the server's context was full: plain greedy stopped after {len(v)} tokens, the speculative arm "
            f"after {len(s)} (compared on the {n} both have)")
    return v, s, first_difference(v, s), ""


def _rb(c: dict[str, Any]) -> str:
    rb = c.get("rollbacks") or {}
    return "rollbacks: " + (", ".join(f"{v} {k}" for k, v in sorted(rb.items())) or "none")


def _zero_after(t: Trace, c: dict[str, Any]) -> tuple[bool, str]:
    return c["zero_after_accept"] > 0, (f"{c['zero_after_accept']} zero-draft rounds right after accepted drafts "
                                        f"({c['drafted']} drafted, {c['accepted']} accepted)")


def probe_server(runner: Any, *, target: str, settings: EngineSettings, triggers: Sequence[str] | None = None,
                 prompt: str = "the cat and the dog", n: int = 48, long_n: int = 2048, n_max: int = 3,
                 accept_draft: str | None = None, reject_draft: str | None = None, chat: bool = False,
                 rollback: str | None = None, progress: ProgressFn | None = None,
                 cancel: Callable[[], bool] | None = None,
                 on_row: Callable[[TriggerResult], None] | None = None) -> ProbeReport:
    """Every llama-server scenario of ``triggers`` on ``target``, through ``runner`` (the registry's llama-server
    runner).  ``rollback`` is what llama-server does for draft-simple on the target (the llama.cpp decision)."""
    t0 = time.perf_counter()
    names = check_triggers(triggers)
    sp = ServerProbe(runner, target=target, settings=settings, prompt=prompt, n=n, long_n=long_n, n_max=n_max,
                     accept_draft=accept_draft, reject_draft=reject_draft, chat=chat, rollback=rollback,
                     progress=progress, cancel=cancel)
    report = ProbeReport(target=target, config={"server_accept_draft": sp.accept_draft,
                                                "server_reject_draft": reject_draft})
    types = sp.spec_types()
    for name in names:
        if name in ("whole-reject", "deep-rollback") and not reject_draft:
            report.notes.append(f"llama-server: {name} not run: it needs a drafter that disagrees with the target "
                                "(--reject-draft FILE)")
            continue
        if name == "ngram-loop" and not any(t in types for t in NGRAM_TYPES):
            report.notes.append(f"llama-server: ngram-loop not run: the binary offers none of {', '.join(NGRAM_TYPES)}")
            continue
        if name == "rollback-modes":
            rows, notes = sp.rollback_modes(types)
            report.notes.extend(notes)
        elif name == "ngram-loop":
            rows = sp.ngram_loop(types)
        else:
            rows = [getattr(sp, name.replace("-", "_"))()]
        for row in rows:
            report.rows.append(row)
            if on_row is not None:
                on_row(row)
    report.seconds[SERVER] = time.perf_counter() - t0
    return report
