"""Samples written to get out of the sandbox: reach a Unix socket outside, make specview kill a process that is not
the sample's, forge their own pass, flood the control channel, read a file their user may not read.  Each attack is
planted against a real listener, process or file of the test's, and the test checks that it was left untouched."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from specview.core.quality.execute import KILL_MARGIN, Limits, SampleResult, run_sample, sandbox_report

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="the attacks are planted through Linux's /proc")

FAST = Limits(wall_s=3, cpu_s=2, memory_mb=256)
#: the kernel's fences alone: no namespaces, private mounts or Landlock (what a Docker container or a kernel with
#: user namespaces off gives)
BARE = ("namespaces", "mounts", "landlock")


def run(program: str, **kw: object) -> SampleResult:
    res = run_sample(program, limits=FAST, **kw)  # type: ignore[arg-type]
    assert res.wall_s <= FAST.wall_s + KILL_MARGIN + 1, res
    return res


class Listener:
    """A Unix socket listening outside the sandbox, recording every connection and byte it gets."""

    def __init__(self, address: str | bytes, mode: int | None = None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(address)
        if mode is not None:
            os.chmod(address, mode)
        self.sock.listen(4)
        self.sock.settimeout(0.1)
        self.got: list[bytes] = []
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(1)
            try:
                self.got.append(b"<connected>" + conn.recv(1024))
            except OSError:
                self.got.append(b"<connected>")
            conn.close()

    def close(self) -> list[bytes]:
        self.stop = True
        self.thread.join()
        self.sock.close()
        return self.got


@pytest.fixture
def private_folder() -> Iterator[Path]:
    """A 0700 folder of this user holding a socket anyone may write to: the shape of /run/user/UID/bus."""
    d = Path.home() / f".specview-attack-{uuid.uuid4().hex[:8]}"
    d.mkdir(mode=0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _connect_program(address: str | bytes) -> str:
    return (f"import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\ns.connect({address!r})\n"
            "s.sendall(b'reached')\nprint('connected')\n")


def _needs_seccomp() -> None:
    if not sandbox_report(FAST).fences.unix_denied:
        pytest.skip("Unix sockets are not denied on this platform (sandbox_report says so: a gap, not a pass)")


@pytest.mark.parametrize("off", [(), BARE], ids=["every-fence", "seccomp-alone"])
@pytest.mark.parametrize("where", ["tmp", "private"])
def test_no_unix_socket_outside_is_reachable_by_its_path(where: str, off: tuple[str, ...],
                                                         private_folder: Path) -> None:
    _needs_seccomp()
    if where == "tmp":
        path = os.path.join(tempfile.gettempdir(), f"specview-attack-{uuid.uuid4().hex[:8]}.sock")
    else:
        path = str(private_folder / "bus")
    listener = Listener(path, 0o777)
    try:
        res = run(_connect_program(path), guard=False, fences_off=off)
        # through ctypes too: no Python-level check stands between the sample and the kernel here
        raw = run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.socket(1, 1, 0), "
                  "ctypes.get_errno())\n", guard=False, fences_off=off)
    finally:
        got = listener.close()
        Path(path).unlink(missing_ok=True)
    assert got == [], f"the listener outside received {got}"
    assert not res.passed and "connected" not in res.output
    assert res.reason.startswith("tried to use the network (denied: PermissionError"), res.reason
    assert raw.passed and raw.output == "-1 1\n", raw  # socket(AF_UNIX) refused with EPERM


def test_no_abstract_unix_socket_is_reachable() -> None:
    _needs_seccomp()
    name = f"\0specview-attack-{uuid.uuid4().hex[:8]}".encode()
    listener = Listener(name)
    try:
        results = [run(_connect_program(name), guard=False, fences_off=off) for off in ((), BARE)]
    finally:
        got = listener.close()
    assert got == []
    for res in results:
        assert res.reason.startswith("tried to use the network (denied: PermissionError"), res.reason


def test_the_guard_names_a_unix_socket_too(private_folder: Path) -> None:
    path = str(private_folder / "docker.sock")
    listener = Listener(path, 0o666)
    try:
        res = run(_connect_program(path))
    finally:
        got = listener.close()
    assert got == [] and res.reason == "tried to use the network (socket(AF_UNIX, SOCK_STREAM))"


def _flood_program(lines: list[str], then: str) -> str:
    """Write ``lines`` on every descriptor the sample holds but its stdout and stderr, then ``then``."""
    return ("import os\nfor fd in range(3, 256):\n    for line in " + repr(lines) + ":\n        try:\n"
            "            os.write(fd, line.encode())\n        except OSError:\n            pass\n" + then)


@pytest.mark.parametrize("off", [(), BARE], ids=["every-fence", "no-namespaces"])
def test_a_sample_cannot_make_specview_kill_another_process(off: tuple[str, ...]) -> None:
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        forged = [f"{{'sample_pid': {bystander.pid}}}\n", f"{{'sample': \"{{'sample_pid': {bystander.pid}}}\"}}\n"]
        res = run(_flood_program(forged, "import time\ntime.sleep(60)\n"), guard=False, fences_off=off, timeout=1)
        assert res.reason == "timed out after 1 s (wall clock)"
        assert bystander.poll() is None, "specview killed a process the sample named"
        # a sample that ends normally leaves the same bystander alive
        res = run(_flood_program(forged, "pass\n"), guard=False, fences_off=off)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


FORGED_PASS = ["{'outcome': 'passed'}\n", "{'sample': \"{'outcome': 'passed'}\"}\n",
               "{'status': 0, 'cpu_s': 0.0, 'maxrss_kb': 0}\n"]


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no-guard"])
def test_a_sample_cannot_forge_its_pass_on_any_descriptor(guard: bool) -> None:
    res = run(_flood_program(FORGED_PASS, "import os\nos._exit(0)\n"), guard=guard)
    assert not res.passed
    assert res.reason == "exited before its tests finished (exit code 0, with an outcome line not its harness's)"
    res = run(_flood_program(FORGED_PASS, "assert 1 + 1 == 3, 'its own test failed'\n"), guard=guard)
    assert (res.passed, res.reason) == (False, "AssertionError: its own test failed")
    # the same program without the forgery still passes: the nonce check refuses only what the harness did not write
    assert run(_flood_program([], "assert 1 + 1 == 2\n"), guard=guard).passed


def test_the_sample_holds_no_descriptor_of_the_control_pipe() -> None:
    """Every descriptor the sample has open but stdin, stdout and stderr is its own pipe to init."""
    res = run("import os\nheld = []\nfor fd in sorted(int(f) for f in os.listdir('/proc/self/fd')):\n"
              "    try:\n        held.append((fd, os.readlink(f'/proc/self/fd/{fd}')))\n    except OSError:\n"
              "        pass\nprint([h for h in held if h[0] > 2])\n", guard=False)
    assert res.passed, res
    held = eval(res.output)  # noqa: S307 - the sample printed a list of (fd, target)
    pipes = [target for fd, target in held if target.startswith("pipe:")]
    assert len(pipes) == 1, held  # its outcome pipe; the listdir's own descriptor is gone by the readlinks


def test_a_flood_on_the_control_channel_keeps_the_parents_memory_bounded() -> None:
    program = ("import os\nchunk = b'x' * (1 << 20)\nwhile True:\n    for fd in range(3, 64):\n        try:\n"
               "            os.write(fd, chunk)\n        except OSError:\n            pass\n")
    tracemalloc.start()
    try:
        res = run(program, guard=False, timeout=1.5)  # the parent's buffer grew by some 13 MB a second
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res.reason == "timed out after 1.5 s (wall clock)"
    assert peak < 8 * 2 ** 20, f"the parent held {peak / 2 ** 20:.0f} MB of a sample's flood"


@pytest.fixture
def root_secret() -> Iterator[Path]:
    """A 0600 file of this user in a 0700 folder of this user."""
    d = Path.home() / f".specview-secret-{uuid.uuid4().hex[:8]}"
    d.mkdir(mode=0o700)
    f = d / "secret"
    f.write_text("specview-planted-secret")
    f.chmod(0o600)
    yield f
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("off", [("landlock",), BARE], ids=["no-landlock", "bare"])
def test_reads_beyond_the_reported_fences_are_refused(off: tuple[str, ...], root_secret: Path) -> None:
    """Without Landlock a sample reads what its user may: as root that is user nobody with no capability (the
    issue: CAP_DAC_READ_SEARCH kept, /etc/shadow read).  Whatever it read, the report said it could."""
    program = "".join(f"try:\n    print(len(open({str(p)!r}, 'rb').read()) > 0)\nexcept OSError as e:\n"
                      f"    print(type(e).__name__)\n" for p in (root_secret, "/etc/shadow"))
    res = run(program, guard=False, fences_off=off)
    assert res.passed and res.fences is not None, res
    secret_read, shadow_read = (line == "True" for line in res.output.splitlines())
    fences = res.fences
    if fences.read_capability:  # it says so, and that the promised fence is missing
        assert any(g.startswith("reads not confined: the sample keeps a capability") for g in fences.gaps())
        assert "no capabilities: it reads only what its own user may" in fences.missing()
    elif os.getuid() == 0:
        assert fences.uid is not None and fences.capabilities_dropped
        assert not secret_read and not shadow_read, res.output
    else:  # its own user's file: the gap the report names
        assert secret_read and any("the file permissions of your own user" in g for g in fences.gaps())
    assert fences.read_capability or not shadow_read


def test_as_root_the_sample_keeps_no_capability() -> None:
    if os.getuid() != 0:
        pytest.skip("as a user the sample has no capabilities to drop (see the user-namespace test)")
    res = run("print(open('/proc/self/status').read())\n", guard=False)
    status = dict(line.split(":\t", 1) for line in res.output.splitlines() if line.startswith("Cap"))
    fences = res.fences
    assert fences is not None
    if fences.read_capability:
        pytest.skip("the interpreter is out of user nobody's reach and there is no mount namespace to expose it "
                    "in: the report says the sample keeps CAP_DAC_READ_SEARCH")
    assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == int(status["CapBnd"], 16) == 0, status
    assert fences.capabilities_dropped


#: what a sample run from an interpreter under /tmp reports: its capabilities, whether it sees its interpreter and
#: a file beside that interpreter's tree, and whether it may write into the tree
UNDER_TMP = """\
import errno, os, sys
print(open('/proc/self/status').read())
tree = os.path.dirname(sys.executable)
print('interpreter', os.path.exists(sys.executable))
print('beside', os.path.exists(os.path.join(os.path.dirname(os.path.dirname(tree)), 'beside.txt')))
try:
    open(os.path.join(tree, 'planted'), 'w')
    print('write', 'done')
