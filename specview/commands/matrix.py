"""``specview matrix``: run both arms over every combination of a few settings and say what flips the outcome.

The flags of the axes and of the settings every cell shares are generated from
the settings' declarations (:func:`~specview.commands.common.add_setting_flags`
with ``matrix=True``: an axis setting takes a comma-separated list); only the
matrix's own axes (targets, drafters, prompts, the suite) are written here.
"""

from __future__ import annotations

import argparse
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core.config import DEMO_DRAFT, DEMO_TARGET, EngineSettings, RunConfig, axes, field_of, settings_class
from ..core.errors import ConfigError, SpecviewError
from ..core.matrix.summary import cell_text
from .common import Progress, add_engine_choice, add_setting_flags, check_output, cli_error, given_settings, parse_tokens

EXIT_IDENTICAL, EXIT_DIVERGED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130

DEFAULT_TARGETS = ["demo:F16", "demo:Q8_0", "demo:Q4_K_M"]
DEFAULT_DRAFTERS = ["demo:Q4_0", "ngram-simple"]
DEFAULT_P_MIN = [0.0, 1.0]
#: settings a matrix gives each cell through its own axes (targets, drafters, prompts)
OWN_AXES = ("target", "draft", "spec_type")


def _csv(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def _with_choices(parse: Any, name: str) -> Any:
    """An axis list parser that also refuses values outside the setting's declared choices."""
    f = field_of(settings_class(name), name)
    choices = list(f.metadata.get("choices") or ())
    label = (f.metadata.get("label") or name).lower()

    def checked(text: str) -> list[Any]:
        vals = parse(text)
        for v in vals:
            if v not in choices:
                words = ", ".join(map(str, choices[:-1])) + f" or {choices[-1]}"
                raise argparse.ArgumentTypeError(f"{label} is {words} (got {v!r})")
        return vals

    checked.__name__ = getattr(parse, "__name__", name)
    return checked


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "matrix",
        help="run a reproducer matrix over quantizations, drafters and settings",
        description="Run vanilla and speculative decoding for every combination of targets, drafters, "
        f"{', '.join(axes())} and prompts; record identical / first mismatch, the verdict, "
        "acceptance and speedup per cell; and say in plain words which setting flips the outcome. "
        "With --suite it runs the built-in prompt suite and reports, per setting, the divergence rate with a "
        "95% interval, where the forks fall and how large the gaps at the forks are. "
        "Each model file is loaded once; the vanilla arm runs once per target, prompt and settings. "
        "Results are rewritten to the JSON file after every cell (schema specview.matrix/1). "
        "List values are comma-separated; list flags may be repeated. Flags override the --config file.",
        epilog="Exit status: 0 every cell identical, 1 some cell forks, 2 error (or only failed cells), "
        "130 interrupted (finished cells are kept). Example: specview matrix --targets demo:F16,demo:Q8_0 "
        "--drafters demo:Q4_0,ngram-simple,none --n-max 1,4 --p-min 0,1 -n 64 -o matrix.json",
    )
    p.add_argument("--config", metavar="TOML", default=None, help="read the axes from a TOML file (docs/matrix.md)")
    from ..core.matrix.preset import preset_names

    p.add_argument("--preset", choices=preset_names(), default=None, metavar="NAME",
                   help="run a public report's localising matrix (" + ", ".join(preset_names()) + "): its parts, "
                   "their roles and a summary that says what the cells establish (docs/matrix.md, Presets)")
    p.add_argument("--model", dest="preset_models", action="append", default=None, metavar="ROLE=MODEL",
                   help="with --preset: put your model in a role of the preset (repeatable; e.g. "
                   "--model quantized=Qwen3-8B-Q4_K_M.gguf); the roles default to the demo")
    g = p.add_argument_group("axes")
    g.add_argument("-m", "--targets", "--target", dest="targets", action="append", type=_csv, default=None,
                   metavar="LIST", help=f"target GGUF files or demo names (default {','.join(DEFAULT_TARGETS)}; "
                   f"{DEMO_TARGET} with --suite)")
    g.add_argument("-md", "--drafters", "--draft", dest="drafters", action="append", type=_csv, default=None,
                   metavar="LIST", help="draft models (files or demo names: draft-simple); TYPE:MODEL for another "
                   "spec type with a draft file (draft-eagle3:eagle.gguf, draft-dspark:demo:dspark); a spec type "
                   "alone (ngram-simple, none; with --engine llama-server also draft-mtp, ngram-mod, ...); or all: "
                   "every spec type the engine runs that has a drafter "
                   f"(default {','.join(DEFAULT_DRAFTERS)}; {DEMO_DRAFT} with --suite)")
    g.add_argument("-p", "--prompt", dest="prompts", action="append", default=None, metavar="TEXT",
                   help="a prompt text (repeatable)")
    g.add_argument("-f", "--prompt-file", dest="prompt_files", action="append", default=None, metavar="FILE",
                   help="a prompt file (repeatable)")
    g.add_argument("--tokens", dest="tokens", action="append", default=None, metavar="IDS",
                   help="a raw-token prompt ('1,2,3'): no BOS, no template (repeatable)")
    g.add_argument("--builtin-prompts", action=argparse.BooleanOptionalAction, default=None,
                   help="include the four built-in prompts (essay, technical, code, list); "
                   "default: on when no other prompt is given")
    g.add_argument("--suite", nargs="?", const="all", default=None, metavar="CATEGORIES|SUITE",
                   help="run the built-in prompt suite (all of it, or a comma-separated list of categories) and "
                   "report divergence rates; defaults to the demo's setting and its run length. With the name of a "
                   "task suite (" + ", ".join(_task_suite_names()) + ") or a .jsonl file, as in specview quality, "
                   "its items are the prompts and each cell also scores both arms' answers: per setting, how many "
                   "answers stayed the same and how many changed, with McNemar's exact p")
    g.add_argument("--items", type=int, default=None, metavar="N",
                   help="with a task suite: its first N items (a built-in suite's default: 50; a file: all)")
    g.add_argument("--seed", type=int, default=0, metavar="S", help="with a built-in task suite: the seed that "
                   "generates its items (default 0)")
    g.add_argument("--execute", action="store_true",
                   help="with a code task suite (HumanEval, a .jsonl file with tests): run the model-written code "
                   "in the sandbox to score it (refused without). What the sandbox enforces here is printed first")
    g.add_argument("--allow-weak-sandbox", action="store_true",
                   help="with --execute: run the code even where this machine lacks a fence "
                   "docs/quality-sandbox.md promises (without it such a machine is refused, naming what is missing)")
    groups = add_setting_flags(p, matrix=True, skip=OWN_AXES)
    for name in axes():
        f = field_of(settings_class(name), name)
        if f.metadata.get("choices"):
            act = p._option_string_actions[f.metadata["flags"][0]]
            act.type = _with_choices(act.type, name)
    _matrix_defaults_in_help(p)
    add_engine_choice(p, groups.get("engine"), matrix=True)
    g = p.add_argument_group("output")
    g.add_argument("-o", "--out", "--json", dest="out", default="matrix.json",
                   help="JSON results, rewritten after every cell (default matrix.json)")
    g.add_argument("--traces", metavar="DIR", default=None, help="also save every cell's full trace in DIR")
    g.add_argument("--resume", action="store_true",
                   help="keep the finished cells of an interrupted run in -o (same definition) and run the rest")
    g.add_argument("--diagnose", action=argparse.BooleanOptionalAction, default=None,
                   help="diagnose every fork: near-tie, state bug or nondeterminism (default on)")
    g.add_argument("--stop-after-fork", type=int, default=None, metavar="N",
                   help="stop each cell's speculative arm N tokens after its fork (default: 16 with --suite, "
                   "else never)")
    g.add_argument("--full-text", action="store_true",
                   help="generate every cell's full text, even after a fork")
    g.add_argument("--kernel-map", metavar="FILE", default=None,
                   help="cite a kernel map (specview kernels -o FILE): each cell records what the map predicts for it "
                   "(proven lossless, kernels differ, not covered), and the summary says which cells the map proves "
                   "lossless, whether they were identical, and every cell that contradicts it")
    g.add_argument("--dry-run", action="store_true", help="list the cells (and, with --kernel-map, each cell's "
                   "prediction) and exit")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=main)
    return p


