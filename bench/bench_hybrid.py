"""A hybrid target in every rollback mode, in-process, against the same run on llama-server.

    python bench/bench_hybrid.py [--arch lfm2,qwen35] [--tokens 128] [--n-max 3] [--threads 1]
                                 [--repeats 3] [--server-bin PATH] [--shared-session]

For each tiny random-weight hybrid target the tests write (tests/tinyhybrid.py: LFM2 short-conv + attention,
Qwen3.5 gated delta net + attention, each with a Q4_0 copy of itself as the drafter, which the target accepts
in part), the same draft-simple run, ``--ignore-eos``:

* in-process (llama.cpp through llama-cpp-python, in this process: no worker), once per rollback mode the
  architecture allows (``checkpoint``: save the sequence state before each verify pass, restore it and replay
  the accepted tokens on a rejection, as llama-server does for draft-simple; ``snapshots``: llama.cpp keeps the
  recurrent state of the last n_max positions, ``n_rs_seq``);
* on llama-server (checkpoint and replay: what the server does for draft-simple on a hybrid).

Printed per run: drafted / accepted, the rounds that rolled back and replayed, the rollbacks of the target's and
the draft model's contexts by mechanism (n_rs_seq snapshot, state copy, checkpoint, replay), the speculative
arm's time per token (the best of ``--repeats``), and for the checkpoint mode what a checkpoint costs: its bytes,
and the milliseconds per round spent saving and restoring it.  Then the in-process arm's time per token as a
share of the server's (the goal: at most 1.05x the server's time per token, in every mode), and whether the
in-process checkpoint arm gave the server's tokens (it must).  The repeats alternate between the engines, so
that the load of a shared machine falls on both alike.  Timing lives here, never in the tests: the machines are
shared and noisy.

Fair shares of a loaded machine: specview starts each llama-server in a session of its own, and Linux (with
``kernel.sched_autogroup_enabled``) gives each session an equal share of the CPUs, however many processes the
other sessions run.  An in-process arm left in the session of the shell that started the bench shares that
session's share with everything else started from it, so on a busy machine its wall time was up to twice the
server's for the same CPU time.  The bench therefore moves itself into a session of its own first (as the servers
are), and prints both sessions' autogroups; ``--shared-session`` keeps the caller's.

CPU time is that of the speculative run alone (the vanilla arm is run once and then reused, on both engines):
in-process, this process's CPU time (``time.process_time``: every thread of it, llama.cpp's included); on the
server, the server process's CPU time (all its threads) plus this process's while it waited on the answer
(the client's side of the request: JSON, the trace).  Both include the prompt and the run's bookkeeping.  CPU time
is nearer load-independent than wall time, but not wholly: a core shared with another (SMT, caches) runs slower.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GGML_NO_BACKTRACE", "1")
os.environ["SPECVIEW_WORKER"] = "0"  # the engine in this process, so its memory's counters can be read
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

PROMPT = "the cat sat on the mat and the dog ran to the park with a ball"


#: the in-process arm's time per token may be at most this multiple of llama-server's
GOAL = 1.05


def ms_per_token(trace) -> float:
    sp = trace.speculative
    return 1000.0 / sp.tokens_per_s if sp.tokens_per_s else float("nan")


def spec_arm(session, cfg, mode):
    """The run (its vanilla arm reused once cached), the context that ran its speculative arm (its memory's
    counters), and the CPU seconds this process spent on the run (every thread: llama.cpp computes in it)."""
    c0 = time.process_time()
    trace = session.run(cfg, reuse_vanilla=True)
    cpu = time.process_time() - c0
    eng = next(e for (role, _m, _s), e in session._engines.items()
               if role == "speculative" and getattr(e, "rollback", None) == mode)
    return trace, eng, cpu


def server_cpu(runner) -> float:
    """CPU seconds (user + system, every thread) the live llama-servers have used so far (/proc/PID/stat)."""
    total = 0
    for srv in runner.pool.live():
        try:
            fields = Path(f"/proc/{srv.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended between the listing and the read
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def server_arm(runner, cfg):
    """The server's run (its vanilla arm reused once cached) and the CPU seconds it cost: the servers' and this
    process's own (the client's side) while it ran."""
    s0, c0 = server_cpu(runner), time.process_time()
    trace = runner.run(cfg, reuse_vanilla=True)
    return trace, server_cpu(runner) - s0 + time.process_time() - c0


def autogroup(pid: int | str = "self") -> str:
    """The scheduler group a process's CPU share is counted in (``/autogroup-N``), or why it cannot be told."""
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except OSError:
        return "no autogroup"


