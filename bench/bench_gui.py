"""How much the desktop app costs on top of the work itself.

1. GUI-thread time of one update with an 8,000-token trace loaded (synthesized
   by tiling a real demo run), including the repaint: a plot update (both
   plots, as a streaming frame makes it), a pane update (one frame's tokens
   appended), and a whole streaming frame through the app's live view.
   Goal: plot update under 16 ms median (one frame at 60 Hz).
2. Wall time of a streamed run in the app versus the same run headless through
   the engine's runner, both arms re-run each time, alternated so that a noisy,
   shared machine hurts both alike.  Goal: streaming adds under 5 %.

Wall times are what a user waits; the GUI thread's CPU time (``thread_time``)
is printed beside them because on a loaded machine the wall time of a short
update is mostly waiting for a core.

Run:  QT_QPA_PLATFORM=offscreen python bench/bench_gui.py [--tokens 256] [--repeats 5]
Prints the figures and the comparison; exits 0 either way (a benchmark, not a test).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import replace

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("GGML_NO_BACKTRACE", "1")

FRAME_MS = 16.0
STREAM_OVERHEAD = 0.05
FRAMES = 30
TOKENS_PER_FRAME = 8


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = f", load average {os.getloadavg()[0]:.1f}"
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}{load}"


def tile_trace(trace, n_tokens: int):
    """Repeat a real trace's steps and rounds until each arm has ``n_tokens`` tokens."""
    from specview.core.arms.compare import compare_arms
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
                steps.append(replace(st, index=off + st.index, pos=st.pos + off,
                                     round=None if st.round is None else st.round + roff))
            for r in arm.rounds:
                if r.first_step + off < n_tokens:
                    rounds.append(replace(r, index=r.index + roff, first_step=r.first_step + off))
            k += 1
        return ArmResult(name=arm.name, tokens=[s.token for s in steps], steps=steps, rounds=rounds,
                         text="".join(s.piece for s in steps), gen_ms=arm.gen_ms * k, stop_reason="max_tokens",
                         drafter=arm.drafter)

    v, s = tile(trace.vanilla), tile(trace.speculative)
    return Trace(config=trace.config, environment=trace.environment, models=trace.models, prompt=trace.prompt,
                 vanilla=v, speculative=s, comparison=compare_arms(v, s), diagnosis=None)


class Clock:
    """Wall and GUI-thread CPU time of a block, appended to two lists."""

    def __init__(self):
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __enter__(self):
        self._t, self._c = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc):
        self.wall.append(time.perf_counter() - self._t)
        self.cpu.append(time.thread_time() - self._c)

    def line(self, what: str, goal: float | None = None) -> str:
        wm, wx = statistics.median(self.wall) * 1e3, max(self.wall) * 1e3
        cm = statistics.median(self.cpu) * 1e3
        out = f"  {what:<52} {wm:7.2f} / {wx:7.2f} ms   (GUI-thread CPU {cm:6.2f} ms)"
        if goal is not None:
            out += f"   goal < {goal:.0f} ms: {'OK' if wm < goal else 'OVER'}"
        return out


def bench_updates(app, win, big):
    """Frame costs with the big trace loaded, as a long run streams its last tokens."""
    from specview.core.config import RunConfig
    from specview.gui.messages import ArmStarted, RunRequest, StepsEvent

    v, s = big.vanilla, big.speculative
    tail = TOKENS_PER_FRAME * FRAMES
    n0 = len(s.steps) - 2 * tail
    req = RunRequest(RunConfig(prompt="x", max_tokens=len(s.steps)))
    win.request = req
    live = win.live
    live.begin(req)
    live.on_arm_started(ArmStarted(req.id, "vanilla"))
    live.on_steps(StepsEvent(req.id, "vanilla", v.steps, []))
    live.on_arm_started(ArmStarted(req.id, "speculative"))

    def feed(a: int, b: int) -> None:
        rounds = [r for r in s.rounds if a <= r.first_step < b]
        live.on_steps(StepsEvent(req.id, "speculative", s.steps[a:b], rounds))

    feed(0, n0)
    live.flush()
    app.processEvents()
    plots, panes, frames = Clock(), Clock(), Clock()
    for f in range(FRAMES):  # each part on its own: the plots, then the panes
        a = n0 + f * TOKENS_PER_FRAME
        feed(a, a + TOKENS_PER_FRAME)
        live.live.pending = {"vanilla": [], "speculative": []}
        with plots:
            win.margin_plot.set_arrays(live.live.margins["vanilla"].view(), live.live.margins["speculative"].view(),
                                       x_max=len(s.steps))
            win.acceptance.set_rounds(live.live.rounds, streaming=True)
            app.processEvents()
        with panes:
            win.panes.speculative.append_steps(s.steps[a:a + TOKENS_PER_FRAME])
            app.processEvents()
    for f in range(FRAMES):  # a whole frame, plots included (the plots are drawn on a budget of their own)
        a = n0 + tail + f * TOKENS_PER_FRAME
        feed(a, a + TOKENS_PER_FRAME)
        live._plots_due = 0.0
        with frames:
            live.flush()
            app.processEvents()
    win.request = None
    shown = Clock()
    with shown:
        win.show_trace(big)
        app.processEvents()
    win.panes.clear()
    fresh = Clock()
    with fresh:
        win.show_trace(big)
        app.processEvents()
    return plots, panes, frames, shown, fresh


