"""Running model-written code: each sample in its own process, folder, limits and (where the platform allows)
namespaces, and a verdict with a reason a user reads.

:func:`run_sample` starts a fresh ``python -I -S`` (no site-packages, no
``PYTHON*`` variables, no user site: HumanEval's tests need only the stdlib)
in a new session, in a new temporary folder that is its cwd, HOME and TMPDIR,
with an environment of a few fixed variables (nothing of the parent's: no
tokens, no keys), stdin closed, and reads one pipe of output and one of
facts (Python literals) from :mod:`.sandbox_child`, which sets up the fences
(see its docstring).  That control pipe is written by the launcher and init
alone: the sample's own lines reach it through init, bounded and marked as
the sample's, and its outcome counts only with the nonce this run gave it.
The parent owns the clock: at the wall-clock limit it kills the process
group it started (and with it the PID namespace; the sample cannot leave the
group), before it reaps the launcher, and never a pid anything wrote; so it
always returns within the limit and a fraction of a second, whatever the
sample does with its signals or children.  The folder is removed afterwards.

What each platform enforces differs; :func:`sandbox_report` tries it (a
probe sample that forks, connects, makes a Unix socket, allocates and tries
to leave its process group) and says so in words, for the CLI and the docs;
:data:`PROMISED` are the fences ``specview quality --execute`` (and a matrix
over a code suite, and the app) will not run without unless told to
(:func:`sandbox_record`).  On Linux with seccomp, unprivileged namespaces and
Landlock everything below holds; elsewhere the report names what does not.
"""

from __future__ import annotations

import ast
import errno
import marshal
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecviewError
from ..sample_python import SAMPLE_ARG
from .fences import PROMISED, SAMPLE_ENV as _ENV, Fences

#: the child's program, the text of these files run with ``-c`` so it needs no readable path of its own
_HERE = Path(__file__).parent
_CHILD_PARTS = ("sandbox_seccomp.py", "sandbox_guard.py", "sandbox_child.py")
#: the most lines, and the longest line, read from the control descriptor (init relays at most 16 of the sample's)
CONTROL_LINES, CONTROL_LINE_BYTES = 64, 256 * 1024
#: the exit code of a sample the in-process guard stopped (sandbox_child.GUARD_EXIT)
_GUARD_EXIT = 86
#: output kept from a sample: its first and last half of this (a sample that prints forever costs nothing)
OUTPUT_BYTES = 64 * 1024
#: seconds allowed after the sample's wall clock for the kill and the clean-up
KILL_MARGIN = 2.0
_EVENTS = {"processes": "tried to start processes", "write": "wrote outside its folder",
           "signals": "tried to signal another process", "network": "tried to use the network"}


class SandboxError(SpecviewError):
    """The sandbox itself could not run a sample (not the sample failing): the message says what to fix."""


@dataclass(frozen=True)
class Limits:
    """What one sample may use.

    ``wall_s`` and ``cpu_s`` in seconds, ``memory_mb`` its address space,
    ``processes`` the processes or threads it may start besides itself (0:
    none; any attempt is a fail), ``file_mb`` the largest file it may write,
    ``disk_mb`` all its files together (its folder is a tmpfs of that size
    where the platform gives a mount namespace).
    """

    wall_s: float = 10.0
    cpu_s: float = 10.0
    memory_mb: int = 512
    processes: int = 0
    file_mb: int = 16
    disk_mb: int = 64

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_mb", "file_mb", "disk_mb"):
            if not getattr(self, name) > 0:
                raise SandboxError(f"sandbox limit {name}={getattr(self, name)!r}: it must be above 0")
        if self.processes < 0:
            raise SandboxError(f"sandbox limit processes={self.processes!r}: it must be 0 or more")
        if self.memory_mb < 64:
            raise SandboxError(f"sandbox limit memory_mb={self.memory_mb}: Python itself needs 64 MB or more")


@dataclass(frozen=True)
class SampleResult:
    """One sample's verdict: ``reason`` is "passed" or why not, in words ("timed out after 10 s (wall clock)",
    "memory limit (512 MB)", "crashed (signal 11, SIGSEGV)", "AssertionError: ...", "tried to start processes
    (os.fork)", ...); ``output`` what it printed (stdout and stderr, the start and end of it)."""

    passed: bool
    reason: str
    output: str
    wall_s: float = 0.0
    cpu_s: float | None = None
    fences: Fences | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _new_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="specview-sample-"))


