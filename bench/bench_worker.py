"""What the worker process costs: a run through it against the same run in this process, measured in one run.

    python bench/bench_worker.py [--target demo:Q8_0] [--draft demo:Q4_0] [--tokens 256] [--repeats 3]

Prints, for the same config (both arms, events streamed to a callback as the app
and the CLI take them):
  * what the wire costs: an Events message of 256 Steps through pickle and back, per Step
    (the tokens stream this way, one such message every ~20 ms at most);
  * the worker's start (spawn to ready), best and worst of --repeats (goal < 1 s);
  * the wall time of a run through the worker against the same run on a Session in
    this process, best of --repeats each, alternating (goal: under 3% slower);
  * the vanilla arm's tokens/s in the worker against ``Llama.generate`` (greedy) in
    this process (goal >= 0.95), after checking both produce the same tokens.
Every model loads as a run on this machine does (``tests/door.py``: no repack
where the crash probe crashed).
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from pathlib import Path

os.environ.setdefault("GGML_NO_BACKTRACE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo:Q8_0")
    ap.add_argument("--draft", default="demo:Q4_0")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    import door

    from specview.backends.llama_cpp import default_threads, demo
    from specview.core.config import EngineSettings, RunConfig
    from specview.core.registry import get_backend
    from specview.core.session import Session
    from specview.core.worker import WorkerRunner

    threads = args.threads or default_threads()
    settings = EngineSettings(n_ctx=1024, threads=threads, flash_attn="off")
    cfg = RunConfig(target=args.target, draft=args.draft, prompt=demo.DEMO_PROMPT, max_tokens=args.tokens,
                    ignore_eos=True, engine=settings)

    wire_us = wire_cost()
    starts = []
    for _ in range(args.repeats):
        r = WorkerRunner("llama.cpp")
        r.call(os.getpid, env={})  # starts the worker: last_start_s is the start alone, not the call
        starts.append(r.last_start_s or 0.0)
        r.close()

    runner = get_backend("llama.cpp").runner()
    assert isinstance(runner, WorkerRunner)
    session = Session()
    events = [0]

    def on_event(arm, ev):
        events[0] += 1

    runner.run(cfg, on_event=on_event)  # load the models on both sides before timing
    session.run(cfg, on_event=on_event)
    best = {"worker": float("inf"), "in-process": float("inf")}
    van_tps = 0.0
    tokens = None
    for _ in range(args.repeats):
        for name, who in (("worker", runner), ("in-process", session)):
            t0 = time.perf_counter()
            t = who.run(cfg, on_event=on_event, reuse_vanilla=False)
            best[name] = min(best[name], time.perf_counter() - t0)
            if name == "worker":
                van_tps = max(van_tps, (len(t.vanilla.tokens) - 1) / (t.vanilla.gen_ms / 1000.0))
                tokens = t.vanilla.tokens
    session.close()

    path = str(demo.resolve(args.target))
    prompt = None
    with Session() as s:
        prompt = s.model("llama.cpp", args.target, door.settings(settings, target=args.target)).tokenize(
            demo.DEMO_PROMPT, chat=True)
    ref = door.llama(path, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=threads, n_threads_batch=threads,
                     verbose=False, flash_attn=False)
    ref_tps = 0.0
    ref_tokens: list[int] = []
    for _ in range(args.repeats):
        ref.reset()
        out: list[int] = []
        t0 = None
        for tok in ref.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if t0 is None:
                t0 = time.perf_counter()
            out.append(tok)
            if len(out) >= args.tokens:
                break
        ref_tps = max(ref_tps, (len(out) - 1) / (time.perf_counter() - (t0 or time.perf_counter())))
        ref_tokens = out
    runner.close()

    ratio = best["worker"] / best["in-process"]
    print(f"target {args.target}, draft {args.draft}, {args.tokens} tokens per arm, {threads} thread(s), "
          f"best of {args.repeats}")
    print(f"wire: {wire_us:.2f} us a Step, an Events message of 256 through pickle and back")
    print(f"worker start:          best {min(starts):.3f} s, worst {max(starts):.3f} s   (goal < 1 s)")
    print(f"run through the worker: {best['worker']:.3f} s; in process: {best['in-process']:.3f} s; "
          f"{(ratio - 1) * 100:+.1f}%   (goal < +3%)")
    same = tokens == ref_tokens[:len(tokens or [])]
    print(f"vanilla arm in the worker: {van_tps:.1f} tok/s; Llama.generate here: {ref_tps:.1f} tok/s; "
          f"{van_tps / ref_tps:.3f}x   (goal >= 0.95; same tokens: {same})")
    ok = max(starts) < 1.0 and ratio < 1.03 and van_tps / ref_tps >= 0.95 and same
    return 0 if ok else 1


def wire_cost(n: int = 256, repeats: int = 200) -> float:
    """Microseconds a Step costs on the wire: one Events message of ``n`` Steps, pickled and unpickled."""
    from specview.core.trace import Step
    from specview.core.worker.wire import Events

    steps = [("on_event", ("vanilla", Step(index=i, token=1000 + i, piece=" word", pos=40 + i, top_ids=list(range(8)),
                                            top_logits=[float(-k) for k in range(8)], margin=1.25)))
             for i in range(n)]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        pickle.loads(pickle.dumps(Events(1, steps)))  # as multiprocessing.connection sends it
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


if __name__ == "__main__":
    raise SystemExit(main())
