#!/usr/bin/env python3
"""A mutation check: plant known defects in a copy of the tree and make sure the tests notice each one.

Each mutation is a small textual patch of one source file (the exact text it replaces must be
found once, or the mutation is reported as stale) and the few fast tests that exist to catch it
(fake engines, tiny GGUF models, stand-in servers): the test functions that fail on it, not their
whole files, so neither the baseline nor a mutation's run pays for tests that cannot kill it.  The
checked-out files (``git ls-files``) are copied to a temporary folder, one copy a job; the named
tests first run there unmutated and must pass; then each mutation is applied to one copy, the same
tests run with ``PYTHONPATH`` pointing at that copy, and they must fail; the copy is restored before
its next mutation.  The jobs (one a core, as the suite's lanes) run side by side and each test run
gets its share of the cores (``$SPECVIEW_THREADS``), so no mutation sees another's patch.  One line
per mutation, as it ends, says which test killed it and how long it took.  The exit status is 0
when every mutation was killed, 1 when one survived (or a baseline failed, or a patch no longer
applies).

    python scripts/mutation-check.py            # every mutation
    python scripts/mutation-check.py -k resume  # those whose name contains "resume"
    python scripts/mutation-check.py --jobs 1   # one at a time
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    more: tuple[tuple[str, str], ...] = ()  # further (old, new) patches of the same file, for a defect in two places

    @property
    def patches(self) -> tuple[tuple[str, str], ...]:
        return ((self.old, self.new), *self.more)


_MEM = "specview/backends/llama_cpp/memory.py"
#: the tests that walk the real rollback on the tiny hybrids (tests/tinyhybrid.py), one case each
_HYBRID_SERIAL = ("tests/backends/test_hybrid_rollback.py::"
                  "test_the_serial_verify_control_reproduces_vanilla_in_every_mode")
_SNAPSHOT_ARM = ("tests/backends/test_snapshot_check.py::"
                 "test_the_snapshot_check_walks_no_snapshot_and_compares_every_token[qwen35]")
_DRAFT_ROLLBACK = ("tests/backends/test_draft_rollback.py::"
                   "test_every_draft_rollback_leaves_the_state_a_clean_context_reaches[qwen35-checkpoint]")


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "vanilla arm: the runner-up token instead of the argmax",
        "specview/core/arms/generate.py",
        "    while True:\n        tok = int(np.argmax(row))",
        "    while True:\n        tok = int(np.argsort(row)[-2])",
        ("tests/core/test_generate.py::test_vanilla_equals_an_independent_greedy_loop",),
    ),
    Mutation(
        "speculative arm: the target's own token after the accepted drafts is the last draft's",
        "specview/core/arms/generate.py",
        "emitted = [*draft[:n_acc], int(argmax[n_acc])]",
        "emitted = [*draft[:n_acc], int(argmax[max(n_acc - 1, 0)])]",
        ("tests/core/test_generate.py::test_speculative_is_lossless_on_a_shape_independent_model",),
    ),
    Mutation(
        "accept rule: the last draft token is never accepted",
        "specview/core/arms/generate.py",
        "    while n < len(draft) and int(argmax[n]) == int(draft[n]):",
        "    while n < len(draft) - 1 and int(argmax[n]) == int(draft[n]):",
        ("tests/core/test_generate.py::test_perfect_drafter_verifies_full_batches",),
    ),
    Mutation(
        "rollback: the first rejected draft token stays in the KV cache",
        "specview/core/arms/generate.py",
        "            done = engine.truncate(n_past + n_acc + 1)",
        "            done = engine.truncate(min(n_past + n_acc + 2, n_past + T))",
        ("tests/core/test_generate.py::test_speculative_is_lossless_on_a_shape_independent_model",),
    ),
    Mutation(
        "diagnosis: a serial-verify control that differs from vanilla is read as a near-tie",
        "specview/core/diagnose/classify.py",
        '        return _rule("state", "serial-verify-differs")',
        '        return _rule("near-tie", "serial-verify-differs")',
        ("tests/core/test_diagnose.py::test_classify",),
    ),
    Mutation(
        "diagnosis: a gap far beyond the envelope is never a state bug",
        "specview/core/diagnose/classify.py",
        "    if gap > far_threshold(env_max, factor=factor, floor=floor):",
        "    if gap > 1e9 * far_threshold(env_max, factor=factor, floor=floor):",
        ("tests/core/test_diagnose.py::test_classify",),
    ),
    Mutation(
        "matrix resume: failed cells are kept, so they are never run again",
        "specview/core/matrix/run.py",
        'run.records = [r for r in resume["cells"] if r.get("status") == "ok"\n',
        'run.records = [r for r in resume["cells"] if r.get("status") in ("ok", "error")\n',
        ("tests/backends/test_matrix_resume.py::test_resume_runs_the_failed_cells_again_and_keeps_the_finished_ones",),
    ),
    Mutation(
        "matrix resume: cells from another machine, build or thread count are mixed in",
        "specview/core/matrix/run.py",
        "                    resumed.check(trace)",
        "                    resumed.differences(trace)",
        ("tests/backends/test_matrix_resume.py::test_resume_from_another_machine_is_refused",),
    ),
    Mutation(
        "report escaping: HTML is written as it comes",
        "specview/core/report/escape.py",
        "    return html.escape(value if isinstance(value, str) else text(value), quote=True)",
        "    return value if isinstance(value, str) else text(value)",
        ("tests/core/test_report.py::test_html_report_escapes_every_token",),
    ),
    Mutation(
        "report escaping: Markdown specials pass through",
        "specview/core/report/escape.py",
        '    s = _MD_SPECIAL.sub(r"\\\\\\1", visible(value))',
        "    s = visible(value)",
        ("tests/core/test_report.py::test_md_helpers_hold_any_backtick_run",),
    ),
    Mutation(
        "kernel map: a width that differs from single-token passes still counts as proven lossless",
        "specview/core/kernels/evidence.py",
        "    differ = [w for w in measured if not row.widths[w].bit_identical]",
        "    differ = []",
        ("tests/core/test_kernel_evidence.py::test_n_max_below_the_planted_width_is_proven_and_above_it_differs",),
    ),
    Mutation(
        "backend check: the llama.cpp build's gpu_offload fact is always false, so no GPU diagnosis checks first",
        "specview/backends/llama_cpp/lib.py",
        '"gpu_offload": bool(ll.llama_supports_gpu_offload()),',
        '"gpu_offload": False,',
        ("tests/backends/test_check_llama.py::test_a_gpu_build_checks_the_backend_before_every_gpu_diagnosis",),
    ),
    Mutation(
        "server cleanup: exit and the signal handlers leave the servers running",
        "specview/backends/local_server/process.py",
        "            srv.stop(grace=1.0)",
        "            pass",
        ("tests/backends/test_server_process.py::test_sigterm_to_specview_stops_its_servers_first",),
    ),
    Mutation(
        "worker death: a worker killed by a signal is reported without it",
        "specview/core/worker/death.py",
        "        return signal.Signals(-exitcode).name",
        "        return None",
        ("tests/core/test_worker.py::test_a_native_death_in_the_speculative_arm_keeps_the_run",),
    ),
    Mutation(
        "preset: a zero-draft cell that drafted is read as the control anyway",
        "specview/core/matrix/preset.py",
        "    if role == \"zero-draft\":\n        if drafted > 0:",
        "    if role == \"zero-draft\":\n        if drafted < 0:",
        ("tests/core/test_matrix_presets.py::test_a_zero_draft_cell_that_drafts_proves_nothing",),
    ),
    Mutation(
        "preset: plain decoding that differs from itself does not void the conclusion",
        "specview/core/matrix/preset.py",
        "    if any(f[\"outcome\"] != \"identical\" for f in by_role.get(\"determinism\", [])):",
        "    if False:",
        ("tests/core/test_matrix_presets.py::test_plain_decoding_that_differs_from_itself_voids_the_rest",),
    ),
    Mutation(
        "one resolution: what the machine decides (no repack where the probe crashed) is dropped",
        "specview/core/resolve.py",
        "            elif get_setting(cfg, d.setting) is None:",
        "            elif False:",
        ("tests/core/test_repack.py::test_the_reason_travels_with_the_resolved_config_not_on_the_settings",),
    ),
    Mutation(
        "drafters axis: TYPE:MODEL runs as draft-simple",
        "specview/core/matrix/settings.py",
        "            return t, name[len(t) + 1:]",
        "            return \"draft-simple\", name[len(t) + 1:]",
        ("tests/core/test_matrix_presets.py::test_a_drafter_names_its_spec_type_and_its_file",),
    ),
    # -- inside the rollback itself (backends/llama_cpp/memory.py, engine.py), each killed through the real path
    Mutation(
        "memory: the n_rs_seq snapshot selected is one position off (the first rejected token's state kept)",
        _MEM,
        "            # llama.cpp picks the state kept `drop` tokens back in the last decode\n"
        "            if not self.ll.llama_memory_seq_rm(self.mem, 0, n, -1):",
        "            # llama.cpp picks the state kept `drop` tokens back in the last decode\n"
        "            if not self.ll.llama_memory_seq_rm(self.mem, 0, n + 1, -1):",
        (_SNAPSHOT_ARM,),
    ),
    Mutation(
        "memory: the checkpoint is saved one pass late, so its restore holds the verify pass's first tokens",
        _MEM,
        "            self.checkpoint()\n        elif mode == SNAPSHOTS:",
        "            self._late = True\n        elif mode == SNAPSHOTS:",
        (f"{_HYBRID_SERIAL}[checkpoint-qwen35]",),
        more=(("        self._pending = False\n        if self._keeping and len(tokens) == 1:",
               "        self._pending = False\n"
               "        if getattr(self, '_late', False):\n"
               "            self._late = False\n"
               "            self.checkpoint()\n"
               "            self._ckpt = (self._ckpt[0] - len(tokens), self._ckpt[1])\n"
               "        if self._keeping and len(tokens) == 1:"),),
    ),
    Mutation(
        "memory: the replay after a checkpoint restore feeds the kept tokens one position on",
        _MEM,
        "            replay = old[c:n]",
        "            replay = old[c + 1:n + 1]",
        (_DRAFT_ROLLBACK,),
    ),
    Mutation(
        "memory: seq_rm drops from one position late (the first rejected token's KV entry kept)",
        _MEM,
        "            if not self.ll.llama_memory_seq_rm(self.mem, 0, n, -1):\n"
        "                raise EvalError(f\"llama.cpp refused to remove KV positions",
        "            if not self.ll.llama_memory_seq_rm(self.mem, 0, n + 1, -1):\n"
        "                raise EvalError(f\"llama.cpp refused to remove KV positions",
        ("tests/backends/test_serial_verify.py::"
         "test_serial_verify_on_a_tiny_model_reproduces_vanilla_through_rejections",),
    ),
    Mutation(
        "memory: a restored state keeps the KV entry at the restored position",
        _MEM,
        "        if not ll.llama_memory_seq_rm(self.mem, 0, n, -1):",
        "        if not ll.llama_memory_seq_rm(self.mem, 0, n + 1, -1):",
        (f"{_HYBRID_SERIAL}[checkpoint-qwen35]",),
    ),
    Mutation(
        "memory: a snapshot context copies no state after a single-token pass (its rollbacks replay from empty)",
        _MEM,
        "            self._keeping = True  # single-token passes keep a copy",
        "            self._keeping = False  # single-token passes keep a copy",
        (f"{_HYBRID_SERIAL}[snapshots-qwen35]",),
    ),
    Mutation(
        "engine: a replay of a single token is skipped (the draft model's rollback loses its last kept token)",
        "specview/backends/llama_cpp/engine.py",
        "        for start in range(0, len(tokens), self._n_batch):",
        "        for start in range(0, len(tokens) - 1, self._n_batch):",
        (_DRAFT_ROLLBACK,),
    ),
    Mutation(
        "draft model: no checkpoint before its drafted tokens (each rollback replays the whole context)",
        "specview/core/arms/drafters.py",
        "        self.engine.prepare_rollback(n_max - 1)",
        "        self.engine.prepare_rollback(0)",
        (_DRAFT_ROLLBACK,),
    ),
    Mutation(
        "desktop app: a sample of model-written code imports what the app carries (numpy, specview)",
        "specview/core/sample_python.py",
        "    sys.meta_path.insert(0, StandardLibraryOnly)",
        "    sys.meta_path.append(StandardLibraryOnly)",
        ("tests/quality/test_sample_python.py::test_the_frozen_app_runs_a_sample_as_python_i_s_does",),
    ),
)


def tracked_files() -> list[str]:
    # tracked files and new ones not yet added (not the ignored ones): the tree as it is checked out
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def copy_tree(dst: Path) -> None:
    for rel in tracked_files():
        src = ROOT / rel
        if not src.is_file():  # deleted in the work tree but still tracked
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def run_tests(tree: Path, tests: tuple[str, ...], timeout: float, threads: int) -> tuple[int, str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONDONTWRITEBYTECODE="1", GGML_NO_BACKTRACE="1", QT_QPA_PLATFORM="offscreen")
    env.setdefault("SPECVIEW_THREADS", str(threads))  # the jobs share the cores, as the suite's lanes do
    # each copy's runs keep their temporary files in the copy (pytest empties --basetemp as it starts)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-rfE",
           "-o", "addopts=", f"--basetemp={tree / '.pytest-tmp'}", *tests]
    t0 = time.perf_counter()
    try:
        cp = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        return cp.returncode, cp.stdout + cp.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return -1, out + f"\n(timed out after {timeout:.0f} s)", time.perf_counter() - t0


def first_failure(output: str) -> str:
    m = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return m.group(1) if m else "?"


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def mutate(tree: Path, m: Mutation, timeout: float, threads: int) -> tuple[bool, str]:
    """Apply ``m`` to ``tree``, run its tests, restore the file: (killed, the line that says so)."""
    f = tree / m.path
    original = f.read_text(encoding="utf-8")
    counts = [original.count(old) for old, _ in m.patches]
    if counts != [1] * len(counts):
        return False, f"STALE     {m.name}: the texts to replace are found {counts} times in {m.path}"
    mutated = original
    for old, new in m.patches:
        mutated = mutated.replace(old, new)
    f.write_text(mutated, encoding="utf-8")
    try:
        rc, out, secs = run_tests(tree, m.tests, timeout, threads)
    finally:
        f.write_text(original, encoding="utf-8")
    if rc == 1:
        return True, f"killed    {m.name}  [{first_failure(out)}] ({secs:.1f} s)"
    if rc == 0:
        return False, f"SURVIVED  {m.name}: {', '.join(m.tests)} still pass ({secs:.1f} s)"
    return False, f"ERROR     {m.name}: pytest exited {rc} ({secs:.1f} s)\n{out[-2000:]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only the mutations whose name contains this text")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per test run (default 300)")
    ap.add_argument("--jobs", type=int, default=0, help="mutations run side by side (default: one a core)")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.k.lower() in m.name.lower()]
    if not chosen:
        print(f"no mutation matches {args.k!r}", file=sys.stderr)
        return 2
    if args.jobs < 0:
        print(f"--jobs {args.jobs}: give a number of jobs, or 0 for one a core", file=sys.stderr)
        return 2
    jobs = max(1, min(args.jobs or cores(), len(chosen)))
    threads = max(1, cores() // jobs)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specview-mutants-") as tmp:
        trees = [Path(tmp) / f"tree{i}" for i in range(jobs)]
        for tree in trees:
            copy_tree(tree)
        where = subprocess.run([sys.executable, "-c", "import specview; print(specview.__file__)"], cwd=trees[0],
                               env=dict(os.environ, PYTHONPATH=str(trees[0])), capture_output=True, text=True).stdout
        if not where.startswith(str(trees[0])):
            print(f"the copy's specview is not the one imported ({where.strip()}): the check would test nothing")
            return 1
        # the baseline: every named test passes on the unmutated copies (split between them)
        suites = sorted({t for m in chosen for t in m.tests})
        # (never an empty part: pytest given no test runs the whole suite)
        parts = [tuple(suites[i::jobs]) for i in range(min(jobs, len(suites)))]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(lambda i: run_tests(trees[i], parts[i], args.timeout, threads), range(len(parts))))
        for rc, out, _ in results:
            if rc != 0:
                print(f"BASELINE FAILED ({time.perf_counter() - t0:.1f} s): the tests must pass before a mutation "
                      f"can be judged\n{out[-3000:]}")
                return 1
        print(f"baseline: {len(suites)} test targets pass unmutated ({time.perf_counter() - t0:.1f} s, "
              f"{len(parts)} job{'s' if len(parts) > 1 else ''})")
        free: queue.SimpleQueue[Path] = queue.SimpleQueue()  # the copies no mutation holds
        for tree in trees:
            free.put(tree)
        printing = threading.Lock()

        def one(m: Mutation) -> bool:
            tree = free.get()
            try:
                killed, line = mutate(tree, m, args.timeout, threads)
            finally:
                free.put(tree)
            with printing:
                print(line, flush=True)
            return killed

        with ThreadPoolExecutor(jobs) as pool:
            killed = list(pool.map(one, chosen))
    bad = killed.count(False)
    total = time.perf_counter() - t_start
    print(f"{len(chosen) - bad} of {len(chosen)} mutations killed in {total:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