def _remove_folder(folder: Path) -> None:
    """Remove the sample's folder even where the sample took the write bits off its own files."""
    def retry(func: Any, path: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            func(path)
        except OSError:
            pass
    shutil.rmtree(folder, onerror=retry)


class _Output:
    """The first and last halves of ``OUTPUT_BYTES`` of what a sample printed; the rest is counted, not kept."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = OUTPUT_BYTES // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > OUTPUT_BYTES // 2:
            cut = len(self.tail) - OUTPUT_BYTES // 2
            self.dropped += cut
            del self.tail[:cut]

    def text(self) -> str:
        middle = f"\n[... {self.dropped} bytes not kept ...]\n" if self.dropped else ""
        return (bytes(self.head).decode("utf-8", "replace") + middle + bytes(self.tail).decode("utf-8", "replace"))


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _reason(facts: list[dict[str, Any]], claims: list[dict[str, Any]], nonce: str, limits: Limits,
            timed_out: bool, wall: float, output: str) -> tuple[bool, str, float | None]:
    """The verdict: init's ``facts`` (the wait status) and the sample's ``claims``, of which an outcome counts only
    with this run's ``nonce``; the first fact that explains the end wins."""
    status = next((r for r in facts if "status" in r), None)
    cpu = status.get("cpu_s") if status else None
    cpu = cpu if isinstance(cpu, (int, float)) else None
    if timed_out:
        return False, f"timed out after {wall:g} s (wall clock)", cpu
    event = next((r for r in claims if "event" in r), None)
    if event:
        return False, f"{_EVENTS.get(str(event['event']), str(event['event']))} ({event.get('detail')})", cpu
    outcome = next((r for r in claims if "outcome" in r and r.get("nonce") == nonce), None)
    if outcome and outcome["outcome"] == "passed" and status and status["status"] == 0:
        return True, "passed", cpu
    if outcome and outcome["outcome"] == "memory":
        return False, f"memory limit ({limits.memory_mb} MB)", cpu
    if outcome and outcome["outcome"] == "exit":
        return False, f"exited before its tests finished (sys.exit({outcome.get('code')}))", cpu
    if outcome and outcome["outcome"] == "error":
        return False, _error_reason(outcome, limits), cpu
    error = next((r["sandbox_error"] for r in claims if "sandbox_error" in r), None)
    if error:
        return False, f"the sandbox failed to start the sample: {error}", cpu
    if status is None or not isinstance(status.get("status"), int):
        return False, "the sandbox ended without a verdict (its launcher died)", cpu
    code = status["status"]
    if os.WIFSIGNALED(code):
        sig = os.WTERMSIG(code)
        # the hard limit's SIGKILL (a sample that ignored SIGXCPU); a VM's tick-based accounting reads low
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu is not None and cpu >= 0.5 * limits.cpu_s):
            return False, f"CPU limit ({limits.cpu_s:g} s)", cpu
        if sig == signal.SIGXFSZ:
            return False, f"file size limit ({limits.file_mb} MB)", cpu
        if "MemoryError" in output or "Cannot allocate memory" in output:
            return False, f"memory limit ({limits.memory_mb} MB)", cpu
        return False, f"crashed (signal {sig}, {_signal_name(sig)})", cpu
    exit_code = os.WEXITSTATUS(code)
    if exit_code == 0 and any("outcome" in r for r in claims):
        return False, "exited before its tests finished (exit code 0, with an outcome line not its harness's)", cpu
    return False, f"exited before its tests finished (exit code {exit_code})", cpu


