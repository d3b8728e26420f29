"""Controls: runs that differ from the arms in one respect, each compared with the vanilla arm.

* :func:`serial_verify_control` -- the threshold-free one: the speculative loop
  with every verify pass computed as single-token passes must reproduce vanilla
  token for token when the loop and its cache are right; if it does not, vanilla
  is run once more to tell a state bug from nondeterminism.  It records which
  rollback paths it walked.  Its passes are one token wide, so it never walks
  llama.cpp's n_rs_seq snapshots (kept only for the positions of the last
  multi-token pass); where the speculative arm rolled back through them,
  :func:`snapshot_check` proves those rollbacks, or the verdict says they are
  unproven.
* :func:`control_matrix` -- ``--controls``: vanilla twice, zero-draft, n-gram,
  another prefill chunk.

Everything runs on the session's already loaded models.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

from ..arms.compare import first_difference
from ..arms.generate import GenOptions, rollbacks_since, rollbacks_used, run_to_end, speculative_greedy, vanilla_greedy
from ..trace import Step, Trace
from .classify import CONTROL_CHUNK, DiagnosisCancelled

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]

SERIAL_FORMS = ("single-token-passes", "ub1-server")
SERIAL_DESCRIPTION = ("the speculative loop with every verify pass computed as single-token passes, one per row, "
                      "on the same context (drafting, acceptance and rollback unchanged)")


SNAPSHOT_DESCRIPTION = ("the speculative arm again, its verify passes as they were, but every rollback it did by an "
                        "n_rs_seq snapshot done by restoring a checkpoint saved before the pass and decoding the kept "
                        "tokens again (state copies and decodes, the paths the serial-verify control walks): it must "
                        "give the speculative arm's tokens, one for one")


def _check(cancel: CancelFn) -> None:
    if cancel():
        raise DiagnosisCancelled("diagnosis cancelled")


def _prompt(trace: Trace) -> list[int]:
    return [int(t) for t in trace.prompt["tokens"]]


def vanilla_repeat(session: Any, cfg: Any, trace: Trace, target: Any, n_ctx: int, opts: GenOptions,
                   cancel: CancelFn, *, upto: int | None = None) -> dict[str, Any]:
    """Plain greedy again on a fresh context (up to token ``upto`` only, when given), compared with vanilla."""
    vanilla = trace.vanilla.tokens
    eng = session.engine("control-vanilla", target, cfg.engine, n_ctx)
    if upto is not None:
        opts = replace(opts, max_tokens=max(1, min(opts.max_tokens, upto + 1)))
    t0 = time.perf_counter()
    arm = run_to_end(vanilla_greedy(eng, _prompt(trace), opts, cancel=cancel))
    _check(cancel)
    d = first_difference(vanilla[: len(arm.tokens)] if upto is not None else vanilla, arm.tokens)
    return {"identical": d is None, "first_mismatch": d, "n_tokens": len(arm.tokens),
            "seconds": round(time.perf_counter() - t0, 3)}


def _first_departure(gen: Any, reference: list[int], cancel: CancelFn) -> list[int]:
    """Run an arm generator until its first token that differs from ``reference`` (or past its end); its tokens."""
    tokens: list[int] = []
    try:
        while len(tokens) < len(reference):
            try:
                ev = next(gen)
            except StopIteration:
                break
            if isinstance(ev, Step):
                tokens.append(ev.token)
                if ev.token != reference[ev.index]:
                    break
    finally:
        gen.close()
    _check(cancel)
    return tokens


def snapshot_rollbacks(trace: Trace) -> int:
    """How many of the speculative arm's target rollbacks selected an n_rs_seq snapshot (for a trace without the
    record: its batched rounds rolled back by ``snapshots``)."""
    rec = trace.speculative.rollbacks.get("target")
    if rec is not None:
        return int(rec.get("n_rs_seq", 0))
    return sum(1 for r in trace.speculative.rounds[1:] if r.rollback == "snapshots" and not r.serial)


def snapshot_check(session: Any, cfg: Any, trace: Trace, target: Any, n_ctx: int, opts: GenOptions,
                   say: ProgressFn, cancel: CancelFn) -> dict[str, Any]:
    """The speculative arm again with each n_rs_seq snapshot rollback done by a checkpoint and a replay.

    Exact, not a threshold: the two runs share every verify pass, so where every snapshot restored the state its
    position had, both decode the same tokens; a snapshot that restored another state changes what follows.  Only
    a difference of the two restores' rounding could also part them (a replay pass is narrower than the verify
    pass whose snapshot it replaces), so a difference leaves the snapshots unproven, never proven wrong.
    """
    spec = list(trace.speculative.tokens)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"form": "checkpoint-rollback", "description": SNAPSHOT_DESCRIPTION,
                           "identical_to_speculative": None, "first_mismatch": None, "n_tokens": None,
                           "rollbacks": None, "skipped": None, "seconds": None}
    eng = session.engine("control-snapshots", target, cfg.engine, n_ctx)
    if not eng.snapshots_by_checkpoint():
        out["skipped"] = "this engine cannot roll a snapshot context back by a checkpoint"
        return out
    _check(cancel)
    say("snapshot check: the speculative arm again, its n_rs_seq snapshot rollbacks done by checkpoint and replay")
    drafter, _ = session.make_drafter(cfg, target, n_ctx)
    used0 = rollbacks_used(eng, drafter)
    tokens = _first_departure(speculative_greedy(eng, drafter, _prompt(trace), opts, n_max_hint=cfg.draft_width,
                                                 cancel=cancel), spec, cancel)
    d = first_difference(spec, tokens)
    out.update(identical_to_speculative=d is None, first_mismatch=d, n_tokens=len(tokens),
               rollbacks=rollbacks_since(used0, eng, drafter), seconds=round(time.perf_counter() - t0, 3))
    return out


def serial_verify_control(session: Any, cfg: Any, trace: Trace, target: Any, n_ctx: int, opts: GenOptions,
                          say: ProgressFn, cancel: CancelFn, *,
                          repeat: dict[str, Any] | None = None) -> dict[str, Any]:
    """The serial-verify arm (same drafter, same settings) against the vanilla arm.

    It stops at its first token that differs from vanilla: from there on the
    answer is known.  When it differs, vanilla is run again on a fresh context
    up to that token (unless ``repeat``, a vanilla-twice result, is given): a
    vanilla that does not repeat itself makes the difference nondeterminism,
    not a state bug.  A run that was itself serial is not run again: its own
    speculative arm is the control.  ``rollbacks`` records the paths the control
    walked; when it reproduces vanilla and the speculative arm rolled back by
    n_rs_seq snapshots, :func:`snapshot_check` runs, and ``unproven`` counts the
    snapshot rollbacks neither proved.
    """
    vanilla = trace.vanilla.tokens
    t0 = time.perf_counter()
    passes = None
    if cfg.serial_verify:
        tokens = list(trace.speculative.tokens)
        reused = True
        used = trace.speculative.rollbacks
    else:
        _check(cancel)
        say("serial-verify control: the speculative loop with every verify row as its own single-token pass")
        eng = session.engine("control-serial", target, cfg.engine, n_ctx)
        drafter, _ = session.make_drafter(cfg, target, n_ctx)
        evals0 = eng.n_evals
        used0 = rollbacks_used(eng, drafter)
        gen = speculative_greedy(eng, drafter, _prompt(trace), opts, n_max_hint=cfg.draft_width,
                                 serial_verify=True, cancel=cancel)
        tokens = _first_departure(gen, list(vanilla) + [-1], cancel)  # -1: past vanilla's end is a departure
        passes = eng.n_evals - evals0
        used = rollbacks_since(used0, eng, drafter)
        reused = False
    d = first_difference(vanilla, tokens)
    out: dict[str, Any] = {
        "form": "single-token-passes",
        "description": SERIAL_DESCRIPTION,
        "identical_to_vanilla": d is None,
        "first_mismatch": d,
        "n_tokens": len(tokens),
        "passes": passes,
        "reused_run": reused,
        "rollbacks": used or None,
        "vanilla_repeat": None,
        "snapshot_check": None,
        "unproven": 0,
        "seconds": None,
    }
    if d is not None:
        if repeat is None:
            say(f"the serial-verify arm differs from vanilla at token {d}: running vanilla again up to there")
            repeat = vanilla_repeat(session, cfg, trace, target, n_ctx, opts, cancel, upto=d)
        out["vanilla_repeat"] = repeat
    elif not reused and snapshot_rollbacks(trace) > 0:
        check = snapshot_check(session, cfg, trace, target, n_ctx, opts, say, cancel)
        out["snapshot_check"] = check
        if not check["identical_to_speculative"]:
            out["unproven"] = snapshot_rollbacks(trace)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def control_matrix(session: Any, cfg: Any, trace: Trace, target: Any, n_ctx: int, opts: GenOptions,
                   say: ProgressFn, cancel: CancelFn) -> list[dict[str, Any]]:
    """vanilla-twice, zero-draft, ngram and prefill-chunk, each compared with the vanilla arm."""
    vanilla = trace.vanilla.tokens
    prompt = _prompt(trace)
    out: list[dict[str, Any]] = []

    def record(name: str, description: str, tokens: list[int] | None, t0: float, skipped: str | None = None):
        if skipped is not None:
            out.append({"name": name, "description": description, "identical": None, "first_mismatch": None,
                        "n_tokens": None, "seconds": 0.0, "skipped": skipped})
            return
        assert tokens is not None
        d = first_difference(vanilla, tokens)
        out.append({"name": name, "description": description, "identical": d is None, "first_mismatch": d,
                    "n_tokens": len(tokens), "seconds": round(time.perf_counter() - t0, 3), "skipped": None})

    _check(cancel)
    say("control: vanilla again on a fresh context")
    t0 = time.perf_counter()
    eng = session.engine("control-vanilla", target, cfg.engine, n_ctx)
    arm = run_to_end(vanilla_greedy(eng, prompt, opts, cancel=cancel))
    _check(cancel)
    record("vanilla-twice", "plain greedy again on a fresh context", arm.tokens, t0)

    _check(cancel)
    zcfg = replace(cfg, p_min=1.0) if cfg.uses_draft_model else replace(cfg, spec_type="none", draft=None)
    desc = ("the speculative loop with the draft model at p_min = 1 (nothing drafted)" if cfg.uses_draft_model
            else "the speculative loop with nothing drafted")
    say("control: zero-draft (" + ("p_min = 1" if cfg.uses_draft_model else "no drafter") + ")")
    t0 = time.perf_counter()
    zt = session.run(zcfg, cancel=cancel)
    _check(cancel)
    record("zero-draft", desc, zt.speculative.tokens, t0)
    out[-1]["n_drafted"] = zt.speculative.n_drafted

    _check(cancel)
    if cfg.spec_type == "ngram-simple":
        record("ngram", "ngram-simple speculation on the same target", None, 0.0,
               skipped="the run itself used ngram-simple")
    else:
        say("control: ngram-simple drafter on the same target")
        t0 = time.perf_counter()
        size_m = min(cfg.ngram_size_m, max(1, cfg.engine.n_batch - 1))  # a verify pass must fit in n_batch
        nt = session.run(replace(cfg, spec_type="ngram-simple", draft=None, ngram_size_m=size_m), cancel=cancel)
        _check(cancel)
        record("ngram", "ngram-simple speculation on the same target (drafts only when the text repeats"
               + (f"; at most {size_m} per round to fit n_batch" if size_m < cfg.ngram_size_m else "") + ")",
               nt.speculative.tokens, t0)
        out[-1]["n_drafted"] = nt.speculative.n_drafted

    _check(cancel)
    chunk = CONTROL_CHUNK if opts.n_batch != CONTROL_CHUNK else 1
    say(f"control: vanilla with a prefill chunk of {chunk}")
    t0 = time.perf_counter()
    arm = run_to_end(vanilla_greedy(eng, prompt, replace(opts, n_batch=chunk), cancel=cancel))
    _check(cancel)
    record("prefill-chunk", f"plain greedy with the prompt prefilled in chunks of {chunk} (run: {opts.n_batch})",
           arm.tokens, t0)
    out[-1]["n_batch"] = chunk
    return out
