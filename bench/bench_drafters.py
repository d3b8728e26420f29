"""What the demo's tiny drafters cost: writing each one, and what it adds to a llama-server's start, in one run.

    python bench/bench_drafters.py [--target demo:Q8_0] [--repeats 5] [--server-bin PATH]

Prints:
  * reading the target's header and tokenizer once (every writer shares it);
  * writing each drafter (EAGLE-3, DFlash, DSpark) from those facts, median of --repeats, and its size;
  * a llama-server's start to ready (``/health``) with each drafter loaded (``--spec-type draft-eagle3``
    and so on) against the same server without one, median of --repeats each, alternating, and the
    difference: the drafter's load (goal: well under a second).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo:Q8_0")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--server-bin", default=None)
    args = ap.parse_args()

    from specview.backends.llama_cpp.demo import resolve
    from specview.backends.llama_cpp.tiny_drafters import WRITERS, common, write_drafter
    from specview.backends.llama_server.binary import find_server_bin
    from specview.backends.llama_server.process import LlamaServer
    from specview.core.config import EngineSettings, RunConfig

    target = resolve(args.target)
    t0 = time.perf_counter()
    facts = common.read_target(target)
    print(f"target {Path(target).name}: header and tokenizer read in {time.perf_counter() - t0:.2f} s")

    binary = find_server_bin(args.server_bin)
    out = Path(tempfile.mkdtemp(prefix="specview-bench-drafters-"))
    drafters: dict[str, Path] = {}
    for st in WRITERS:
        times = []
        for i in range(args.repeats):
            t0 = time.perf_counter()
            drafters[st] = write_drafter(st, facts, out / f"{st}.gguf")
            times.append(time.perf_counter() - t0)
        size = drafters[st].stat().st_size
        print(f"{st:<13} written in {statistics.median(times) * 1000:6.0f} ms (median of {args.repeats}), "
              f"{size / 1e6:.1f} MB")

    def ready_s(spec_type: str, draft: Path | None) -> float:
        cfg = RunConfig(target=str(target), draft=str(draft) if draft else None, spec_type=spec_type,
                        prompt="x", engine=EngineSettings(threads=1, n_ctx=512)).to_dict()
        srv = LlamaServer.for_run(binary, cfg, target=str(target), draft=str(draft) if draft else None,
                                  speculative=draft is not None, label=spec_type)
        t0 = time.perf_counter()
        srv.start()
        try:
            srv.wait_ready()
            return time.perf_counter() - t0
        finally:
            srv.stop()

    print(f"llama-server start to ready ({binary}), median of {args.repeats}, alternating with the baseline:")
    for st, draft in drafters.items():
        base, with_draft = [], []
        for _ in range(args.repeats):
            base.append(ready_s("none", None))
            with_draft.append(ready_s(st, draft))
        b, w = statistics.median(base), statistics.median(with_draft)
        print(f"  {st:<13} {w:.3f} s against {b:.3f} s without a drafter: +{(w - b) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
