"""The in-process half of a probe: each trigger's scenario on real contexts, judged by the serial-verify control.

:func:`probe_in_session` is a job (:meth:`specview.core.registry.Runner.job`): it
runs where the engine's models live (the worker process) and returns a
:class:`~.result.ProbeReport`.  Per scenario:

1. plain greedy on a context of the scenario's size (cached per prompt and size);
2. the speculative loop on a fresh context with the scenario's drafter (a
   :class:`~.scenarios.ScriptedDrafter`, or ngram-simple) and rollback mode;
3. the trigger's own count (zero-draft rounds right after accepted drafts, whole
   rejections, rollbacks deeper than the snapshots kept, drafts cut by the
   context's edge ...): no count, no claim (``unproven``);
4. a fork is judged by the control: the same script with every verify row its
   own single-token pass on a fresh context, and where that forks too, plain
   greedy once more (a state bug is proven only where plain greedy repeats).

A fork in the snapshots mode whose control reproduces vanilla stays
``unproven``: the control's single-token passes keep their states as copies and
never take llama.cpp's n_rs_seq snapshots, so it does not walk the path that
forked (the checkpoint row covers the same drafts).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from ..arms.compare import first_difference
from ..arms.drafters import NgramDrafter
from ..arms.generate import GenOptions, run_to_end, speculative_greedy, vanilla_greedy
from ..engine import ROLLBACK_MODES, Engine
from ..errors import Cancelled, ConfigError
from ..trace import ArmResult, Step
from .result import IDENTICAL, IN_PROCESS, NEAR_TIE, STATE, UNPROVEN, ProbeReport, TriggerResult
from .scenarios import LOOP_PROMPT, Scenario, ScriptedDrafter, check_triggers, in_process_scenarios
from .neighbour import neighbour_in_session

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]

#: the mechanism each rollback mode's own path records (a snapshot context's copies are "state-copy", not n_rs_seq)
MECHANISM = {"seq-rm": "seq-rm", "snapshots": "n_rs_seq", "checkpoint": "checkpoint"}
#: the n-gram the in-process n-gram drafter looks up (short, so that a looping text keeps it drafting)
NGRAM_N = 1
#: the snapshots a context keeps by default (llama.cpp's draft n_max), for the deep rollback
DEPTH = 3


def _round_up(n: int, to: int = 256) -> int:
    return ((n + to - 1) // to) * to


class Contexts:
    """The job's contexts on one loaded model, by (role, settings, size); every one closed at the end."""

    def __init__(self, model: Any):
        self.model = model
        self._open: dict[tuple, Engine] = {}

    def get(self, role: str, settings: Any, n_ctx: int, *, fresh: bool = False) -> Engine:
        key = (role, settings, n_ctx)
        e = self._open.pop(key, None)
        if e is not None and fresh:
            e.close()
            e = None
        if e is None:
            e = self.model.new_engine(settings, n_ctx)
        self._open[key] = e
        return e

    def close(self) -> None:
        for e in self._open.values():
            e.close()
        self._open.clear()


