"""The engine's worker process: runs through it equal runs in process, and every native death is survived.

Each death is planted in a real worker (``tests/plants_worker.py``, registered
by dotted path like a plug-in) or sent to it from outside: a segmentation
fault, an abort, an early exit, a hang past the deadline, SIGKILL and SIGSEGV
from another process.  Each test asserts the message, the partial trace (what
streamed before the death, against an in-process run of the same config), that
no process is left, and that the next request gets a fresh worker.
"""

from __future__ import annotations

import os
import pickle
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import typing

import pytest

import plants_worker
from plants_worker import NAME, PATH
from specview.core.config import EngineSettings, RunConfig
from specview.core.errors import EngineCrashed
from specview.core.registry import get_backend, register_backend, unregister_backend
from specview.core.session import Session
from specview.core.worker import WorkerRunner, live_workers, run_isolated

PROMPT = "the cat sat on the mat and"


@pytest.fixture
def planted(monkeypatch):
    register_backend(NAME, PATH)
    yield monkeypatch
    unregister_backend(NAME)


def cfg_for(target, draft, backend="llama.cpp", **kw) -> RunConfig:
    base = dict(target=str(target), draft=str(draft), prompt=PROMPT, chat=False, max_tokens=40, n_max=3,
                ignore_eos=True, backend=backend)
    base.update(kw)
    return RunConfig(**base)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie is gone for every purpose but its entry
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_the_registry_hands_out_a_worker_for_an_in_process_engine(monkeypatch):
    assert isinstance(get_backend("llama.cpp").runner(), WorkerRunner)
    monkeypatch.setenv("SPECVIEW_WORKER", "0")
    assert isinstance(get_backend("llama.cpp").runner(), Session)


def test_a_run_through_the_worker_equals_the_run_in_process(tiny_target, tiny_draft):
    cfg = cfg_for(tiny_target, tiny_draft)
    with Session() as s:
        here = s.run(cfg)
    events = []
    with get_backend("llama.cpp").runner() as r:
        there = r.run(cfg, on_event=lambda arm, ev: events.append((arm, ev)))
        pid = r.pid
        assert pid is not None and pid != os.getpid()
        d = r.diagnose(there, cfg)
        assert there.diagnosis is d or there.diagnosis == d
        assert (r.loads, r.vanilla_runs, r.speculative_runs) == (2, 1, 1)
    assert gone(pid)
    assert there.vanilla.tokens == here.vanilla.tokens
    assert there.speculative.tokens == here.speculative.tokens
    assert [(x.drafted, x.accepted) for x in there.speculative.rounds] == \
        [(x.drafted, x.accepted) for x in here.speculative.rounds]
    # every token and round streamed back as it happened, in order
    assert [ev.token for arm, ev in events if arm == "vanilla"] == here.vanilla.tokens
    assert [ev.token for arm, ev in events if arm == "speculative" and hasattr(ev, "token")] == \
        here.speculative.tokens


def _expect_crash(runner, cfg, **kw) -> EngineCrashed:
    seen = []
    with pytest.raises(EngineCrashed) as info:
        runner.run(cfg, on_event=lambda arm, ev: seen.append((arm, ev)), **kw)
    exc = info.value
    exc.seen = seen  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize("kind,sig", [("segv", "SIGSEGV"), ("abort", "SIGABRT")])