def bench_stream(app, win, cfg, repeats: int):
    from PySide6.QtCore import QEventLoop

    from specview.core.registry import get_backend

    headless = get_backend(cfg.backend).runner()
    done: list = []
    loop = QEventLoop()

    def finished(_trace):
        done.append(time.perf_counter())
        loop.quit()

    win.sigTraceShown.connect(finished)
    win.sigError.connect(lambda msg: (done.append(None), loop.quit()))

    def app_run():
        done.clear()
        frames0 = win.frames
        t0, c0 = time.perf_counter(), time.thread_time()
        win.run(reuse_vanilla=False)
        loop.exec()  # the GUI thread sleeps between events, exactly as in the app
        if done[0] is None:
            raise SystemExit(f"the app's run failed: {win.last_error}")
        return done[0] - t0, time.thread_time() - c0, win.frames - frames0

    def headless_run():
        t0 = time.perf_counter()
        headless.run(cfg, reuse_vanilla=False)
        return time.perf_counter() - t0

    app_run()  # warm-up: loads the models in the worker and here, fills caches
    headless_run()
    h, a, gui_cpu, frames = [], [], [], 0
    for _ in range(repeats):
        h.append(headless_run())
        wall, cpu, nf = app_run()
        a.append(wall)
        gui_cpu.append(cpu)
        frames += nf
    headless.close()
    return h, a, gui_cpu, frames


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=256, help="tokens per arm in the streamed comparison")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--big", type=int, default=8000, help="tokens per arm in the loaded trace")
    ap.add_argument("--target", default="demo:Q8_0")
    ap.add_argument("--draft", default="demo:Q4_0")
    ap.add_argument("--skip-stream", action="store_true", help="only the update costs (no model runs but one)")
    args = ap.parse_args()

    from specview.gui.app import application

    app = application(offscreen=True)
    from specview.core.config import RunConfig
    from specview.core.registry import get_backend
    from specview.gui.window import MainWindow

    cfg = RunConfig(target=args.target, draft=args.draft, max_tokens=args.tokens,
                    prompt="Write an essay on the importance of sleep for students.")
    print("specview GUI benchmark")
    print(f"machine: {machine()}")
    print(f"run: target {cfg.target}, draft {cfg.draft}, {cfg.max_tokens} tokens per arm, "
          f"QT_QPA_PLATFORM={os.environ.get('QT_QPA_PLATFORM')}")
    with get_backend(cfg.backend).runner() as runner:
        base = runner.run(cfg)
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
        plots, panes, frames, shown, fresh = bench_updates(app, win, big)
        print(f"\nGUI-thread time per update with the {args.big:,}-token trace loaded "
              f"(wall median / max of {FRAMES}):")
        print(plots.line("plot update (margins + acceptance, setData + repaint)", FRAME_MS))
        print(panes.line(f"pane update (append {TOKENS_PER_FRAME} tokens + paint)", FRAME_MS))
        print(frames.line("a whole streaming frame (panes, plots, marks, progress)"))
        print(shown.line("showing the whole trace once (panes already filled)"))
        print(fresh.line("showing the whole trace once (empty panes, e.g. Open)"))
        if args.skip_stream:
            return 0
        win.set_controls(backend=cfg.backend, target=cfg.target, draft=cfg.draft, max_tokens=cfg.max_tokens,
                         prompt=cfg.prompt, chat=True, p_min=0.0, n_max=cfg.n_max, diagnose=False)
        win.auto_run.setChecked(False)
        h, a, gui_cpu, nframes = bench_stream(app, win, cfg, args.repeats)
        hm, am = statistics.median(h), statistics.median(a)
        # each app run against the headless run just before it: a shared machine's load drifts slowly,
        # so the median of these pairs is steadier than the ratio of the two medians
        over = statistics.median(x / y for x, y in zip(a, h)) - 1.0
        print(f"\nstreamed run in the app vs headless runner ({args.tokens} tokens per arm, both arms each time, "
              f"{args.repeats} alternated runs):")
        print(f"  headless  {', '.join(f'{x:.2f}' for x in h)} s   median {hm:.2f} s")
        print(f"  app       {', '.join(f'{x:.2f}' for x in a)} s   median {am:.2f} s")
        print(f"  the GUI thread used {statistics.median(gui_cpu) / am * 100:.1f} % of one core during an app run; "
              f"{nframes / sum(a):.1f} frames drawn per second (the plots in "
              f"{win.live.plot_frames / max(1, win.frames):.0%} of them)")
        print(f"  best of {args.repeats}: headless {min(h):.2f} s, app {min(a):.2f} s ({(min(a) / min(h) - 1) * 100:+.1f} %)")
        print(f"  streaming adds {over * 100:+.1f} % (median of the {args.repeats} pairs)   "
              f"goal < {STREAM_OVERHEAD * 100:.0f} %: "
              f"{'OK' if over < STREAM_OVERHEAD else 'OVER'}")
    finally:
        win.shutdown()
        win.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
