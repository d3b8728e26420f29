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
    from ..core.diagnose.reference import DEFAULT_CONTINUATION, KL_MEAN_LIMIT, TOP1_LIMIT

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
    add_engine_choice(p, groups["engine"])
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the result as JSON")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=main)
    return p


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
                            chat=chat, continuation=args.continuation, progress=progress)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_check(result))
    return EXIT_BROKEN if result["ok"] is False else EXIT_OK
