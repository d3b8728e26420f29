"""How much the desktop app costs on top of the work itself.

1. GUI-thread time of one plot update and one pane update with an 8,000-token
   trace loaded (synthesized by tiling a real demo run), including the repaint.
   Target: under 16 ms each (one frame at 60 Hz).
2. Wall time of a streamed run in the app versus the same run headless through
   ``Session.run``, both arms re-run each time, alternated to share the noise.
   Target: streaming adds under 5 %.

Run:  QT_QPA_PLATFORM=offscreen python bench/bench_gui.py [--tokens 256] [--repeats 3]
Prints the figures and the comparison; exits 0 either way (a benchmark, not a test).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

FRAME_MS = 16.0
STREAM_OVERHEAD = 0.05


def tile_trace(trace, n_tokens: int):
    """Repeat a real trace's steps and rounds until each arm has ``n_tokens`` tokens."""
    from specview.core.compare import compare_arms
    from specview.core.trace import ArmResult, Trace

    def tile(arm):
        steps, rounds = [], []
        n0 = len(arm.steps)
        k = 0
        while len(steps) < n_tokens:
            off = k * n0
            roff = k * max(1, len(arm.rounds))
            for st in arm.steps:
                if len(steps) >= n_tokens:
                    break
                steps.append(replace(st, index=off + st.index, pos=st.pos + off, round=st.round + roff))
            for r in arm.rounds:
                if r.first_step + off < n_tokens:
                    rounds.append(replace(r, index=r.index + roff, first_step=r.first_step + off))
            k += 1
        out = ArmResult(name=arm.name, tokens=[s.token for s in steps], steps=steps, rounds=rounds,
                        text="".join(s.piece for s in steps), gen_ms=arm.gen_ms * k, stop_reason="max_tokens",
                        drafter=arm.drafter)
        return out

    v, s = tile(trace.vanilla), tile(trace.speculative)
    return Trace(config=trace.config, environment=trace.environment, models=trace.models, prompt=trace.prompt,
                 vanilla=v, speculative=s, comparison=compare_arms(v, s), diagnosis=None)


def ms(samples):
    return statistics.median(samples) * 1000.0, max(samples) * 1000.0


def bench_updates(app, win, big, frames: int = 30):
    """Median/max GUI-thread ms of (a) a plot update, (b) appending one frame's tokens to a full pane."""
    import numpy as np

    v, s = big.vanilla, big.speculative
    # preload: everything but the last `tail` tokens, as during a long stream
    tail = 8 * frames
    win.panes.vanilla.set_steps(v.steps)
    win.panes.speculative.clear_tokens()
    win.panes.speculative.append_steps(s.steps[:-tail])
    mv = np.array([st.margin for st in v.steps], float)
    ms_ = np.array([st.margin for st in s.steps], float)
    app.processEvents()

    rounds_upto = {}
    for f in range(frames):
        n = len(s.steps) - tail + 8 * (f + 1)
        rounds_upto[n] = [r for r in s.rounds if r.first_step < n]
    plot_t, pane_t = [], []
    for f in range(frames):
        n = len(s.steps) - tail + 8 * (f + 1)
        # the update as the app does it: new data, then the event loop paints the dirty regions
        t0 = time.perf_counter()
        win.margin_plot.set_arrays(mv, ms_[:n], x_max=len(s.steps))
        win.acceptance.set_rounds(rounds_upto[n], streaming=True)
        app.processEvents()
        plot_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        win.panes.speculative.append_steps(s.steps[n - 8:n])
        app.processEvents()
        pane_t.append(time.perf_counter() - t0)
    full_t = []
    for _ in range(10):  # worst case: both plots repainted whole (e.g. after a resize)
        t0 = time.perf_counter()
        win.margin_plot.viewport().repaint()
        win.acceptance.viewport().repaint()
        full_t.append(time.perf_counter() - t0)
    print(f"  (a whole repaint of both plots: median {statistics.median(full_t) * 1000:.1f} ms)")
    t0 = time.perf_counter()
    win.show_trace(big)
    app.processEvents()
    full = time.perf_counter() - t0
    win.panes.clear()
    t0 = time.perf_counter()
    win.show_trace(big)
    app.processEvents()
    full_fresh = time.perf_counter() - t0
    return plot_t, pane_t, full, full_fresh