def _matrix_defaults_in_help(p: argparse.ArgumentParser) -> None:
    """Where a matrix's default differs from a single run's, its flag's help says the matrix's."""
    import re

    from ..core.matrix.settings import MATRIX_DEFAULTS
    from ..core.matrix.suite import SUITE_MAX_TOKENS

    shown = {**{k: str(v) for k, v in MATRIX_DEFAULTS.items()}, "p_min": ",".join(f"{x:g}" for x in DEFAULT_P_MIN)}
    for act in p._actions:
        if act.dest in shown and act.help:
            extra = f"; {SUITE_MAX_TOKENS} with --suite" if act.dest == "max_tokens" else "; 0 with --suite"
            act.help = re.sub(r"\(default [^)]*\)", f"(default {shown[act.dest]}{extra})", act.help)


def _task_suite_names() -> tuple[str, ...]:
    from ..core.quality import SUITE_NAMES

    return SUITE_NAMES


def _task_suite(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``quality`` block of ``--suite NAME`` naming a task suite, or None (categories of the prompt suite)."""
    from ..core.matrix.quality import is_task_suite, suite_block

    if args.suite is None or not is_task_suite(args.suite):
        for flag, given in (("--items", args.items is not None), ("--execute", args.execute),
                            ("--allow-weak-sandbox", args.allow_weak_sandbox), ("--seed", args.seed != 0)):
            if given:
                raise SpecviewError(f"{flag} goes with a task suite: give --suite NAME (one of "
                                    f"{', '.join(_task_suite_names())}) or --suite FILE.jsonl")
        return None
    if args.prompts or args.prompt_files or args.tokens:
        raise SpecviewError(f"--suite {args.suite}: a matrix over a task suite runs only its items; drop --prompt, "
                            "--prompt-file and --tokens")
    return suite_block(args.suite, args.items, args.seed, args.execute)


def _flat(values: list[list[Any]] | None) -> list[Any] | None:
    if values is None:
        return None
    return [v for group in values for v in group]


def _prompts(args: argparse.Namespace, chat: bool) -> list:
    from ..core.matrix import PromptSpec, prompt_from_file
    from ..core.prompts import PromptError

    given: list[PromptSpec] = []
    for i, text in enumerate(args.prompts or []):
        given.append(PromptSpec(name=f"prompt{i + 1}", text=text, chat=chat))
    for f in args.prompt_files or []:
        try:
            ps = prompt_from_file(f, chat=chat, pipes=True)
        except PromptError as exc:
            raise SpecviewError(f"--prompt-file {exc}") from None
        name, k = ps.name, 2
        while any(q.name == name for q in given):
            name, k = f"{ps.name}-{k}", k + 1
        given.append(replace(ps, name=name))
    for i, t in enumerate(args.tokens or []):
        given.append(PromptSpec(name=f"tokens{i + 1}" if len(args.tokens) > 1 else "tokens", tokens=parse_tokens(t),
                                chat=False))
    return given


def spec_from_args(args: argparse.Namespace):
    from ..core.matrix import MatrixSpec, builtin_prompts, load_spec, spec_from_dict
    from ..core.matrix.preset import is_preset_file
    from ..core.matrix.suite import STOP_AFTER_FORK, SUITE_MAX_TOKENS, suite

    task = _task_suite(args)
    suite_cats = None
    if args.suite is not None and task is None:
        suite_cats = None if args.suite == "all" else _csv(args.suite)
    if args.preset or (args.config and is_preset_file(args.config)):
        spec = _preset_spec(args)
        from_file = True
    elif args.preset_models:
        raise SpecviewError("--model ROLE=MODEL puts a model in a preset's role: give --preset NAME too")
    elif args.config:
        spec = load_spec(args.config)
        from_file = True
    elif args.suite is not None:
        spec = MatrixSpec(targets=[DEMO_TARGET], drafters=[DEMO_DRAFT], max_tokens=SUITE_MAX_TOKENS,
                          stop_after_fork=None if task else STOP_AFTER_FORK)
        from_file = False
    else:
        spec = spec_from_dict({"targets": DEFAULT_TARGETS, "drafters": DEFAULT_DRAFTERS, "p_min": DEFAULT_P_MIN,
                               "builtin_prompts": False})
        from_file = False
    for key in ("targets", "drafters"):
        v = _flat(getattr(args, key))
        if v is not None:
            setattr(spec, key, v)
    chat = True if args.chat is None else bool(args.chat)
    given = _prompts(args, chat)
    if task is not None:
        from ..core.matrix.quality import load_items, task_prompts

        spec.quality = task
        given = task_prompts(load_items(task), chat=chat)
    elif args.suite is not None:
        given = suite(suite_cats) + given
    if given or args.builtin_prompts is not None or not from_file:
        use_builtin = args.builtin_prompts if args.builtin_prompts is not None else not given
        spec.prompts = (builtin_prompts() if use_builtin else []) + given
    if not spec.prompts:
        raise SpecviewError("no prompt: give --prompt, --prompt-file, --tokens, --suite or --builtin-prompts")
    # settings given on the command line win over the file's
    ax = set(axes())
    for name, v in given_settings(args, RunConfig).items():
        if name == "chat":
            continue  # the prompts' own (above)
        if name in ax:
            spec.set_axis(name, _flat(v))  # a preset's parts too (it refused the axes they set)
        else:
            setattr(spec, name, v)
    eng = given_settings(args, EngineSettings)
    for name in [n for n in eng if n in ax]:
        spec.set_axis(name, _flat(eng.pop(name)))
    try:
        spec.engine = replace(spec.engine, **eng)
    except ConfigError as exc:
        raise cli_error(exc) from None
    if args.full_text:
        spec.stop_after_fork = None
    elif args.stop_after_fork is not None:
        spec.stop_after_fork = args.stop_after_fork
    elif args.suite is not None and task is None and spec.stop_after_fork is None:
        spec.stop_after_fork = STOP_AFTER_FORK
    if args.diagnose is not None:
        spec.diagnose = bool(args.diagnose)
    if args.backend is not None:
        spec.backend = args.backend
    if "all" in spec.drafters:
        spec.drafters, left_out = every_drafter(spec)
        if left_out:
            Progress(getattr(args, "quiet", False))("drafters: all the engine runs except " + "; ".join(left_out))
    if args.kernel_map is not None:
        spec.kernel_map = args.kernel_map
    if spec.source and (given_settings(args, RunConfig) or given_settings(args, EngineSettings) or given
                        or args.targets or args.drafters or args.kernel_map):
        spec.source = f"{spec.source} with the flags given"
    spec.validate()
    return spec


def _preset_spec(args: argparse.Namespace):
    """The preset's matrix with the user's models in its roles; flags that would break its parts are refused."""
    from ..core.matrix.preset import load_preset, model_roles_text, preset_path

    if args.config and args.preset:
        raise SpecviewError("--preset and --config both define the matrix: give one")
    name = args.preset or args.config
    if args.targets or args.drafters:
        raise SpecviewError(f"with a preset, give your models by role, --model ROLE=MODEL (preset {name}: "
                            f"{model_roles_text(name)})")
    models: dict[str, str] = {}
    for item in args.preset_models or []:
        role, sep, model = item.partition("=")
        if not sep or not role or not model:
            raise SpecviewError(f"--model {item!r}: give ROLE=MODEL (preset {name}: {model_roles_text(name)})")
        models[role.strip()] = model.strip()
    spec = load_preset(name, models)
    given = [n for cls in (RunConfig, EngineSettings) for n in given_settings(args, cls) if n in axes()]
    own = [n for n in given if n in spec.preset["axes"]]
    if own:
        raise SpecviewError(f"preset {name} sets {own[0]} part by part; to change it, copy {preset_path(name)}, "
                            "edit its [[part]] tables and run the copy with --config")
    return spec


def every_drafter(spec) -> tuple[list[str], list[str]]:
    """``all`` in the drafters, spelled out: every spec type the engine runs that has a drafter for these targets.

    The n-gram types need none; draft-mtp needs an MTP head in every target; a draft-file type needs its
    drafter, given as TYPE:MODEL alongside ``all``, or the demo's own (``demo:Q4_0``, ``demo:eagle3``, ...)
    when every target is a demo model.  Returns the drafters and what was left out, with why.
    """
    from ..core.config import DEMO_DRAFTERS, DRAFT_FILE_TYPES
    from ..core.demo import is_demo_name
    from ..core.matrix.spec import drafter_parts
    from ..core.registry import get_backend

    given = [d for d in spec.drafters if d != "all"]
    have = {drafter_parts(d)[0] for d in given}
    try:
        offered = get_backend(spec.backend).spec_types(spec.engine)
    except SpecviewError as exc:
        raise SpecviewError(f"--drafters all: {exc}") from None
    demo = all(is_demo_name(t) for t in spec.targets)
    out, left = list(given), []
    for st in offered:
        if st == "none" or st in have:
            continue
        if st in DRAFT_FILE_TYPES:
            if demo:
                out.append(DEMO_DRAFT if st == "draft-simple" else f"demo:{DEMO_DRAFTERS[st]}")
            else:
                left.append(f"{st} (no drafter: give one as {st}:FILE)")
        elif st == "draft-mtp":
            no_head = [t for t in spec.targets if not get_backend(spec.backend).has_mtp_heads(t)]
            if no_head:
                left.append(f"draft-mtp ({no_head[0]} has no MTP head)")
            else:
                out.append(st)
        else:
            out.append(st)
    if not out:
        raise SpecviewError(f"--drafters all: the {spec.backend} engine has no spec type with a drafter for these "
                            "targets (" + "; ".join(left) + ")")
    return out, left


def dry_run(spec, cells) -> None:
    """The cells, one a line; with a kernel map, each with what the map predicts for it."""
    from ..core.matrix import cell_config, describe

    if not spec.kernel_map:
        for i, c in enumerate(cells):
            print(f"{i:3d}  {describe(c)}")
        print(f"{len(cells)} cells")
        return
    from ..core.kernels.evidence import citation, citation_text
    from ..core.matrix.evidence import predict_planned

    kmap = spec.load_kernel_map()
    rows = [(f"{i:3d}  {describe(c)}", predict_planned(kmap, cell_config(spec, c), spec.kernel_map))
            for i, c in enumerate(cells)]
    width = max(len(a) for a, _ in rows)
    counts: dict[str, int] = {}
    for a, p in rows:
        if p.status == "proven-lossless":
            why = f"widths {p.widths[0]}-{p.widths[-1]}" if len(p.widths) > 1 else "width 1"
        elif p.status == "kernels-differ":
            why = f"width {p.first_differing} differs"
        else:
            why = p.missing[0] if p.missing else p.reason
        print(f"{a:<{width}}  map: {p.status} ({why})")
        counts[p.status] = counts.get(p.status, 0) + 1
    print(f"{len(cells)} cells; " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    print(citation_text(citation(kmap, spec.kernel_map)))
    print("(predicted by name at this machine's thread count; a running cell is matched by its model file's facts)")


def main(args: argparse.Namespace) -> int:
    from ..core.matrix import expand, format_rates, summarize

    progress = Progress(args.quiet)
    if not args.dry_run:  # before anything is loaded or decided: a matrix of hours must not die at its first write
        check_output(args.out, "-o")
    spec = spec_from_args(args)
    for d in spec.decide():  # this machine's decisions for the axes left unset (no repack where it crashed)
        progress(d.why)
    cells = expand(spec)
    if args.dry_run:
        dry_run(spec, cells)
        return EXIT_IDENTICAL
    out = Path(args.out)
    if spec.quality and spec.quality.get("execute"):  # --suite with --execute: scoring runs model-written code
        from .quality import checked_sandbox

        spec.quality["sandbox"] = checked_sandbox(args.allow_weak_sandbox)  # recorded in the matrix's spec

    from ..core.matrix import load_matrix, run_matrix
    from ..core.registry import get_backend

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
    t0 = time.perf_counter()
    progress(f"{len(cells)} cells, {spec.max_tokens} tokens per arm; results stream to {out}")
    runner = get_backend(spec.backend).runner(progress=progress)
    try:
        run = run_matrix(spec, runner, out=out, traces_dir=args.traces, progress=progress,
                         cancel=lambda: stop["asked"], resume=resume)
    finally:
        runner.close()
        if old is not None:
            signal.signal(signal.SIGINT, old)
    doc = run.to_json()
    print(f"matrix: {len(run.records)} of {len(cells)} cells; {run.counters.get('loads', 0)} model loads, "
          f"{run.counters.get('vanilla_runs', 0)} vanilla runs, {run.counters.get('speculative_runs', 0)} "
          f"speculative runs ({time.perf_counter() - t0:.0f} s)")
    print(format_grid(doc))
    print()
    for line in summarize(doc, kernel_map=False):
        print(line)
    if len(spec.prompts) > 1:
        print()
        print("rates over the prompts (95% Wilson interval)" + (", and whether each setting's answers changed "
                                                               "(McNemar's exact p):" if spec.quality else ":"))
        for line in format_rates(doc["rates"]):
            print(line)
    if isinstance(doc.get("kernel_map"), dict):
        from ..core.kernels.evidence import citation_text
        from ..core.matrix.evidence import kernel_lines

        print()
        print(citation_text(doc["kernel_map"]))
        for line in kernel_lines(doc):
            print(line)
    progress(f"results written to {out}")
    if run.status == "interrupted":
        return EXIT_INTERRUPTED
    crashed = [r for r in run.records if r.get("crash")]
    if crashed:  # a dead engine is an error whatever the other cells found
        print()
        print(f"{len(crashed)} cell(s) crashed the engine's worker process (each later cell ran on a fresh one):")
        for r in crashed:
            c = r["crash"]
            print(f"  cell {r['index']}: {c.get('signal') or 'exit ' + str(c.get('exitcode'))}"
                  + (f" during {c['activity']}" if c.get("activity") else "")
                  + (f"; likely {c['known_cause']['id']}: {c['known_cause']['advice']}" if c.get("known_cause") else ""))
        return EXIT_ERROR
    ok = [r for r in run.records if r["status"] == "ok"]
    if any(not r["identical"] for r in ok):
        return EXIT_DIVERGED
    if len(ok) < len(run.records):
        return EXIT_ERROR
    return EXIT_IDENTICAL


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def format_grid(doc: dict[str, Any]) -> str:
    """The grid as plain text for the terminal."""
    from ..core.matrix import grid

    from ..core.matrix.quality import cell_mark

    def text(cell: dict[str, Any] | None) -> str:  # over a task suite, whether the answer changed beside the fork
        mark = cell_mark(cell) if cell else ""
        return cell_text(cell, sep=" ") + (f" · {mark}" if mark else "")

    g = grid(doc)
    head = [" · ".join(g.row_axes)] + [g.col_label(c) for c in g.cols]
    rows = [[g.row_label(r)] + [text(g.at.get((r, c))) for c in g.cols] for r in g.rows]
    widths = [max(len(x[i]) for x in [head] + rows) for i in range(len(head))]
    fmt = lambda row: "  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])
