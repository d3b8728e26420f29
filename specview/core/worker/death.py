"""A dead or stuck worker, turned into one account a user can act on.

:func:`account` reads what is left of a worker (its exit status, the last
activity it recorded, the tail of its log with the native and Python frames
the dying process printed) and returns a JSON-ready dict; :func:`message`
words it.  Known causes are a small table: each entry says what it matches
(the signal, a native frame, what the worker was doing, the machine) and what
to try.  A matching cause is a hypothesis the message states as such, with the
upstream report that describes it.
"""

from __future__ import annotations

import re
import signal
from typing import Any, Callable

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
def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for ln in fh:
                if ln.startswith("flags"):
                    return set(ln.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


_PASS = re.compile(r"a (\d+)-token pass")


def _amx(acc: dict[str, Any], flags: set[str]) -> bool:
    if acc.get("signal") not in ("SIGSEGV", "SIGBUS"):
        return False
    fn = (acc.get("native_function") or "") + " ".join(acc.get("native_frames") or [])
    if "amx" in fn.lower():
        return True
    m = _PASS.search(acc.get("activity") or "")
    multi = m is not None and int(m.group(1)) >= 2
    return multi and any(f.startswith("amx") for f in flags) and not acc.get("no_repack")


def _vulkan_driver(acc: dict[str, Any], flags: set[str]) -> bool:
    frames = " ".join(acc.get("native_frames") or []) + (acc.get("native_function") or "")
    return acc.get("signal") in ("SIGSEGV", "SIGBUS", "SIGABRT") and (
        "libvulkan" in frames or "vk_icd" in frames or "lvp_" in frames or "radv" in frames)


def _oom(acc: dict[str, Any], flags: set[str]) -> bool:
    return acc.get("signal") == "SIGKILL" and not acc.get("hung") and not acc.get("killed_by_specview")


def _ggml_assert(acc: dict[str, Any], flags: set[str]) -> bool:
    return acc.get("signal") == "SIGABRT" and bool(acc.get("assert"))


KNOWN_CAUSES: list[dict[str, Any]] = [
    {
        "id": "amx-repack",
        "match": _amx,
        "cause": "ggml's AMX kernels crash on multi-token passes of quantized models on Intel CPUs with AMX "
                 "(llama.cpp issue #20824, unfixed; also ollama #17205)",
        "advice": "run with --no-repack (-nr): the weights then stay in the plain CPU buffer and the AMX "
                  "kernels are not used",
        "retry": {"no_repack": True},
    },
    {
        "id": "vulkan-driver",
        "match": _vulkan_driver,
        "cause": "the crash is inside the Vulkan driver (Mesa's lavapipe 22.3 crashed this way; 25.0 ran)",
        "advice": "update the GPU driver (Mesa from your distribution's backports), or run on the CPU with -ngl 0",
        "retry": {"gpu_layers": 0},
    },
    {
        "id": "oom-killer",
        "match": _oom,
        "cause": "something outside the worker killed it with SIGKILL; most often the kernel's out-of-memory "
                 "killer (see `dmesg` or `journalctl -k` for 'Out of memory')",
        "advice": "use a smaller model or a smaller context (-c), or free memory, and run again",
        "retry": None,
    },
    {
        "id": "ggml-assert",
        "match": _ggml_assert,
        "cause": "llama.cpp stopped on a failed assertion (GGML_ASSERT)",
        "advice": "the assertion names what llama.cpp refused; if the model file and settings are valid, "
                  "report it to llama.cpp with this trace",
        "retry": None,
    },
]


def known_cause(acc: dict[str, Any], flags: set[str] | None = None,
                causes: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    flags = _cpu_flags() if flags is None else flags
    for c in causes or KNOWN_CAUSES:
        match: Callable[[dict[str, Any], set[str]], bool] = c["match"]
        if match(acc, flags):
            return {k: v for k, v in c.items() if k != "match"}
    return None


def account(*, exitcode: int | None, activity: str, log: str, log_path: str | None, hung_s: float | None = None,
            during: str = "", killed_by_specview: bool = False, no_repack: bool | None = None,
            flags: set[str] | None = None) -> dict[str, Any]:
    """What is known of a worker's death, as a JSON-ready dict (the trace's ``crash`` block)."""
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
        "no_repack": no_repack,
    }
    acc["known_cause"] = known_cause(acc, flags)
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
