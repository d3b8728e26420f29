"""``specview``: the command-line dispatcher.

Subcommands live in :mod:`specview.commands`, one module each, imported only
when chosen.  Exit status: 0 the arms are identical (or the command
succeeded), 1 the arms diverged, 2 an error (a bad file, a bad value, a
missing backend), 70 an internal error (a bug in specview: one line, the
traceback written to a file; never a status that reads as a result), 130
interrupted, 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from . import __version__
from .core.sample_python import SAMPLE_ARG  # the first argument that makes the frozen app a sample's interpreter
from .core.worker.shared import WORKER_ARG  # the first argument that makes the frozen app an engine worker

COMMANDS = {
    "run": ("specview.commands.run", "run both arms on a target and compare them (the main job)"),
    "models": ("specview.commands.models", "list the models on this machine and which can draft for which"),
    "matrix": ("specview.commands.matrix", "run a reproducer matrix over quantizations, drafters and settings"),
    "quality": ("specview.commands.quality", "run a task suite through both arms: does speculative decoding change answers?"),
    "report": ("specview.commands.report", "write an HTML and Markdown bug report from a trace or matrix"),
    "compare": ("specview.commands.compare", "compare two saved traces (e.g. from two machines)"),
    "check": ("specview.commands.check", "check the backend against the CPU: KL divergence of the same tokens"),
    "kernels": ("specview.commands.kernels", "map which draft widths are bit-identical to single-token passes"),
    "locate": ("specview.commands.locate", "name the first op where a verify pass departs from single-token passes"),
    "prescribe": ("specview.commands.prescribe", "say which speculative settings are proven lossless here"),
    "probe": ("specview.commands.probe", "force the known triggers of real rollback and state bugs, each proven"),
    "doctor": ("specview.commands.doctor", "say what specview will run on: engines, GPU backends, CPU"),
    "gui": ("specview.commands.gui", "open the desktop app"),
}

EXIT_IDENTICAL = 0
EXIT_DIVERGED = 1
EXIT_ERROR = 2
#: an exception specview did not expect: a bug (sysexits.h's EX_SOFTWARE), never 1, which reads as "diverged"
EXIT_INTERNAL = 70
#: Ctrl-C; SIGTERM (128 + 15, as a shell reports a process the signal ended)
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
#: set it to print an internal error's traceback on stderr as well
DEBUG_ENV = "SPECVIEW_DEBUG"


def _load(name: str):
    return importlib.import_module(COMMANDS[name][0])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specview",
        description="Does greedy speculative decoding give exactly the text plain greedy decoding gives? "
        "specview runs both on your model, shows where they fork, and says whether it is a near-tie or a bug.",
        epilog="Exit status: 0 identical / success, 1 the arms diverged, 2 error, 70 internal error (a bug in "
        "specview; the traceback is written to a file, or printed with SPECVIEW_DEBUG=1), 130 interrupted, "
        "143 terminated (SIGTERM). "
        "Run `specview COMMAND --help` for a command's flags.",
    )
    parser.add_argument("--version", action="version", version=f"specview {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        if only is None or name == only:
            try:
                _load(name).add_parser(sub)
            except ModuleNotFoundError as exc:
                if not exc.name or not exc.name.startswith("specview"):
                    raise
                continue
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    parser.set_defaults(_commands=sub.choices)
    return parser


def unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """The message for arguments ``parser`` does not take, with the nearest flag it does take for each one
    that looks like a flag (``--n_max`` -> ``--n-max``)."""
    import difflib

    from .core.llama_flags import REMOVED_FLAGS

    flags = [f for a in parser._actions for f in a.option_strings]
    hints = []
    for arg in extra:
        name = arg.split("=", 1)[0]
        if REMOVED_FLAGS.get(name) in flags:
            hints.append(f"{name} is llama.cpp's removed name for {REMOVED_FLAGS[name]}")
        elif name.startswith("-"):
            near = difflib.get_close_matches(name.replace("_", "-"), flags, n=1, cutoff=0.75)
            if near:
                hints.append(f"{name}: did you mean {near[0]}?")
    msg = f"unrecognized arguments: {' '.join(extra)}"
    return msg + ("; " + "; ".join(hints) if hints else "") + f" (`{parser.prog} --help` lists what it takes)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [WORKER_ARG]:  # the frozen app started as an engine worker (specview.core.worker)
        from .core.worker.child import entry

        entry(argv[1:])
        return 0
    if argv[:1] == [SAMPLE_ARG]:  # the frozen app started as the sandbox's python -I -S -c (specview.core.quality)
        from .core.sample_python import run as run_python

        run_python(argv[1:])
        return 0
    if not argv:
        argv = ["gui"]
    cmd = argv[0] if argv and argv[0] in COMMANDS else None
    if cmd is not None:
        from .commands.common import join_dash_values

        argv = join_dash_values(argv)  # --server-args "--no-repack": a value that starts with a dash
    parser = build_parser(only=cmd)
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the command's own parser, with its usage, as argparse says a bad value
        command = getattr(args, "_commands", {}).get(getattr(args, "command", None), parser)
        command.error(unrecognized(command, extra))
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_ERROR
    from .core.errors import ConfigError, SpecviewError

    previous = _unwind_on_sigterm()
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:  # found after the flags were read (a token id the model does not have): name the flag
        from .commands.common import cli_error

        print(f"specview: error: {cli_error(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except SpecviewError as exc:
        print(f"specview: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Terminated:
        print("specview: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print("specview: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `specview ... | head`: the reader left; say nothing more
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except Exception as exc:  # a bug in specview: say so in one line, never with a status that means a result
        return internal_error(exc, argv)
    finally:
        if previous is not None and signal.getsignal(signal.SIGTERM) is _terminate:  # not one chained onto it since
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a logout, a job's time limit) while a command runs: unwound as Ctrl-C is, so the engine's
    process is stopped and its folder removed, a command's own interrupt handling keeps what it finished, and the
    exit status says terminated. Python's default would end the process on the spot, every ``finally`` skipped."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def _unwind_on_sigterm():
    """Have SIGTERM raise :class:`Terminated` while a command runs; the handler it replaced (None where this
    cannot be done: not the main thread, or SIGTERM ignored or handled by whoever started this process)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
            return None
        return signal.signal(signal.SIGTERM, _terminate)
    except (ValueError, OSError):  # pragma: no cover - no signals here
        return None


def internal_error(exc: BaseException, argv: list[str]) -> int:
    """Report an exception specview did not expect: one line naming it and where its traceback was written
    (the whole traceback on stderr too with ``$SPECVIEW_DEBUG``); returns :data:`EXIT_INTERNAL`."""
    import time
    import traceback

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    what = " ".join(str(exc).split())
    what = f"{type(exc).__name__}: {what[:200]}{'…' if len(what) > 200 else ''}" if what else type(exc).__name__
    where = None
    try:
        import tempfile

        from .core.paths import cache_dir

        folder = cache_dir() / "errors"
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), suffix=".txt", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(f"specview {__version__}: specview {' '.join(argv)}\n\n{tb}")
        where = name
    except Exception:  # no folder to write it to: the debug hint still says how to see it
        pass
    if os.environ.get(DEBUG_ENV):
        print(tb, file=sys.stderr, end="")
    hint = f"the traceback is in {where}" if where else f"rerun with {DEBUG_ENV}=1 to see the traceback"
    print(f"specview: internal error (a bug in specview, please report it): {what}; {hint}", file=sys.stderr)
    return EXIT_INTERNAL


def gui_main() -> int:
    return main(["gui", *sys.argv[1:]])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