class Probe:
    """One in-process probe of one target (see the module docstring)."""

    def __init__(self, session: Any, *, backend: str, target: str, settings: Any, prompt: str, n: int,
                 long_n: int, n_max: int, chat: bool = False, progress: ProgressFn | None = None,
                 cancel: CancelFn | None = None):
        self.session, self.backend, self.target, self.settings = session, backend, target, settings
        self.prompt_text, self.n, self.long_n, self.n_max, self.chat = prompt, n, long_n, n_max, chat
        self.say = progress or (lambda m: None)
        self.cancel = cancel or (lambda: False)
        self.model = session.model(backend, target, settings)
        self.contexts = Contexts(self.model)
        self._vanilla: dict[tuple, ArmResult] = {}

    # -- what the scenarios share ---------------------------------------------------------------------
    def tokens(self, text: str | None) -> list[int]:
        return self.model.tokenize(text or self.prompt_text, chat=self.chat)

    def settings_for(self, mode: str | None) -> Any:
        return self.settings if mode is None else replace(self.settings, rollback=mode)

    def opts(self, max_tokens: int) -> GenOptions:
        return GenOptions(max_tokens=max_tokens, ignore_eos=True, n_batch=self.settings.n_batch)

    def modes(self) -> tuple[list[str], list[str]]:
        """(the rollback modes a context of this target accepts, one line per refused mode)."""
        ok, refused = [], []
        for mode in ROLLBACK_MODES:
            try:
                self.model.new_engine(self.settings_for(mode), 256).close()
                ok.append(mode)
            except ConfigError as exc:
                refused.append(f"rollback {mode}: {exc}")
        return ok, refused

    def vanilla(self, prompt: list[int], n_ctx: int, max_tokens: int, *, fresh: bool = False) -> ArmResult:
        """Plain greedy of ``prompt`` on a context of ``n_ctx`` (cached: a shorter run is a prefix)."""
        key = (tuple(prompt), n_ctx)
        arm = self._vanilla.get(key)
        if arm is None or len(arm.tokens) < max_tokens or fresh:
            eng = self.contexts.get("probe-vanilla" if not fresh else "probe-vanilla-again", self.settings, n_ctx,
                                    fresh=True)
            arm = run_to_end(vanilla_greedy(eng, prompt, self.opts(max_tokens), cancel=self.cancel))
            self._check()
            if fresh:
                return arm
            self._vanilla[key] = arm
        return arm

    def _check(self) -> None:
        if self.cancel():
            raise Cancelled("probe cancelled")

    # -- one scenario ---------------------------------------------------------------------------------
    def drafter(self, sc: Scenario, oracle: list[int]) -> Any:
        if sc.ngram:
            return NgramDrafter(size_n=NGRAM_N, size_m=sc.n_max)
        eog = frozenset(self.model.vocab.eog)
        return ScriptedDrafter(oracle, sc.script, n_max=sc.n_max, n_vocab=self.model.vocab.n_vocab, avoid=eog,
                               deep=sc.deep, edge=sc.edge)

    def size(self, sc: Scenario, n_prompt: int) -> int:
        return sc.n_ctx or _round_up(n_prompt + sc.max_tokens + max(sc.n_max, sc.deep) + 2)

    def arm(self, sc: Scenario, prompt: list[int], oracle: list[int], n_ctx: int, max_tokens: int, *,
            serial: bool, stop_at: Sequence[int] | None = None) -> tuple[ArmResult, Engine, Any]:
        """The scenario's speculative arm (stopping at its first token off ``stop_at`` when given)."""
        eng = self.contexts.get("probe-control" if serial else "probe-speculative", self.settings_for(sc.rollback),
                                n_ctx, fresh=True)
        drafter = self.drafter(sc, oracle)
        hint = sc.n_max if sc.n_max_hint is None else sc.n_max_hint
        gen = speculative_greedy(eng, drafter, prompt, self.opts(max_tokens), n_max_hint=hint, serial_verify=serial,
                                 cancel=self.cancel)
        if stop_at is None:
            arm = run_to_end(gen)
        else:
            arm = _until_off(gen, stop_at)
        self._check()
        return arm, eng, drafter

    def run(self, sc: Scenario) -> TriggerResult:
        t0 = time.perf_counter()
        prompt = self.tokens(sc.prompt)
        n_ctx = self.size(sc, len(prompt))
        max_tokens = sc.max_tokens
        if sc.trigger == "context-edge":
            # a prompt long enough that the run's tokens fill the context exactly (the engine may pad n_ctx)
            real = self.contexts.get("probe-speculative", self.settings_for(sc.rollback), n_ctx, fresh=True).n_ctx
            prompt = long_prompt(prompt, real - sc.max_tokens - 1)
            max_tokens = real - len(prompt) - 1
        vanilla = self.vanilla(prompt, n_ctx, max_tokens)
        ref = vanilla.tokens[:max_tokens]
        oracle = prompt + ref
        arm, eng, drafter = self.arm(sc, prompt, oracle, n_ctx, max_tokens, serial=False)
        d = first_difference(ref, arm.tokens)
        counts = count_rounds(arm, upto=d)
        counts["mechanisms"] = dict((getattr(arm, "rollbacks", None) or {}).get("target") or {})
        counts["rollback_mode"] = getattr(eng, "rollback", None)
        counts["snapshot_depth"] = getattr(eng, "rollback_depth", None)
        stats = getattr(getattr(eng, "memory", None), "stats", None)
        if stats is not None and hasattr(stats, "to_dict"):
            counts["memory"] = stats.to_dict()
        reached, what = reached_trigger(sc, arm, drafter, counts, eng, len(prompt), upto=d)
        row = TriggerResult(sc.trigger, sc.label, IN_PROCESS, UNPROVEN, "", reached, len(arm.tokens), d,
                            counts=counts)
        if d is None:
            row.result = IDENTICAL if reached else UNPROVEN
            row.evidence = (f"{len(ref)}/{len(ref)} tokens equal plain greedy; {what}" if reached
                            else f"the trigger did not happen: {what}")
        else:
            self.judge(row, sc, prompt, oracle, n_ctx, max_tokens, ref, d, what, arm.tokens)
        row.seconds = time.perf_counter() - t0
        return row

    def snapshot_check(self, sc: Scenario, prompt: list[int], oracle: list[int], n_ctx: int, max_tokens: int,
                       spec: list[int]) -> dict[str, Any]:
        """The arm again with every n_rs_seq snapshot rollback done by checkpoint and replay (the paths the
        serial-verify control walks): the same tokens as the arm prove its snapshots (exact, no threshold)."""
        eng = self.contexts.get("probe-snapshots", self.settings_for(sc.rollback), n_ctx, fresh=True)
        by_ckpt = getattr(eng, "snapshots_by_checkpoint", None)
        if by_ckpt is None or not by_ckpt():
            return {"identical": None, "skipped": "this engine cannot roll a snapshot context back by a checkpoint"}
        hint = sc.n_max if sc.n_max_hint is None else sc.n_max_hint
        gen = speculative_greedy(eng, self.drafter(sc, oracle), prompt, self.opts(max_tokens), n_max_hint=hint,
                                 cancel=self.cancel)
        arm = _until_off(gen, spec)
        self._check()
        d = first_difference(spec, arm.tokens)
        return {"identical": d is None, "first_mismatch": d, "n_tokens": len(arm.tokens)}

    def judge(self, row: TriggerResult, sc: Scenario, prompt: list[int], oracle: list[int], n_ctx: int,
              max_tokens: int, ref: list[int], d: int, what: str, spec: list[int]) -> None:
        """A fork: the serial-verify control, then (where it forks too) plain greedy once more."""
        self.say(f"{sc.trigger} ({sc.label}): fork at token {d}; the serial-verify control")
        ctl, _, _ = self.arm(sc, prompt, oracle, n_ctx, max_tokens, serial=True, stop_at=ref)
        cd = first_difference(ref[:len(ctl.tokens)] if len(ctl.tokens) < len(ref) else ref, ctl.tokens)
        row.control = {"form": "single-token-passes", "identical": cd is None, "first_mismatch": cd,
                       "n_tokens": len(ctl.tokens), "rollbacks": count_rounds(ctl)["rollbacks"]}
        if cd is None:
            snaps = int(row.counts.get("mechanisms", {}).get("n_rs_seq", 0)) or row.counts["rollbacks"].get("snapshots")
            proof = self.snapshot_check(sc, prompt, oracle, n_ctx, max_tokens, spec) if snaps else None
            if snaps:
                row.control["snapshot_check"] = proof
            if snaps and not (proof or {}).get("identical"):
                row.result = UNPROVEN
                why = ((proof or {}).get("skipped") or
                       f"with each of its {snaps} n_rs_seq snapshot rollbacks done by checkpoint and replay the arm "
                       f"gives other tokens from token {(proof or {}).get('first_mismatch')}")
                row.evidence = (f"fork at token {d}; the serial-verify control equals plain greedy, but its "
                                "single-token passes never take the n_rs_seq snapshots the arm rolled back by, and "
                                f"the snapshot check does not prove them ({why}); {what}")
            else:
                row.result = NEAR_TIE
                row.evidence = (f"fork at token {d}; the serial-verify control (every verify row its own "
                                f"single-token pass) equals plain greedy over {len(ctl.tokens)} tokens: batched "
                                f"numerics" + (f" (its {snaps} n_rs_seq snapshot rollbacks proven by the snapshot "
                                               "check)" if snaps else "") + f"; {what}")
            return
        again = self.vanilla(prompt, n_ctx, cd + 1, fresh=True)
        repeats = again.tokens[:cd + 1] == ref[:cd + 1]
        row.control["vanilla_repeats"] = repeats
        if repeats:
            row.result = STATE
            row.evidence = (f"fork at token {d}; the serial-verify control forks too, at token {cd}, and plain greedy "
                            f"repeats itself: the loop or its memory is wrong; {what}")
        else:
            row.result = UNPROVEN
            row.evidence = f"fork at token {d}; plain greedy does not repeat itself here (nondeterministic); {what}"


