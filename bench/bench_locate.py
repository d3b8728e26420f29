"""What one ``specview locate`` costs, against the two plain passes it explains, measured in the same run.

    python bench/bench_locate.py [--target demo:F16] [--width 4] [--row 0] [--position 32] [--threads 0]
                                 [--repeat 3]

The locate: the walk to the position (prefill, then one single-token pass per
token, as plain decoding walks it), the width-T and single-token passes each
run observed (every graph node copied out) and unobserved (the check that
observing changed nothing), and the node-by-node comparison.  The baseline: the
same two plain passes (width T and width 1) on the same prefix, in a context
without an observer.  The model is loaded before anything is timed.  Goal: one
locate on the demo under 10 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("GGML_NO_BACKTRACE", "1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo:F16")
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--row", type=int, default=0)
    ap.add_argument("--position", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from specview.core.config import EngineSettings
    from specview.core.demo import DEMO_PROMPT
    from specview.core.locate.find import locate
    from specview.core.session import Session

    settings = EngineSettings(threads=args.threads)
    with Session() as session:
        model = session.model("llama.cpp", args.target, settings)
        ids = model.tokenize(DEMO_PROMPT, chat=True)
        runs, plain_pair = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            loc = locate(session, args.target, width=args.width, row=args.row, position=args.position,
                         prompt=DEMO_PROMPT, settings=settings)
            runs.append(time.perf_counter() - t0)
            # the baseline: the same two passes, plain, on the prefix locate left in its walk context
            eng = session.engine("locate", model, settings, 0)
            start = args.position - args.row
            eng.truncate(len(ids) + start - 1)
            batch = loc.batch_tokens
            t0 = time.perf_counter()
            eng.eval(batch, rows=range(args.width))
            t_batch = time.perf_counter() - t0
            eng.truncate(len(ids) + args.position - 1)
            t0 = time.perf_counter()
            eng.eval(loc.single_tokens, rows=[0])
            plain_pair.append(t_batch + time.perf_counter() - t0)
        n_nodes = len(loc.nodes)
    med, base = statistics.median(runs), statistics.median(plain_pair)
    print(f"target {args.target}, width {args.width}, row {args.row}, token {args.position} "
          f"({len(ids)} prompt tokens), threads {loc.threads_used}, {args.repeat} runs")
    print(f"one locate: {med:.2f} s median (min {min(runs):.2f}, max {max(runs):.2f}); parts of the last: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in loc.seconds.items()))
    print(f"the two plain passes (width {args.width} + width 1): {base * 1000:.1f} ms median "
          f"-> locate costs {med / base:.0f}x them")
    print(f"{n_nodes} nodes per pass observed ({loc.selection}), {loc.count('identical') + loc.count('differs')} "
          f"compared; observer exact: {loc.observer_exact}")
    print(loc.where())
    print(f"goal (one locate on the demo under 10 s): {'met' if med < 10 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
