"""``specview report``: a shareable bug report (HTML and Markdown) from a trace or a matrix file."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="write an HTML and Markdown bug report from a trace, a matrix or a kernel map",
        description="Write a self-contained HTML report (plots embedded) and a GitHub-ready Markdown file "
        "(PNG plots beside it) from a trace saved by `specview run --json`, a matrix file from "
        "`specview matrix` or a kernel map from `specview kernels -o`: the verdict and its numbers, the fork in "
        "context, the plots, acceptance, settings, models, environment and the equivalent llama.cpp commands; "
        "for a matrix the grid, the forks, the divergence rates and the kernel map it cites; for a kernel map "
        "its heatmap and per-width tables. With --kernel-map a trace's report says what the map predicts for "
        "the run and what that means for its fork.",
        epilog="Exit status: 0 written, 2 error.",
    )
    p.add_argument("input", metavar="FILE.json", help="a specview trace, matrix or kernel map JSON file")
    p.add_argument("-o", "--out", default="specview-report", help="output folder (default specview-report)")
    p.add_argument("--name", default="report", help="base name of the files (default report)")
    p.add_argument("--card", nargs="?", const="", default=None, metavar="OUT.png",
                   help="also draw the fork card, one PNG for a GitHub comment, and show it at the top of the "
                        "Markdown report (default fork-card.png in the output folder)")
    p.add_argument("--kernel-map", metavar="FILE", default=None,
                   help="a kernel map (specview kernels -o FILE): a trace's report gets a 'Kernel map' section (the "
                   "map's prediction for this run, the target's per-width table, what it means for the fork); a "
                   "matrix run without one is predicted cell by cell from its recorded settings")
    p.add_argument("--issue", action="store_true",
                   help="write instead the body of an upstream issue (NAME-issue.md, under GitHub's 65,536 characters) "
                        "and the request its reproduction sends (request.json): the verdict and its proof, the op, the "
                        "verify widths, both arms' token ids around the fork, the build, the flags, each model's "
                        "SHA-256, and llama-server commands and a curl request that give the fork without specview, "
                        "with the -ub 1 control")
    p.set_defaults(func=main)
    return p


def plot_renderer():
    """The app's plot renderer, imported when a trace or locate report first needs it; without Qt, no plots and a
    note."""

    def render(trace: Any) -> dict[str, bytes]:
        try:
            from ..gui.export import report_plots
        except ImportError as exc:
            print(f"specview: the report has no plots: the app's plotting (PySide6, pyqtgraph) cannot be imported "
                  f"({exc})", file=sys.stderr)
            return {}
        return report_plots(trace)

    return render


def card_renderer():
    """The app's fork card, or None (and a note) without Qt."""
    try:
        from ..gui.card import fork_card_png
    except ImportError as exc:
        print(f"specview: no fork card: the app's widgets (PySide6, pyqtgraph) cannot be imported ({exc})",
              file=sys.stderr)
        return None
    return fork_card_png


def main(args: argparse.Namespace) -> int:
    from ..core.errors import SpecviewError
    from ..core.report.write import write_report

    if args.issue:
        from ..core.report.issue import LIMIT, gh_length
        from ..core.report.write import write_issue

        if args.card is not None:
            raise SpecviewError("--issue writes the issue's body only; draw the fork card with its own --card run")
        written = write_issue(args.input, args.out, name=args.name, kernel_map=args.kernel_map)
        body = written["issue"].read_text(encoding="utf-8")
        for key, path in written.items():
            print(f"{key:<10} {path}")
        print(f"{gh_length(body)} characters (GitHub takes up to {LIMIT:,}); paste {written['issue'].name} as the "
              "issue's body" + (f" and attach {written['request'].name}" if "request" in written else ""))
        return 0
    card = card_path = None
    if args.card is not None:
        if args.card and not args.card.lower().endswith(".png"):
            raise SpecviewError(f"--card {args.card}: the fork card is a PNG; give a file name ending in .png")
        card, card_path = card_renderer(), args.card or None
    written = write_report(args.input, args.out, name=args.name, plots=plot_renderer(), card=card,
                           card_path=card_path, kernel_map=args.kernel_map)
    if args.card is not None and "card" not in written:
        print("specview: no fork card: only a trace's report has one (report a saved trace)", file=sys.stderr)
    for key, path in written.items():
        print(f"{key:<10} {path}")
    return 0
