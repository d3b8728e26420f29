"""A dead or stuck worker, turned into one account a user can act on.

:func:`account` reads what is left of a worker (its exit status, the last
activity it recorded, the tail of its log with the native and Python frames
the dying process printed) and returns a JSON-ready dict; :func:`message`
words it.  A known cause (:class:`KnownCause`) says what it matches (the
signal, a native frame, what the worker was doing, the machine's CPU flags)
and what to try.  Each engine contributes its own
(:meth:`specview.core.registry.Backend.death_causes`: llama.cpp's AMX
kernels, a Vulkan driver, a failed assertion), read before the ones every
engine shares (:data:`SHARED_CAUSES`: the OOM killer).  A matching cause is a
hypothesis the message states as such, with the upstream report that
describes it.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..doctor import cpu_flags
from .native import MARK

#: the runtime's own frames, skipped when naming the native function that crashed
_RUNTIME = ("libffi", "_ctypes", "libpython", "/python3", "libc.so", "ld-linux", "libpthread", "libgcc_s")
_ENTRY = ("_start", "main", "__libc_start_main", "Py_BytesMain", "Py_RunMain")
_FRAME = re.compile(r"^(?P<lib>[^()\s]+)\((?P<sym>[^)+]*)(?:\+0x[0-9a-f]+)?\)\s*\[0x[0-9a-f]+\]\s*$")


def signal_name(exitcode: int | None) -> str | None:
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def native_frames(log: str) -> list[str]:
    """The frames of the crash itself, from the hook's block in the log (its own frames left out)."""
    start = log.rfind(MARK)
    if start < 0:
        return []
    block = log[start:].splitlines()[1:]
    frames = []
    for ln in block:
        if ln.startswith("Python frames:"):
            break
        if _FRAME.match(ln.strip()):
            frames.append(ln.strip())
    # the hook's own frames run from the top down to libffi's closure entry, then the kernel's signal
    # trampoline (a libc frame): the crash's frames start after it
    last_closure = max((i for i, f in enumerate(frames) if "libffi" in f), default=-1)
    if last_closure >= 0:
        frames = frames[last_closure + 2:]
    return frames


def native_function(frames: list[str]) -> str | None:
    """The first named frame outside the runtime (``ggml_backend_amx_mul_mat in libggml-cpu.so``)."""
    for f in frames:
        m = _FRAME.match(f)
        if not m:
            continue
        lib, sym = m.group("lib"), m.group("sym")
        base = lib.rsplit("/", 1)[-1]
        if any(r in lib for r in _RUNTIME) or base.startswith("python") or sym in _ENTRY:
            continue
        return f"{sym} in {base}" if sym else base
    return None


def python_frames(log: str) -> list[str]:
    """faulthandler's frames of the thread that was running specview's code, innermost first."""
    start = log.rfind("Current thread")
    if start < 0:
        start = log.rfind("Fatal Python error")
    if start < 0:
        return []
    out = []
    for ln in log[start:].splitlines()[1:]:
        s = ln.strip()
        if not s.startswith("File "):
            if out:
                break
            continue
        out.append(s)
    return out


def assert_line(log: str) -> str | None:
    """The last line llama.cpp printed before aborting (``GGML_ASSERT(...) failed``), if any."""
    for ln in reversed(log.splitlines()):
        if "GGML_ASSERT" in ln or "GGML_ABORT" in ln or (" failed" in ln and "ggml" in ln):
            return ln.strip()[:300]
    return None


# -- known causes ------------------------------------------------------------------------------
@dataclass(frozen=True)
class KnownCause:
    """One known way a worker dies: ``match(account, cpu_flags)`` says whether this death is it."""

    id: str
    match: Callable[[dict[str, Any], frozenset[str]], bool]
    cause: str  # what it is, with the upstream report that describes it
    advice: str  # what to try
    retry: dict[str, Any] | None = None  # the settings a retry would change

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "cause": self.cause, "advice": self.advice, "retry": self.retry}


@dataclass(frozen=True)
class DeathCauses:
    """What one engine knows of how its worker dies: its causes (the first that matches wins) and the values
    of the settings they read, recorded in the account (so a saved account says what its match was read on)."""

    causes: tuple[KnownCause, ...] = ()
    recorded: dict[str, Any] = field(default_factory=dict)


