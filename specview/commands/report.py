"""``specview report``: a shareable bug report (HTML and Markdown) from a trace or a matrix file."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="write an HTML and Markdown bug report from a trace or matrix",
        description="Write a self-contained HTML report (plots embedded) and a GitHub-ready Markdown file "
        "(PNG plots beside it) from a trace saved by `specview run --json` or a matrix file from "
        "`specview matrix`: the verdict and its numbers, the fork in context, the plots, acceptance, "
        "settings, models, environment and the equivalent llama.cpp commands.",
        epilog="Exit status: 0 written, 2 error.",
    )
    p.add_argument("input", metavar="TRACE_OR_MATRIX.json", help="a specview trace or matrix JSON file")
    p.add_argument("-o", "--out", default="specview-report", help="output folder (default specview-report)")
    p.add_argument("--name", default="report", help="base name of the files (default report)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from ..report import write_report

    written = write_report(args.input, args.out, name=args.name)
    for key, path in written.items():
        print(f"{key:<10} {path}")
    return 0
