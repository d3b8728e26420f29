"""The prompt suite as one matrix against one ``specview run`` process per prompt, measured in the same run.

    python bench/bench_suite.py [--tokens 256] [--limit N] [--repeats R] [--threads T] [--stop-after-fork 16]
                                [--full-text]

Contender A is ``specview matrix --suite`` (the demo's default setting, ``--no-diagnose``): one process,
each model loaded once, the vanilla arm computed once per prompt, and each speculative arm stopped a few
tokens after its fork.  Contender B is the same prompts run as separate ``specview run --no-diagnose``
processes, one per prompt, as a user without the suite would.  Both are real command lines started as
subprocesses, so process start-up and model loading count on both sides.

Prints both wall times, their ratio, the tokens each side generated, and a check that both sides found
the same fork (or none) for every prompt: a faster suite that disagreed would be worthless.  With
``--repeats R`` the two contenders alternate R times and each keeps its best time, so a shared machine's
load hurts both alike; the load average before and after is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GGML_NO_BACKTRACE", "1")


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "specview", *args]


def _run(argv: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if res.returncode not in (0, 1):
        sys.exit(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stderr}")
    return dt, res.returncode


def _toml_string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a valid TOML basic string for these texts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--limit", type=int, default=None, help="only the first N suite prompts (default all)")
    ap.add_argument("--threads", type=int, default=0, help="-t for both sides (0: every core)")
    ap.add_argument("--repeats", type=int, default=1, help="alternate the two sides this many times; best of each")
    ap.add_argument("--stop-after-fork", type=int, default=None, help="the suite's default unless given")
    ap.add_argument("--full-text", action="store_true", help="suite cells generate their whole text too")
    args = ap.parse_args()

    from specview.core.config import DEMO_DRAFT, DEMO_TARGET
    from specview.core.prompts import suite_prompts

    prompts = suite_prompts()[: args.limit] if args.limit else suite_prompts()
    common = ["-n", str(args.tokens), "--no-diagnose", "-q"] + (["-t", str(args.threads)] if args.threads else [])
    print(f"suite of {len(prompts)} prompts, {DEMO_TARGET} target, {DEMO_DRAFT} draft, {args.tokens} tokens per arm, "
          f"threads {args.threads or 'all'}; load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="specview-bench-suite-") as tmp:
        d = Path(tmp)
        # warm the demo cache (deriving a quantization is not what either side measures)
        _run(_cmd("run", "-n", "4", "--no-diagnose", "-q", "-p", "warm up"))

        matrix_out = d / "suite.json"
        stop = (["--full-text"] if args.full_text else
                ["--stop-after-fork", str(args.stop_after_fork)] if args.stop_after_fork is not None else [])
        if args.limit:
            toml = d / "suite.toml"
            toml.write_text("builtin_prompts = false\nprompts = [\n" + "".join(
                f"  {{ name = {_toml_string(p.name)}, text = {_toml_string(p.text or '')}, "
                f"category = {_toml_string(p.category or '')} }},\n" for p in prompts) + "]\n"
                f"targets = [{_toml_string(DEMO_TARGET)}]\ndrafters = [{_toml_string(DEMO_DRAFT)}]\n"
                "stop_after_fork = 16\n", encoding="utf-8")
            suite_argv = _cmd("matrix", "--config", str(toml), *common, *stop, "-o", str(matrix_out))
        else:
            suite_argv = _cmd("matrix", "--suite", *common, *stop, "-o", str(matrix_out))
        print("A:", " ".join(suite_argv[2:]))
        print(f"B: specview run -f PROMPT {' '.join(common)} --json OUT, once per prompt")
        for i, p in enumerate(prompts):
            (d / f"p{i}.txt").write_text(p.text or "", encoding="utf-8")
        t_suite = t_runs = float("inf")
        for rep in range(args.repeats):
            dt, _ = _run(suite_argv)
            t_suite = min(t_suite, dt)
            doc = json.loads(matrix_out.read_text(encoding="utf-8"))
            total, runs = 0.0, []
            for i in range(len(prompts)):
                out = d / f"run{i}.json"
                dtr, _ = _run(_cmd("run", "-f", str(d / f"p{i}.txt"), *common, "--json", str(out)))
                total += dtr
                runs.append(json.loads(out.read_text(encoding="utf-8")))
            t_runs = min(t_runs, total)
            print(f"   round {rep + 1}: A {dt:.1f} s, B {total:.1f} s (load average {os.getloadavg()[0]:.1f})")

    cells = {c["params"]["prompt"]: c for c in doc["cells"]}
    agree = forks = 0
    spec_tokens_suite = spec_tokens_runs = 0
    for p, r in zip(prompts, runs):
        c = cells[p.name]
        fm = r["comparison"]["first_mismatch"]
        idx = None if fm is None else fm["index"]
        agree += c.get("first_mismatch") == idx
        forks += idx is not None
        spec_tokens_suite += c.get("n_speculative") or 0
        spec_tokens_runs += len(r["speculative"]["tokens"])
    ctr = doc.get("counters", {})
    g = (doc.get("rates") or {}).get("settings", [{}])[0]
    print()
    print(f"suite (one process)        {t_suite:8.1f} s   {ctr.get('loads')} model loads, "
          f"{spec_tokens_suite} speculative tokens")
    print(f"{len(prompts)} separate processes    {t_runs:8.1f} s   {2 * len(prompts)} model loads, "
          f"{spec_tokens_runs} speculative tokens")
    print(f"ratio                      {t_runs / t_suite:8.2f}x  (separate / suite)")
    print(f"same fork on both sides    {agree} of {len(prompts)} prompts ({forks} fork in the separate runs)")
    if g:
        print(f"divergence rate            {g.get('forks')} of {g.get('n')} "
              f"({100 * (g.get('rate') or 0):.1f}%, 95% CI {100 * (g.get('low') or 0):.1f}–"
              f"{100 * (g.get('high') or 0):.1f}%)")
    print(f"load average after         {os.getloadavg()[0]:.1f}")
    return 0 if agree == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