def _error_reason(outcome: dict[str, Any], limits: Limits) -> str:
    """An exception's reason: the fence that raised it where one did (the file size or folder limit, the process
    limit, the network or a path denied), else its type and first line."""
    message = outcome["message"].strip().splitlines()
    said = f"{outcome['type']}: {message[0][:300]}" if message else outcome["type"]
    err, where, trace = outcome.get("errno"), outcome.get("filename") or "", outcome.get("traceback", "")
    if err == errno.EFBIG:
        return f"file size limit ({limits.file_mb} MB)"
    if err in (errno.ENOSPC, errno.EDQUOT):
        return f"filled its folder ({limits.disk_mb} MB)"
    if (err == errno.EAGAIN and any(w in trace for w in ("fork", "spawn", "Popen", "exec"))) or \
            "can't start new thread" in said:
        return f"tried to start processes (the process limit stopped it: {said})"
    if err in (errno.ENETUNREACH, errno.EACCES, errno.EPERM) and not where and ("connect" in trace or
                                                                               "socket" in trace):
        return f"tried to use the network (denied: {said})"
    if err in (errno.EACCES, errno.EPERM, errno.EROFS) and where:
        return f"denied outside its folder ({said})"
    return said


def _exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited, without reaping it: while it is an unreaped zombie its pid, and so
    its process group's id, cannot be given to another process."""
    try:
        got = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return got is not None and got.si_pid == pid


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group of the launcher, our own child, not yet reaped (so the group's id is still the
    one it made), and wait (up to :data:`KILL_MARGIN` in all) until nothing of that group runs: the sample and
    its processes cannot leave the group (seccomp) or die with their PID namespace.  Nothing a sample writes
    names a process to signal."""
    deadline = time.monotonic() + KILL_MARGIN
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    try:
        proc.wait(timeout=KILL_MARGIN)
    except subprocess.TimeoutExpired:
        return
    while time.monotonic() < deadline and _group_runs(proc.pid):
        time.sleep(0.01)


def _group_runs(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies waiting for a reaper have ended)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_bytes().rsplit(b")", 1)[-1].split()
            except OSError:
                continue
            if len(fields) > 3 and int(fields[3]) == pgid and fields[0] != b"Z":
                return True
    return False


def run_sample(program: str, *, timeout: float | None = None, limits: Limits | None = None,
               guard: bool = True, probe: bool = False, fences_off: tuple[str, ...] = ()) -> SampleResult:
    """Run ``program`` (Python source) in the sandbox; passed when it ran to its end without an exception.

    ``timeout`` (seconds) overrides ``limits.wall_s``.  ``guard=False`` leaves
    out the in-process guard (the tests use it to check the kernel's fences on
    their own); ``probe`` makes the child try the fences first (for
    :func:`sandbox_report`); ``fences_off`` leaves out kernel fences
    (``"namespaces"``, ``"mounts"``, ``"landlock"``, ``"seccomp"``) so the tests can check
    the rest and the report's words where a platform lacks them.  Returns within the wall clock plus
    :data:`KILL_MARGIN`; :class:`SandboxError` only when no sample could start
    at all (no temporary folder, no interpreter).
    """
    if os.name != "posix":
        raise SandboxError("running model-written code needs a POSIX system (Linux or macOS): "
                           "this platform has no process groups or resource limits to fence it with")
    limits = limits or Limits()
    wall = float(timeout) if timeout is not None else limits.wall_s
    if not wall > 0:
        raise SandboxError(f"sample timeout {timeout!r}: it must be above 0 seconds")
    try:
        folder = _new_folder()
    except OSError as e:
        raise SandboxError(f"no temporary folder for the sample ({e}): check TMPDIR ({tempfile.gettempdir()})") from e
    try:
        (folder / "sample.py").write_text(program, encoding="utf-8")
        return _run_in(folder, wall, limits, guard, probe, fences_off)
    finally:
        _remove_folder(folder)


def _child_program() -> str:
    """The child's one program: the seccomp filter's and the guard's definitions, then the child."""
    return "\n".join(_HERE.joinpath(name).read_text(encoding="utf-8") for name in _CHILD_PARTS)


#: what ``-c`` runs: the child's code, compiled once by the parent, read from an inherited descriptor
_BOOT = ("import marshal, os, sys\nfd, size = map(int, sys.argv[1].split(':'))\ncode = os.pread(fd, size, 0)\n"
         "os.close(fd)\ndel fd, size\nexec(marshal.loads(code))\n")
_CODE: list[tuple[int, int]] = []