def own_session(argv: list[str]) -> int | None:
    """Move this process into a session of its own, as specview starts each llama-server (see the module
    docstring); a process-group leader cannot, so it runs the bench again as a child in a new session and
    returns the child's exit status.  None: this process goes on."""
    if os.getsid(0) == os.getpid():
        return None
    try:
        os.setsid()
        return None
    except PermissionError:  # a process-group leader (a shell job): a child can
        import subprocess

        return subprocess.call([sys.executable, os.path.abspath(__file__), *argv], start_new_session=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="lfm2,qwen35")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--server-bin", default="")
    ap.add_argument("--shared-session", action="store_true",
                    help="stay in the caller's session (its scheduler share) instead of one of the bench's own")
    args = ap.parse_args()
    if not args.shared_session:
        rc = own_session(sys.argv[1:])
        if rc is not None:
            return rc

    from tinyhybrid import hybrid_pair

    from specview.backends.llama_cpp.memory import allowed_modes, file_architecture
    from specview.backends.llama_server import ServerRunner, find_server_bin
    from specview.core.config import EngineSettings, RunConfig
    from specview.core.session import Session

    binary = find_server_bin(args.server_bin or None)
    print(f"llama-server {binary}; {args.tokens} tokens, n_max {args.n_max}, -t {args.threads}, "
          f"best of {args.repeats}")
    bad = 0
    with tempfile.TemporaryDirectory(prefix="specview-bench-hybrid-") as tmp:
        for arch in [a for a in args.arch.split(",") if a]:
            target, draft = hybrid_pair(arch, Path(tmp) / arch)
            modes = [m for m in allowed_modes(file_architecture(target)) if m != "seq-rm"]
            print(f"\n{arch}: {target.name} with {draft.name}; rollback modes {', '.join(modes)}")

            def cfg(backend: str, rollback: str | None = None) -> RunConfig:
                eng = EngineSettings(threads=args.threads, rollback=rollback,
                                     server_bin=binary if backend == "llama-server" else "")
                return RunConfig(target=str(target), draft=str(draft), spec_type="draft-simple", n_max=args.n_max,
                                 p_min=0.0, max_tokens=args.tokens, ignore_eos=True, prompt=PROMPT, chat=False,
                                 backend=backend, engine=eng)

            per_token: dict[str, float] = {m: float("inf") for m in [*modes, "server"]}
            cpu_token: dict[str, float] = {m: float("inf") for m in [*modes, "server"]}
            tokens: dict[str, list[int]] = {}
            last: dict[str, tuple] = {}
            with Session() as s, ServerRunner(single_server=True) as r:
                for mode in modes:
                    spec_arm(s, cfg("llama.cpp", mode), mode)  # warm: contexts opened, the vanilla arm cached
                r.run(cfg("llama-server"))
                print(f"  scheduler groups: in-process {autogroup()}, llama-server "
                      + ", ".join(sorted({autogroup(srv.pid) for srv in r.pool.live()})))
                for _ in range(args.repeats):  # alternating, so a busy moment costs every engine alike
                    for mode in modes:
                        trace, eng, cpu = spec_arm(s, cfg("llama.cpp", mode), mode)
                        n = max(1, len(trace.speculative.tokens))
                        per_token[mode] = min(per_token[mode], ms_per_token(trace))
                        cpu_token[mode] = min(cpu_token[mode], 1000.0 * cpu / n)
                        tokens[mode], last[mode] = list(trace.speculative.tokens), (trace, eng)
                    tr, cpu = server_arm(r, cfg("llama-server"))
                    per_token["server"] = min(per_token["server"], ms_per_token(tr))
                    cpu_token["server"] = min(cpu_token["server"], 1000.0 * cpu / max(1, len(tr.speculative.tokens)))
                    tokens["server"], last["server"] = list(tr.speculative.tokens), (tr, None)
            for mode in modes:
                trace, eng = last[mode]
                sp = trace.speculative
                rounds = [r for r in sp.rounds if r.index > 0]
                rolled = sum(1 for r in rounds if r.rollback)
                replays = [r.replay for r in rounds if r.replay]
                print(f"  in-process {mode:<10}  drafted {sp.n_drafted:4d}  accepted {sp.n_accepted:4d}  "
                      f"rounds {len(rounds):3d} (rolled back {rolled}, replayed {len(replays)}, widths "
                      f"{sorted(set(replays)) or '-'})  {per_token[mode]:.2f} ms/token, CPU {cpu_token[mode]:.3f} ms/token")
                for ctx, used in sp.rollbacks.items():
                    print(f"      {ctx} rollbacks: " + ", ".join(f"{m} {c}" for m, c in used.items()))
                stats = eng.memory.stats
                if mode == "checkpoint" and rounds:
                    n = max(1, stats.checkpoints)
                    print(f"      a checkpoint: {stats.checkpoint_bytes} bytes; saving "
                          f"{1000 * stats.checkpoint_seconds / n:.3f} ms and restoring "
                          f"{1000 * stats.restore_seconds / n:.3f} ms per checkpoint")
            sp = last["server"][0].speculative
            print(f"  llama-server (checkpoint)  drafted {sp.n_drafted:4d}  accepted {sp.n_accepted:4d}  "
                  f"{per_token['server']:.2f} ms/token, CPU {cpu_token['server']:.3f} ms/token")
            for mode in modes:
                ratio, cpu_ratio = per_token[mode] / per_token["server"], cpu_token[mode] / cpu_token["server"]
                print(f"  {mode}: in-process time per token / server's = {ratio:.2f} "
                      f"({'within' if ratio <= GOAL else 'OVER'} the {GOAL:.2f}x goal); CPU time per token "
                      f"{cpu_ratio:.2f}x ({'within' if cpu_ratio <= GOAL else 'OVER'})")
            print(f"  (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: where it is above the CPU "
                  "count, wall time measures the scheduler as much as the engine; CPU time much less so)")
            same = tokens.get("checkpoint") == tokens["server"]
            bad += not same
            print(f"  in-process checkpoint arm == llama-server's arm: {'yes' if same else 'NO'} "
                  f"({len(tokens['server'])} tokens)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
