"""Known crashers, found before they bite: the AMX probe and the no-repack default it decides.

On Intel CPUs with AMX (``amx_int8`` in /proc/cpuinfo) a natively built
llama.cpp compiles ggml's AMX kernels, and every decode of two or more tokens
of a quantized model with repacked weights dies in ``ggml_backend_amx_mul_mat``
(llama.cpp #20824, unfixed upstream).  Loading the weights with
``use_extra_bufts = false`` (llama.cpp's ``--no-repack``) avoids it.

:func:`probe_multi_token_decode` decodes a few tokens at once on a small
quantized model with repacking on, past any GPU's pinned host buffer
(``no_host``: with a GPU visible llama.cpp would put the CPU's weights there and
repack none, and a pass there would wrongly clear a CPU-only run of the same
build).  It runs in a throwaway worker process
(:func:`specview.core.worker.run_isolated`), so a crash costs that process
only, and its result is cached per llama.cpp build and CPU.  The probe is
needed, and run, only on x86 CPUs with AMX; elsewhere the question does not
arise.  Where it crashed, runs default to no repack (:func:`repack_decision`)
and say so; an explicit ``--no-repack`` / ``--repack`` always wins.

``$SPECVIEW_REPACK_PROBE`` plants the probe's result on any CPU: ``crashed``
makes this machine decide what an AMX machine decides (no repack), and a
model load that still gets repacked weights (a ``CPU_REPACK`` buffer) fails
as the first multi-token pass would there (:func:`check_repacked_load`);
``ok`` plants a probe that ran fine.  The test suite runs once more with
``crashed`` so a test that loads a model past the resolution fails on every
CPU, not only on the ones that crash.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from ...core.config import EngineSettings
from ...core.doctor import AMX_FLAGS, cpu_flags, cpu_name, has_amx, is_x86
from ...core.errors import EngineCrashed, SpecviewError
from ...core.facts import Fact
from ...core.paths import cache_dir
from ...core.registry import Runner
from ...core.resolve import Decision
from .plant import PLANT_VARIABLE, REPACKED_BUFFERS, planted, planted_result

#: the engines whose weights llama.cpp's CPU backend repacks (both run the same ggml code)
LLAMA_ENGINES = ("llama.cpp", "llama-server")
PROBE_TOKENS = 4
UPSTREAM = "llama.cpp #20824"
#: the demo quantizations the probe loads, first found first (Q4_0 and Q4_K are both repacked, and AMX-packed)
PROBE_QUANTS = ("Q4_0", "Q4_K_M", "Q8_0")
PROBE_TIMEOUT = 180.0
CACHE_NAME = "multi-token-decode.json"
#: part of the cache's key: a result of an earlier probe (one a visible GPU could clear) is not read as this one's
PROBE_VERSION = 2


# -- the build and the CPU ----------------------------------------------------------------------
def libllama_path() -> Path | None:
    """The libllama this llama-cpp-python loads (``$LLAMA_CPP_LIB_PATH`` first, as llama-cpp-python does)."""
    import importlib.util

    dirs: list[Path] = []
    env = os.environ.get("LLAMA_CPP_LIB_PATH")
    if env:
        dirs.append(Path(env))
    spec = importlib.util.find_spec("llama_cpp")
    if spec is not None and spec.origin:
        dirs.append(Path(spec.origin).parent / "lib")
    for d in dirs:
        for name in ("libllama.so", "libllama.dylib", "llama.dll"):
            if (d / name).exists():
                return (d / name).resolve()
    return None


def build_identity(flags: frozenset[str] | None = None) -> dict[str, Any]:
    """What the probe's answer depends on: the llama.cpp build (path, size, mtime), the CPU's name and flags."""
    lib = libllama_path()
    st = lib.stat() if lib is not None else None
    flags = cpu_flags() if flags is None else flags
    return {
        "probe": PROBE_VERSION,
        "libllama": str(lib) if lib else None,
        "libllama_size": st.st_size if st else None,
        "libllama_mtime": int(st.st_mtime) if st else None,
        "cpu": cpu_name(),
        "cpu_flags": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16],
    }


def identity_key(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def probe_needed(flags: frozenset[str] | None = None) -> bool:
    """Only x86 CPUs with AMX meet the crash; everywhere else the probe is not run (a planted result stands in)."""
    return planted() is not None or (is_x86() and has_amx(cpu_flags() if flags is None else flags))


# -- the probe itself (run in a worker) -----------------------------------------------------------
def probe_model() -> Path:
    """A small quantized model: a demo quantization already on disk, else the demo's Q4_0 derived."""
    from . import demo

    for q in PROBE_QUANTS:
        p = demo.derived_path(q)
        if p.exists():
            return p
    return demo.resolve(f"demo:{PROBE_QUANTS[0]}")