def test_a_native_death_in_the_speculative_arm_keeps_the_run(planted, tiny_target, tiny_draft, kind, sig):
    cfg = cfg_for(tiny_target, tiny_draft)
    with Session() as s:
        ref = s.run(cfg)
    first_wide = next(i for i, st in enumerate(ref.speculative.steps) if st.batch_size and st.batch_size >= 2)
    assert first_wide is not None
    # the fifth pass of two or more tokens: after the prefills of both arms and the drafter's, a verify pass
    planted.setenv("SPECVIEW_PLANT", f"{kind}:4:2")
    r = get_backend(NAME).runner()
    try:
        exc = _expect_crash(r, cfg_for(tiny_target, tiny_draft, backend=NAME))
        assert exc.signal == sig
        text = str(exc)
        assert sig in text and "while running" in text
        assert "-token pass at position" in text and "target.gguf" in text  # what it was doing, from the worker
        if sys.platform.startswith("linux"):
            assert exc.crash["native_frames"], "the dying worker printed its native frames"
        assert exc.crash["python_frames"], "faulthandler's frames reached the log"
        assert os.path.exists(exc.crash["log"])
        t = exc.trace
        assert t is not None
        # the vanilla arm finished before the death: kept whole, equal to the in-process run
        assert t.vanilla.tokens == ref.vanilla.tokens and t.vanilla.stop_reason == ref.vanilla.stop_reason
        # the speculative arm stopped "crashed" with exactly what streamed, a prefix of the real arm
        spec_seen = [ev.token for arm, ev in exc.seen if arm == "speculative" and hasattr(ev, "token")]
        assert t.speculative.stop_reason == "crashed"
        assert t.speculative.tokens == spec_seen == ref.speculative.tokens[:len(spec_seen)]
        assert t.extra["crash"]["signal"] == sig
        assert live_workers() == []
        # the trace is a bug report: it saves and loads with its crash block
        from specview.core.trace import Trace

        back = Trace.from_json(__import__("json").loads(t.dumps()))
        assert back.speculative.stop_reason == "crashed" and back.extra["crash"]["signal"] == sig
        # the next request starts a fresh worker and runs
        planted.delenv("SPECVIEW_PLANT")
        r.timeout = None
        again = r.run(cfg_for(tiny_target, tiny_draft, backend=NAME))
        assert again.speculative.tokens == ref.speculative.tokens and r.starts == 2
    finally:
        r.close()
    assert live_workers() == []


def test_a_worker_that_exits_early_is_an_exit_status_not_a_signal(planted, tiny_target, tiny_draft):
    planted.setenv("SPECVIEW_PLANT", "exit:3:1")
    with get_backend(NAME).runner() as r:
        exc = _expect_crash(r, cfg_for(tiny_target, tiny_draft, backend=NAME))
    assert exc.signal is None and exc.exitcode == 3
    assert "exited unexpectedly with status 3" in str(exc)


def test_a_worker_that_stops_making_progress_is_stopped_at_the_deadline(planted, tiny_target, tiny_draft):
    planted.setenv("SPECVIEW_PLANT", "hang:2:1")
    planted.setenv("SPECVIEW_WORKER_TIMEOUT", "2")
    t0 = time.monotonic()
    with get_backend(NAME).runner() as r:
        exc = _expect_crash(r, cfg_for(tiny_target, tiny_draft, backend=NAME))
        pid_gone = live_workers() == []
    assert time.monotonic() - t0 < 60
    assert exc.crash["hung"] and exc.signal == "SIGKILL" and pid_gone
    assert "stopped making progress for" in str(exc) and "SPECVIEW_WORKER_TIMEOUT" in str(exc)
    assert exc.known_cause is None  # specview's own kill is not read as the OOM killer


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_signal_from_outside_mid_run(tiny_target, tiny_draft, sig):
    cfg = cfg_for(tiny_target, tiny_draft, max_tokens=400)
    r = get_backend("llama.cpp").runner()
    sent = []

    def on_event(arm, ev):
        if arm == "vanilla" and getattr(ev, "index", -1) == 50 and not sent:
            sent.append(r.pid)
            os.kill(r.pid, sig)

    try:
        with pytest.raises(EngineCrashed) as info:
            r.run(cfg, on_event=on_event)
    finally:
        r.close()
    exc = info.value
    assert exc.signal == sig.name and sig.name in str(exc)
    assert gone(sent[0])
    assert exc.trace is not None and exc.trace.vanilla.stop_reason == "crashed"
    assert len(exc.trace.vanilla.tokens) >= 51
    if sig == signal.SIGKILL:
        assert exc.known_cause["id"] == "oom-killer"


