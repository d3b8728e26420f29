"""``specview report``: a shareable bug report (HTML and Markdown) from a trace or a matrix file."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="write an HTML and Markdown bug report from a trace or matrix",
        description="Write a self-contained HTML report (plots embedded) and a GitHub-ready Markdown file "
        "(PNG plots beside it) from a trace saved by `specview run --json` or a matrix file from "
        "`specview matrix`: the verdict and its numbers, the fork in context, the plots, acceptance, "
        "settings, models, environment and the equivalent llama.cpp commands; for a matrix the grid, the "
        "forks and the divergence rates.",
        epilog="Exit status: 0 written, 2 error.",
    )
    p.add_argument("input", metavar="TRACE_OR_MATRIX.json", help="a specview trace or matrix JSON file")
    p.add_argument("-o", "--out", default="specview-report", help="output folder (default specview-report)")
    p.add_argument("--name", default="report", help="base name of the files (default report)")
    p.set_defaults(func=main)
    return p


def plot_renderer():
    """The app's plot renderer, imported when a trace report first needs it; without Qt, no plots and a note."""

    def render(trace: Any) -> dict[str, bytes]:
        try:
            from ..gui.export import trace_plots
        except ImportError as exc:
            print(f"specview: the report has no plots: the app's plotting (PySide6, pyqtgraph) cannot be imported "
                  f"({exc})", file=sys.stderr)
            return {}
        return trace_plots(trace)

    return render


def main(args: argparse.Namespace) -> int:
    from ..core.report.write import write_report

    written = write_report(args.input, args.out, name=args.name, plots=plot_renderer())
    for key, path in written.items():
        print(f"{key:<10} {path}")
    return 0
