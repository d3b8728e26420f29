"""``specview probe``: the known triggers of real rollback and state bugs, each forced and judged by its control."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.config import DEMO_TARGET
from ..core.errors import ConfigError, SpecviewError
from .common import Progress, add_engine_choice, check_output, cli_error

EXIT_OK, EXIT_STATE = 0, 1


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from ..core.probe.scenarios import NAMES

    p = sub.add_parser(
        "probe",
        help="force the known triggers of real rollback and state bugs and prove each result",
        description="Run the situations in which real speculative-decoding state bugs were reported (accepted "
        "drafts followed by a zero-draft round, a whole rejection, a rollback deeper than the snapshots, a "
        "neighbour request on a two-slot server, the context's edge in the middle of a draft, a long run, the "
        "n-gram types on a looping text, every rollback mode the architecture allows), in-process with a scripted "
        "drafter and on your llama-server, and prove each result: identical, near-tie proven (the control, "
        "serial verify in-process and -ub 1 on the server, reproduces plain greedy), state (the control forks "
        "too while plain greedy repeats itself) or unproven (the trigger did not happen, or the control could "
        "not decide). docs/probe.md says how each trigger is forced.",
        epilog="Example: specview probe -m model.gguf --server --reject-draft other.gguf. Exit status: 0 no row "
        "reads state, 1 a row reads state, 2 error, 130 interrupted.",
    )
    g = p.add_argument_group("probe")
    g.add_argument("-m", "--target", "--model", dest="target", default=None, metavar="MODEL",
                   help=f"target GGUF file or demo name (default {DEMO_TARGET})")
    g.add_argument("--triggers", type=_csv, default=None, metavar="LIST",
                   help=f"triggers to run, comma-separated (default all: {', '.join(NAMES)})")
    g.add_argument("-p", "--prompt", default="the cat and the dog", help="the prompt (plain text, no template)")
    g.add_argument("-n", "--tokens", dest="n", type=int, default=48, help="tokens per short run (default 48)")
    g.add_argument("--long", dest="long_n", type=int, default=2048, help="tokens of the long run (default 2048)")
    g.add_argument("--n-max", dest="n_max", type=int, default=3, help="tokens per draft (default 3)")
    g.add_argument("--server", action="store_true", help="run the triggers on llama-server too")
    g.add_argument("--server-only", action="store_true", help="run them on llama-server only")
    g.add_argument("--server-bin", default="", metavar="PATH", help="the llama-server binary (default: found)")
    g.add_argument("--server-args", default="", metavar="FLAGS", help="extra llama-server flags")
    g.add_argument("--accept-draft", default=None, metavar="GGUF",
                   help="the server's drafter that agrees with the target (default: the target itself)")
    g.add_argument("--reject-draft", default=None, metavar="GGUF",
                   help="the server's drafter that disagrees (a model of the same vocabulary; without one the "
                   "server's whole-rejection and deep-rollback triggers do not run)")
    g.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: what the machine decides)")
    g.add_argument("-ngl", "--gpu-layers", dest="gpu_layers", type=int, default=None, help="layers on the GPU")
    g.add_argument("--rollback", default=None, help="the in-process rollback (default: as llama-server would)")
    g.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write the report as JSON")
    g.add_argument("--markdown", "--md", dest="md_out", default=None, metavar="OUT", help="write it as Markdown")
    g.add_argument("--show", default=None, metavar="FILE", help="print a saved probe report instead of running one")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    add_engine_choice(p, g)
    p.set_defaults(func=main)
    return p


def _settings(args: argparse.Namespace):
    from dataclasses import replace

    from ..core.config import EngineSettings

    kw = {k: v for k, v in (("threads", args.threads), ("gpu_layers", args.gpu_layers), ("rollback", args.rollback),
                            ("server_bin", args.server_bin), ("server_args", args.server_args)) if v not in (None, "")}
    try:
        return replace(EngineSettings(), **kw)
    except ConfigError as exc:
        raise cli_error(exc) from None


def main(args: argparse.Namespace) -> int:
    from ..core.probe.result import STATE, ProbeReport
    from ..core.probe.text import markdown, table

    if args.show:
        report = ProbeReport.load(args.show)
        print(table(report))
        return EXIT_STATE if report.worst == STATE else EXIT_OK
    from ..core.probe.run import run_probe

    for flag, path in (("--accept-draft", args.accept_draft), ("--reject-draft", args.reject_draft)):
        if path and not path.startswith("demo:") and not Path(path).is_file():
            raise SpecviewError(f"{flag} {path}: no such file")
    check_output(args.json_out, "--json")
    check_output(args.md_out, "--markdown")
    progress = Progress(args.quiet)
    try:
        report = run_probe(args.target or DEMO_TARGET, backend=args.backend, settings=_settings(args),
                           in_process=not args.server_only, server=args.server or args.server_only,
                           triggers=args.triggers, prompt=args.prompt, n=args.n, long_n=args.long_n,
                           n_max=args.n_max, accept_draft=args.accept_draft, reject_draft=args.reject_draft,
                           progress=progress)
    except ValueError as exc:  # an unknown trigger
        raise SpecviewError(f"--triggers: {exc}") from None
    print(table(report))
    if args.json_out:
        report.save(args.json_out)
    if args.md_out:
        from ..core.jsonfile import write_atomic

        write_atomic(args.md_out, markdown(report))
    return EXIT_STATE if report.worst == STATE else EXIT_OK
