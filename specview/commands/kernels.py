"""``specview kernels``: which verify widths compute exactly what single-token passes compute, per target."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from ..core.config import DEMO_TARGET, EngineSettings, RunConfig, declared
from ..core.errors import ConfigError, SpecviewError
from .common import Progress, add_engine_choice, add_setting_flags, check_output, cli_error, given_settings

DEFAULT_POSITIONS = 128


def _csv(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def add_map_flags(p: argparse.ArgumentParser, *, widths: str = "1-16", positions: int = DEFAULT_POSITIONS,
                  stop: bool = False) -> argparse._ArgumentGroup:
    """The flags that say what to map: targets, prompts, widths, positions, and the engine settings."""
    g = p.add_argument_group("map")
    g.add_argument("-m", "--targets", "--target", dest="targets", action="append", type=_csv, default=None,
                   metavar="LIST", help=f"target GGUF files or demo names, comma-separated (default {DEMO_TARGET})")
    g.add_argument("--prompts", action="append", type=_csv, default=None, metavar="LIST",
                   help="built-in prompt names (essay, code, list, technical) or prompt files, comma-separated "
                   "(default: every built-in prompt)")
    g.add_argument("-p", "--prompt", dest="texts", action="append", default=None, metavar="TEXT",
                   help="a prompt text (repeatable)")
    g.add_argument("--widths", default=widths, help=f"verify widths to map, e.g. 1-16 or 1-4,8,16; width 1 "
                   f"(the rollback control) is always mapped (default {widths})")
    g.add_argument("--positions", type=int, default=positions,
                   help=f"teacher-forced positions per prompt at every width (default {positions})")
    g.add_argument("--stop-at-difference", action=argparse.BooleanOptionalAction, default=stop,
                   help="stop measuring a width at its first row that differs: which widths are bit-identical is "
                   "answered as fully, in less time, but a differing width's figures cover only the rows measured "
                   f"(default {'on' if stop else 'off'})")
    g.add_argument("--locate", action=argparse.BooleanOptionalAction, default=False,
                   help="for every width that differs, locate its first differing row (specview locate) and group "
                   "the widths by the op where they first depart; about one to two seconds per differing width "
                   "on the demo at one thread (default off)")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    skip = [f.name for f in declared(RunConfig) if f.name not in ("chat", "top_k")]
    # the context is sized to the map; settings declared for one engine only (a server's binary) do not apply
    # the server engines' own settings (a binary, its flags) mean nothing to a map; llama.cpp's knobs (GGML_VK_*) do
    skip += ["n_ctx"] + [f.name for f in declared(EngineSettings)
                         if f.metadata["only_for"] and "llama.cpp" not in f.metadata["only_for"]]
    groups = add_setting_flags(p, matrix=True, skip=skip)
    add_engine_choice(p, groups.get("engine"))
    return g


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "kernels",
        help="map which draft widths are bit-identical to single-token passes on this build",
        description="Teacher-force each target's own greedy continuation of a few prompts and compute every "
        "position twice: as a single-token pass (what plain decoding runs) and as row j of a width-T verify "
        "pass on the same KV prefix (what speculative decoding runs), for every width asked. Prints, per "
        "target and width, how many rows are bit-identical, the max and p95 |logit difference| over both "
        "rows' top-k, argmax flips and the positions whose margin is below the shift, then a heatmap. "
        "A draft of n_max tokens uses widths 1..n_max+1: where all are bit-identical, that n_max is proven "
        "lossless for these prompts on this build (docs/diagnosis.md).",
        epilog="Example: specview kernels --targets demo:F16,demo:Q8_0,demo:Q4_K_M --widths 1-16 "
        "--positions 128 -o kernels.json. Exit status: 0 done, 2 error, 130 interrupted.",
    )
    g = add_map_flags(p)
    g.add_argument("-o", "--output", "--json", dest="output", metavar="FILE", default=None,
                   help="save the map as JSON (schema specview.kernels/1)")
    g.add_argument("--show", metavar="FILE", default=None, help="print a saved map instead of computing one")
    p.set_defaults(func=main)
    return p


def settings_from_args(args: argparse.Namespace) -> list[EngineSettings]:
    """One EngineSettings per combination of the axis values given (--flash-attn, --no-repack): the map covers each.

    Where --no-repack/--repack is not given it stays unset, and the engine decides it for this machine when
    the map runs (no repack where the crash probe crashed: :mod:`specview.core.resolve`).
    """
    import itertools

    given = given_settings(args, EngineSettings)
    names = [n for n in ("flash_attn", "no_repack") if n in given]
    lists = [list(dict.fromkeys(v for group in given.pop(n) for v in group)) for n in names]
    try:
        base = replace(EngineSettings(), **given)
        return [replace(base, **dict(zip(names, combo))) for combo in itertools.product(*lists)]
    except ConfigError as exc:
        raise cli_error(exc) from None


def prompts_from_args(args: argparse.Namespace) -> list:
    from ..core.prompts import PromptSpec, builtin_names, builtin_prompts, prompt_from_file

    chat = True if args.chat is None else bool(args.chat)
    out = []
    names = [n for group in (args.prompts or []) for n in group]
    builtin = set(builtin_names())
    for n in names:
        if n in builtin:
            out.append(replace(builtin_prompts([n])[0], chat=chat))
        elif Path(n).expanduser().exists():
            out.append(prompt_from_file(n, chat=chat, pipes=True))
        else:
            raise SpecviewError(f"--prompts: {n!r} is neither a built-in prompt ({', '.join(sorted(builtin))}) "
                                "nor an existing file")
    for i, text in enumerate(args.texts or []):
        out.append(PromptSpec(name=f"prompt{i + 1}", text=text, chat=chat))
    if not out:
        out = [replace(p, chat=chat) for p in builtin_prompts()]
    return out


def backend_of(args: argparse.Namespace):
    from ..core.registry import get_backend

    backend = args.backend or "llama.cpp"
    be = get_backend(backend)
    if not be.in_process:
        raise SpecviewError(f"--engine {backend}: the kernel map runs forward passes itself; use an in-process "
                            "engine (llama.cpp, mlx) on the same model file")
    return be


def map_from_args(args: argparse.Namespace, session, progress: Progress):
    """The kernel map the flags ask for, on ``session``'s loaded models."""
    from ..core.kernels.map import kernel_map, parse_widths

    try:
        widths = parse_widths(args.widths)
    except ConfigError as exc:
        raise SpecviewError(f"--widths: {exc}") from None
    if args.positions < 1:
        raise SpecviewError(f"--positions must be >= 1 (got {args.positions})")
    targets = [t for group in (args.targets or [[DEMO_TARGET]]) for t in group]
    settings = settings_from_args(args)
    prompts = prompts_from_args(args)
    progress(f"mapping {len(targets)} target(s) x {len(settings)} setting(s) over {len(prompts)} prompt(s), "
             f"widths {args.widths}, {args.positions} positions each")
    try:
        km = kernel_map(session, targets, prompts, widths, args.positions, settings,
                        backend=args.backend or "llama.cpp", top_k=args.top_k or 8, progress=progress,
                        stop_at_difference=args.stop_at_difference)
    except ConfigError as exc:
        raise cli_error(exc) from None
    return with_causes(km, session, progress) if getattr(args, "locate", False) else km


def with_causes(km, session, progress: Progress):
    """``km`` with each differing width's cause located (``--locate``), on ``session``'s engine."""
    from ..core.kernels.causes import locate_causes

    km = session.job(locate_causes, km, progress=progress)
    for t in km.targets:
        progress(f"{t.label}: the locates of its differing widths took {t.locate_seconds:.1f} s")
    return km


def main(args: argparse.Namespace) -> int:
    from ..core.kernels.map import KernelMap

    if args.show:
        km = KernelMap.load(args.show)
    else:
        progress = Progress(args.quiet)
        check_output(args.output)
        t0 = time.perf_counter()
        with backend_of(args).runner(progress=progress) as session:
            km = map_from_args(args, session, progress)
        if args.output:
            progress(f"kernel map written to {km.save(args.output)}")
        progress(f"done in {time.perf_counter() - t0:.1f} s")
    print(km.table())
    print()
    print(km.heatmap())
    return 0
