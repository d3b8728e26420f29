"""What specview will run on, in plain words: ``specview doctor`` and the app's "About this setup".

Each engine answers for itself (:meth:`specview.core.registry.Backend.setup_facts`);
this module adds the machine's facts that move the numerics (CPU, its
features, the thread count a run uses) and turns the whole into lines a user
can read, or JSON.  An engine that cannot be used here is a fact too, with its
reason, never an error.
"""

from __future__ import annotations

import os
import platform
from typing import Any, Iterable

from .config import THREADS_VARIABLE, EngineSettings, default_threads
from .facts import STATUSES, Fact
from .registry import backend_names, get_backend

#: CPU flags (as /proc/cpuinfo spells them) that decide which kernels ggml's CPU backend takes, by the name shown
KERNEL_FEATURES = (
    ("AVX2", ("avx2",)), ("AVX-512", ("avx512f",)), ("AVX-VNNI", ("avx_vnni",)),
    ("AVX512-VNNI", ("avx512_vnni",)), ("AVX512-BF16", ("avx512_bf16",)),
    ("AMX", ("amx_int8", "amx_bf16", "amx_tile")),
    ("NEON", ("asimd", "neon")), ("DOTPROD", ("asimddp", "dotprod")), ("I8MM", ("i8mm",)), ("SVE", ("sve",)),
    ("SME", ("sme",)),
)
#: /proc/cpuinfo's AMX flags (Intel Sapphire Rapids and later); ggml's AMX kernels run where they are
AMX_FLAGS = ("amx_int8", "amx_bf16", "amx_tile")
#: macOS sysctl names for the same features (hw.optional.*), mapped to /proc/cpuinfo's spelling
_SYSCTL_FLAGS = {"hw.optional.avx2_0": "avx2", "hw.optional.avx512f": "avx512f", "hw.optional.neon": "asimd",
                 "hw.optional.arm.FEAT_DotProd": "asimddp", "hw.optional.arm.FEAT_I8MM": "i8mm",
                 "hw.optional.arm.FEAT_SME": "sme"}


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags in /proc/cpuinfo's spelling (``avx2``, ``amx_int8``, ``asimddp`` ...).

    Linux: the ``flags`` (x86) or ``Features`` (ARM) line of /proc/cpuinfo (or
    ``cpuinfo``, its text, as the tests give it); macOS: ``sysctl``'s
    ``hw.optional`` features; elsewhere, or when neither can be read, empty.
    """
    if cpuinfo is None and platform.system() == "Darwin":
        return _sysctl_flags()
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                cpuinfo = fh.read()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return frozenset()


def _sysctl_flags() -> frozenset[str]:
    import subprocess

    try:
        out = subprocess.run(["sysctl", "-a"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    flags: set[str] = set()
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in _SYSCTL_FLAGS and value == "1":
            flags.add(_SYSCTL_FLAGS[key])
        elif key in ("machdep.cpu.features", "machdep.cpu.leaf7_features"):
            flags.update(w.lower().replace(".", "_") for w in value.split())
    return frozenset(flags)


def kernel_features(flags: Iterable[str] | None = None) -> list[str]:
    """The features among ``flags`` (default: this CPU's) that pick ggml's CPU kernels: AVX2, AVX-512, AMX ..."""
    have = set(cpu_flags() if flags is None else flags)
    return [name for name, spellings in KERNEL_FEATURES if have & set(spellings)]


def has_amx(flags: Iterable[str] | None = None) -> bool:
    """Whether the CPU has Intel AMX (``amx_int8``/``amx_bf16``/``amx_tile``)."""
    return bool(set(cpu_flags() if flags is None else flags) & set(AMX_FLAGS))


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts() -> list[Fact]:
    n = default_threads()
    source = f"${THREADS_VARIABLE}" if os.environ.get(THREADS_VARIABLE, "").strip() not in ("", "0") else \
        "every core this process may use"
    return [
        Fact("machine", "cpu", cpu_name(), f"CPU: {cpu_name()} ({os.cpu_count() or '?'} cores, {platform.machine()})",
             "info"),
        Fact("machine", "cpu_features", kernel_features(),
             "CPU features that pick kernels: " + (", ".join(kernel_features()) or "none of AVX2, AVX-512, AMX, "
                                                   "NEON, DOTPROD read") + (" (no AMX)" if is_x86() and not has_amx() else ""),
             "info"),
        Fact("machine", "os", f"{platform.system()} {platform.release()}",
             f"OS: {platform.system()} {platform.release()}, Python {platform.python_version()}", "info"),
        Fact("machine", "threads", n,
             f"threads: a run with -t 0 uses {n} ({source}); the thread count can change the logits on the CPU, "
             "so every trace records the one it used", "info"),
    ]


def gather(settings: EngineSettings | None = None, *, engines: Iterable[str] | None = None,
           deep: bool = True) -> list[Fact]:
    """Every engine's facts, then the machine's.  ``deep`` allows slower checks (loading a model)."""
    settings = settings or EngineSettings()
    facts: list[Fact] = []
    for name in engines or backend_names():
        try:
            be = get_backend(name)
        except Exception as exc:  # an engine that cannot even be constructed is reported, not raised
            facts.append(Fact(name, "usable", False, f"{name}: not usable here: {exc}", "info"))
            continue
        try:
            facts.extend(be.setup_facts(settings, deep=deep))
        except Exception as exc:
            facts.append(Fact(name, "usable", False, f"{name}: its check failed: {type(exc).__name__}: {exc}",
                              "warn"))
    facts.extend(machine_facts())
    return facts


def worst(facts: Iterable[Fact]) -> str:
    order = {s: i for i, s in enumerate(STATUSES)}
    return max((f.status for f in facts), key=lambda s: order.get(s, 0), default="ok")


MARK = {"ok": "ok  ", "info": "    ", "warn": "WARN", "problem": "FAIL"}


def format_facts(facts: Iterable[Fact]) -> str:
    lines: list[str] = []
    topic = None
    for f in facts:
        if f.topic != topic:
            topic = f.topic
            lines.append("" if lines else "")
            lines.append(f"[{topic}]")
        lines.append(f"  {MARK.get(f.status, '    ')}  {f.text}")
        if f.advice:
            for ln in f.advice.splitlines():
                lines.append(f"          {ln}")
    return "\n".join(lines).strip("\n")


def environment_facts(facts: Iterable[Fact]) -> dict[str, Any]:
    """The facts as a trace's ``environment["setup"]`` block: {topic.name: value}."""
    return {f"{f.topic}.{f.name}": f.value for f in facts}


# -- GPU builds ----------------------------------------------------------------------------
GPU_BUILDS = {
    "vulkan": ('CMAKE_ARGS="-DGGML_VULKAN=on"', "Vulkan (AMD incl. Strix Halo, Intel, NVIDIA)"),
    "rocm": ('CMAKE_ARGS="-DGGML_HIP=on -DAMDGPU_TARGETS=<your gfx target, e.g. gfx1151>"', "ROCm / HIP (AMD)"),
    "cuda": ('CMAKE_ARGS="-DGGML_CUDA=on"', "CUDA (NVIDIA)"),
    "metal": ('CMAKE_ARGS="-DGGML_METAL=on"', "Metal (Apple silicon)"),
}
REINSTALL = "pip install --force-reinstall --no-cache-dir --no-binary llama-cpp-python llama-cpp-python==0.3.36"


def likely_gpu_apis() -> list[str]:
    """The GPU APIs this machine probably wants, most likely first (a guess from what is visible)."""
    if platform.system() == "Darwin":
        return ["metal"]
    apis: list[str] = []
    if os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidiactl"):
        apis.append("cuda")
    if os.path.exists("/dev/kfd"):
        apis.append("rocm")
    apis.append("vulkan")
    for a in ("cuda", "rocm"):
        if a not in apis:
            apis.append(a)
    return apis


def gpu_build_advice() -> str:
    """The rebuild lines for a GPU build, the likely one first (``--no-cache-dir`` so pip cannot reuse a CPU wheel)."""
    lines = []
    for api in likely_gpu_apis():
        cmake, what = GPU_BUILDS[api]
        lines.append(f"{what}: {cmake} {REINSTALL}")
    return "\n".join(lines)