def _child_code() -> tuple[int, int]:
    """A descriptor of an unlinked file holding the child's compiled code, and its size: made once per process,
    so no sample pays for compiling the child's few hundred lines (a third of its start on a busy machine)."""
    if not _CODE:
        data = marshal.dumps(compile(_child_program(), "<specview sandbox>", "exec"))
        memfd = getattr(os, "memfd_create", None)
        fd = memfd("specview-sandbox", os.MFD_CLOEXEC) if memfd else os.dup(tempfile.TemporaryFile().fileno())
        os.set_inheritable(fd, False)
        os.pwrite(fd, data, 0)
        _CODE.append((fd, len(data)))
    return _CODE[0]


class _ControlLines:
    """The control descriptor's lines, each a Python literal dict: the launcher's and init's own (``facts``), and
    the sample's lines init relayed (``claims``).  A line over :data:`CONTROL_LINE_BYTES` is dropped, and at most
    :data:`CONTROL_LINES` are kept, so nothing written there grows the parent's memory without bound."""

    def __init__(self) -> None:
        self.buf, self.skipping, self.count = bytearray(), False, 0
        self.facts: list[dict[str, Any]] = []
        self.claims: list[dict[str, Any]] = []

    def add(self, data: bytes) -> None:
        self.buf += data
        *lines, rest = self.buf.split(b"\n")
        for line in lines:
            if self.skipping:
                self.skipping = False
            elif self.count < CONTROL_LINES:
                self.count += 1
                self._keep(line)
        self.buf = bytearray(rest)
        if len(self.buf) > CONTROL_LINE_BYTES:
            self.buf, self.skipping = bytearray(), True

    def _keep(self, line: bytes) -> None:
        record = _literal(line.decode("utf-8", "replace"))
        if not isinstance(record, dict):
            return
        if isinstance(record.get("sample"), str):
            claim = _literal(record["sample"])
            if isinstance(claim, dict):
                self.claims.append(claim)
        else:
            self.facts.append(record)


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return None


def interpreter() -> list[str]:
    """How a sample's interpreter starts, before the code it runs: ``python -I -S -c`` (no site-packages, no
    PYTHON* variables, no script folder on sys.path), or where this is the frozen app, which has no ``python``,
    the app with :data:`~specview.core.sample_python.SAMPLE_ARG`, which gives the sample the same."""
    if getattr(sys, "frozen", False):
        return [sys.executable, SAMPLE_ARG]
    return [sys.executable, "-I", "-S", "-c"]


def _start(folder: Path, guard: bool, probe: bool, limits: Limits, off: tuple[str, ...],
           nonce: str) -> tuple[subprocess.Popen[bytes], int]:
    """The launcher, in a new session, with the control pipe's write end and the nonce's pipe; returns it and the
    control pipe's read end."""
    ctl_r, ctl_w = os.pipe()
    nonce_r, nonce_w = os.pipe()
    os.write(nonce_w, nonce.encode())
    os.close(nonce_w)
    cfg = {"ctl": ctl_w, "nonce": nonce_r, "folder": str(folder), "guard": guard, "probe": probe,
           "limits": asdict(limits), "off": list(off)}
    env = {**_ENV, "HOME": str(folder), "TMPDIR": str(folder)}
    try:
        code_fd, size = _child_code()
        proc = subprocess.Popen([*interpreter(), _BOOT, f"{code_fd}:{size}", repr(cfg)],
                                cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, pass_fds=(ctl_w, nonce_r, code_fd), start_new_session=True,
                                close_fds=True)
    except OSError as e:
        os.close(ctl_r)
        raise SandboxError(f"cannot start the sample's interpreter {sys.executable}: {e}") from e
    finally:
        os.close(ctl_w)
        os.close(nonce_r)
    return proc, ctl_r


