"""``specview run``: both arms on one target, compared, summarised, optionally saved as a trace."""

from __future__ import annotations

import argparse
import time

from ..core import demo
from ..core.engine import SpecviewError
from ..core.session import RunConfig, Session
from ..core.trace import Step, Trace
from .common import Progress, add_engine_flags, engine_settings, parse_tokens, read_prompt_file

EXIT_IDENTICAL, EXIT_DIVERGED = 0, 1


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run",
        help="run both arms on a target and compare them (the main job)",
        description="Run plain greedy decoding (vanilla) and greedy speculative decoding on the same target, "
        "compare them token by token, and say whether and where they fork. With no --target it runs the "
        "bundled demo model (SmolLM2-135M-Instruct: demo:Q8_0 target, demo:Q4_0 draft).",
        epilog="Exit status: 0 identical, 1 the arms diverged, 2 error.",
    )
    g = p.add_argument_group("models")
    g.add_argument("-m", "--target", "--model", dest="target", default=None,
                   help=f"target GGUF file, or a demo name like demo:F16 (default {demo.DEMO_TARGET})")
    g.add_argument("-md", "--draft", "--model-draft", dest="draft", default=None,
                   help=f"draft GGUF for draft-simple (default {demo.DEMO_DRAFT} with the demo target)")
    g = p.add_argument_group("speculation (llama.cpp names)")
    g.add_argument("--spec-type", default="draft-simple", metavar="TYPE",
                   help="how tokens are drafted: draft-simple, ngram-simple or none (default draft-simple); with "
                   "--engine llama-server any type the binary lists in its --help (draft-mtp, draft-eagle3, "
                   "ngram-mod, ...)")
    g.add_argument("--n-max", "--spec-draft-n-max", dest="n_max", type=int, default=3,
                   help="most tokens drafted per round (default 3, as llama.cpp)")
    g.add_argument("--n-min", "--spec-draft-n-min", dest="n_min", type=int, default=0,
                   help="drop a draft shorter than this (default 0)")
    g.add_argument("--p-min", "--spec-draft-p-min", dest="p_min", type=float, default=0.0,
                   help="stop drafting when the draft's top-10 softmax probability is below this; "
                   "1 drafts nothing: the zero-draft control (default 0)")
    g.add_argument("--spec-ngram-simple-size-n", dest="ngram_n", type=int, default=12,
                   help="ngram-simple: n-gram looked up in the history (default 12)")
    g.add_argument("--spec-ngram-simple-size-m", dest="ngram_m", type=int, default=48,
                   help="ngram-simple: most tokens copied after a match (default 48)")
    g = p.add_argument_group("prompt and stopping")
    src = g.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", default=None, help=f"prompt text (default: {demo.DEMO_PROMPT!r})")
    src.add_argument("-f", "--prompt-file", default=None, help="read the prompt from a file ('-' for stdin)")
    src.add_argument("--tokens", default=None,
                     help="raw prompt token ids ('1,2,3'), fed as they are: no BOS, no template")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap the prompt in the model's chat template (default on)")
    g.add_argument("-n", "--max-tokens", "--n-predict", dest="max_tokens", type=int, default=256,
                   help="tokens to generate per arm (default 256)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens")
    g.add_argument("--top-k", type=int, default=8, help="alternatives recorded per token (default 8)")
    add_engine_flags(p)
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
    from ..core.drafters import SPEC_TYPES

    if args.engine != "llama-server" and args.spec_type not in SPEC_TYPES:
        raise SpecviewError(f"--spec-type must be one of {', '.join(SPEC_TYPES)} with --engine {args.engine} "
                            f"(got {args.spec_type!r}); other types run with --engine llama-server")
    target = args.target or demo.DEMO_TARGET
    draft = args.draft
    if draft is None and args.spec_type == "draft-simple":
        if demo.is_demo_name(target):
            draft = demo.DEMO_DRAFT
        else:
            raise SpecviewError("--spec-type draft-simple needs --draft FILE (a smaller model with the same tokenizer); "
                                "or use --spec-type ngram-simple, which needs no draft model")
    prompt, tokens = None, None
    if args.tokens is not None:
        tokens = parse_tokens(args.tokens)
    elif args.prompt_file is not None:
        prompt = read_prompt_file(args.prompt_file)
    else:
        prompt = args.prompt if args.prompt is not None else demo.DEMO_PROMPT
    return RunConfig(
        target=target,
        draft=draft if args.spec_type == "draft-simple" else None,
        spec_type=args.spec_type,
        n_max=args.n_max,
        n_min=args.n_min,
        p_min=args.p_min,
        ngram_size_n=args.ngram_n,
        ngram_size_m=args.ngram_m,
        max_tokens=args.max_tokens,
        prompt=prompt,
        prompt_tokens=tokens,
        chat=bool(args.chat) and tokens is None,
        ignore_eos=args.ignore_eos,
        top_k=args.top_k,
        backend=args.engine,
        engine=engine_settings(args),
    )


