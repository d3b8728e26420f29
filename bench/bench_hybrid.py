"""A hybrid target in every rollback mode, in-process, against the same run on llama-server.

    python bench/bench_hybrid.py [--arch lfm2,qwen35] [--tokens 128] [--n-max 3] [--threads 1]
                                 [--repeats 3] [--server-bin PATH]

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
    """The run (both arms), the context that ran its speculative arm (its memory's counters), and the CPU seconds
    this thread spent on the run."""
    c0 = time.thread_time()
    trace = session.run(cfg, reuse_vanilla=False)
    cpu = time.thread_time() - c0
    eng = next(e for (role, _m, _s), e in session._engines.items()
               if role == "speculative" and getattr(e, "rollback", None) == mode)
    return trace, eng, cpu


def server_cpu(runner) -> float:
    """CPU seconds (user + system) the live llama-servers have used so far (/proc/PID/stat)."""
    total = 0
    for srv in runner.pool.live():
        fields = Path(f"/proc/{srv.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="lfm2,qwen35")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--server-bin", default="")
    args = ap.parse_args()

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
                    spec_arm(s, cfg("llama.cpp", mode), mode)  # warm: contexts opened, weights paged in
                r.run(cfg("llama-server"))
                n_both = 2 * args.tokens  # CPU time covers both arms and their prompts, on either engine
                for _ in range(args.repeats):  # alternating, so a busy moment costs every engine alike
                    for mode in modes:
                        trace, eng, cpu = spec_arm(s, cfg("llama.cpp", mode), mode)
                        per_token[mode] = min(per_token[mode], ms_per_token(trace))
                        cpu_token[mode] = min(cpu_token[mode], 1000.0 * cpu / n_both)
                        tokens[mode], last[mode] = list(trace.speculative.tokens), (trace, eng)
                    c0 = server_cpu(r)
                    tr = r.run(cfg("llama-server"), reuse_vanilla=False)
                    per_token["server"] = min(per_token["server"], ms_per_token(tr))
                    cpu_token["server"] = min(cpu_token["server"], 1000.0 * (server_cpu(r) - c0) / n_both)
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
                  "count, wall time measures the scheduler as much as the engine; CPU time does not)")
            same = tokens.get("checkpoint") == tokens["server"]
            bad += not same
            print(f"  in-process checkpoint arm == llama-server's arm: {'yes' if same else 'NO'} "
                  f"({len(tokens['server'])} tokens)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
