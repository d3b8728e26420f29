"""``specview gui``: open the desktop app (also what ``specview`` with no arguments does)."""

from __future__ import annotations

import argparse
import os


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "gui",
        help="open the desktop app",
        description="Open the desktop app: both arms side by side as they stream, the fork marked, "
        "acceptance and margin plots, and a verdict. With TRACE, open a saved trace, matrix or kernel map "
        "(no model needed).",
    )
    p.add_argument("trace", nargs="?", metavar="TRACE",
                   help="a trace JSON (from `specview run --json` or Save), a matrix JSON or a kernel map JSON "
                   "(from `specview kernels -o`) to open")
    p.add_argument("--theme", choices=["system", "light", "dark"], default=None,
                   help="colour theme (default: the one used last)")
    p.add_argument("--run", action="store_true", help="start a run with the remembered settings as soon as the window opens")
    p.add_argument("--no-preload", action="store_true", help="do not load the models before the first run")
    p.add_argument("--fresh", action="store_true", help="ignore the remembered models and settings (start from the demo)")
    p.add_argument("--smoke", metavar="OUT.json", default=None,
                   help="self-test: open the window on the demo with fresh settings, run it, write the trace to "
                   "OUT.json and exit (0 ok, 1 error, 3 no trace in time); what a packager runs on a built bundle")
    p.add_argument("-n", "--max-tokens", dest="smoke_tokens", type=int, default=16,
                   help="tokens per arm for --smoke (default 16)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from ..core.errors import SpecviewError

    if args.trace and not os.path.exists(args.trace):
        raise SpecviewError(f"{args.trace}: no such trace file")
    try:
        from ..gui.launch import run_app
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SpecviewError(f"the desktop app needs PySide6 and pyqtgraph ({exc}); install them with "
                            "`pip install PySide6-Essentials pyqtgraph`") from exc
    return run_app(path=args.trace, theme=args.theme, run=args.run, preload=not args.no_preload, fresh=args.fresh,
                   smoke=args.smoke, smoke_tokens=args.smoke_tokens)