def _run_in(folder: Path, wall: float, limits: Limits, guard: bool, probe: bool,
            off: tuple[str, ...]) -> SampleResult:
    nonce = secrets.token_hex(16)
    t0 = time.monotonic()
    proc, ctl_r = _start(folder, guard, probe, limits, off, nonce)
    ctl = _ControlLines()
    out = _Output()
    timed_out = False
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(ctl_r, selectors.EVENT_READ, "ctl")
    ended_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if ended_at is None and _exited(proc.pid):
                ended_at = now
            if ended_at is not None and now - ended_at > 0.2:
                break  # the launcher is gone: what still holds a pipe is a leftover, killed below
            if now - t0 >= wall:
                timed_out = not _exited(proc.pid) or not any("status" in r for r in ctl.facts)
                break
            budget = min(wall - (now - t0), 0.05 if ended_at is not None else 0.25)
            for key, _ in sel.select(timeout=max(budget, 0.001)):
                fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
                data = os.read(fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                elif key.data == "out":
                    out.add(data)
                else:
                    ctl.add(data)
    finally:
        _kill_group(proc)
        sel.close()
        proc.stdout.close()
        os.close(ctl_r)
    if timed_out and any("status" in r for r in ctl.facts):
        timed_out = False  # it finished just as the clock ran out
    output = out.text()
    passed, reason, cpu = _reason(ctl.facts, ctl.claims, nonce, limits, timed_out, wall, output)
    return SampleResult(passed=passed, reason=reason, output=output, wall_s=time.monotonic() - t0, cpu_s=cpu,
                        fences=Fences.from_records(ctl.facts, ctl.claims))


@dataclass(frozen=True)
class SandboxReport:
    """What this platform enforces around a sample, found by running a probe (it forks, connects, allocates)."""

    fences: Fences
    limits: Limits
    python: str

    def lines(self) -> list[str]:
        return self.fences.lines(self.limits)

    def gaps(self) -> list[str]:
        return self.fences.gaps()

    def missing(self) -> list[str]:
        """The fences :data:`PROMISED` that do not hold here, in words."""
        return self.fences.missing()

    def to_dict(self, *, allowed_weak: bool = False) -> dict[str, Any]:
        """What a quality result records: the lines, the gaps, the promised fences missing, and whether the run was
        told to go on without them (``--allow-weak-sandbox``)."""
        return {"enforced": self.lines(), "gaps": self.gaps(), "missing": self.missing(),
                "allowed_weak": bool(allowed_weak), "python": self.python}

    def text(self) -> str:
        """The report as ``specview quality --execute`` prints it before anything runs."""
        out = ["the sandbox each sample runs in here (docs/quality-sandbox.md):", *(f"  {x}" for x in self.lines())]
        out += [f"  NOT enforced here: {g}" for g in self.gaps()]
        return "\n".join(out)


def refuse_weak(report: SandboxReport, allow_weak: bool) -> None:
    """:class:`SandboxError` where a promised fence is missing here and the user did not say to go on without it."""
    missing = report.missing()
    if missing and not allow_weak:
        raise SandboxError("this machine's sandbox lacks what docs/quality-sandbox.md promises for model-written "
                           "code: " + "; ".join(missing) + ". Pass --allow-weak-sandbox to run it anyway, "
                           "knowing the sample is not fenced that way")


def sandbox_record(allow_weak: bool, limits: Limits | None = None) -> dict[str, Any]:
    """What a run that executes model-written code records (``SandboxReport.to_dict``), after :func:`refuse_weak`:
    every path that runs suite code (``specview quality``, ``specview matrix`` over a task suite, the app) asks
    here, so each refuses the same machines with the same words."""
    report = sandbox_report(limits)
    refuse_weak(report, allow_weak)
    return report.to_dict(allowed_weak=allow_weak)


_REPORTS: dict[Limits, SandboxReport] = {}


def sandbox_report(limits: Limits | None = None) -> SandboxReport:
    """Run the probe sample once per process and limits and say what held (the platform does not change)."""
    limits = limits or Limits()
    if limits not in _REPORTS:
        result = run_sample("pass\n", limits=limits, guard=False, probe=True)
        if not result.passed or result.fences is None:
            raise SandboxError(f"the sandbox's probe sample did not run ({result.reason}); its output: "
                               f"{result.output[-500:] or '(none)'}")
        _REPORTS[limits] = SandboxReport(fences=result.fences, limits=limits, python=sys.executable)
    return _REPORTS[limits]


__all__ = ["KILL_MARGIN", "OUTPUT_BYTES", "PROMISED", "Fences", "Limits", "SampleResult", "SandboxError",
           "SandboxReport", "refuse_weak", "run_sample", "sandbox_record", "sandbox_report"]
