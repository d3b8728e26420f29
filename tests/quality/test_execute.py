"""The sandbox that runs model-written code: planted samples that pass, fail, hang, fork, allocate, write
outside their folder, read the environment, crash or ignore signals; each ends with its own reason, the next
sample still runs, nothing outside the sample's folder changes and no process is left behind."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from specview.core.quality.execute import (KILL_MARGIN, OUTPUT_BYTES, Limits, SampleResult, SandboxError,
                                           run_sample, sandbox_report)

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs process groups and rlimits (POSIX)")

SECRET = "specview-planted-secret-7f3a"
#: short limits so the hanging samples cost seconds; CPU above what faulting in memory_mb costs a slow machine
FAST = Limits(wall_s=3, cpu_s=2, memory_mb=256)


@pytest.fixture(autouse=True)
def planted_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECVIEW_TEST_SECRET", SECRET)


def run(program: str, limits: Limits = FAST, **kw: object) -> SampleResult:
    res = run_sample(program, limits=limits, **kw)  # type: ignore[arg-type]
    # never a stuck run: the parent is back within the sample's wall clock and the kill's margin
    assert res.wall_s <= limits.wall_s + KILL_MARGIN + 1, res
    return res


def leftovers(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (a sample's folder is in its launcher's arguments)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def test_a_passing_sample_passes_with_its_output() -> None:
    res = run("def add(a, b):\n    return a + b\n\nassert add(2, 3) == 5\nprint('sum', add(2, 3))\n")
    assert (res.passed, res.reason) == (True, "passed")
    assert res.output == "sum 5\n"


def test_a_failing_assertion_is_a_fail_with_its_message() -> None:
    res = run("def add(a, b):\n    return a - b\n\nassert add(2, 3) == 5, 'add(2, 3) is not 5'\n")
    assert not res.passed
    assert res.reason == "AssertionError: add(2, 3) is not 5"


@pytest.mark.parametrize("program", ["import time\ntime.sleep(60)\n",
                                     "import signal, time\n"
                                     "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):\n"
                                     "    signal.signal(s, signal.SIG_IGN)\n"
                                     "time.sleep(60)\n"], ids=["sleep", "ignores-signals"])
def test_a_sample_that_hangs_times_out_on_the_wall_clock(program: str) -> None:
    res = run(program)
    assert not res.passed
    assert res.reason == "timed out after 3 s (wall clock)"


def test_a_busy_loop_stops_at_the_cpu_limit() -> None:
    res = run("while True:\n    pass\n", Limits(wall_s=20, cpu_s=1))
    assert (res.passed, res.reason) == (False, "CPU limit (1 s)")
    assert res.cpu_s is not None and res.cpu_s > 0


def test_a_busy_loop_that_ignores_sigxcpu_is_still_stopped() -> None:
    """Its hard limit a second later kills it; the wall clock is far above two CPU seconds on a busy machine."""
    res = run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n",
              Limits(wall_s=20, cpu_s=1))
    assert (res.passed, res.reason) == (False, "CPU limit (1 s)")


def test_the_timeout_argument_overrides_the_wall_clock_limit() -> None:
    res = run_sample("import time\ntime.sleep(60)\n", timeout=1.5, limits=FAST)
    assert res.reason == "timed out after 1.5 s (wall clock)"
    assert res.wall_s < FAST.wall_s


def test_a_fork_bomb_is_refused_and_leaves_no_process() -> None:
    res = run("import os\nprint(os.getcwd(), flush=True)\nwhile True:\n    os.fork()\n")
    assert not res.passed
    assert res.reason == "tried to start processes (os.fork)"
    folder = res.output.split()[0]
    assert not leftovers(folder)


@pytest.mark.parametrize("program", ["import subprocess\nsubprocess.run(['true'])\n",
                                     "import os\nos.system('true')\n",
                                     "import multiprocessing\nmultiprocessing.Process(target=print).start()\n"],
                         ids=["subprocess", "system", "multiprocessing"])
def test_every_way_of_starting_a_process_is_named(program: str) -> None:
    res = run(program)
    assert not res.passed
    assert res.reason.startswith("tried to start processes ("), res.reason


def test_the_process_limit_holds_without_the_guard() -> None:
    """A fork through ctypes passes the in-process guard by; the kernel's RLIMIT_NPROC refuses it."""
    if not sandbox_report().fences.processes_limited:
        pytest.skip("this platform does not limit a sample's processes (see sandbox_report)")
    res = run("import ctypes, os\nlibc = ctypes.CDLL(None)\n"
              "made = 0\nfor _ in range(64):\n    pid = libc.fork()\n    if pid == 0:\n        os._exit(0)\n"
              "    made += pid > 0\nprint('forked', made)\n")
    assert res.passed, res
    assert res.output == "forked 0\n"
    res = run("import os\nwhile True:\n    os.fork()\n", guard=False)
    assert res.reason.startswith("tried to start processes (the process limit stopped it: BlockingIOError"), res


