"""The diagnosis in words: the explanation stored in the trace and what ``specview run`` prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..config import DRAFT_PARAM_TYPES
from ..trace import Trace
from .classify import FAR_FACTOR, FAR_FLOOR, LOGIT_TOL


def _piece(trace: Trace, token: int | None) -> str:
    if token is None:
        return "(none)"
    for arm in (trace.vanilla, trace.speculative):
        for st in arm.steps:
            if st.token == token:
                return repr(st.piece)
    return f"#{token}"


def _controls_sentence(ctrls: list[dict[str, Any]] | None) -> str:
    if not ctrls:
        return ""
    same = [c["name"] for c in ctrls if c.get("identical")]
    diff = [f"{c['name']} (at token {c['first_mismatch']})" for c in ctrls if c.get("identical") is False]
    parts = []
    if same:
        parts.append("stayed identical to vanilla: " + ", ".join(same))
    if diff:
        parts.append("diverged: " + ", ".join(diff))
    return " Controls " + "; ".join(parts) + "." if parts else ""


def serial_form_words(form: str | None) -> str:
    if form == "ub1-server":
        return "the same server with -ub 1 (every row of a verify batch in its own single-token micro-batch)"
    return "the speculative loop with every verify row computed as its own single-token pass"


def mechanisms_words(rollbacks: dict[str, Any] | None, context: str = "target") -> str:
    """ "n_rs_seq ×31, state-copy ×2" from an arm's or a control's ``rollbacks`` record ("no rollback": none)."""
    rec = (rollbacks or {}).get(context) or {}
    used = [f"{m} ×{c}" for m, c in rec.items() if c]
    return ", ".join(used) if used else "no rollback"


def serial_line(sv: dict[str, Any] | None) -> str | None:
    """One line on the serial-verify control, or None when it did not run."""
    if not sv:
        return None
    form = serial_form_words(sv.get("form"))
    if sv.get("identical_to_vanilla") is None:
        return f"serial verify  not run ({sv.get('skipped') or 'not available for this engine'})"
    walked = f" (its rollbacks: {mechanisms_words(sv['rollbacks'])})" if sv.get("rollbacks") else ""
    if sv["identical_to_vanilla"]:
        n = sv.get("n_tokens")
        head = f"serial verify  IDENTICAL to vanilla{'' if n is None else f' over all {n} tokens'}: {form}{walked} "
        if sv.get("unproven"):
            return (head + f"reproduces plain greedy, but the speculative arm's {sv['unproven']} n_rs_seq snapshot "
                    "rollbacks are a path no single-token pass walks, and the snapshot check did not prove them: "
                    "UNPROVEN (run again with --rollback checkpoint, which the control covers)")
        return head + "reproduces plain greedy, so the fork comes from batched-vs-single numerics (proven)"
    rep = sv.get("vanilla_repeat")
    tail = ""
    if rep is not None:
        tail = ("; vanilla run again repeats itself up to there" if rep.get("identical")
                else f"; vanilla run again differs from itself at token {rep.get('first_mismatch')}")
    return (f"serial verify  DIFFERS from vanilla at token {sv.get('first_mismatch')}: {form}{walked} does not "
            f"reproduce plain greedy{tail}")


def snapshot_line(sv: dict[str, Any] | None) -> str | None:
    """One line on the snapshot check (a speculative arm that rolled back by n_rs_seq snapshots), or None."""
    chk = (sv or {}).get("snapshot_check")
    if not chk:
        return None
    if chk.get("skipped"):
        return f"snapshot check  not run ({chk['skipped']}): the n_rs_seq snapshot rollbacks are unproven"
    walked = mechanisms_words(chk.get("rollbacks"))
    if chk.get("identical_to_speculative"):
        return (f"snapshot check  IDENTICAL to the speculative arm over its {chk.get('n_tokens')} tokens with every "
                f"n_rs_seq snapshot rollback done by checkpoint and replay ({walked}): the snapshots restored the "
                "states their positions had (proven)")
    return (f"snapshot check  DIFFERS from the speculative arm at token {chk.get('first_mismatch')} with every "
            f"n_rs_seq snapshot rollback done by checkpoint and replay ({walked}): a wrong snapshot, or the two "
            "restores rounding apart; the snapshot rollbacks are UNPROVEN")


def reference_line(ref: dict[str, Any] | None) -> str | None:
    if not ref:
        return None
    if ref.get("skipped"):
        return f"backend check  not run ({ref['skipped']})"
    t = ref.get("totals") or {}
    kl, top1 = t.get("kl_mean"), t.get("same_top1")
    nums = (f"mean KL {kl:.2e} nats, same top-1 {top1:.1%}" if kl is not None and top1 is not None else "no positions")
    who = f"{ref.get('test_label')} against {ref.get('reference_label')}"
    if ref.get("ok"):
        return f"backend check  ok: {who}, {nums}"
    return (f"BACKEND CHECK FAILED  {who}: {nums} ({'; '.join(ref.get('problems') or [])}). This backend computes "
            f"the model wrongly; read nothing into a fork until it is fixed")


def verify_widths(trace: Trace) -> dict[int, int] | None:
    """How many verify passes of each width the speculative arm ran (round 0, the prefill, not counted);
    None when the engine reports no rounds (llama-server, mlx_lm.server)."""
    spec = trace.speculative
    if not spec.rounds:
        return None
    out: dict[int, int] = {}
    for r in spec.rounds:
        if r.index >= 1:
            out[r.batch_size] = out.get(r.batch_size, 0) + 1
    return dict(sorted(out.items()))


def widths_words(widths: dict[int, int] | None) -> str:
    """ "86 verify passes: width 2 ×10, 3 ×20, 4 ×56" """
    if widths is None:
        return "the engine reports no verify passes, so which widths ran is not known"
    n = sum(widths.values())
    if not n:
        return "no verify pass ran"
    parts = [f"{'width ' if i == 0 else ''}{w} ×{c}" for i, (w, c) in enumerate(widths.items())]
    return f"{n} verify pass{'es' if n != 1 else ''}: {', '.join(parts)}"


def replay_widths(trace: Trace) -> dict[int, int]:
    """How many replay passes of each width followed a checkpoint restore (a hybrid target's rollback)."""
    out: dict[int, int] = {}
    for r in trace.speculative.rounds:
        if r.index >= 1 and r.replay and r.rollback == "checkpoint":
            out[r.replay] = out.get(r.replay, 0) + 1
    return dict(sorted(out.items()))


def rollback_line(trace: Trace) -> str | None:
    """ "rollback checkpoint: 22 of 25 rounds restored and replayed (replay passes: width 2 ×15, 3 ×7)", or how a
    snapshot run rolled back; None where rejected drafts were dropped from a KV cache (or nothing says how)."""
    rounds = [r for r in trace.speculative.rounds if r.index >= 1]
    modes: dict[str, int] = {}
    for r in rounds:
        if r.rollback:
            modes[r.rollback] = modes.get(r.rollback, 0) + 1
    if not modes or set(modes) == {"seq-rm"}:
        return None
    parts = []
    if modes.get("snapshots"):
        parts.append(f"{modes['snapshots']} by a kept recurrent state (snapshots: llama.cpp's n_rs_seq)")
    if modes.get("state-copy"):
        parts.append(f"{modes['state-copy']} by a state copied after a single-token pass (snapshot mode)")
    if modes.get("checkpoint"):
        widths = replay_widths(trace)
        ws = ", ".join(f"{'width ' if i == 0 else ''}{w} ×{c}" for i, (w, c) in enumerate(widths.items()))
        parts.append(f"{modes['checkpoint']} by a checkpoint restored and replayed (replay passes: {ws})")
    if modes.get("seq-rm"):
        parts.append(f"{modes['seq-rm']} by llama_memory_seq_rm")
    used = trace.speculative.rollbacks
    paths = "; ".join(f"{ctx} {mechanisms_words(used, ctx)}" for ctx in used)
    return (f"rollback {len([r for r in rounds if r.rollback])} of {len(rounds)} rounds: " + "; ".join(parts)
            + (f" (by mechanism: {paths})" if paths else ""))


#: the engines on which -ub 1 computes every row of a verify pass in its own single-token micro-batch
UB1_ENGINES = ("llama.cpp", "llama-server")
#: the n_max a run that drafted nothing because of n_max 0 is pointed to (llama.cpp's default)
DRAFTING_N_MAX = 3


def single_row_verify(trace: Trace) -> str | None:
    """How a run computed every verify row as its own single-token pass, so that no batched verify pass ran:
    "serial verify", "-ub 1", or None for a run whose verify passes were batched."""
    cfg = trace.config if isinstance(trace.config, Mapping) else {}
    rounds = [r for r in trace.speculative.rounds if r.index >= 1]
    if cfg.get("serial_verify") or (rounds and all(r.serial for r in rounds)):
        return "serial verify"
    engine = cfg.get("engine") if isinstance(cfg.get("engine"), Mapping) else {}
    if engine.get("n_ubatch") == 1 and cfg.get("backend", "llama.cpp") in UB1_ENGINES:
        return "-ub 1"
    return None


def batched_again(how: str) -> tuple[str, dict[str, Any]]:
    """(what to do, the settings it takes) to run a single-row-verify run again with batched verify passes."""
    if how == "-ub 1":
        return "run it again with a larger micro-batch (-ub 512)", {"n_ubatch": 512}
    return "run it again without serial verify", {"serial_verify": False}


@dataclass(frozen=True)
class ZeroDraft:
    """Why a speculative arm drafted nothing, and the one change that makes it draft."""

    why: str  # "n_max 0 allows no draft token"
    fix: str  # "raise n_max to 3": what to do, as a step the user takes before running again
    settings: dict[str, Any]  # the settings the fix sets (the app's link)


def _n(cfg: Mapping[str, Any], key: str, default: float) -> float:
    v = cfg.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def zero_draft_setting(cfg: Mapping[str, Any] | None) -> ZeroDraft | None:
    """The setting that lets no token be drafted whatever the text (spec type none, n_max 0, p_min 1), else None."""
    cfg = cfg if isinstance(cfg, Mapping) else {}
    spec_type = cfg.get("spec_type") or "draft-simple"
    if spec_type == "none":
        return ZeroDraft("the spec type is none, so no drafter ran", "use a draft model (spec type draft-simple)",
                         {"spec_type": "draft-simple"})
    if spec_type != "ngram-simple" and _n(cfg, "n_max", DRAFTING_N_MAX) == 0:
        return ZeroDraft("n_max 0 allows no draft token", f"raise n_max to {DRAFTING_N_MAX}",
                         {"n_max": DRAFTING_N_MAX})
    if spec_type in DRAFT_PARAM_TYPES and _n(cfg, "p_min", 0.0) >= 1:
        return ZeroDraft("p_min 1 is llama.cpp's zero-draft control: no draft token is ever that probable",
                         "lower p_min to 0", {"p_min": 0.0})
    return None


def zero_draft(cfg: Mapping[str, Any] | None) -> ZeroDraft:
    """Why a run with these settings drafted nothing, and what makes it draft."""
    cfg = cfg if isinstance(cfg, Mapping) else {}
    fixed = zero_draft_setting(cfg)
    if fixed is not None:
        return fixed
    spec_type = cfg.get("spec_type") or "draft-simple"
    if spec_type == "ngram-simple":
        n = int(_n(cfg, "ngram_size_n", 12))
        return ZeroDraft(f"ngram-simple drafts only where its last {n} tokens occurred earlier in the prompt or "
                         "the output, and they never did", "use a draft model (spec type draft-simple)",
                         {"spec_type": "draft-simple"})
    n_min = int(_n(cfg, "n_min", 0))
    if n_min > 0:
        return ZeroDraft(f"n_min {n_min} dropped every draft shorter than {n_min} tokens", "lower n_min to 0",
                         {"n_min": 0})
    p_min = _n(cfg, "p_min", 0.0)
    if spec_type in DRAFT_PARAM_TYPES and p_min > 0:
        return ZeroDraft(f"the drafter was never at least p_min {p_min:g} sure of a token", "lower p_min to 0",
                         {"p_min": 0.0})
    return ZeroDraft("the drafter proposed no token for this text", "try a longer run or another prompt", {})


def drafted_nothing(trace: Trace) -> bool:
    """Whether the speculative arm is known to have drafted no token (so the run tested nothing speculative):
    its rounds or its engine's totals say so, or its settings allow no draft."""
    spec = trace.speculative
    known = bool(spec.rounds) or spec.reported_drafted is not None or zero_draft_setting(trace.config) is not None
    return known and spec.n_drafted == 0


def _zero_draft_words(trace: Trace) -> str:
    comp = trace.comparison
    widths = verify_widths(trace)
    rounds = sum(widths.values()) if widths is not None else None
    z = zero_draft(trace.config)
    where = f" in {rounds} rounds" if rounds else ""
    return (f"The speculative arm produced exactly vanilla's {comp.agree} tokens, but it drafted no token{where} "
            f"({z.why}): every verify pass was a single-token pass, as in plain decoding, so nothing speculative "
            f"was tested. Inconclusive for speculation: to test it, {z.fix} and run again.")


def _single_row_words(trace: Trace, how: str) -> str:
    spec = trace.speculative
    rounds = len([r for r in spec.rounds if r.index >= 1])
    counts = f"{spec.n_drafted} tokens drafted and {spec.n_accepted} accepted"
    tally = f"{rounds} rounds with {counts}" if rounds else counts
    step, _ = batched_again(how)
    return (f"The speculative arm produced exactly vanilla's {trace.comparison.agree} tokens with {how}: every "
            f"verify row was computed as its own single-token pass, so no batched verify pass ran. This run tested "
            f"the speculative loop (drafting, acceptance, rollback and the KV cache, over {tally}) and found it "
            f"right, but not batched verification, where batched-versus-single rounding can flip a near-tie into a "
            f"fork. To test that, {step}.")


def identical_words(trace: Trace) -> str:
    """What an identical run proves: lossless at the verify widths it exercised; the loop alone when every verify
    row was its own single-token pass (serial verify, -ub 1); nothing when nothing was drafted."""
    if drafted_nothing(trace):
        return _zero_draft_words(trace)
    how = single_row_verify(trace)
    if how:
        return _single_row_words(trace, how)
    comp = trace.comparison
    widths = verify_widths(trace)
    replays = replay_widths(trace)
    also = ""
    if replays:
        n = sum(replays.values())
        also = (f" and after {n} checkpoint restore{'s' if n != 1 else ''}, the replay widths "
                f"({', '.join(f'{w} ×{c}' for w, c in replays.items())})")
    return (f"The speculative arm produced exactly vanilla's {comp.agree} tokens: greedy speculative decoding was "
            f"lossless on this run, at the verify widths it exercised ({widths_words(widths)}){also}; identical "
            "says nothing of widths it never ran.")


def departure_sentence(dep: dict[str, Any] | None) -> str:
    """ " Its verify pass first departs from the single-token pass at blk.0 Qcur-0: MUL_MAT on f16 weights ..." """
    if not dep or dep.get("skipped"):
        return ""
    if dep.get("node") is None:
        return (f" Located on the same single-token prefix, row {dep['row']} of the width-{dep['width']} pass "
                "equals the single-token pass at every observed node.")
    return (f" Located on the same single-token prefix, row {dep['row']} of the width-{dep['width']} verify pass "
            f"{dep['where']}.")


def departure_line(dep: Any) -> str | None:
    """One plain line of a diagnosis' ``departure`` record ("located: row 1 of the width-4 verify pass first differs
    at blk.3 ffn_out-3: MUL_MAT on q4_K weights in CPU_REPACK, ..."), the reason when it was not located, or None."""
    if not isinstance(dep, dict) or not dep:
        return None
    if dep.get("skipped"):
        return f"located: not run ({dep['skipped']})"
    where = dep.get("where")
    if not where:
        return None
    if dep.get("node") is None:  # "row J of the width-T pass is bit-identical ..." already says which pass
        return f"located: {where}"
    return f"located: row {dep.get('row')} of the width-{dep.get('width')} verify pass {where}"


def _snapshot_sentence(chk: dict[str, Any] | None) -> str:
    if not chk:
        return "no snapshot check ran."
    if chk.get("skipped"):
        return f"the snapshot check did not run ({chk['skipped']})."
    return (f"the snapshot check (the same arm with each snapshot rollback done by checkpoint and replay) differs "
            f"from it at token {chk.get('first_mismatch')}, which a wrong snapshot explains, and so does the "
            "rounding of a replay pass narrower than the verify pass.")


def _snapshots_proven(sv: dict[str, Any]) -> str:
    chk = sv.get("snapshot_check")
    if not chk or not chk.get("identical_to_speculative"):
        return ""
    return (" The speculative arm's n_rs_seq snapshot rollbacks, which no single-token pass walks, are proven by "
            "the snapshot check: the same arm with each of them done by checkpoint and replay gives its tokens, "
            "one for one.")


def _gap_words(d: dict[str, Any], th: dict[str, Any]) -> str:
    if d.get("gap") is None or th.get("far") is None:
        return ""
    return f" (its gap, {d['gap']:.4f} logits, is under the far threshold {th['far']:.3f})"


#: quantizations whose weights are plain floats (their verify passes still round by batch shape)
FLOAT_WEIGHTS = ("F32", "F16", "BF16", "F64")


def _expected_words(trace: Trace) -> str:
    """Why a proven near-tie is no bug, in the words of the target's weights (a quantized or a float file)."""
    quant = str(((trace.models or {}).get("target") or {}).get("quantization") or "").upper()
    if quant in FLOAT_WEIGHTS:
        return (f"Float weights ({quant}) round by batch shape too: llama.cpp multiplies several rows with "
                "other kernels than one row, summing in another order. This is not a bug in the speculative loop.")
    return "This is expected on quantized targets and is not a bug in the speculative loop."


def explain(d: dict[str, Any], trace: Trace) -> str:
    verdict, rule = d["verdict"], d["rule"]
    ctrl = _controls_sentence(d.get("controls"))
    ref = d.get("reference")
    pre = ""
    if ref and ref.get("ok") is False:
        pre = (f"Before anything else: the backend check failed ({'; '.join(ref.get('problems') or [])}); this "
               f"backend does not compute the model as the CPU does, so the fork below may be its fault. ")
    if verdict == "identical":
        return f"{pre}{identical_words(trace)}{ctrl}"
    # an engine that diagnoses from the outside may lack replays or an envelope: read what is there
    rp = d.get("replays") or {}
    env = d.get("envelope") or {}
    th = d.get("thresholds") or {}
    sv = d.get("serial_verify") or {}
    a, b = _piece(trace, d["vanilla_token"]), _piece(trace, d["speculative_token"])
    sp = rp.get("speculative") or {}
    numbers = ""
    if sp.get("shape") and d.get("gap") is not None and env.get("max") is not None:
        numbers = (f" The teacher-forced replays agree: one token per pass picks {a} by {d['gap']:.4f} logits over "
                   f"{b}; the speculative arm's own {sp['shape']} picks {b} by {sp['gap']:.4f}, while the two "
                   f"shapes move this target's logits by up to {env['max']:.4f} (p95 {env['p95']:.4f}) over the "
                   f"shared prefix.")
    if rule == "serial-verify-reproduces-vanilla":
        return (f"{pre}The serial-verify control, {serial_form_words(sv.get('form'))}, reproduces vanilla token "
                f"for token, so drafting, acceptance, rollback and the KV cache are right. That proves the fork at "
                f"token {d['fork']} ({a} against {b}) comes from the verify pass computing several rows at once, "
                f"whose rounding differs from one row at a time: the argmax flipped on a near-tie.{numbers}"
                f"{_snapshots_proven(sv)}"
                f"{departure_sentence(d.get('departure'))} {_expected_words(trace)}{ctrl}")
    if rule == "snapshot-restore-unproven":
        return (f"{pre}The serial-verify control, {serial_form_words(sv.get('form'))}, reproduces vanilla token for "
                f"token, but it proves only the rollback paths it walked ({mechanisms_words(sv.get('rollbacks'))}). "
                f"The speculative arm rolled back {sv.get('unproven') or 'some'} times through llama.cpp's n_rs_seq "
                f"snapshots ({mechanisms_words(trace.speculative.rollbacks)}), which exist only for the positions "
                f"of the last multi-token pass, so no single-token pass walks them; "
                f"{_snapshot_sentence(sv.get('snapshot_check'))} So the fork at token {d['fork']} ({a} against {b}) "
                f"is unproven: it may be a near-tie{_gap_words(d, th)}, or a snapshot that restored the wrong "
                f"state. To prove it, run the same with --rollback checkpoint: the control covers that path.{ctrl}")
    if rule == "serial-verify-differs":
        return (f"{pre}The serial-verify control, {serial_form_words(sv.get('form'))}, computes every KV entry and "
                f"every row exactly as vanilla computes them, yet it still differs from vanilla (at token "
                f"{sv.get('first_mismatch')}), while vanilla repeats itself. Batched numerics cannot explain that: "
                f"the loop or its cache is wrong (a rejected draft kept by the rollback, an accepted token's KV "
                f"entry lost, a draft accepted that the target did not pick, wrong positions). This is worth a bug "
                f"report: attach the trace.{ctrl}")
    if rule == "vanilla-repeat-disagrees":
        rep = sv.get("vanilla_repeat") or next(
            (c for c in d.get("controls") or [] if c.get("name") == "vanilla-twice"), {})
        return (f"{pre}Vanilla decoding run again on a fresh context gives different tokens (first at token "
                f"{rep.get('first_mismatch')}): this backend is not deterministic, so a fork between the arms "
                f"says nothing about speculative decoding. Report the nondeterminism to the backend (threads, "
                f"GPU atomics).{ctrl}")
    if verdict == "near-tie":
        how = ("within the largest shift seen before the fork" if rule == "gap-within-envelope"
               else f"above the largest shift seen before the fork but under the far threshold {th['far']:.3f}")
        return (f"{pre}Both teacher-forced replays reproduce what the arms did, from clean contexts: one token per "
                f"pass picks {a} by {d['gap']:.4f} logits over {b}; the speculative arm's own {sp['shape']} "
                f"picks {b} by {sp['gap']:.4f}. Between the two shapes this target's logits move by up to "
                f"{env['max']:.4f} (p95 {env['p95']:.4f}) over the shared prefix, and the gap is {how}: the "
                f"argmax flipped on a near-tie through batched-versus-single rounding."
                f"{departure_sentence(d.get('departure'))} This is expected on "
                f"quantized targets and is not a bug in the speculative loop.{ctrl}")
    if verdict == "state":
        if rule == "speculative-unreproducible":
            dev = sp["first_deviation"]
            st = trace.speculative.steps[dev]
            picks = ("" if sp["reproduces_token"]
                     else f"; from a clean state its verify pass picks {_piece(trace, sp['token'])}, not {b}")
            return (f"{pre}Rebuilding the speculative arm's KV state from its own recorded batches on a clean "
                    f"context gives different logits from what the arm recorded, from token {dev} on (round "
                    f"{st.round}, up to {sp['max_recorded_delta']:.4f} logits off), and a second clean replay agrees "
                    f"with the first. So the arm's state was not the state its accepted tokens imply"
                    f"{picks}. "
                    f"Suspect the KV rollback (a rejected draft kept), wrong positions, or injected state. "
                    f"This is worth a bug report: attach the trace.{ctrl}")
        if rule == "vanilla-unreproducible":
            dev = rp["single"]["first_deviation"]
            return (f"{pre}Replaying plain greedy on a clean context gives different logits from what the vanilla "
                    f"arm recorded, from token {dev} on, while two clean replays agree: the vanilla arm's context "
                    f"was not clean. This is worth a bug report: attach the trace.{ctrl}")
        serial = (" The serial-verify control reproduces vanilla, so the loop and its cache are right: the batched "
                  "verify pass itself computes something else (kernels or positions in passes of more than one "
                  "token)." if sv.get("identical_to_vanilla") else "")
        return (f"{pre}Both replays reproduce their tokens, but the gap at the fork, {d['gap']:.4f} logits, is far "
                f"beyond what batched-versus-single numerics move logits anywhere else in the shared prefix "
                f"(max {env['max']:.4f}; far means above {th['far']:.3f}). Rounding does not do that: suspect "
                f"positions or batch handling in the verify pass.{serial} This is worth a bug report: attach the "
                f"trace.{ctrl}")
    # nondeterministic, from the replays
    which = "vanilla" if rule == "vanilla-replays-disagree" else "speculative"
    key = "single" if which == "vanilla" else "speculative"
    dev = rp[key]["first_deviation"]
    return (f"{pre}The {which} arm does not reproduce itself: replaying it twice from clean contexts in its own "
            f"shape gives different logits (first at token {dev}). With a nondeterministic backend a fork between "
            f"the arms says nothing about speculative decoding; report the nondeterminism to the backend "
            f"(threads, GPU atomics) and run the controls.{ctrl}")


def format_verdict(diag: dict[str, Any]) -> str:
    """The readable lines ``specview run`` prints after its summary: the verdict, then the serial-verify control."""
    verdict = diag.get("verdict")
    th = diag.get("thresholds") or {}
    lines = []
    ref_line = reference_line(diag.get("reference"))
    if ref_line and ref_line.startswith("BACKEND"):
        lines.append(ref_line)
    lines.append(f"VERDICT  {str(verdict).upper()}" + (f"  (rule {diag['rule']})" if diag.get("rule") else ""))
    sv = serial_line(diag.get("serial_verify"))
    if sv:
        lines.append("  " + sv)
    snap = snapshot_line(diag.get("serial_verify"))
    if snap:
        lines.append("  " + snap)
    if ref_line and not ref_line.startswith("BACKEND"):
        lines.append("  " + ref_line)
    dep = diag.get("departure")
    if dep:
        lines.append("  located  " + (f"not run ({dep['skipped']})" if dep.get("skipped") else
                                      f"row {dep['row']} of the width-{dep['width']} pass: {dep['where']}"))
    rp = diag.get("replays")
    env = diag.get("envelope")
    if diag.get("fork") is not None and rp:
        si, sp = rp["single"], rp["speculative"]
        vp, sp_ = diag.get("vanilla_piece"), diag.get("speculative_piece")
        lines.append(f"  fork at token {diag['fork']}: a = vanilla {diag['vanilla_token']}"
                     f"{'' if vp is None else ' ' + repr(vp)}, b = speculative {diag['speculative_token']}"
                     f"{'' if sp_ is None else ' ' + repr(sp_)}")
        lines.append(f"  gap (one token per pass)  logit(a) - logit(b) = {si['gap']:.4f}; ranks a {si['rank_a']}, "
                     f"b {si['rank_b']}; replay picks {si['token']} "
                     f"({'reproduces vanilla' if si['reproduced'] else 'does NOT reproduce vanilla'})")
        lines.append(f"  speculative shape ({sp['shape']})  logit(b) - logit(a) = {sp['gap']:.4f}; "
                     f"ranks b {sp['rank_b']}, a {sp['rank_a']}; replay picks {sp['token']} "
                     f"({'reproduces' if sp['reproduced'] else 'does NOT reproduce'} the speculative arm)")
        for key, name in (("single", "vanilla"), ("speculative", "speculative")):
            r = rp[key]
            if not r["reproduced"]:
                rr = r["rerun_consistent"]
                lines.append(f"  {name} replay deviates from the record at token {r['first_deviation']} "
                             f"(up to {r['max_recorded_delta']:.4f} logits); a second clean replay "
                             f"{'agrees with the first' if rr else 'differs from the first'}")
    if env:
        at_fork = f", at the fork {env['at_fork']:.4f}" if env.get("at_fork") is not None else ""
        if env["max"] is None:
            lines.append(f"  envelope  no shared positions before the fork{at_fork}")
        else:
            lines.append(f"  envelope  max {env['max']:.4f}, p95 {env['p95']:.4f}, median {env['median']:.4f} "
                         f"logits over {env['positions']} shared positions (top-{env['top_k']} union){at_fork}")
    if th.get("far") is not None:
        nt = th.get("near_tie")
        lines.append(f"  thresholds  (supporting numbers where the serial-verify control ran, except that a gap "
                     f"above far reads state regardless) near-tie: both replays reproduce and gap <= far; within "
                     f"the envelope: gap <= "
                     f"max {'n/a' if nt is None else f'{nt:.4f}'}; state: gap > far = max({th['far_factor']:g} x "
                     f"envelope max, {th['far_floor']:g}) = {th['far']:.4f}, or a replay that does not reproduce "
                     f"its arm (tolerance {th['logit_tol']:g} logits)")
    else:
        lines.append(f"  thresholds  identical: every token equal; replays run only on a fork "
                     f"(far factor {th.get('far_factor', FAR_FACTOR):g}, floor {th.get('far_floor', FAR_FLOOR):g}, "
                     f"tolerance {th.get('logit_tol', LOGIT_TOL):g})")
    ar = diag.get("at_risk")
    if ar is not None and th.get("at_risk") is not None:
        lines.append(f"  at risk  {len(ar)} vanilla positions have a top-1/top-2 margin below the envelope max "
                     f"{th['at_risk']:.4f}" + (f": {', '.join(map(str, ar[:12]))}{' ...' if len(ar) > 12 else ''}"
                                                if ar else ""))
    ctrls = diag.get("controls")
    if ctrls:
        lines.append("  controls")
        for c in ctrls:
            if c.get("skipped"):
                res = f"skipped ({c['skipped']})"
            elif c["identical"]:
                drafted = f", {c['n_drafted']} drafted" if c.get("n_drafted") is not None else ""
                res = f"identical ({c['n_tokens']} tokens{drafted})"
            else:
                res = f"diverges at token {c['first_mismatch']}"
            lines.append(f"    {c['name']:<14} {res}  - {c['description']}")
    lines.append("  " + diag.get("explanation", ""))
    return "\n".join(lines)
