"""Server starts and wall time of a llama-server matrix: one server per model pair, against two per cell.

    python bench/bench_server.py [--target demo:Q8_0] [--draft demo:Q4_0] [--tokens 48]
                                 [--n-max 2,4] [--p-min 0,0.5] [--threads 1] [--server-bin PATH]

The matrix is 2 n_max x 2 p_min x the built-in prompts, draft-simple.  Both
protocols run it in the same process, one after the other, on the same cells:

* **single-server** (the default runner): one llama-server per (target,
  drafter, server flags), kept across cells; the vanilla arm as one-token
  requests on it, cached per prompt;
* **two servers per cell** (the former behaviour): a vanilla server and a
  speculative server started for every cell and stopped after it, both arms
  run in every cell.

Prints the cells, the server starts and the wall time of each, their ratio,
and checks that both produced the same tokens in every cell.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("GGML_NO_BACKTRACE", "1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo:Q8_0")
    ap.add_argument("--draft", default="demo:Q4_0")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--n-max", default="2,4")
    ap.add_argument("--p-min", default="0,0.5")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--server-bin", default="")
    ap.add_argument("--prompts", default="", help="comma-separated built-in prompt names (default: all)")
    args = ap.parse_args()

    from specview.backends.llama_server import ServerRunner, find_server_bin
    from specview.core.config import EngineSettings, RunConfig
    from specview.core.prompts import builtin_prompts

    binary = find_server_bin(args.server_bin or None)
    prompts = builtin_prompts([p for p in args.prompts.split(",") if p] or None)
    n_maxes = [int(x) for x in args.n_max.split(",")]
    p_mins = [float(x) for x in args.p_min.split(",")]
    eng = EngineSettings(threads=args.threads, server_bin=binary)
    cells = [RunConfig(target=args.target, draft=args.draft, spec_type="draft-simple", n_max=n, p_min=p,
                       max_tokens=args.tokens, prompt=pr.text, chat=pr.chat, backend="llama-server", engine=eng)
             for n in n_maxes for p in p_mins for pr in prompts]
    print(f"llama-server {binary}")
    print(f"matrix: {len(n_maxes)} n_max x {len(p_mins)} p_min x {len(prompts)} prompts = {len(cells)} cells, "
          f"{args.tokens} tokens per arm, {args.target} + {args.draft}, -t {args.threads}")

    results = {}
    protocols = (("single-server", {}, True),
                 ("two servers per cell", {"single_server": False, "keep_servers": False}, False))
    for name, kw, reuse in protocols:
        runner = ServerRunner(**kw)
        tokens = []
        t0 = time.perf_counter()
        try:
            for c in cells:
                t = runner.run(c, reuse_vanilla=reuse)
                tokens.append((tuple(t.vanilla.tokens), tuple(t.speculative.tokens)))
        finally:
            runner.close()
        wall = time.perf_counter() - t0
        results[name] = {"starts": runner.loads, "wall": wall, "tokens": tokens,
                         "vanilla_runs": runner.vanilla_runs}
        print(f"  {name:<22} {runner.loads:3d} server starts, {runner.vanilla_runs:3d} vanilla arms computed, "
              f"{wall:7.1f} s")
    new, old = results["single-server"], results["two servers per cell"]
    same = sum(a == b for a, b in zip(new["tokens"], old["tokens"]))
    print(f"server starts: {new['starts']} instead of {old['starts']} "
          f"({old['starts'] / max(1, new['starts']):.1f}x fewer)")
    print(f"wall time: {new['wall']:.1f} s instead of {old['wall']:.1f} s "
          f"(ratio single/two = {new['wall'] / old['wall']:.2f}, {old['wall'] / new['wall']:.2f}x faster)")
    print(f"cells with the same tokens in both protocols: {same} of {len(cells)}")
    return 0 if same == len(cells) else 1


if __name__ == "__main__":
    sys.exit(main())
