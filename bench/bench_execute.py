"""What the sandbox costs per sample: a trivial passing sample through ``run_sample`` against a bare
``python -c pass`` started the same way (subprocess, pipes), measured in one run.

    python bench/bench_execute.py [--repeats 20]

Prints the median and best of --repeats for:
  * the baseline: ``python -I -S -c pass`` with its output on a pipe, waited for;
  * a sample in the sandbox with every fence this platform has (namespaces, mounts, Landlock, limits, the
    in-process guard), and the overhead over the baseline;
  * the same without the seccomp filter (what the filter costs);
  * the same without the kernel's namespaces, mounts and Landlock (what those fences cost on their own);
and what the platform enforces (``sandbox_report``), with the promised fences it lacks.  HumanEval's 164
problems run one sample per arm each.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()

    from specview.core.quality.execute import run_sample, sandbox_report

    def bare() -> None:
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True)

    def sandboxed(**kw: object) -> None:
        res = run_sample("assert 1 + 1 == 2\n", **kw)  # type: ignore[arg-type]
        if not res.passed:
            raise SystemExit(f"the trivial sample failed: {res.reason}\n{res.output}")

    report = sandbox_report()
    rows = [("python -I -S -c pass (baseline)", timed(bare, args.repeats)),
            ("run_sample, every fence", timed(sandboxed, args.repeats)),
            ("run_sample, no seccomp", timed(lambda: sandboxed(fences_off=("seccomp",)), args.repeats)),
            ("run_sample, no namespaces/mounts/Landlock",
             timed(lambda: sandboxed(fences_off=("namespaces", "mounts", "landlock")), args.repeats))]
    base = statistics.median(rows[0][1])
    print(f"per sample, median and best of {args.repeats}:")
    for name, times in rows:
        med = statistics.median(times)
        extra = "" if name.endswith("(baseline)") else f"   overhead {1000 * (med - base):6.1f} ms ({med / base:.2f}x)"
        print(f"  {name:44s} {1000 * med:7.1f} ms  (best {1000 * min(times):6.1f}){extra}")
    print("what holds here:")
    for line in report.lines():
        print("  " + line)
    for gap in report.gaps():
        print("  gap: " + gap)
    for fence in report.missing():
        print("  promised but missing (--execute refuses without --allow-weak-sandbox): " + fence)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