def _show(piece: str | None) -> str:
    if piece is None:
        return "(end of output)"
    return repr(piece)


def _context(steps: list[Step], i: int, n: int) -> str:
    before = "".join(s.piece for s in steps[max(0, i - n):i])
    at = steps[i].piece if i < len(steps) else ""
    after = "".join(s.piece for s in steps[i + 1:i + 1 + n])
    return f"…{before}[[{at}]]{after}…".replace("\n", "⏎")


def summary(trace: Trace, *, context: int = 8) -> str:
    """The readable summary `specview run` prints."""
    v, s, c = trace.vanilla, trace.speculative, trace.comparison
    tgt = trace.models["target"] or {}
    drf = trace.models.get("draft") or {}
    cfg = trace.config
    lines = []
    drafter = cfg.get("spec_type")
    if drafter == "draft-simple":
        drafter += f" with {drf.get('file', cfg.get('draft'))} ({drf.get('quantization', '?')})"
    lines.append(f"target   {tgt.get('file', cfg.get('target'))} ({tgt.get('quantization', '?')}, "
                 f"{tgt.get('architecture', '?')})")
    lines.append(f"drafter  {drafter}; n_max={cfg.get('n_max')} n_min={cfg.get('n_min')} p_min={cfg.get('p_min')}")
    lines.append(f"prompt   {len(trace.prompt['tokens'])} tokens; generated {len(v.tokens)} vanilla, "
                 f"{len(s.tokens)} speculative ({v.stop_reason} / {s.stop_reason})")
    lines.append("")
    if c.identical:
        lines.append(f"IDENTICAL: both arms produced the same {c.agree} tokens.")
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
    if not s.rounds and s.reported_drafted is not None:
        lines.append(f"drafted {s.n_drafted}, accepted {s.n_accepted} (the engine's own totals; no per-round data): "
                     f"acceptance {'n/a' if rate is None else f'{rate:.1%}'}")
    else:
        lines.append(f"drafted {s.n_drafted}, accepted {s.n_accepted} in {max(0, len(s.rounds) - 1)} verify rounds: "
                     f"acceptance {'n/a' if rate is None else f'{rate:.1%}'}, "
                     f"mean tokens per round {'n/a' if mean is None else f'{mean:.2f}'}")
    speed = s.tokens_per_s / v.tokens_per_s if v.tokens_per_s else 0.0
    lines.append(f"speed    vanilla {v.tokens_per_s:.1f} tok/s, speculative {s.tokens_per_s:.1f} tok/s "
                 f"({speed:.2f}x); prompt {v.prompt_ms:.0f} ms")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    progress = Progress(args.quiet)
    cfg = config_from_args(args)
    t0 = time.perf_counter()
    session = None
    try:
        if args.engine == "llama-server":
            from ..backends.server import run_server_trace

            trace = run_server_trace(cfg, server_bin=args.server_bin, server_args=args.server_args,
                                     progress=progress, diagnose=bool(args.diagnose))
        else:
            session = Session(progress=progress)
            progress(f"running vanilla and speculative arms ({cfg.max_tokens} tokens each)")
            trace = session.run(cfg)
        diag = _diagnose(session, cfg, trace, args, progress) if args.diagnose or args.controls else None
        if args.json:
            path = trace.save(args.json)
            progress(f"trace written to {path}")
        print(summary(trace, context=args.context))
        if diag is not None:
            print()
            print(diag)
        progress(f"done in {time.perf_counter() - t0:.1f} s")
    finally:
        if session is not None:
            session.close()
    if trace.vanilla.stop_reason == "cancelled" or trace.speculative.stop_reason == "cancelled":
        return 130
    return EXIT_IDENTICAL if trace.comparison.identical else EXIT_DIVERGED


def _diagnose(session: Session | None, cfg: RunConfig, trace: Trace, args: argparse.Namespace,
              progress: Progress) -> str | None:
    if session is None:  # llama-server: diagnosed from the outside while its servers were up
        from ..backends.server import format_server_verdict

        return format_server_verdict(trace.diagnosis) if trace.diagnosis else None
    from ..core import diagnose as dmod

    progress("diagnosing: teacher-forced replays at the fork and the numeric envelope")
    result = dmod.diagnose(session, cfg, trace, controls=args.controls, progress=progress)
    return dmod.format_verdict(result)
