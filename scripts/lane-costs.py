#!/usr/bin/env python3
"""Write the test suite's cost table (``tests/lane_costs.json``) from pytest's JUnit XML.

    python -m pytest --junitxml=/tmp/suite.xml
    python scripts/lane-costs.py /tmp/suite.xml > tests/lane_costs.json

Several XML files (a run in parts) add up; a test in more than one counts its last time.  A test's
time in the XML is its setup, call and teardown (pytest's default ``junit_duration_report``), so a
file's module fixture (a server, a model load) counts once, in its first test.  The table keeps the
files that took at least ``--min`` seconds; ``tests/lanes.py`` counts the others by their test
count, which orders the cheap ones well enough.  Only the order matters, so the machine it was
measured on need not be the one that runs the suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_file(classname: str, root: Path) -> str | None:
    """``tests.backends.test_x.TestY`` to ``tests/backends/test_x.py``: the longest prefix that is a file."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        rel = "/".join(parts[:n]) + ".py"
        if (root / rel).is_file():
            return rel
    return None


def file_seconds(xml_paths: list[Path], root: Path) -> dict[str, float]:
    times: dict[tuple[str, str], tuple[str, float]] = {}
    gone: set[str] = set()
    for path in xml_paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            classname, name = case.get("classname", ""), case.get("name", "")
            where = test_file(classname, root)
            if where is None:  # a file renamed or removed since the run: its time goes nowhere
                gone.add(classname)
                continue
            times[(classname, name)] = (where, float(case.get("time") or 0.0))
    for classname in sorted(gone):
        print(f"lane-costs: left out {classname}: no such test file under {root} now", file=sys.stderr)
    seconds: dict[str, float] = {}
    for where, secs in times.values():
        seconds[where] = seconds.get(where, 0.0) + secs
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("xml", nargs="+", type=Path, help="pytest --junitxml output")
    ap.add_argument("--min", type=float, default=5.0, help="leave out files under this many seconds (default 5)")
    ap.add_argument("--machine", default="", help="what the times were measured on, for the table's note")
    args = ap.parse_args(argv)
    for path in args.xml:
        if not path.is_file():
            ap.error(f"{path}: no such file (write it with python -m pytest --junitxml={path})")
    seconds = file_seconds(args.xml, ROOT)
    kept = {f: round(s) for f, s in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0])) if s >= args.min}
    about = ("seconds per test file (setup, call and teardown of its tests) from pytest's JUnit XML, "
             "written by scripts/lane-costs.py; tests/lanes.py hands out the costliest files first, and a file "
             "not named here counts by its test count")
    if args.machine:
        about += f"; measured on {args.machine}"
    json.dump({"about": about, "seconds": kept}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
