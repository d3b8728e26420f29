"""What the kernel map costs, against one 256-token run of both arms measured in the same run.

    python bench/bench_kernels.py [--targets demo:F16,demo:Q8_0,demo:Q4_K_M,demo:Q4_0] [--widths 1-16]
                                  [--positions 128] [--threads 0] [--tokens 256]

The map: every target over the built-in prompts, every width, ``--positions``
teacher-forced positions per prompt.  The baseline: ``specview run``'s default
(demo:Q8_0 target, demo:Q4_0 draft, n_max 3, the essay prompt) for ``--tokens``
tokens per arm with EOS ignored, run once before and once after the map (their
mean is the baseline, so a machine that slows down or speeds up during the
bench hurts both sides alike).  Every model is loaded before anything is timed.
Goal: the map costs no more than the baseline.

``--stop-at-difference`` maps as ``specview prescribe`` does (a width is not
measured further once a row differs).  Also printed: forward passes and rows the map ran, what the same map would cost
with a separate single-token walk per width (the schedule the map avoids by
rolling one walk back for every width), and the per-width table and heatmap.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("GGML_NO_BACKTRACE", "1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="demo:F16,demo:Q8_0,demo:Q4_K_M,demo:Q4_0")
    ap.add_argument("--widths", default="1-16")
    ap.add_argument("--positions", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--table", action="store_true", help="also print the per-width tables")
    ap.add_argument("--stop-at-difference", action="store_true",
                    help="map as `specview prescribe` does: a width stops at its first differing row")
    args = ap.parse_args()

    from specview.core.config import DEMO_DRAFT, DEMO_TARGET, EngineSettings, RunConfig
    from specview.core.demo import DEMO_PROMPT
    from specview.core.kernels.map import block_starts, kernel_map, parse_widths, tokens_needed
    from specview.core.prompts import builtin_prompts
    from specview.core.session import Session

    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    widths = parse_widths(args.widths)
    prompts = builtin_prompts()
    settings = EngineSettings(threads=args.threads)
    session = Session()
    for name in dict.fromkeys([*targets, DEMO_TARGET, DEMO_DRAFT]):
        session.model("llama.cpp", name, settings)  # loads (and derives) outside the timings

    cfg = RunConfig(target=DEMO_TARGET, draft=DEMO_DRAFT, prompt=DEMO_PROMPT, max_tokens=args.tokens,
                    ignore_eos=True, engine=settings)

    def baseline() -> float:
        t0 = time.perf_counter()
        trace = session.run(cfg, reuse_vanilla=False)
        dt = time.perf_counter() - t0
        print(f"  both arms, {args.tokens} tokens: {dt:.2f} s (vanilla {trace.vanilla.tokens_per_s:.1f} tok/s, "
              f"speculative {trace.speculative.tokens_per_s:.1f} tok/s, "
              f"{'identical' if trace.comparison.identical else 'forked'})", flush=True)
        return dt

    print(f"baseline: {DEMO_TARGET} target, {DEMO_DRAFT} draft, n_max {cfg.n_max}, threads "
          f"{args.threads or 'all'}", flush=True)
    b1 = baseline()
    print(f"kernel map: {len(targets)} targets x {len(prompts)} prompts, widths {args.widths}, "
          f"{args.positions} positions each{', stopping a width at its first difference' if args.stop_at_difference else ''}",
          flush=True)
    t0 = time.perf_counter()
    km = kernel_map(session, targets, prompts, widths, args.positions, settings,
                    progress=lambda m: print(f"  {m}", flush=True), stop_at_difference=args.stop_at_difference)
    t_map = time.perf_counter() - t0
    b2 = baseline()
    base = (b1 + b2) / 2

    n_tok = tokens_needed(widths, args.positions)
    walk = n_tok - 1
    blocks = sum(len(block_starts(w, args.positions)) for w in widths)
    rows = sum(len(block_starts(w, args.positions)) * w for w in widths)
    pairs = len(targets) * len(prompts)
    naive = pairs * (len(widths) * walk + blocks)
    print()
    if args.table:
        print(km.table())
        print()
    print(km.heatmap())
    print()
    measured = sum(st.rows for t in km.targets for st in t.widths.values())
    print(f"schedule: {pairs} x ({walk} single-token walk + {blocks} verify blocks) = {pairs * (walk + blocks)} "
          f"forward passes, {pairs * rows} rows; rows compared: {measured}; a separate walk per width would take "
          f"{naive} passes")
    for t in km.targets:
        print(f"  {t.label:<14} {t.seconds:7.1f} s   safe widths {t.safe_widths()}   safe n_max {t.safe_n_max()}")
    print(f"kernel map: {t_map:.1f} s; one {args.tokens}-token run of both arms: {base:.1f} s "
          f"(before {b1:.1f} s, after {b2:.1f} s)")
    ratio = t_map / base if base > 0 else float("inf")
    print(f"ratio map / run: {ratio:.2f} (goal <= 1.00: {'met' if ratio <= 1.0 else 'NOT met'})")
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
