"""``specview run``: both arms on one target, compared, summarised, optionally saved as a trace."""

from __future__ import annotations

import argparse
import time

from ..core.config import DEMO_DRAFT, DEMO_DRAFTERS, DEMO_TARGET, DRAFT_FILE_TYPES, RunConfig
from ..core.demo import DEMO_PROMPT, is_demo_name
from ..core.diagnose import format_verdict
from ..core.diagnose.ties import format_ties, tie_density
from ..core.diagnose.words import rollback_line
from ..core.errors import ConfigError, EngineCrashed, SpecviewError
from ..core.models import is_store_name
from ..core.models.preflight import refusal
from ..core.registry import Runner, get_backend
from ..core.resolve import Resolved, decided
from ..core.trace import Step, Trace
from .common import (Progress, add_engine_choice, add_setting_flags, check_output, cli_error, engine_settings,
                     given_settings, parse_tokens, read_prompt_file)

EXIT_IDENTICAL, EXIT_DIVERGED = 0, 1


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run",
        help="run both arms on a target and compare them (the main job)",
        description="Run plain greedy decoding (vanilla) and greedy speculative decoding on the same target, "
        "compare them token by token, and say whether and where they fork. With no --target it runs the "
        f"bundled demo model (SmolLM2-135M-Instruct: {DEMO_TARGET} target, {DEMO_DRAFT} draft).",
        epilog="Exit status: 0 identical, 1 the arms diverged, 2 error.",
    )
    groups = add_setting_flags(p)
    src = groups["prompt"].add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", default=None, help=f"prompt text (default: {DEMO_PROMPT!r})")
    src.add_argument("-f", "--prompt-file", default=None, help="read the prompt from a file ('-' for stdin)")
    src.add_argument("--tokens", default=None,
                     help="raw prompt token ids ('1,2,3'), fed as they are: no BOS, no template")
    add_engine_choice(p, groups["engine"])
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="OUT", default=None, help="write the full trace as JSON to OUT")
    g.add_argument("--diagnose", action=argparse.BooleanOptionalAction, default=True,
                   help="explain a divergence: near-tie, state bug or nondeterminism (default on)")
    g.add_argument("--controls", action="store_true",
                   help="also run the control matrix (vanilla twice, p_min=1, n-gram, other prefill chunk)")
    g.add_argument("--context", type=int, default=8, help="tokens of context shown around the fork (default 8)")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=main)
    return p


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run the flags describe (defaults from the settings' declarations)."""
    kw = given_settings(args, RunConfig)
    target = kw.get("target") or DEMO_TARGET
    kw["target"] = target
    spec_type = kw.get("spec_type", "draft-simple")
    if spec_type in DRAFT_FILE_TYPES and not args.draft:
        if not is_demo_name(target):
            what = ("a smaller model with the same tokenizer" if spec_type == "draft-simple"
                    else f"a {spec_type[6:]} drafter trained for this target")
            raise SpecviewError(f"--spec-type {spec_type} needs --draft FILE ({what}); "
                                "or use --spec-type ngram-simple, which needs no draft model")
        # the demo's own drafter of this type: the Q4_0 copy, or a tiny random-weight EAGLE-3 / DFlash / DSpark
        kw["draft"] = DEMO_DRAFT if spec_type == "draft-simple" else f"demo:{DEMO_DRAFTERS[spec_type]}"
    elif spec_type not in DRAFT_FILE_TYPES:  # n-gram, MTP heads and none draft from no second file
        kw["draft"] = None
    if args.tokens is not None:
        kw["prompt_tokens"] = parse_tokens(args.tokens)
        kw["prompt"] = None
        kw["chat"] = False
    elif args.prompt_file is not None:
        kw["prompt"] = read_prompt_file(args.prompt_file)
    else:
        kw["prompt"] = args.prompt if args.prompt is not None else DEMO_PROMPT
    try:
        cfg = RunConfig(backend=args.backend, engine=engine_settings(args), **kw)
        backend = get_backend(cfg.backend)
        backend.check(cfg)
        why = refusal(cfg.target, cfg.draft, cfg.spec_type, backend.model_kind)  # headers: before anything loads
        if why:
            raise ConfigError(why, setting="draft" if cfg.uses_draft_model else "spec_type")
    except ConfigError as exc:
        raise cli_error(exc) from None
    return cfg


def resolved_from_args(args: argparse.Namespace) -> Resolved:
    """The run the flags describe, with what this machine decides for what they leave unset: no repack where
    the crash probe crashed, and with no --target the demo quantization that can fork on this build."""
    cfg = config_from_args(args)
    return Runner.resolve(cfg, default_target="target" not in given_settings(args, RunConfig),
                   progress=Progress(getattr(args, "quiet", False)))


def _show(piece: str | None) -> str:
    if piece is None:
        return "(end of output)"
    return repr(piece)


def _context(steps: list[Step], i: int, n: int) -> str:
    before = "".join(s.piece for s in steps[max(0, i - n):i])
    at = steps[i].piece if i < len(steps) else ""
    after = "".join(s.piece for s in steps[i + 1:i + 1 + n])
    return f"…{before}[[{at}]]{after}…".replace("\n", "⏎")


def _named(cfg: dict, role: str, facts: dict) -> str:
    """A model as the summary shows it: its file, after the store name it was given by (``ollama:qwen3:8b =
    sha256-...``)."""
    file, name = facts.get("file", cfg.get(role)), cfg.get(role)
    return f"{name} = {file}" if isinstance(name, str) and is_store_name(name) else str(file)


def summary(trace: Trace, *, context: int = 8) -> str:
    """The readable summary `specview run` prints."""
    v, s, c = trace.vanilla, trace.speculative, trace.comparison
    tgt = trace.models["target"] or {}
    drf = trace.models.get("draft") or {}
    cfg = trace.config
    lines = []
    drafter = cfg.get("spec_type")
    if drafter == "draft-simple":
        drafter += f" with {_named(cfg, 'draft', drf)} ({drf.get('quantization', '?')})"
    lines.append(f"target   {_named(cfg, 'target', tgt)} ({tgt.get('quantization', '?')}, "
                 f"{tgt.get('architecture', '?')})")
    lines.append(f"drafter  {drafter}; n_max={cfg.get('n_max')} n_min={cfg.get('n_min')} p_min={cfg.get('p_min')}")
    lines.append(f"prompt   {len(trace.prompt['tokens'])} tokens; generated {len(v.tokens)} vanilla, "
                 f"{len(s.tokens)} speculative ({v.stop_reason} / {s.stop_reason})")
    if trace.prompt.get("chat_note"):
        lines.append(f"note     {trace.prompt['chat_note']}")
    noted = [role for role, m in (("target", tgt), ("draft", drf)) if m.get("rollback_note")]
    if noted:  # the MLX engine: mlx-lm itself refuses to speculate on this model, so the arm is specview's loop
        lines.append(f"note     {' and '.join(noted)}: {(tgt if noted[0] == 'target' else drf)['rollback_note']}")
    if cfg.get("serial_verify"):
        lines.append("verify   serial: every verify pass computed as single-token passes (--serial-verify)")
    if decided(cfg, "no_repack"):
        lines.append(f"repack   {decided(cfg, 'no_repack')}")
    demo = decided(cfg, "target") or trace.environment.get("demo_pick")  # (where traces before config.decided kept it)
    if demo:
        lines.append(f"demo     {demo}")
    lines.append("")
    crashed = "crashed" in (v.stop_reason, s.stop_reason)
    if crashed:
        lines.append(f"CRASHED: the engine died after {len(v.tokens)} vanilla and {len(s.tokens)} speculative tokens; "
                     + (f"up to there the arms agree on all {c.agree} tokens both have." if c.identical else
                        "the arms had already forked:"))
    if crashed and c.identical:
        pass
    elif c.identical:
        lines.append(f"IDENTICAL: both arms produced the same {c.agree} tokens{_identical_reach(trace)}.")
    else:
        fm = c.first_mismatch
        assert fm is not None
        lines.append(f"DIVERGED at token {fm.index} (character {fm.char_offset}); "
                     f"the arms agree on the first {c.agree} tokens.")
        lines.append(f"  vanilla      {fm.vanilla_token}  {_show(fm.vanilla_piece)}")
        lines.append(f"  speculative  {fm.speculative_token}  {_show(fm.speculative_piece)}")
        if fm.index < len(v.steps) and v.steps[fm.index].margin is not None:
            st = v.steps[fm.index]
            lines.append(f"  vanilla top-1/top-2 margin there: {st.margin:.4f} logits")
        if fm.index < len(s.steps) and s.steps[fm.index].round is None:
            lines.append("  speculative token's round and verify row: not reported by this engine")
        elif fm.index < len(s.steps):
            ss = s.steps[fm.index]
            kind = "an accepted draft token" if ss.from_draft else "the target's own token"
            lines.append(f"  speculative token was {kind}, round {ss.round}, row {ss.batch_index} of a "
                         f"T={ss.batch_size} forward pass")
        lines.append("  context:")
        lines.append(f"    vanilla      {_context(v.steps, fm.index, context)}")
        lines.append(f"    speculative  {_context(s.steps, fm.index, context)}")
    lines.append("")
    rate = s.acceptance_rate
    mean = s.mean_accepted
    if not s.rounds and s.reported_drafted is None and s.drafter not in (None, "none"):
        lines.append("drafted, accepted: not reported by this engine (no per-round data or totals)")
    elif not s.rounds and s.reported_drafted is not None:
        lines.append(f"drafted {s.n_drafted}, accepted {s.n_accepted} (the engine's own totals; no per-round data): "
                     f"acceptance {'n/a' if rate is None else f'{rate:.1%}'}")
    else:
        lines.append(f"drafted {s.n_drafted}, accepted {s.n_accepted} in {max(0, len(s.rounds) - 1)} verify rounds: "
                     f"acceptance {'n/a' if rate is None else f'{rate:.1%}'}, "
                     f"mean tokens per round {'n/a' if mean is None else f'{mean:.2f}'}")
        if (how := rollback_line(trace)) is not None:
            lines.append(how)
    if crashed:  # no arm that ran to its end: no speed to compare
        return "\n".join(lines)
    speed = s.tokens_per_s / v.tokens_per_s if v.tokens_per_s else 0.0
    lines.append(f"speed    vanilla {v.tokens_per_s:.1f} tok/s, speculative {s.tokens_per_s:.1f} tok/s "
                 f"({speed:.2f}x); prompt {v.prompt_ms:.0f} ms")
    return "\n".join(lines)


def _identical_reach(trace: Trace) -> str:
    """What an identical run did not test, said on its headline: nothing drafted, or no batched verify pass."""
    from ..core.diagnose.words import drafted_nothing, single_row_verify, zero_draft

    if drafted_nothing(trace):
        z = zero_draft(trace.config)
        return f", but nothing was drafted ({z.why}): inconclusive for speculative decoding; {z.fix}"
    how = single_row_verify(trace)
    if how:
        return f", with {how}: the loop was tested, batched verification was not"
    return ""


def main(args: argparse.Namespace) -> int:
    progress = Progress(args.quiet)
    check_output(args.json, "--json")
    resolved = resolved_from_args(args)
    cfg = resolved.config
    t0 = time.perf_counter()
    trace: Trace | None = None
    diag = None
    crash: EngineCrashed | None = None
    with get_backend(cfg.backend).runner(progress=progress) as runner:
        progress(f"running vanilla and speculative arms ({cfg.max_tokens} tokens each)")
        try:
            trace = resolved.record(runner.run(cfg))
            if (args.diagnose or args.controls) and not _cancelled(trace):
                progress("diagnosing: teacher-forced replays at the fork and the numeric envelope")
                diag = format_verdict(runner.diagnose(trace, cfg, controls=args.controls, progress=progress))
        except EngineCrashed as exc:  # the engine died; what it computed is kept, and is itself a bug report
            crash = exc
            if trace is None:
                trace = resolved.record(exc.trace)
            elif exc.crash:
                trace.extra["crash"] = exc.crash
    if trace is not None and args.json:
        from ..core.report.summary import TRACE_KEY, sealed_summary

        trace.extra[TRACE_KEY] = sealed_summary(trace)  # for one table across machines (specview compare DIR)
        path = trace.save(args.json)
        progress(f"trace written to {path}")
    if crash is not None:
        if trace is not None and (trace.vanilla.steps or trace.speculative.steps):
            print(summary(trace, context=args.context))
            print()
        raise SpecviewError(str(crash) + ("" if args.json or trace is None else
                                          "\n  keep the run for a bug report: add --json TRACE.json"))
    assert trace is not None
    print(summary(trace, context=args.context))
    if diag is not None:
        print()
        print(diag)
    print()
    print(format_ties(tie_density(trace)))
    progress(f"done in {time.perf_counter() - t0:.1f} s")
    if _cancelled(trace):
        return 130
    return EXIT_IDENTICAL if trace.comparison.identical else EXIT_DIVERGED


def _cancelled(trace: Trace) -> bool:
    return trace.vanilla.stop_reason == "cancelled" or trace.speculative.stop_reason == "cancelled"
