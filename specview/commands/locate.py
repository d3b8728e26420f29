"""``specview locate``: the first graph node where the batched pass departs from the single-token pass."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..core.config import DEMO_TARGET, EngineSettings, RunConfig, declared
from ..core.errors import ConfigError, SpecviewError
from .common import (Progress, add_engine_choice, add_setting_flags, check_output, cli_error, engine_settings,
                     parse_tokens)

NOT_OBSERVABLE = {
    "llama-server": "llama-server computes its passes in its own process and shows none of their nodes",
    "mlx-server": "mlx_lm.server computes its passes in its own process and shows none of their nodes",
}


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "locate",
        help="name the first op where a verify pass's row departs from the single-token pass",
        description="Run the single-token pass and a width-T pass from the same teacher-forced KV prefix, "
        "capture every node of both graphs (llama.cpp's cb_eval), and compare row J of each batched node "
        "with the single-token node in graph order. Prints the first node that differs (its op, input types "
        "and shapes, the weight's type and buffer: CPU, CPU_REPACK, AMX, Vulkan0 ...), how the difference "
        "grows layer by layer, and how many logits differ. Both observed passes are checked against an "
        "unobserved context, bit for bit. With --engine mlx (an MLX model folder) the passes are compared per "
        "layer, not per op: the embedding, each transformer block's output, the final norm and the logits.",
        epilog="Examples: specview locate -m demo:F16 --width 4 --position 20; specview locate --trace "
        "trace.json (the trace's fork, with its own target and settings). Exit status: 0 no difference, "
        "1 a node differs, 2 error, 130 interrupted.",
    )
    g = p.add_argument_group("locate")
    g.add_argument("-m", "--target", "--model", dest="target", default=None, metavar="MODEL",
                   help=f"target GGUF file, MLX folder (--engine mlx) or demo name (default {DEMO_TARGET}, or the trace's)")
    g.add_argument("--width", type=int, default=None, metavar="T",
                   help="width of the verify pass (1 + drafted tokens); the trace's fork pass with --trace")
    g.add_argument("--row", type=int, default=None, metavar="J", help="row of the pass to compare (default 0)")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--position", type=int, default=None, metavar="P",
                       help="generated token to compute (default: row + 1); the sequence is the target's own "
                       "greedy continuation of the prompt")
    where.add_argument("--trace", default=None, metavar="TRACE.json",
                       help="locate this trace's fork: its target, prompt, settings, and the width and row of "
                       "the verify pass that chose the differing token")
    g.add_argument("-p", "--prompt", default=None, help="prompt text (default: the demo's essay prompt)")
    g.add_argument("--tokens", default=None, metavar="IDS", help="raw prompt token ids instead of a text")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap the prompt in the model's chat template (default on)")
    g.add_argument("--json", dest="json_out", default=None, metavar="OUT",
                   help="write the locate as JSON (schema specview.locate/1)")
    g.add_argument("--show", default=None, metavar="FILE", help="print a saved locate instead of running one")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    skip = [f.name for f in declared(RunConfig)]
    skip += ["n_ctx"] + [f.name for f in declared(EngineSettings) if f.metadata["only_for"]]
    groups = add_setting_flags(p, matrix=True, skip=skip)  # None = not given: a trace's setting stands
    add_engine_choice(p, groups.get("engine"), matrix=True)
    p.set_defaults(func=main)
    return p


def _single_values(args: argparse.Namespace) -> None:
    """A matrix-style flag gives a list (an axis); locate runs one setting: take its one value."""
    for f in declared(EngineSettings):
        v = getattr(args, f.name, None)
        if isinstance(v, list):
            flat = [x for group in v for x in (group if isinstance(group, list) else [group])]
            if len(set(flat)) != 1:
                raise SpecviewError(f"{f.metadata['flags'][-1]}: locate runs one setting (got {', '.join(map(str, flat))})")
            setattr(args, f.name, flat[0])


def request_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`specview.core.locate.find.locate` the flags ask for."""
    from ..core.demo import DEMO_PROMPT

    _single_values(args)
    req: dict[str, Any]
    if args.trace:
        from ..core.locate.find import fork_of
        from ..core.trace import Trace

        req = fork_of(Trace.load(args.trace))
        base = req["settings"]
        if args.target:
            req["target"] = args.target
        if args.width is not None:
            req["width"] = args.width
        if args.row is not None:
            req["row"] = args.row
    else:
        if args.width is None:
            raise SpecviewError("give --width T (or --trace TRACE.json, which names its own)")
        base = None
        req = {"target": args.target or DEMO_TARGET, "width": args.width, "row": args.row or 0,
               "position": args.position, "backend": args.backend or "llama.cpp", "chat": bool(args.chat)}
        if args.tokens:
            req["prompt_tokens"] = list(parse_tokens(args.tokens))
        else:
            req["prompt"] = args.prompt if args.prompt is not None else DEMO_PROMPT
    if args.backend:
        req["backend"] = args.backend
    try:
        req["settings"] = engine_settings(args, base)
    except ConfigError as exc:
        raise cli_error(exc) from None
    if req["backend"] in NOT_OBSERVABLE:
        raise SpecviewError(f"--engine {req['backend']}: not observable: {NOT_OBSERVABLE[req['backend']]}. "
                            "Locate the same GGUF file with --engine llama.cpp (the default).")
    return req


def run_locate(runner: Any, req: dict[str, Any], progress: Any) -> Any:
    """The locate on ``runner``'s engine (in its worker process where it has one)."""
    from ..core.locate.find import locate

    return runner.job(locate, progress=progress, **req)


def main(args: argparse.Namespace) -> int:
    from ..core.locate.find import Located
    from ..core.registry import get_backend

    if args.show:
        try:
            loc = Located.load(args.show)
        except SpecviewError:
            from ..core.jsonfile import declares_schema

            if declares_schema(args.show, "specview.trace"):
                raise SpecviewError(f"--show {args.show}: a specview trace, not a locate; to locate its fork, run "
                                    f"`specview locate --trace {args.show}`") from None
            raise
    else:
        progress = Progress(args.quiet)
        check_output(args.json_out, "--json")
        req = request_from_args(args)
        t0 = time.perf_counter()
        try:
            with get_backend(req["backend"]).runner(progress=progress) as runner:
                loc = run_locate(runner, req, progress)
        except ConfigError as exc:
            if exc.setting in ("row", "position", "width"):
                raise SpecviewError(f"--{exc.setting}: {exc}") from None
            raise cli_error(exc) from None
        if args.json_out:
            progress(f"locate written to {loc.save(args.json_out)}")
        progress(f"done in {time.perf_counter() - t0:.1f} s")
    print(loc.text())
    return 0 if loc.identical else 1