def bench_stream(app, win, cfg, repeats: int):
    from specview.core.session import Session

    headless = Session()
    # load the models in both places first: load time is not what is measured
    headless.model(cfg.backend, cfg.target, cfg.engine)
    if cfg.draft:
        headless.model(cfg.backend, cfg.draft, cfg.engine)
    from PySide6.QtCore import QEventLoop

    done = []
    loop = QEventLoop()

    def finished(_trace):
        done.append(time.perf_counter())
        loop.quit()

    win.sigTraceShown.connect(finished)
    win.sigError.connect(lambda msg: (done.append(None), loop.quit()))

    def app_run():
        done.clear()
        t0 = time.perf_counter()
        win.run(reuse_vanilla=False)
        loop.exec()  # the GUI thread sleeps between events, exactly as in the app
        if done[0] is None:
            raise SystemExit(f"the app's run failed: {win.last_error}")
        return done[0] - t0

    def headless_run():
        t0 = time.perf_counter()
        headless.run(cfg, reuse_vanilla=False)
        return time.perf_counter() - t0

    app_run()  # warm-up: loads the models in the worker, fills caches
    headless_run()
    a, h = [], []
    for _ in range(repeats):
        h.append(headless_run())
        a.append(app_run())
    headless.close()
    return h, a


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=256, help="tokens per arm in the streamed comparison")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--big", type=int, default=8000, help="tokens per arm in the loaded trace")
    ap.add_argument("--target", default="demo:Q8_0")
    ap.add_argument("--draft", default="demo:Q4_0")
    args = ap.parse_args()

    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from specview.core.session import RunConfig, Session
    from specview.gui.window import MainWindow

    cfg = RunConfig(target=args.target, draft=args.draft, max_tokens=args.tokens,
                    prompt="Write an essay on the importance of sleep for students.")
    print(f"specview GUI benchmark  (target {cfg.target}, draft {cfg.draft}, {os.cpu_count()} cores, "
          f"QT_QPA_PLATFORM={os.environ.get('QT_QPA_PLATFORM')})")
    sess = Session()
    base = sess.run(cfg)
    sess.close()
    big = tile_trace(base, args.big)
    print(f"trace: {len(big.vanilla.tokens)} vanilla / {len(big.speculative.tokens)} speculative tokens, "
          f"{len(big.speculative.rounds)} rounds (tiled from a real {args.tokens}-token run)")

    win = MainWindow(settings_path=None)
    win.auto_run.setChecked(False)
    win.diagnose.setChecked(False)
    win.resize(1480, 920)
    win.show()
    app.processEvents()
    try:
        plot_t, pane_t, full, full_fresh = bench_updates(app, win, big)
        pm, px = ms(plot_t)
        qm, qx = ms(pane_t)
        print("\nGUI-thread time per update with the 8,000-token trace loaded (median / max of 30):")
        print(f"  plot update (margins + acceptance, setData + repaint)  {pm:7.2f} / {px:7.2f} ms"
              f"   target < {FRAME_MS:.0f} ms: {'OK' if pm < FRAME_MS else 'OVER'}")
        print(f"  pane update (append one frame of 8 tokens + paint)     {qm:7.2f} / {qx:7.2f} ms"
              f"   target < {FRAME_MS:.0f} ms: {'OK' if qm < FRAME_MS else 'OVER'}")
        print(f"  showing the whole trace once (panes already filled)     {full * 1000:7.1f} ms")
        print(f"  showing the whole trace once (empty panes, e.g. Open)   {full_fresh * 1000:7.1f} ms")

        win.set_controls(target=cfg.target, draft=cfg.draft, max_tokens=cfg.max_tokens, prompt=cfg.prompt,
                         chat=True, p_min=0.0, n_max=cfg.n_max)
        win.auto_run.setChecked(False)
        win.frames = 0
        h, a = bench_stream(app, win, cfg, args.repeats)
        print(f"  frames drawn while streaming: {win.frames} over {args.repeats + 1} runs "
              f"({win.frames / sum(a):.1f} per second of app run)" if a else "")
        hm, am = statistics.median(h), statistics.median(a)
        over = am / hm - 1.0
        print(f"\nstreamed run in the app vs headless Session.run ({args.tokens} tokens per arm, both arms each "
              f"time, {args.repeats} alternated runs):")
        print(f"  headless  {', '.join(f'{x:.2f}' for x in h)} s   median {hm:.2f} s")
        print(f"  app       {', '.join(f'{x:.2f}' for x in a)} s   median {am:.2f} s")
        print(f"  streaming adds {over * 100:+.1f} %   target < {STREAM_OVERHEAD * 100:.0f} %: "
              f"{'OK' if over < STREAM_OVERHEAD else 'OVER'}")
    finally:
        win.shutdown()
        win.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