def _probe_load(path_or_demo: str | os.PathLike[str] | None, *, no_host: bool = True) -> Any:
    """The probe's model, loaded as the probe loads it: on the CPU, repacking on, and (``no_host``) past a GPU's
    pinned host buffer.  With a GPU visible llama.cpp would put the CPU's weights in that buffer and repack none of
    them, so a pass there would wrongly clear a CPU-only run of the same build (a hidden GPU, ``-ngl 0`` with
    ``GGML_VK_VISIBLE_DEVICES`` unset), which the cached result is read for."""
    from . import demo
    from .model import LlamaModel

    path = probe_model() if path_or_demo is None else demo.resolve(str(path_or_demo))
    return LlamaModel(path, gpu_layers=0, no_repack=False, no_host=no_host)


def probe_buffers(path_or_demo: str | os.PathLike[str] | None = None, *, no_host: bool = True) -> dict[str, float]:
    """The weight buffers of the probe's load (``no_host=False``: of a load that takes a GPU's host buffer), MiB
    each, with nothing decoded: what the probe exercises, safe to ask on a CPU whose repacked kernels crash."""
    model = _probe_load(path_or_demo, no_host=no_host)
    try:
        return dict(model.weight_buffers)
    finally:
        model.close()


def probe_multi_token_decode(path_or_demo: str | os.PathLike[str] | None = None, *,
                             n_tokens: int = PROBE_TOKENS) -> dict[str, Any]:
    """Load a quantized model as :func:`_probe_load` does and decode ``n_tokens`` tokens in one pass.

    Returns what ran (``{"ok": True, "model": ..., "n_tokens": ..., "buffers": ..., "seconds": ...}``).
    On an AMX CPU with a native build this is where the process dies: call it
    through :func:`run_probe` (a throwaway worker), never in a process you need.
    """
    from .engine import LlamaEngine

    t0 = time.perf_counter()
    model = _probe_load(path_or_demo)
    path = model.path
    buffers = dict(model.weight_buffers)
    try:
        # every setting given (repacking on, as the probe must test it): nothing is left for a decision to make
        settings = Runner.resolve_settings(EngineSettings(gpu_layers=0, n_batch=64, n_ubatch=64, no_repack=False,
                                                          rollback="auto"), backend="llama.cpp", measure=False)[0]
        eng = LlamaEngine(model, settings, n_ctx=256)
        try:
            toks = model.tokenize("The quick brown fox jumps over the lazy dog")[:n_tokens]
            while len(toks) < n_tokens:
                toks.append(toks[-1])
            rows = eng.eval(toks, rows=range(n_tokens))
            finite = bool(all(float(abs(r).max()) < float("inf") for r in rows))
        finally:
            eng.close()
        facts = model.facts()
    finally:
        model.close()
    return {"ok": True, "model": str(path), "quantization": facts.get("quantization"), "n_tokens": n_tokens,
            "finite": finite, "buffers": buffers, "repacked": sorted(b for b in buffers if b in REPACKED_BUFFERS),
            "seconds": round(time.perf_counter() - t0, 3)}


# -- the cached verdict ---------------------------------------------------------------------------
class ProbeCache:
    """A JSON file of results keyed by what they were measured on, in the cache's ``probes`` folder.

    An unreadable file reads as empty and an unwritable one is skipped: a lost cache costs a probe
    next time, never the run.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def path(self) -> Path:
        return cache_dir() / "probes" / self.name

    def read(self) -> dict[str, Any]:
        try:
            d = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return d if isinstance(d, dict) else {}

    def get(self, key: str) -> dict[str, Any] | None:
        r = self.read().get(key)
        return r if isinstance(r, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        from ...core.trace import write_atomic

        d = self.read()
        d[key] = value
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(d, indent=1, default=str) + "\n")
        except (OSError, SpecviewError):
            pass


CACHE = ProbeCache(CACHE_NAME)


def cached_result(identity: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The probe's cached result for this build and CPU (the planted one, where one is), or None when it has not
    run here."""
    plant = planted_result()
    if plant is not None:
        return plant
    return CACHE.get(identity_key(identity or build_identity()))


