"""``specview check``: is the backend sane?  The same tokens on this build and on a reference, compared."""

from __future__ import annotations

import argparse
import json

from ..core.config import DEMO_TARGET
from ..core.errors import ConfigError, SpecviewError
from .common import Progress, add_engine_choice, add_setting_flags, cli_error, engine_settings, read_prompt_file

EXIT_OK, EXIT_BROKEN = 0, 1
#: the run settings that mean nothing to a teacher-forced check (only the target, the prompt and the engine do)
_SKIP = ("draft", "spec_type", "n_max", "n_min", "p_min", "ngram_size_n", "ngram_size_m", "serial_verify",
         "max_tokens", "ignore_eos", "top_k", "server_bin", "server_args")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from ..core.config import RunConfig
    from ..core.diagnose.reference import DEFAULT_CONTINUATION, KL_MEAN_LIMIT, TOP1_LIMIT

    DEFAULT_N_MAX = RunConfig.__dataclass_fields__["n_max"].default

    p = sub.add_parser(
        "check",
        help="check the backend against the CPU: KL divergence and top-1 agreement of the same tokens",
        description="Is this build's backend sane? Teacher-force the same tokens (each prompt plus "
        f"{DEFAULT_CONTINUATION} greedy tokens) on your build with the GPU (-ngl > 0 on a GPU build) and on the CPU "
        "(-ngl 0), and report per-position KL divergence (mean, p99, max), the share of positions with the same "
        "top-1 token, the largest logit difference and both perplexities, as llama-perplexity --kl-divergence does, "
        "in one command and without a baseline file. On a CPU-only build the pair is one thread against all threads. "
        f"A pair is broken when the mean KL is above {KL_MEAN_LIMIT:g} nats, the same top-1 share below "
        f"{TOP1_LIMIT:.0%}, or a logit is not finite: read nothing into a fork on such a backend.",
        epilog="Exit status: 0 sane (or no pair to compare on this machine), 1 broken, 2 error.",
    )
    groups = add_setting_flags(p, skip=_SKIP)
    g = groups["prompt"]
    src = g.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", action="append", default=None,
                     help="a prompt text (repeatable; default: the built-in prompts)")
    src.add_argument("-f", "--prompt-file", action="append", default=None,
                     help="read a prompt from a file (repeatable; '-' for stdin)")
    src.add_argument("--prompts", default=None, metavar="NAMES",
                     help="built-in prompts by name, comma-separated (essay, technical, code, list)")
    g.add_argument("-n", "--continuation", type=int, default=DEFAULT_CONTINUATION, metavar="N",
                   help=f"greedy tokens the reference adds after each prompt (default {DEFAULT_CONTINUATION})")
    g.add_argument("--widths", default=f"1-{DEFAULT_N_MAX + 1}", metavar="LIST",
                   help="verify widths to check the continuation at, each as passes of exactly that many tokens: "
                   "a range 1-4, a list 1,2,4,8, or none (default: 1 to n_max + 1 of llama.cpp's default n_max, "
                   f"1-{DEFAULT_N_MAX + 1})")
    add_engine_choice(p, groups["engine"])
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the result as JSON")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=main)
    return p


def parse_widths(text: str) -> list[int]:
    """``1-4`` -> [1, 2, 3, 4]; ``1,2,8`` -> [1, 2, 8]; ``none`` -> []; anything else is a one-line error."""
    t = text.strip().lower()
    if t in ("none", "0", ""):
        return []
    out: set[int] = set()
    try:
        for part in t.split(","):
            a, dash, b = part.strip().partition("-")
            lo, hi = int(a), int(b) if dash else int(a)
            if lo < 1 or hi < lo or hi > 512:
                raise ValueError
            out.update(range(lo, hi + 1))
    except ValueError:
        raise SpecviewError(f"--widths {text!r}: give widths from 1 to 512 as a range (1-4), a list (1,2,4,8) or "
                            "none") from None
    return sorted(out)


def _prompts(args: argparse.Namespace) -> list[tuple[str, str]]:
    from ..core.prompts import builtin_prompts

    if args.prompt:
        return [(f"prompt {i + 1}" if len(args.prompt) > 1 else "prompt", t) for i, t in enumerate(args.prompt)]
    if args.prompt_file:
        return [(str(f), read_prompt_file(f)) for f in args.prompt_file]
    names = [n.strip() for n in args.prompts.split(",") if n.strip()] if args.prompts else None
    return [(p.name, p.text or "") for p in builtin_prompts(names)]


def main(args: argparse.Namespace) -> int:
    from ..core.diagnose.reference import check_texts, format_check
    from ..core.registry import get_backend

    progress = Progress(args.quiet or args.json)
    if args.continuation < 0:
        raise SpecviewError(f"--continuation must be >= 0 (got {args.continuation})")
    widths = parse_widths(args.widths)
    if widths and args.continuation < 2:
        raise SpecviewError("--widths checks the continuation's positions: give --continuation 2 or more, or "
                            "--widths none")
    try:
        settings = engine_settings(args)
    except ConfigError as exc:
        raise cli_error(exc) from None
    target = args.target or DEMO_TARGET
    chat = True if args.chat is None else bool(args.chat)
    backend = get_backend(args.backend)
    if not backend.in_process:
        raise SpecviewError(f"the backend check teacher-forces tokens in-process; the {backend.name} engine cannot "
                            "return the logits of every position. Check the same GGUF with --engine llama.cpp "
                            "(the same llama.cpp build) instead.")
    texts = _prompts(args)
    with backend.runner(progress=progress) as runner:
        result = runner.job(check_texts, backend=backend.name, target=target, settings=settings, texts=texts,
                            chat=chat, continuation=args.continuation, progress=progress, widths=widths)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_check(result))
    return EXIT_BROKEN if result["ok"] is False else EXIT_OK