def test_a_thread_is_a_process_too() -> None:
    if not sandbox_report().fences.processes_limited:
        pytest.skip("this platform does not limit a sample's processes (see sandbox_report)")
    res = run("import threading\nt = threading.Thread(target=print)\nt.start()\nt.join()\n")
    assert res.reason.startswith("tried to start processes"), res


@pytest.mark.parametrize("program", ["x = []\nwhile True:\n    x.append(bytearray(10 ** 7))\n",
                                     "x = b'x' * (10 ** 11)\n"], ids=["grows", "at-once"])
def test_unbounded_allocation_stops_at_the_memory_limit(program: str) -> None:
    if not sandbox_report(FAST).fences.probed.get("memory"):
        pytest.skip("this platform does not enforce RLIMIT_AS (see sandbox_report)")
    res = run(program, Limits(wall_s=10, cpu_s=8, memory_mb=256))
    assert (res.passed, res.reason) == (False, "memory limit (256 MB)")


def test_a_sample_writes_in_its_folder_and_home_but_nowhere_else(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("before")
    real_home = Path.home() / f".specview-sandbox-probe-{os.getpid()}"
    before = sorted(p.name for p in tmp_path.iterdir())
    # its own folder and its HOME (which is its folder): fine
    res = run("import os\nopen('here.txt', 'w').write('x')\n"
              "open(os.path.expanduser('~/there.txt'), 'w').write('y')\n"
              "print(sorted(os.listdir(os.path.expanduser('~'))))\n")
    assert res.passed, res
    assert res.output == "['here.txt', 'sample.py', 'there.txt']\n"
    for target, mode in ((outside, "w"), (tmp_path / "new.txt", "w"), (outside, "a"), (real_home, "w")):
        res = run(f"open({str(target)!r}, {mode!r}).write('changed')\n")
        assert not res.passed
        assert res.reason == f"wrote outside its folder (open({str(target)!r}, {mode!r}))"
    res = run(f"import os\nos.remove({str(outside)!r})\n")
    assert res.reason == f"wrote outside its folder (os.remove({str(outside)!r}))"
    kept = Path.home() / f".specview-sandbox-keep-{os.getpid()}"  # under the real home (hidden from it as root)
    (kept / "sub").mkdir(parents=True)
    (kept / "sub" / "file").write_text("kept")
    try:
        res = run(f"import shutil\nshutil.rmtree({str(kept)!r})\n")
        # the guard stops the first unlink; with Landlock the kernel already refuses reading the folder; as root
        # the home is under a tmpfs of the sample's (the interpreter's trees bound back in)
        assert res.reason.startswith(("wrote outside its folder (os.", "denied outside its folder",
                                      "FileNotFoundError")), res
        assert (kept / "sub" / "file").read_text() == "kept"
    finally:
        shutil.rmtree(kept)
    assert outside.read_text() == "before"
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not real_home.exists()


def test_writes_outside_are_denied_by_the_kernel_without_the_guard(tmp_path: Path) -> None:
    if not sandbox_report().fences.landlock_abi:
        pytest.skip("no Landlock on this platform: only the in-process guard stops writes outside the folder")
    # under the real home, which the sample sees (its /tmp is a tmpfs of its own where it has a mount namespace)
    kept = Path.home() / f".specview-sandbox-kernel-{os.getpid()}"
    kept.mkdir()
    outside = kept / "outside.txt"
    outside.write_text("before")
    try:
        for program in (f"open({str(outside)!r}, 'w').write('changed')\n",
                        f"import os\nos.remove({str(outside)!r})\n",
                        f"open({str(kept / 'new.txt')!r}, 'w').write('x')\n",
                        f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')\n"):
            res = run(program, guard=False)
            assert not res.passed
            assert res.reason.startswith(("denied outside its folder (PermissionError", "FileNotFoundError")), res
        assert outside.read_text() == "before"
        assert sorted(p.name for p in kept.iterdir()) == ["outside.txt"]
        assert list(tmp_path.iterdir()) == []
    finally:
        shutil.rmtree(kept)


def test_the_folder_is_removed_afterwards() -> None:
    res = run("import os\nos.makedirs('a/b')\nopen('a/b/c', 'w').write('x')\nos.chmod('a/b', 0)\n"
              "os.chmod('a', 0o500)\nprint(os.getcwd())\n")
    assert res.passed, res
    assert not Path(res.output.strip()).exists()


def test_a_sample_sees_none_of_the_parents_environment() -> None:
    assert os.environ["SPECVIEW_TEST_SECRET"] == SECRET
    res = run("import os\nprint(sorted(os.environ))\n"
              f"assert {SECRET!r} not in repr(dict(os.environ)), 'the secret leaked'\n")
    assert res.passed, res
    names = eval(res.output)  # noqa: S307 - our own sample printed a list of names
    assert "SPECVIEW_TEST_SECRET" not in names
    assert set(names) <= {"PATH", "LANG", "LC_ALL", "PYTHONIOENCODING", "HOME", "TMPDIR", "LC_CTYPE"}


def test_a_sample_cannot_read_the_secret_from_other_processes() -> None:
    """/proc/<pid>/environ of the parent (and of every process it can see) holds no secret for it."""
    res = run("import os\nfound = []\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n        try:\n"
              "            data = open(f'/proc/{p}/environ', 'rb').read()\n        except OSError:\n"
              "            continue\n"
              f"        if {SECRET.encode()!r} in data:\n            found.append(p)\n"
              f"assert not found, 'the secret is readable in ' + repr(found)\n"
              f"print(open('/proc/{os.getpid()}/environ', 'rb').read())\n", guard=False)
    assert not res.passed
    # the parent is either invisible (a PID namespace with its own /proc) or unreadable (Landlock, another uid)
    assert res.reason.startswith(("FileNotFoundError", "PermissionError", "denied outside its folder")), res
    assert SECRET not in res.output


@pytest.mark.parametrize("program, signal_name", [("import os\nos.abort()\n", "SIGABRT"),
                                                  ("import ctypes\nctypes.string_at(0)\n", "SIGSEGV"),
                                                  ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
                                                   "SIGKILL")])
def test_a_crash_is_a_fail_naming_its_signal(program: str, signal_name: str) -> None:
    import signal
    res = run(program)
    assert not res.passed
    assert res.reason == f"crashed (signal {int(signal.Signals[signal_name])}, {signal_name})"


@pytest.mark.parametrize("program, reason", [
    ("import sys\nsys.exit(0)\n", "exited before its tests finished (sys.exit(0))"),
    ("import os\nos._exit(0)\n", "exited before its tests finished (exit code 0)"),
    ("import os\nos.closerange(0, 1024)\n", "exited before its tests finished (exit code 0)"),
])
def test_a_sample_that_ends_early_did_not_pass(program: str, reason: str) -> None:
    res = run(program)
    assert (res.passed, res.reason) == (False, reason)


def test_the_file_size_and_folder_limits() -> None:
    lim = Limits(wall_s=5, cpu_s=4, file_mb=2, disk_mb=8)
    res = run("open('big', 'wb').write(b'x' * (3 * 2 ** 20))\n", lim)
    assert (res.passed, res.reason) == (False, "file size limit (2 MB)")
    if not sandbox_report(lim).fences.folder_quota:
        pytest.skip("no mount namespace on this platform: the folder has no total cap")
    res = run("for i in range(8):\n    open(f'f{i}', 'wb').write(b'x' * (2 ** 20 + 2 ** 19))\n", lim)
    assert (res.passed, res.reason) == (False, "filled its folder (8 MB)")


def test_network_is_denied_where_the_platform_allows() -> None:
    res = run("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n")
    assert res.reason == "tried to use the network (socket(AF_INET, SOCK_STREAM))"
    res = run("import socket\ns = socket.socket()\n")
    assert res.reason == "tried to use the network (socket(AF_INET, SOCK_STREAM))"
    res = run("import socket\na, b = socket.socketpair()\na.sendall(b'x')\nassert b.recv(1) == b'x'\n")
    assert res.passed, res  # an unnamed pair reaches nothing: asyncio's self-pipe needs it
    fences = sandbox_report().fences
    if not fences.network_denied:
        assert "network not denied on this platform" in fences.gaps()
        pytest.skip("network not denied on this platform (the in-process guard only)")
    res = run("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n", guard=False)
    assert res.reason.startswith("tried to use the network (denied: "), res


def test_signals_to_other_processes_are_refused() -> None:
    res = run(f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)\n")
    assert res.reason == f"tried to signal another process (os.kill({os.getpid()}, 15))"


def test_output_is_kept_to_its_start_and_end() -> None:
    res = run("import sys\nsys.stdout.write('first\\n' + 'x' * 1_000_000 + '\\nlast\\n')\n")
    assert res.passed, res.reason
    assert res.output.startswith("first\n") and res.output.endswith("\nlast\n")
    assert len(res.output.encode()) <= OUTPUT_BYTES + 100
    assert "bytes not kept" in res.output


def test_the_run_goes_on_after_each_bad_sample() -> None:
    bad = ["import time\ntime.sleep(60)\n", "import os\nos.fork()\n", "import os\nos.abort()\n",
           "x = b'x' * (10 ** 11)\n", "raise ValueError('no')\n"]
    t0 = time.monotonic()
    reasons = [run(p).reason for p in bad]
    assert run("assert sum(range(10)) == 45\n").passed
    assert len(set(reasons)) == len(bad), reasons
    # the hang costs its wall clock; the rest end at once: the whole is bounded, never stuck
    assert time.monotonic() - t0 < FAST.wall_s + len(bad) * (KILL_MARGIN + 1)


def test_without_namespaces_a_sample_cannot_leave_its_group_and_is_killed() -> None:
    """No PID namespace: the sample's setsid() is refused (seccomp), so the process group's kill reaches it."""
    program = ("import os, time\nprint(os.getcwd(), flush=True)\ntry:\n    os.setsid()\nexcept OSError as e:\n"
               "    print('refused', e.errno, flush=True)\ntime.sleep(60)\n")
    res = run(program, guard=False, fences_off=("namespaces", "mounts", "landlock"))
    assert res.reason == "timed out after 3 s (wall clock)"
    assert not leftovers(res.output.split()[0])
    assert res.fences is not None and not res.fences.pid_namespace
    if not res.fences.seccomp:
        pytest.skip("no seccomp filter on this platform: a sample that leaves its group outlives the kill")
    assert res.output.splitlines()[1] == "refused 1"


def test_without_namespaces_or_seccomp_the_report_names_the_kill_gap() -> None:
    off = run_sample("pass\n", limits=FAST, guard=False, probe=True, fences_off=("namespaces", "seccomp"))
    assert off.passed and off.fences is not None
    assert not off.fences.probed["group"] and not off.fences.kill_complete
    assert "no PID namespace and no seccomp: a sample that leaves its process group outlives the kill" in \
        off.fences.gaps()
    assert any(m.startswith("everything it starts dies with it") for m in off.fences.missing())


def test_the_report_says_what_this_platform_enforces() -> None:
    report = sandbox_report()
    lines = report.lines()
    assert [line.split(":")[0] for line in lines] == ["network", "unix sockets", "processes", "memory", "time", "files",
                                                      "folder", "environment", "other processes", "user",
                                                      "control channel", "score"]
    fences = report.fences
    assert set(fences.probed) == {"processes", "network", "unix", "memory", "group"}
    assert ("network not denied on this platform" in report.gaps()) == (not fences.probed["network"])
    assert ("NOT denied" in lines[0]) == (not fences.probed["network"])
    off = run_sample("pass\n", limits=FAST, guard=False, probe=True,
                     fences_off=("namespaces", "mounts", "landlock", "seccomp"))
    assert off.passed and off.fences is not None
    if not off.fences.probed["network"]:
        assert "network not denied on this platform" in off.fences.gaps()
        assert off.fences.lines(FAST)[0] == "network: NOT denied on this platform"
    assert any(g.startswith("writes outside the folder not prevented") for g in off.fences.gaps())


@pytest.mark.parametrize("kw, word", [({"wall_s": 0}, "wall_s=0"), ({"memory_mb": 16}, "memory_mb=16"),
                                      ({"processes": -1}, "processes=-1"), ({"disk_mb": -5}, "disk_mb=-5")])
def test_bad_limits_are_refused_naming_the_value(kw: dict[str, float], word: str) -> None:
    with pytest.raises(SandboxError, match=word):
        Limits(**kw)  # type: ignore[arg-type]


def test_the_sample_runs_the_parents_interpreter_without_site_packages() -> None:
    res = run("import sys\nprint(sys.flags.isolated, sys.flags.no_site, sys.version_info[:2])\n")
    assert res.output == f"1 1 {tuple(sys.version_info[:2])}\n"