def _oom(acc: dict[str, Any], flags: frozenset[str]) -> bool:
    return acc.get("signal") == "SIGKILL" and not acc.get("hung") and not acc.get("killed_by_specview")


#: the causes every engine's worker can die of, read after the engine's own
SHARED_CAUSES: tuple[KnownCause, ...] = (
    KnownCause(
        "oom-killer", _oom,
        cause="something outside the worker killed it with SIGKILL; most often the kernel's out-of-memory "
              "killer (see `dmesg` or `journalctl -k` for 'Out of memory')",
        advice="use a smaller model or a smaller context (-c), or free memory, and run again"),
)


def known_cause(acc: dict[str, Any], flags: frozenset[str] | None = None,
                causes: Sequence[KnownCause] = SHARED_CAUSES) -> dict[str, Any] | None:
    """The first of ``causes`` that matches the account ``acc`` on a CPU with ``flags`` (default: this one's)."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    for c in causes:
        if c.match(acc, flags):
            return c.to_dict()
    return None


def account(*, exitcode: int | None, activity: str, log: str, log_path: str | None, hung_s: float | None = None,
            during: str = "", killed_by_specview: bool = False, engine: DeathCauses | None = None,
            flags: frozenset[str] | None = None) -> dict[str, Any]:
    """What is known of a worker's death, as a JSON-ready dict (the trace's ``crash`` block); ``engine`` is what
    the worker's engine knows of its deaths (None: only the shared causes are read)."""
    frames = native_frames(log)
    acc: dict[str, Any] = {
        "signal": signal_name(exitcode) if hung_s is None else "SIGKILL",
        "exitcode": exitcode,
        "hung": hung_s is not None,
        "hung_seconds": hung_s,
        "killed_by_specview": killed_by_specview or hung_s is not None,
        "during": during,
        "activity": activity or None,
        "native_frames": frames[:12],
        "native_function": native_function(frames),
        "python_frames": python_frames(log)[:8],
        "assert": assert_line(log),
        "log_tail": log.splitlines()[-40:],
        "log": log_path,
    }
    engine = engine or DeathCauses()
    for k, v in engine.recorded.items():  # an engine adds to the account, never rewrites what the death says
        acc.setdefault(k, v)
    acc["known_cause"] = known_cause(acc, flags, (*engine.causes, *SHARED_CAUSES))
    return acc


def message(acc: dict[str, Any]) -> str:
    """The account in words: what happened, while doing what, where, the likely cause, and what to try."""
    what = acc.get("during") or "working"
    doing = acc.get("activity")
    if acc.get("hung"):
        head = (f"the engine's worker process stopped making progress for {acc['hung_seconds']:.0f} s while "
                f"{what}; specview stopped it (SIGKILL)")
    elif acc.get("signal"):
        sig = acc["signal"]
        desc = {"SIGSEGV": "a segmentation fault", "SIGABRT": "an abort", "SIGKILL": "SIGKILL",
                "SIGBUS": "a bus error", "SIGILL": "an illegal instruction", "SIGFPE": "an arithmetic fault",
                "SIGTERM": "SIGTERM"}.get(sig, sig)
        head = f"the engine's worker process was terminated by {sig} ({desc}) while {what}"
    else:
        head = f"the engine's worker process exited unexpectedly with status {acc.get('exitcode')} while {what}"
    lines = [head]
    if doing:
        lines.append(f"  it was doing: {doing}")
    if acc.get("native_function"):
        lines.append(f"  native function: {acc['native_function']}")
    if acc.get("assert"):
        lines.append(f"  llama.cpp said: {acc['assert']}")
    kc = acc.get("known_cause")
    if kc:
        lines.append(f"  likely cause: {kc['cause']}")
        lines.append(f"  try: {kc['advice']}")
    elif acc.get("hung"):
        lines.append("  try: if the backend is only slow (a GPU driver compiling shaders on first use, a huge model), "
                     "allow more time with SPECVIEW_WORKER_TIMEOUT=SECONDS; otherwise report it with the log below")
    else:
        lines.append("  try: run it again (a fresh worker starts); if it repeats, try -ngl 0, --no-repack or -t 1 "
                     "to see which part of llama.cpp it comes from, and report it with the saved trace")
    if acc.get("log"):
        lines.append(f"  the worker's log: {acc['log']}")
    return "\n".join(lines)