def long_prompt(prompt: Sequence[int], n: int) -> list[int]:
    """``prompt`` repeated to ``n`` tokens (at least the prompt itself)."""
    out = list(prompt)
    while len(out) < n:
        out.extend(prompt[1:] if len(prompt) > 1 else prompt)  # the BOS once
    return out[:max(n, len(prompt))]


def _until_off(gen: Any, ref: Sequence[int]) -> ArmResult:
    """Drain an arm generator up to its first token that differs from ``ref`` (or past ``ref``'s end)."""
    tokens: list[int] = []
    try:
        while True:
            try:
                ev = next(gen)
            except StopIteration as stop:
                return stop.value
            if isinstance(ev, Step):
                tokens.append(ev.token)
                if ev.index >= len(ref) or ev.token != ref[ev.index]:
                    break
    finally:
        gen.close()
    return ArmResult(name="speculative", tokens=tokens)


def count_rounds(arm: ArmResult, *, upto: int | None = None) -> dict[str, Any]:
    """The rounds of ``arm`` up to the one that emitted token ``upto`` (the fork), counted by kind."""
    rounds = [r for r in arm.rounds[1:] if upto is None or r.first_step <= upto]
    rollbacks: dict[str, int] = {}
    for r in rounds:
        if r.rollback:
            rollbacks[r.rollback] = rollbacks.get(r.rollback, 0) + 1
    zero_after = sum(1 for a, b in zip(rounds, rounds[1:]) if a.accepted > 0 and b.drafted == 0)
    return {"rounds": len(rounds), "drafted": sum(r.drafted for r in rounds),
            "accepted": sum(r.accepted for r in rounds), "rollbacks": rollbacks,
            "whole_rejections": sum(1 for r in rounds if r.drafted > 0 and r.accepted == 0),
            "zero_after_accept": zero_after,
            "deepest_drop": max((r.drafted - r.accepted for r in rounds), default=0),
            "replays": sum(1 for r in rounds if r.replay)}