def run_probe(*, timeout: float = PROBE_TIMEOUT, isolate: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Run the probe in a throwaway worker and cache what happened (``crashed`` true or false)."""
    if isolate is None:
        from ...core.worker import run_isolated as isolate
    identity = build_identity()
    t0 = time.perf_counter()
    try:
        result: dict[str, Any] = dict(isolate(probe_multi_token_decode, None, timeout=timeout))
        result["crashed"] = False
    except EngineCrashed as exc:
        result = {"crashed": True, "signal": exc.signal, "exitcode": exc.exitcode, "activity": exc.activity,
                  "known_cause": exc.known_cause, "message": str(exc).splitlines()[0] if str(exc) else ""}
    except SpecviewError as exc:  # no model to probe with, say: not a crash, and not cached
        return {"crashed": False, "skipped": str(exc), "identity": identity}
    result.update(identity=identity, n_tokens=result.get("n_tokens", PROBE_TOKENS),
                  probe_seconds=round(time.perf_counter() - t0, 3), when=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    CACHE.put(identity_key(identity), result)
    return result


def probe_result(*, run: bool = True) -> dict[str, Any] | None:
    """The probe's result for this build and CPU: cached, else run now (``run``); None where it is not needed."""
    if not probe_needed():
        return None
    cached = cached_result()
    if cached is not None or not run:
        return cached
    return run_probe()


def reason_text(result: dict[str, Any]) -> str:
    """The one line a run prints and records when the probe's crash made it default to no repack."""
    sig = result.get("signal") or f"exit {result.get('exitcode')}"
    if result.get("planted"):
        return (f"no repack by default: ${PLANT_VARIABLE}=crashed plants a {result.get('n_tokens', PROBE_TOKENS)}-"
                f"token decode of repacked weights that crashed ({sig}; the AMX bug, {UPSTREAM}); --repack turns "
                "repacking back on")
    return (f"no repack by default: a {result.get('n_tokens', PROBE_TOKENS)}-token decode of a quantized model "
            f"with repacked weights crashed this llama.cpp build on this CPU ({sig}; the AMX bug, {UPSTREAM}); "
            "--repack turns repacking back on")


def repack_decision(settings: EngineSettings, *, measure: bool = True) -> Decision | None:
    """The machine's ``no_repack`` for settings that leave it unset: on, with why, where the probe crashed.

    ``measure=False`` reads only a cached probe result.  This is the one place
    the no-repack default is decided; both llama.cpp engines ask it through
    their backend's ``decide`` (:mod:`specview.core.resolve`).
    """
    if settings.no_repack is not None:
        return None
    r = probe_result(run=measure)
    if r and r.get("crashed"):
        return Decision("no_repack", True, reason_text(r))
    return None


# -- what doctor says ---------------------------------------------------------------------------
def build_uses_amx(system_info: str | None) -> bool:
    """Whether llama.cpp's system info reports AMX kernels (``AMX_INT8 = 1``)."""
    for part in (system_info or "").replace("CPU :", "|").split("|"):
        name, _, val = part.partition("=")
        if name.strip().startswith("AMX") and val.strip() == "1":
            return True
    return False


def setup_facts(system_info: str | None, *, deep: bool = True) -> list[Fact]:
    """doctor's lines: AMX on the CPU and in the build, and the multi-token decode probe (run only where needed)."""
    name = "llama.cpp"
    flags = cpu_flags()
    amx = sorted(set(flags) & set(AMX_FLAGS))
    uses = build_uses_amx(system_info)
    facts = [Fact(name, "amx", {"cpu": amx, "build": uses},
                  ("CPU has AMX (" + ", ".join(amx) + ")" if amx else "CPU has no AMX")
                  + ("; this llama.cpp build uses it (AMX_INT8 in its system info)" if uses else
                     "; this llama.cpp build does not report AMX kernels"), "info")]
    if not probe_needed(flags):
        facts.append(Fact(name, "repack_probe", None,
                          "multi-token decode probe: not needed here (the known crash is on x86 CPUs with AMX)",
                          "info"))
        return facts
    r = cached_result() if not deep else probe_result(run=True)
    if r is None:
        facts.append(Fact(name, "repack_probe", None, "multi-token decode probe: not run yet (doctor without "
                          "--quick runs it, in a throwaway worker)", "info"))
    elif r.get("crashed"):
        facts.append(Fact(name, "repack_probe", r,
                          f"multi-token decode probe: a {r.get('n_tokens', PROBE_TOKENS)}-token decode of a quantized "
                          f"model with repacked weights CRASHED ({r.get('signal') or r.get('exitcode')}); runs "
                          "default to --no-repack here", "warn",
                          advice=f"the AMX bug ({UPSTREAM}): weights stay in the plain CPU buffer with --no-repack; "
                          "--repack forces repacking (and the crash)"))
    elif r.get("skipped"):
        facts.append(Fact(name, "repack_probe", r, f"multi-token decode probe: not run ({r['skipped']})", "info"))
    else:
        where = (f" ({', '.join(r['repacked'])} buffer)" if r.get("repacked") else
                 " (none of its weights were repacked by this build, so the repacked kernels were not exercised)"
                 if "repacked" in r else "")
        facts.append(Fact(name, "repack_probe", r,
                          f"multi-token decode probe: a {r.get('n_tokens', PROBE_TOKENS)}-token decode of "
                          f"{Path(str(r.get('model'))).name} with repacking on{where} ran fine; repacking stays on",
                          "ok"))
    return facts