def test_the_worker_dies_with_its_parent(tiny_target, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        from specview.core.config import RunConfig
        from specview.core.registry import get_backend
        r = get_backend("llama.cpp").runner()
        r.preload(RunConfig(target={str(tiny_target)!r}, spec_type="none", draft=None, prompt="x"))
        print(r.pid, flush=True)
        time.sleep(600)
    """))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(p.stdout.readline())
        assert not gone(pid)
        p.kill()
        p.wait(10)
        deadline = time.monotonic() + 10
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(pid), "the worker outlived a parent killed with SIGKILL"
    finally:
        p.kill()


def _probe_value(x: int) -> int:
    return x * 7


def _probe_crash() -> None:
    import ctypes

    ctypes.string_at(0)


def test_run_isolated_returns_or_says_how_it_died():
    assert run_isolated(_probe_value, 6) == 42
    with pytest.raises(EngineCrashed) as info:
        run_isolated(_probe_crash)
    assert info.value.signal == "SIGSEGV"
    assert live_workers() == []


def test_a_probe_is_read_with_the_known_causes_of_the_engine_whose_code_it_probes(planted):
    """The generic proxy knows no engine's causes: the engine whose package holds the probe contributes them."""
    from specview.backends.llama_cpp import probe
    from specview.core.worker.proxy import engine_of

    assert engine_of(probe.probe_multi_token_decode) == "llama.cpp"
    assert engine_of(plants_worker.probe_crash) == NAME
    assert engine_of(_probe_crash) is None
    with pytest.raises(EngineCrashed) as theirs:
        run_isolated(plants_worker.probe_crash)
    with pytest.raises(EngineCrashed) as nobodys:
        run_isolated(_probe_crash)
    assert theirs.value.signal == nobodys.value.signal == "SIGSEGV"
    # llama.cpp's causes read whether the weights are repacked, and the account records what they read
    assert "no_repack" in theirs.value.crash and "no_repack" not in nobodys.value.crash
    assert live_workers() == []


@pytest.mark.skipif(os.name != "posix", reason="the frozen app's stand-in is a shell script")
def test_the_frozen_app_becomes_a_worker_by_its_first_argument(monkeypatch, tmp_path):
    """The frozen app is one executable: started with the worker argument first, its CLI hands over to the
    worker's loop (a stand-in here: a script that runs ``python -m specview.cli`` with the same arguments)."""
    exe = tmp_path / "specview-app"
    exe.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m specview.cli "$@"\n')
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(exe))
    assert run_isolated(_probe_value, 6) == 42
    assert live_workers() == []


def test_a_job_takes_its_settings_by_name():
    """``settings=`` decides the worker's environment (the first of a kernel map's list); a job without it, or
    with settings by position, runs on the live worker as it is."""
    var = "SPECVIEW_TEST_N_CTX"
    with WorkerRunner(None, env_for=lambda s: {var: str(s.n_ctx)}) as r:
        assert r.job(plants_worker.environ_of, var, settings=EngineSettings(n_ctx=256)) == "256"
        assert r.job(plants_worker.environ_of, var, settings=[EngineSettings(n_ctx=512), EngineSettings(n_ctx=64)]) \
            == "512"
        assert r.starts == 2  # another environment: another worker
        assert r.job(plants_worker.environ_of, var) == "512"
        assert r.job(plants_worker.environ_of_positional, EngineSettings(n_ctx=1024), var) == "512"
        assert r.starts == 2
    assert live_workers() == []


def test_every_message_crosses_the_pipe_as_itself():
    from specview.core.trace import Step
    from specview.core.worker import wire

    step = Step(index=0, token=5, piece=" a", pos=7, top_ids=[5, 6], top_logits=[1.5, None], margin=0.25)
    msgs = [wire.Run(1, "cfg", {"cancel": wire.Callback("cancel"), "on_event": wire.Callback("on_event")}),
            wire.Diagnose(2, "trace", "cfg", {"controls": True}), wire.Preload(3, "cfg"),
            wire.Job(4, "mod", "fn", (1, 2), {"settings": None}), wire.Call(5, "mod", "fn", (), {}), wire.Cancel(6),
            wire.Close(), wire.Ready(123), wire.Events(7, [("on_event", ("vanilla", step))]),
            wire.Progress(7, "loading target.gguf"), wire.Record(7, "head", {"a": 1}),
            wire.Result(7, [1, 2], {"loads": 1}), wire.Error(7, ValueError("bad"), {"loads": 2})]
    assert {type(m) for m in msgs} == {*typing.get_args(wire.Request), *typing.get_args(wire.Reply),
                                       wire.Cancel, wire.Close}
    for m in msgs:
        back = pickle.loads(pickle.dumps(m))
        assert type(back) is type(m)
        if isinstance(m, wire.Error):
            assert type(back.error) is ValueError and back.error.args == ("bad",) and back.counters == m.counters
        else:
            assert back == m
    assert pickle.loads(pickle.dumps(msgs[8])).events[0][1][1].top_logits == [1.5, None]