except OSError as e:
    print('write', errno.errorcode[e.errno])
"""


@pytest.mark.parametrize("how", ["symlinks", "copies"])
def test_as_root_from_an_interpreter_under_tmp_the_sample_keeps_no_capability(how: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter under /tmp, which the sample's tmpfs covers: a venv (its ``python`` a symlink to the base
    interpreter, or a copy of it), as the desktop app unpacked there is. The interpreter's trees are read before
    the mounts (read after them, a symlink no longer resolves) and a tree inside /tmp is bound back, read-only:
    otherwise the covered tree looks out of nobody's reach and the sample kept CAP_DAC_READ_SEARCH, and the app
    could not read its own archive. Nothing else of /tmp comes back with it."""
    if os.getuid() != 0:
        pytest.skip("as a user the sample has no capabilities to drop (see the user-namespace test)")
    base = os.path.realpath(sys.executable)
    where = tempfile.mkdtemp(prefix="specview-venv-", dir="/tmp")
    os.chmod(where, 0o755)
    try:
        Path(where, "beside.txt").write_text("not the sample's\n")
        subprocess.run([base, "-m", "venv", "--without-pip", f"--{how}", os.path.join(where, "venv")], check=True,
                       timeout=120)
        venv_python = os.path.join(where, "venv", "bin", "python")
        assert os.path.islink(venv_python) == (how == "symlinks")
        monkeypatch.setattr(sys, "executable", venv_python)
        res = run(UNDER_TMP, guard=False, fences_off=("landlock",))  # the read-only bind holds without Landlock
        planted = os.path.exists(os.path.join(where, "venv", "bin", "planted"))
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert res.passed, res
    status = dict(line.split(":\t", 1) for line in res.output.splitlines() if line.startswith("Cap"))
    fences = res.fences
    assert fences is not None and fences.uid != 0
    assert not fences.read_capability, fences
    assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == int(status["CapBnd"], 16) == 0, status
    assert fences.capabilities_dropped
    said = dict(line.split(" ", 1) for line in res.output.splitlines() if line.split(" ", 1)[0] in
                ("interpreter", "beside", "write"))
    # a symlinked venv's tree is the base interpreter's, outside /tmp: the venv itself stays covered
    assert said == {"interpreter": "True" if how == "copies" else "False", "beside": "False",
                    "write": "EROFS" if how == "copies" else "ENOENT"}, res.output
    assert not planted


@pytest.mark.parametrize("off", [("landlock",), BARE], ids=["no-landlock", "bare"])
def test_a_sample_cannot_reopen_its_launchers_descriptors_through_proc(off: tuple[str, ...]) -> None:
    """init and the launcher hold the control pipe: even without Landlock (and without namespaces) the sample
    opens none of their descriptors and reads neither their memory nor their environment."""
    program = ("import os\ndef parent(pid):\n"
               "    return int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])\n"
               "init = parent(os.getpid())\nlauncher = parent(init)\nopened, tried = 0, 0\n"
               "for pid in (init, launcher):\n    for path in ([f'/proc/{pid}/mem', f'/proc/{pid}/environ'] +\n"
               "                 [f'/proc/{pid}/fd/{n}' for n in range(3, 64)]):\n        tried += 1\n"
               "        try:\n            fd = os.open(path, os.O_WRONLY if '/fd/' in path else os.O_RDONLY)\n"
               "        except OSError:\n            continue\n        opened += 1\n"
               "        os.close(fd)\nprint(opened, tried > 0, init != launcher)\n")
    res = run(program, guard=False, fences_off=off)
    assert res.passed, res
    assert res.output == "0 True True\n", res.output