def reached_trigger(sc: Scenario, arm: ArmResult, drafter: Any, counts: dict[str, Any], eng: Engine,
                    n_prompt: int, *, upto: int | None) -> tuple[bool, str]:
    """Whether the scenario's trigger happened before the fork (``upto``), and the count that says so."""
    rb = counts["rollbacks"]
    rb_text = ", ".join(f"{v} {k}" for k, v in sorted(rb.items())) or "none"
    if sc.trigger == "zero-after-accept":
        k = counts["zero_after_accept"]
        return k > 0, f"{k} zero-draft rounds right after accepted drafts"
    if sc.trigger == "whole-reject":
        k = counts["whole_rejections"]
        return k > 0, f"{k} drafts rejected whole (rollbacks: {rb_text})"
    if sc.trigger == "deep-rollback":
        depth = counts.get("snapshot_depth") or 0
        deep = [r for r in arm.rounds[1:] if r.drafted - r.accepted > max(depth, 0) and r.drafted > 0
                and (upto is None or r.first_step <= upto)]
        how = sorted({r.rollback for r in deep if r.rollback})
        kept = f"{depth} snapshots kept" if depth else "no snapshots kept"
        mech = counts.get("mechanisms") or {}
        paths = (f"; the context's paths: {', '.join(f'{v} {m}' for m, v in sorted(mech.items()) if v)}"
                 if mech else "")
        return bool(deep), (f"{len(deep)} rollbacks of up to {counts['deepest_drop']} tokens ({kept}), taken by "
                            f"{', '.join(how) or 'nothing'}{paths}")
    if sc.trigger == "context-edge":
        end = n_prompt + len(arm.tokens) - 1  # the cell after the last one the run's verify passes wrote
        cut = getattr(drafter, "cut", 0)
        hit = end >= eng.n_ctx - 2 and cut > 0
        counts["edge"] = {"end": end, "n_ctx": eng.n_ctx, "cut": cut}
        return hit, (f"the run wrote up to cell {end - 1} of a {eng.n_ctx}-cell context; {cut} drafts cut short of "
                     f"{sc.n_max} tokens by the context's edge")
    if sc.trigger == "long-run":
        n = len(arm.tokens) if upto is None else upto
        return n >= sc.max_tokens, (f"{n} tokens before any fork, {counts['rounds']} rounds, rollbacks: {rb_text}, "
                                    f"{counts['zero_after_accept']} zero-draft rounds after accepted drafts")
    if sc.trigger == "ngram-loop":
        return counts["drafted"] > 0, (f"{counts['drafted']} n-gram tokens drafted from the looping text, "
                                       f"{counts['accepted']} accepted, rollbacks: {rb_text}")
    if sc.trigger == "rollback-modes":
        mech = counts.get("mechanisms") or {}
        if mech:  # what the context itself says each rollback used
            name = MECHANISM.get(sc.rollback or "", sc.rollback or "")
            k = int(mech.get(name, 0))
            paths = ", ".join(f"{v} {m}" for m, v in sorted(mech.items()) if v) or "none"
            return k > 0, f"{k} rollbacks by {name} (the context's paths: {paths})"
        k = rb.get(sc.rollback or "", 0)
        return k > 0, f"{k} rollbacks by {sc.rollback} (all rollbacks: {rb_text})"
    return False, "no count for this trigger"


