"""Ctrl+C and SIGTERM of ``specview run``: the real CLI in its own process, interrupted as a terminal would (exit
130) or stopped by ``kill`` (exit 143).

The run is long (the demo target, 4,000 tokens with no end-of-text stop), the signal is sent to the
``specview`` process once it has said what it runs, and the test asserts the exit status, that no
process the command started outlives it, wherever the engine runs (this process or a worker), and
that the worker's folder went with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.demo


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc; zombies count as gone)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            parents[int(d.name)] = int(fields[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - out
        out |= frontier
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("sig, status, said", [(signal.SIGINT, 130, "specview: interrupted"),
                                               (signal.SIGTERM, 143, "specview: terminated")],
                         ids=["ctrl-c", "sigterm"])
def test_a_stopped_specview_run_exits_with_its_status_and_leaves_nothing(demo_paths, tmp_path, sig, status, said):
    cmd = [sys.executable, "-m", "specview", "run", "-m", "demo:Q4_K_M", "-md", "demo:Q4_0", "-n", "4000",
           "--ignore-eos", "-c", "4096", "-t", "1", "-p", "Write an essay on the importance of sleep for students."]
    # A terminal starts the command with SIGINT at its default action. A test run started in the background of a
    # non-interactive shell (`nohup ... &`, a CI script's `cmd &`) has SIGINT ignored, every child inherits that, and
    # Python then installs no KeyboardInterrupt handler: the command would run its 4,000 tokens deaf to Ctrl+C.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path)),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = p.stderr.readline()
        assert first.startswith("specview: "), first
        time.sleep(2.0)  # into the run: the models load and the vanilla arm starts
        assert p.poll() is None, "the 4,000-token run ended before it was interrupted"
        started = _children(p.pid)
        os.kill(p.pid, sig)  # the terminal's Ctrl+C, or `kill`, to the command itself
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == status, (p.returncode, err[-2000:])
    assert said in err and "Traceback" not in err, err[-2000:]
    deadline = time.monotonic() + 10
    while any(_alive(c) for c in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c for c in started if _alive(c)], "a process started by specview run outlived it"
    assert not list(tmp_path.glob("specview-*-worker-*")), "the engine worker's folder outlived the command"


def _engine_flags(engine: str) -> list[str]:
    if engine == "llama.cpp":
        return []
    from specview.backends.llama_server import binary as sb
    from require import missing

    path = os.environ.get(sb.ENV_BIN) or str(sb.cached_server_path())
    if not (Path(path).is_file() and os.access(path, os.X_OK)):
        missing(f"no llama-server at {path}: build one with scripts/build-llama-server.sh",
                switch="SPECVIEW_REQUIRE_SERVER")
    return ["--engine", "llama-server", "--server-bin", path]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("engine, kept", [("llama.cpp", "worker"), ("llama-server", "llama-server")])
def test_a_run_killed_outright_leaves_no_process_and_the_next_command_takes_its_files(demo_paths, tmp_path, engine,
                                                                                      kept):
    """SIGKILL (the out-of-memory killer, ``kill -9``) gives the command no time to remove its engine worker's
    folder or its servers' logs: the worker and the servers die with it (the kernel's parent-death signal), and
    the next command that starts a worker or a server removes what its dead predecessor left."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))
    cmd = [sys.executable, "-m", "specview", "run", "-m", "demo:Q4_K_M", "-md", "demo:Q4_0", "-t", "1", "--no-diagnose",
           *_engine_flags(engine)]
    p = subprocess.Popen(cmd + ["-n", "4000", "--ignore-eos", "-c", "4096", "-p", "Write an essay on sleep."],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        assert p.stderr.readline().startswith("specview: ")
        time.sleep(2.0)
        assert p.poll() is None, "the 4,000-token run ended before it was killed"
        started = _children(p.pid)
        left = list(tmp_path.glob(f"specview-{p.pid}-{kept}-*"))
        assert started and left, (started, left)  # the worker or servers, and what they keep, named for the command
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    deadline = time.monotonic() + 10
    while any(_alive(c) for c in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c for c in started if _alive(c)], "a process outlived the killed command"
    assert all(f.exists() for f in left)  # nobody could remove them yet
    nxt = subprocess.run(cmd + ["-n", "4", "-p", "Hi"], capture_output=True, text=True, env=env, timeout=300)
    assert nxt.returncode in (0, 1), nxt.stderr[-2000:]
    assert not [f for f in left if f.exists()], "the next command left what the killed one kept"
    assert not list(tmp_path.glob("specview-*")), "the next command left its own files"