def test_a_deaths_known_cause_is_the_engines_own_or_one_every_engine_shares():
    from specview.backends.llama_cpp.crashes import death_causes
    from specview.core.worker.death import account
    from specview.core.worker.native import MARK

    amx = frozenset({"avx2", "amx_int8", "amx_tile"})

    def acc(sig, engine, *, flags=amx, log="", activity="a 4-token pass at position 31 of target.gguf"):
        return account(exitcode=-int(sig), activity=activity, log=log, log_path=None, engine=engine, flags=flags)

    llama = death_causes(EngineSettings(no_repack=False))
    segv = acc(signal.SIGSEGV, llama)
    assert segv["known_cause"]["id"] == "amx-repack" and segv["known_cause"]["retry"] == {"no_repack": True}
    assert segv["no_repack"] is False  # what the match read, kept in the account
    assert acc(signal.SIGSEGV, death_causes(EngineSettings(no_repack=True)))["known_cause"] is None
    assert acc(signal.SIGSEGV, llama, flags=frozenset({"avx2"}))["known_cause"] is None
    assert acc(signal.SIGSEGV, llama, activity="a 1-token pass at position 31 of target.gguf")["known_cause"] is None
    # without the engine's causes the same death has no cause: the generic account knows no llama.cpp
    generic = acc(signal.SIGSEGV, None)
    assert generic["known_cause"] is None and "no_repack" not in generic
    vulkan = f"\n{MARK} SIGSEGV; native frames:\n/usr/lib/libvulkan_lvp.so(lvp_CmdDispatch+0x1c) [0x7f0a1b2c]\n"
    assert acc(signal.SIGSEGV, llama, flags=frozenset(), log=vulkan)["known_cause"]["id"] == "vulkan-driver"
    abort = "llama.cpp/ggml.c:1234: GGML_ASSERT(n_tokens <= n_batch) failed\n"
    assert acc(signal.SIGABRT, llama, log=abort)["known_cause"]["id"] == "ggml-assert"
    assert acc(signal.SIGABRT, None, log=abort)["known_cause"] is None
    # SIGKILL from outside is every engine's
    assert acc(signal.SIGKILL, llama)["known_cause"]["id"] == acc(signal.SIGKILL, None)["known_cause"]["id"] \
        == "oom-killer"