def probe_in_session(session: Any, *, target: str, settings: Any, backend: str = "llama.cpp",
                     triggers: Sequence[str] | None = None, prompt: str = "the cat and the dog", n: int = 48,
                     long_n: int = 2048, n_max: int = 3, chat: bool = False, progress: ProgressFn | None = None,
                     cancel: CancelFn | None = None, on_row: Callable[[Any], None] | None = None) -> ProbeReport:
    """Every in-process scenario of ``triggers`` (all by default) on ``target``: a job of the target's runner."""
    t0 = time.perf_counter()
    names = check_triggers(triggers)
    probe = Probe(session, backend=backend, target=target, settings=settings, prompt=prompt, n=n, long_n=long_n,
                  n_max=n_max, chat=chat, progress=progress, cancel=cancel)
    report = ProbeReport(target=target, config={"prompt": prompt, "n": n, "long_n": long_n, "n_max": n_max,
                                                "chat": chat, "triggers": list(names),
                                                "rollback": getattr(settings, "rollback", None),
                                                "threads": getattr(settings, "threads", None)})
    try:
        modes, refused = probe.modes()
        report.notes.extend(refused)
        deep_mode = "snapshots" if "snapshots" in modes else None
        for sc in in_process_scenarios(names, n=n, long_n=long_n, n_max=n_max, depth=DEPTH, modes=modes):
            if sc.trigger == "deep-rollback" and deep_mode:
                sc = replace(sc, rollback=deep_mode, label=f"{sc.label}, snapshots")
            probe.say(f"in-process: {sc.trigger} ({sc.label})")
            row = probe.run(sc)
            report.rows.append(row)
            if on_row is not None:
                on_row(row)
        if "neighbour" in names:
            probe.say("in-process: neighbour (a second context on the same weights)")
            row = neighbour_in_session(probe, LOOP_PROMPT)
            report.rows.insert(next((i for i, r in enumerate(report.rows)
                                     if names.index(r.trigger) > names.index("neighbour")), len(report.rows)), row)
            if on_row is not None:
                on_row(row)
        report.environment = {"model": probe.model.facts(), "backend": backend}
    finally:
        probe.contexts.close()
    report.seconds[IN_PROCESS] = time.perf_counter() - t0
    return report
