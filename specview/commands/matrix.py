"""``specview matrix``: run both arms over every combination of a few settings and say what flips the outcome."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ..core.engine import SpecviewError
from .common import Progress, add_engine_flags, engine_settings, parse_tokens

EXIT_IDENTICAL, EXIT_DIVERGED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130

DEFAULT_TARGETS = ["demo:F16", "demo:Q8_0", "demo:Q4_K_M"]
DEFAULT_DRAFTERS = ["demo:Q4_0", "ngram-simple"]


def _csv(kind: type):
    def parse(text: str) -> list[Any]:
        out = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(kind(part))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{part!r} is not a valid {kind.__name__}") from None
        if not out:
            raise argparse.ArgumentTypeError("empty list")
        return out

    parse.__name__ = f"{kind.__name__} list"
    return parse


def _fa_list(text: str) -> list[str]:
    vals = _csv(str)(text)
    for v in vals:
        if v not in ("auto", "on", "off"):
            raise argparse.ArgumentTypeError(f"flash attention is auto, on or off (got {v!r})")
    return vals


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "matrix",
        help="run a reproducer matrix over quantizations, drafters and settings",
        description="Run vanilla and speculative decoding for every combination of targets, drafters, "
        "n_max, p_min, flash attention and prompts; record identical / first mismatch, the verdict, "
        "acceptance and speedup per cell; and say in plain words which setting flips the outcome. "
        "Each model file is loaded once; the vanilla arm runs once per target, prompt and settings. "
        "Results are rewritten to the JSON file after every cell (schema specview.matrix/1). "
        "List values are comma-separated; list flags may be repeated. Flags override the --config file.",
        epilog="Exit status: 0 every cell identical, 1 some cell forks, 2 error (or only failed cells), "
        "130 interrupted (finished cells are kept). Example: specview matrix --targets demo:F16,demo:Q8_0 "
        "--drafters demo:Q4_0,ngram-simple,none --n-max 1,4 --p-min 0,1 -n 64 -o matrix.json",
    )
    p.add_argument("--config", metavar="TOML", default=None, help="read the axes from a TOML file (docs/matrix.md)")
    g = p.add_argument_group("axes")
    g.add_argument("-m", "--targets", "--target", dest="targets", action="append", type=_csv(str), default=None, metavar="LIST",
                   help=f"target GGUF files or demo names (default {','.join(DEFAULT_TARGETS)})")
    g.add_argument("-md", "--drafters", "--draft", dest="drafters", action="append", type=_csv(str), default=None, metavar="LIST",
                   help="draft models (files or demo names: draft-simple), ngram-simple, none "
                   f"(default {','.join(DEFAULT_DRAFTERS)})")
    g.add_argument("--n-max", "--spec-draft-n-max", dest="n_max", action="append", type=_csv(int), default=None, metavar="LIST",
                   help="n_max values for draft-simple cells (default 3)")
    g.add_argument("--p-min", "--spec-draft-p-min", dest="p_min", action="append", type=_csv(float), default=None, metavar="LIST",
                   help="p_min values for draft-simple cells; 1 is the zero-draft control (default 0,1)")
    g.add_argument("-p", "--prompt", dest="prompts", action="append", default=None, metavar="TEXT",
                   help="a prompt text (repeatable)")
    g.add_argument("-f", "--prompt-file", dest="prompt_files", action="append", default=None, metavar="FILE",
                   help="a prompt file (repeatable)")
    g.add_argument("--tokens", dest="tokens", action="append", default=None, metavar="IDS",
                   help="a raw-token prompt ('1,2,3'): no BOS, no template (repeatable)")
    g.add_argument("--builtin-prompts", action=argparse.BooleanOptionalAction, default=None,
                   help="include the four built-in prompts (essay, technical, code, list); "
                   "default: on when no other prompt is given")
    g = p.add_argument_group("every cell")
    g.add_argument("-n", "--max-tokens", "--n-predict", dest="max_tokens", type=int, default=None,
                   help="tokens to generate per arm (default 128)")
    g.add_argument("--n-min", "--spec-draft-n-min", dest="n_min", type=int, default=None,
                   help="drop a draft shorter than this (default 0)")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap text prompts in the chat template (default on)")
    g.add_argument("--ignore-eos", action="store_true", default=None, help="keep generating past end-of-generation")
    add_engine_flags(p)
    fa = p._option_string_actions["--flash-attn"]  # the shared flag becomes an axis here
    fa.choices = None
    fa.type = _fa_list
    fa.default = None
    fa.help = "flash attention: auto, on, off, or a list such as on,off (an axis; default auto)"
    fa.metavar = "LIST"
    g = p.add_argument_group("output")
    g.add_argument("-o", "--out", "--json", dest="out", default="matrix.json",
                   help="JSON results, rewritten after every cell (default matrix.json)")
    g.add_argument("--traces", metavar="DIR", default=None, help="also save every cell's full trace in DIR")
    g.add_argument("--resume", action="store_true",
                   help="keep the finished cells of an interrupted run in -o (same definition) and run the rest")
    g.add_argument("--diagnose", action=argparse.BooleanOptionalAction, default=None,
                   help="diagnose every fork: near-tie, state bug or nondeterminism (default on)")
    g.add_argument("--dry-run", action="store_true", help="list the cells and exit")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=main)
    return p


def _flat(values: list[list[Any]] | None) -> list[Any] | None:
    if values is None:
        return None
    return [v for group in values for v in group]


def spec_from_args(args: argparse.Namespace):
    from ..core.matrix import PromptSpec, builtin_prompts, load_spec, prompt_from_file, spec_from_dict

    if args.config:
        spec = load_spec(args.config)
        from_file = True
    else:
        spec = spec_from_dict({"targets": DEFAULT_TARGETS, "drafters": DEFAULT_DRAFTERS, "p_min": [0.0, 1.0],
                               "builtin_prompts": False})
        from_file = False
    for key in ("targets", "drafters", "n_max", "p_min"):
        v = _flat(getattr(args, key))
        if v is not None:
            setattr(spec, key, v)
    if args.flash_attn is not None:
        spec.flash_attn = list(args.flash_attn)
    chat = True if args.chat is None else bool(args.chat)
    given: list[PromptSpec] = []
    for i, text in enumerate(args.prompts or []):
        given.append(PromptSpec(name=f"prompt{i + 1}", text=text, chat=chat))
    for f in args.prompt_files or []:
        ps = prompt_from_file(f, chat=chat)
        name, k = ps.name, 2
        while any(q.name == name for q in given):
            name, k = f"{ps.name}-{k}", k + 1
        given.append(PromptSpec(name=name, text=ps.text, chat=chat))
    for i, t in enumerate(args.tokens or []):
        given.append(PromptSpec(name=f"tokens{i + 1}" if len(args.tokens) > 1 else "tokens", tokens=parse_tokens(t),
                                chat=False))
    if given or args.builtin_prompts is not None or not from_file:
        use_builtin = args.builtin_prompts if args.builtin_prompts is not None else not given
        spec.prompts = (builtin_prompts() if use_builtin else []) + given
    if not spec.prompts:
        raise SpecviewError("no prompt: give --prompt, --prompt-file, --tokens or --builtin-prompts")
    if args.max_tokens is not None:
        spec.max_tokens = args.max_tokens
    if args.n_min is not None:
        spec.n_min = args.n_min
    if args.ignore_eos:
        spec.ignore_eos = True
    if args.diagnose is not None:
        spec.diagnose = bool(args.diagnose)
    if args.engine != "llama.cpp":
        spec.backend = args.engine
    # engine flags given on the command line win over the file's [engine] table
    defaults = {"n_ctx": 0, "n_batch": 512, "n_ubatch": 512, "gpu_layers": -1, "threads": 0, "kv_type": "f16"}
    args.flash_attn = "auto"
    cli = engine_settings(args)
    from dataclasses import replace

    spec.engine = replace(spec.engine, **{k: getattr(cli, k) for k, d in defaults.items() if getattr(cli, k) != d})
    spec.validate()
    return spec


def main(args: argparse.Namespace) -> int:
    from ..core.matrix import describe, expand, summarize

    progress = Progress(args.quiet)
    spec = spec_from_args(args)
    cells = expand(spec)
    if args.dry_run:
        for i, c in enumerate(cells):
            print(f"{i:3d}  {describe(c)}")
        print(f"{len(cells)} cells")
        return EXIT_IDENTICAL
    out = Path(args.out)
    if not out.parent.is_dir() and str(out.parent):
        raise SpecviewError(f"-o {out}: the folder {out.parent} does not exist")

    from ..core.matrix import load_matrix, run_matrix
    from ..core.session import Session

    resume = None
    if args.resume:
        if out.exists():
            resume = load_matrix(out)
        else:
            progress(f"--resume: {out} does not exist yet; running every cell")

    stop = {"asked": False}

    def on_sigint(signum, frame):  # first Ctrl-C: finish writing and stop; second: stop at once
        if stop["asked"]:
            raise KeyboardInterrupt
        stop["asked"] = True
        progress("interrupted: stopping after writing the finished cells (Ctrl-C again to abort at once)")

    old = signal.signal(signal.SIGINT, on_sigint) if _main_thread() else None
    if args.engine == "llama-server":
        from ..backends.server import ServerRunner

        session = ServerRunner(server_bin=args.server_bin, server_args=args.server_args, progress=progress)
    else:
        session = Session(progress=progress)
    t0 = time.perf_counter()
    progress(f"{len(cells)} cells, {spec.max_tokens} tokens per arm; results stream to {out}")
    try:
        run = run_matrix(spec, session, out=out, traces_dir=args.traces, progress=progress,
                         cancel=lambda: stop["asked"], resume=resume)
    finally:
        session.close()
        if old is not None:
            signal.signal(signal.SIGINT, old)
    doc = run.to_json()
    print(f"matrix: {len(run.records)} of {len(cells)} cells; {run.counters.get('loads', 0)} model loads, "
          f"{run.counters.get('vanilla_runs', 0)} vanilla runs, {run.counters.get('speculative_runs', 0)} "
          f"speculative runs ({time.perf_counter() - t0:.0f} s)")
    print(format_grid(doc))
    print()
    for line in summarize(doc):
        print(line)
    progress(f"results written to {out}")
    if run.status == "interrupted":
        return EXIT_INTERRUPTED
    ok = [r for r in run.records if r["status"] == "ok"]
    if any(not r["identical"] for r in ok):
        return EXIT_DIVERGED
    if len(ok) < len(run.records):
        return EXIT_ERROR
    return EXIT_IDENTICAL


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def cell_text(cell: dict[str, Any] | None) -> str:
    from ..core.matrix import verdict_label

    if cell is None:
        return "(not run)"
    if cell.get("status") == "error":
        return "error"
    if cell["identical"]:
        return "identical"
    v = verdict_label(cell)
    v = "diverged" if v.startswith("diverged") else v
    return f"fork@{cell['first_mismatch']} {v}"


def format_grid(doc: dict[str, Any]) -> str:
    """The grid as plain text for the terminal."""
    from ..core.matrix import grid

    g = grid(doc)
    head = [" · ".join(g.row_axes)] + [g.col_label(c) for c in g.cols]
    rows = [[g.row_label(r)] + [cell_text(g.at.get((r, c))) for c in g.cols] for r in g.rows]
    widths = [max(len(x[i]) for x in [head] + rows) for i in range(len(head))]
    fmt = lambda row: "  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


if __name__ == "__main__":  # pragma: no cover
    from ..cli import main as cli_main

    sys.exit(cli_main(["matrix", *sys.argv[1:]]))
