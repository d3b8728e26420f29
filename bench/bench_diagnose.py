"""What does a diagnosis cost next to the run it explains?

Runs both arms on the demo model (defaults: demo:Q8_0 target, demo:Q4_0 draft,
the essay chat prompt, 256 tokens, n_max 3), then the diagnosis, and prints the
run's wall time, the diagnosis's, and their ratio (the goal is <= ~1x: the two
replays are one vanilla pass per shared position plus one verify pass per
speculative round, with no drafting).  With --controls it also times the control
matrix.  An identical run is diagnosed with the envelope over the whole run
(``envelope_if_identical``), so the ratio is measured either way.

    python bench/bench_diagnose.py                       # demo defaults
    python bench/bench_diagnose.py --target demo:Q4_K_M -n 128 --threads 1
    python bench/bench_diagnose.py --controls

Figures vary with the machine and its load; llama.cpp's threads spin at
barriers, so on a busy machine pass --threads 1 (or set SPECVIEW_THREADS).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from specview.core import demo
from specview.core import diagnose as dmod
from specview.core.engine import EngineSettings
from specview.core.session import RunConfig, Session


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=demo.DEMO_TARGET)
    p.add_argument("--draft", default=demo.DEMO_DRAFT)
    p.add_argument("-n", "--max-tokens", type=int, default=256)
    p.add_argument("--n-max", type=int, default=3)
    p.add_argument("--prompt", default=demo.DEMO_PROMPT)
    p.add_argument("--threads", type=int, default=0, help="0 = $SPECVIEW_THREADS or every core")
    p.add_argument("--controls", action="store_true", help="also time the control matrix")
    args = p.parse_args(argv)

    cfg = RunConfig(target=args.target, draft=args.draft, prompt=args.prompt, max_tokens=args.max_tokens,
                    n_max=args.n_max, engine=EngineSettings(threads=args.threads))
    session = Session()
    try:
        session.model(cfg.backend, cfg.target, cfg.engine)  # load time is not part of either figure
        session.model(cfg.backend, cfg.draft, cfg.engine)
        t0 = time.perf_counter()
        trace = session.run(cfg)
        t_run = time.perf_counter() - t0
        t0 = time.perf_counter()
        d = dmod.diagnose(session, cfg, trace, envelope_if_identical=True)
        t_diag = time.perf_counter() - t0
        t_ctrl = None
        if args.controls:
            t0 = time.perf_counter()
            dmod.diagnose(session, cfg, trace, controls=True)
            t_ctrl = time.perf_counter() - t0 - t_diag
    finally:
        session.close()

    fm = trace.comparison.first_mismatch
    rp = d["replays"] or {}
    print(f"target {cfg.target}, draft {cfg.draft}, {cfg.max_tokens} tokens, n_max {cfg.n_max}, "
          f"threads {args.threads or 'default'}")
    print(f"comparison      {'identical' if fm is None else f'fork at token {fm.index}'}; verdict {d['verdict']}")
    print(f"run             {t_run:8.2f} s  (vanilla {trace.vanilla.gen_ms / 1000:.2f} s, "
          f"speculative {trace.speculative.gen_ms / 1000:.2f} s)")
    print(f"diagnosis       {t_diag:8.2f} s  ({rp.get('positions')} positions, {rp.get('passes')} forward passes)")
    print(f"ratio           {t_diag / t_run:8.2f} x the run")
    if t_ctrl is not None:
        print(f"controls        {t_ctrl:8.2f} s  ({t_ctrl / t_run:.2f} x the run)")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS        {rss:8.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
