"""``specview quality``: does speculative decoding change answers?  A task suite through both arms, scored.

The engine and setting flags are ``specview run``'s (generated from the
settings' declarations), and the config is built the way ``run`` builds it
(:func:`specview.commands.run.resolved_from_args`); only the suite's own flags
are written here.  ``-n`` is the number of items (the answer length is
``--max-tokens``).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from .common import Progress, add_engine_choice, add_setting_flags

EXIT_UNCHANGED, EXIT_CHANGED, EXIT_INTERRUPTED = 0, 1, 130
#: tokens per answer where --max-tokens is not given: short answers, and a whole function for code
TEXT_TOKENS, CODE_TOKENS = 64, 384


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from ..core.quality import DEFAULT_ITEMS, DIAGNOSE_CHOICES, SUITE_NAMES

    p = sub.add_parser(
        "quality",
        help="run a task suite through both arms: does speculative decoding change answers?",
        description="Run every item of a task suite through plain greedy decoding (vanilla) and greedy "
        "speculative decoding, score each arm's answer, and report the paired outcome: both pass, both fail, "
        "only vanilla passes, only speculative passes; McNemar's exact test on the items whose answer changed; "
        "each arm's pass rate with a 95% Wilson interval; and for every changed answer its fork and diagnosis "
        "(near-tie / state / nondeterministic). The engine and settings flags are specview run's. The result "
        "is rewritten to DIR/quality.json after every item, with each item's trace in DIR/traces/.",
        epilog="Exit status: 0 no item's answer changed, 1 some item's answer changed, 2 error, 130 interrupted "
        "(finished items are kept: --resume). Example: specview quality --suite arithmetic -n 20",
    )
    groups = add_setting_flags(p)
    _items_not_tokens(p)
    g = p.add_argument_group("suite")
    g.add_argument("--suite", default="mixed", metavar="NAME|FILE",
                   help=f"the task suite: {', '.join(SUITE_NAMES)}, or a .jsonl file of {{\"prompt\", \"answer\"}} "
                   "(\"match\": exact, regex or number) or {\"prompt\", \"test\"} objects (default mixed)")
    g.add_argument("-n", "--items", type=int, default=None, metavar="N",
                   help=f"how many items (a built-in suite: default {DEFAULT_ITEMS}; a file or humaneval: all)")
    g.add_argument("--seed", type=int, default=0, help="the seed a built-in suite's items are generated from "
                   "(default 0: the same items everywhere)")
    g.add_argument("--execute", action="store_true",
                   help="allow running model-written code to score a code suite (humaneval, a JSONL with tests); "
                   "without it such a suite is refused. What the sandbox enforces here is printed first")
    g.add_argument("--allow-weak-sandbox", action="store_true",
                   help="with --execute: run the code even where this machine lacks a fence "
                   "docs/quality-sandbox.md promises (without it such a machine is refused, naming what is missing)")
    add_engine_choice(p, groups["engine"])
    g = p.add_argument_group("output")
    g.add_argument("-o", "--out", default="quality", metavar="DIR",
                   help="folder of the result (DIR/quality.json) and each item's trace (default ./quality)")
    g.add_argument("--resume", action="store_true",
                   help="keep the finished items of an interrupted run in DIR (same suite and settings) and run the rest")
    g.add_argument("--diagnose", choices=DIAGNOSE_CHOICES, default="discordant",
                   help="which forks to diagnose: those of items whose answer changed (default), every fork, none")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=main)
    return p


def _items_not_tokens(p: argparse.ArgumentParser) -> None:
    """``-n`` counts items here (the issue's ``--suite arithmetic -n 20``): the answer length keeps its long flags,
    and its default becomes "by suite" (:data:`TEXT_TOKENS`, :data:`CODE_TOKENS`)."""
    act = p._option_string_actions.pop("-n")
    act.option_strings.remove("-n")
    act.default = None
    act.help = (f"most tokens per answer (default {TEXT_TOKENS}; {CODE_TOKENS} for a code suite)")


def checked_sandbox(allow_weak: bool) -> dict:
    """What the sandbox enforces here, printed on stderr before anything runs (quiet or not: it is what the user
    agreed to); refused where a promised fence is missing, unless ``--allow-weak-sandbox``
    (:func:`~specview.core.quality.execute.sandbox_record`).  The record for the result: ``specview quality``'s
    and ``specview matrix``'s over a code suite alike."""
    from ..core.quality.execute import sandbox_record, sandbox_report

    report = sandbox_report()
    print(report.text(), file=sys.stderr)
    record = sandbox_record(allow_weak)
    if report.missing():
        print("specview: --allow-weak-sandbox: running model-written code without: " + "; ".join(report.missing()),
              file=sys.stderr)
    return record


def main(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..core.errors import SpecviewError
    from ..core.quality import RESULT_FILE, load_suite, run_quality
    from ..core.quality.text import format_result
    from ..core.registry import get_backend
    from ..core.resolve import Resolved
    from .run import resolved_from_args

    progress = Progress(args.quiet)
    suite = load_suite(args.suite, args.items, args.seed)
    if suite.needs_execute and not args.execute:
        raise SpecviewError(f"--suite {args.suite} is code: scoring it runs what the model wrote. Pass --execute to "
                            "allow that (docs/quality.md says how the code is confined)")
    sandbox = checked_sandbox(args.allow_weak_sandbox) if args.execute else None
    args.prompt = args.prompt_file = args.tokens = None  # each item brings its own prompt
    resolved = resolved_from_args(args)
    if args.max_tokens is None:
        resolved = Resolved(replace(resolved.config, max_tokens=CODE_TOKENS if suite.needs_execute else TEXT_TOKENS),
                            resolved.decisions)
    for d in resolved.decisions:
        progress(d.why)
    out = Path(args.out)
    progress(f"{len(suite.items)} items of {suite.name} through both arms ({resolved.config.max_tokens} tokens each)")
    stop = {"now": False}
    old = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))  # a polite stop keeps the finished items
    try:
        with get_backend(resolved.config.backend).runner(progress=progress) as runner:
            result = run_quality(runner, resolved, suite, execute=args.execute, out_dir=out, resume=args.resume,
                                 progress=progress, cancel=lambda: stop["now"], diagnose=args.diagnose,
                                 sandbox=sandbox)
    finally:
        signal.signal(signal.SIGTERM, old)
    print(format_result(result))
    progress(f"result written to {out / RESULT_FILE} (specview report {out / RESULT_FILE} -o DIR for a report)")
    if result.status == "interrupted":
        print("specview: interrupted; run the same command with --resume to finish it", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_CHANGED if result.discordant else EXIT_UNCHANGED