def test_a_matrix_outlives_a_crashing_engine_and_exits_2(planted, tiny_target, tiny_draft, tmp_path, capsys):
    """Every cell's worker dies in its first verify passes: each cell is an error that keeps its crash and its
    partial trace, each later cell gets a fresh worker, and the matrix exits 2."""
    from specview import cli
    from specview.core.matrix import load_matrix
    from specview.core.trace import Trace

    planted.setenv("SPECVIEW_PLANT", "segv:4:2")
    toml = tmp_path / "m.toml"
    toml.write_text(f'targets = ["{tiny_target}"]\ndrafters = ["{tiny_draft}"]\nn_max = [2, 3]\n'
                    'max_tokens = 30\nignore_eos = true\nchat = false\nprompts = ["the cat sat on the"]\n',
                    encoding="utf-8")
    out = tmp_path / "m.json"
    rc = cli.main(["matrix", "--config", str(toml), "--engine", NAME, "-o", str(out),
                   "--traces", str(tmp_path / "traces")])
    err = capsys.readouterr()
    assert rc == 2, err.err
    assert "2 cell(s) crashed" in err.out
    doc = load_matrix(out)
    assert [c["status"] for c in doc["cells"]] == ["error", "error"]
    for c in doc["cells"]:
        assert c["crash"]["signal"] == "SIGSEGV" and "SIGSEGV" in c["error"]
        t = Trace.load(out.parent / c["trace"])
        assert t.speculative.stop_reason == "crashed" and t.vanilla.stop_reason == "max_tokens"
    assert live_workers() == []


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads a process's children from /proc")
def test_specview_run_whose_worker_gets_sigsegv_exits_2_and_keeps_the_trace(tiny_target, tiny_draft, tmp_path):
    out = tmp_path / "crash.json"
    cmd = [sys.executable, "-m", "specview.cli", "run", "-m", str(tiny_target), "--draft", str(tiny_draft),
           "-p", PROMPT, "--no-chat", "-n", "3000", "--ignore-eos", "--json", str(out)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stderr:  # the arms run once the draft has loaded
            if "loading" in line and "draft.gguf" in line:
                break
        deadline = time.monotonic() + 30
        kids: list[int] = []
        while not kids and time.monotonic() < deadline:
            kids = _children(p.pid)
            time.sleep(0.05)
        assert kids, "specview run started no worker process"
        time.sleep(0.5)
        os.kill(kids[0], signal.SIGSEGV)
        stdout, rest = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 2, rest
    assert "SIGSEGV" in rest and "segmentation fault" in rest
    assert "it was doing:" in rest
    t = __import__("specview.core.trace", fromlist=["Trace"]).Trace.load(out)
    assert t.extra["crash"]["signal"] == "SIGSEGV"
    assert "crashed" in (t.vanilla.stop_reason, t.speculative.stop_reason)
    assert all(gone(k) for k in kids)


def test_a_cancel_reaches_the_worker_while_tokens_stream(tiny_target, tiny_draft):
    """The cancel flag set at vanilla token 20 stops the arm soon after, not at its 2,000th token: the parent
    checks it between streamed messages, not only when the pipe is quiet."""
    flag = []
    cfg = cfg_for(tiny_target, tiny_draft, max_tokens=2000)

    def on_event(arm, ev):
        if arm == "vanilla" and getattr(ev, "index", -1) == 20:
            flag.append(True)

    with get_backend("llama.cpp").runner() as r:
        t = r.run(cfg, on_event=on_event, cancel=lambda: bool(flag))
    assert t.vanilla.stop_reason == "cancelled"
    assert 21 <= len(t.vanilla.tokens) < 1000, len(t.vanilla.tokens)


def test_a_model_load_reports_progress_to_the_deadline(tiny_target):
    """llama.cpp's load progress reaches the activity record, so a long load is not taken for a hang."""
    import door

    from specview.core import activity

    seen: list[str] = []
    activity.set_sink(seen.append)
    try:
        door.model(tiny_target).close()
    finally:
        activity.set_sink(None)
    loads = [s for s in seen if s.startswith(f"loading {tiny_target.name} (")]
    assert loads and loads[-1].endswith("(100%)")


def test_the_sweep_takes_only_what_dead_processes_left(tmp_path):
    import subprocess
    import sys

    from specview.core.paths import KEEP_FILE, sweep_orphans, temp_prefix

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid no process has now
    assert temp_prefix("worker") == f"specview-{os.getpid()}-worker-"
    folders = {
        "dead": tmp_path / f"specview-{dead.pid}-worker-abc123",
        "mine": tmp_path / f"specview-{os.getpid()}-worker-def456",
        "alive": tmp_path / f"specview-{os.getppid()}-worker-ghi789",
        "kept": tmp_path / f"specview-{dead.pid}-worker-jkl012",
        "older": tmp_path / "specview-worker-x1y2z3a4",
        "other": tmp_path / f"not-specview-{dead.pid}-mno345",
    }
    for f in folders.values():
        f.mkdir()
        (f / "worker.log").write_text("log")
    (folders["kept"] / KEEP_FILE).write_text("")
    logs = {"dead": tmp_path / f"specview-{dead.pid}-llama-server-speculative-x1.log",
            "alive": tmp_path / f"specview-{os.getppid()}-llama-server-vanilla-x2.log"}
    for f in logs.values():
        f.write_text("server log")
    os.mkfifo(tmp_path / f"specview-{dead.pid}-worker-fifo")  # neither a file nor a folder: left alone
    assert sorted(sweep_orphans(tmp_path)) == sorted([str(folders["dead"]), str(logs["dead"])])
    assert {k for k, f in folders.items() if f.exists()} == {"mine", "alive", "kept", "older", "other"}
    assert {k for k, f in logs.items() if f.exists()} == {"alive"}
    assert (tmp_path / f"specview-{dead.pid}-worker-fifo").exists()
