"""``specview prescribe``: the speculative settings proven lossless on this machine, and the fastest of them."""

from __future__ import annotations

import argparse
import json
import time

from ..core.config import DEMO_DRAFT
from ..core.errors import SpecviewError
from .common import Progress, check_output
from .kernels import add_map_flags, backend_of, map_from_args, with_causes

DEFAULT_WIDTHS = "1-9"
DEFAULT_POSITIONS = 256  # as long as a default run: a kernel can change with the KV length


def _ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not out or any(n < 1 for n in out):
        raise argparse.ArgumentTypeError("n_max candidates are integers >= 1")
    return out


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "prescribe",
        help="say which speculative settings are proven lossless here, and which is fastest",
        description="Map the verify widths of each target (as `specview kernels` does, or read a saved map), "
        "measure both arms for each candidate n_max in short runs, and print the settings the map proves "
        "lossless (a draft of n_max tokens uses widths 1..n_max+1, all of which must be bit-identical to "
        "single-token passes), each with its measured speedup over plain decoding; -ub 1 where it is needed, "
        "mapped and measured too; for a hybrid or recurrent target, every rollback mode (checkpoint, snapshots) "
        "measured at the largest proven n_max, proven only where every speculative row equals vanilla's bit for "
        "bit through its rollbacks, and the fastest proven one prescribed; and the fastest lossy setting for "
        "comparison, with its divergence rate.",
        epilog="Example: specview prescribe --targets demo:Q8_0,demo:Q4_K_M --suite-results suite.json. "
        "Exit status: 0 done, 2 error, 130 interrupted.",
    )
    g = add_map_flags(p, widths=DEFAULT_WIDTHS, positions=DEFAULT_POSITIONS, stop=True)
    g.add_argument("--map", dest="map_file", metavar="FILE", default=None,
                   help="use a saved kernel map (specview kernels -o FILE) instead of mapping again; its targets, "
                   "prompts and settings are used")
    s = p.add_argument_group("speed runs")
    s.add_argument("-md", "--draft", default=None, metavar="MODEL",
                   help=f"draft model for the speed runs (default {DEMO_DRAFT} for demo targets)")
    s.add_argument("--n-max", dest="candidates", type=_ints, default=None, metavar="LIST",
                   help="candidate n_max values to measure (default 1,2,3,4,6,8,12,15 up to the widest mapped width - 1)")
    s.add_argument("-n", "--max-tokens", dest="max_tokens", type=int, default=64,
                   help="tokens per arm in each speed run (default 64)")
    s.add_argument("--no-ub1", dest="ub1", action="store_false",
                   help="do not map and measure -ub 1 where no n_max is proven lossless")
    s.add_argument("--suite-results", metavar="FILE", default=None,
                   help="a `specview matrix --suite` result file: the fastest lossy setting's divergence rate "
                   "is taken from it")
    s.add_argument("-o", "--output", "--json", dest="output", metavar="FILE", default=None,
                   help="save the prescription as JSON")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from ..core.demo import is_demo_name
    from ..core.kernels.map import KernelMap
    from ..core.matrix.prescribe import DEFAULT_CANDIDATES, prescribe, suite_rates
    from ..core.trace import write_atomic

    progress = Progress(args.quiet)
    check_output(args.output)
    if args.max_tokens < 1:
        raise SpecviewError(f"--max-tokens must be >= 1 (got {args.max_tokens})")
    if args.suite_results:
        suite_rates(args.suite_results)  # a bad file fails now, not after the runs
    t0 = time.perf_counter()
    with backend_of(args).runner(progress=progress) as session:
        km = KernelMap.load(args.map_file) if args.map_file else map_from_args(args, session, progress)
        if args.map_file and args.locate:
            km = with_causes(km, session, progress)
        draft = args.draft
        if draft is None:
            if not all(is_demo_name(t.target) for t in km.targets):
                raise SpecviewError("--draft MODEL is needed for the speed runs (a smaller model with the target's "
                                    "tokenizer); the demo draft is only the default for demo targets")
            draft = DEMO_DRAFT
        if not args.map_file:
            print(km.heatmap())
            print()
        pres = prescribe(session, km, draft=draft, candidates=args.candidates or DEFAULT_CANDIDATES,
                         max_tokens=args.max_tokens, ub1=args.ub1, suite_results=args.suite_results,
                         progress=progress)
    print(pres.text())
    if args.output:
        progress(f"prescription written to {write_atomic(args.output, json.dumps(pres.to_json(), indent=1) + chr(10))}")
    progress(f"done in {time.perf_counter() - t0:.1f} s")
    return 0
