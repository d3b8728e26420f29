"""llama.cpp's known ways to kill its worker, for the account of a dead one (:mod:`specview.core.worker.death`).

:meth:`LlamaBackend.death_causes <specview.backends.llama_cpp.backend.LlamaBackend.death_causes>`
hands these to the worker's proxy; each matches on the account (its signal,
native frames, what the worker was doing) and the CPU's flags, and says what
to try.  The settings they read are recorded in the account with them.
"""

from __future__ import annotations

import re
from typing import Any

from ...core.config import EngineSettings
from ...core.worker.death import DeathCauses, KnownCause

_PASS = re.compile(r"a (\d+)-token pass")


def _amx(acc: dict[str, Any], flags: frozenset[str]) -> bool:
    if acc.get("signal") not in ("SIGSEGV", "SIGBUS"):
        return False
    fn = (acc.get("native_function") or "") + " ".join(acc.get("native_frames") or [])
    if "amx" in fn.lower():
        return True
    m = _PASS.search(acc.get("activity") or "")
    multi = m is not None and int(m.group(1)) >= 2
    return multi and any(f.startswith("amx") for f in flags) and not acc.get("no_repack")


def _vulkan_driver(acc: dict[str, Any], flags: frozenset[str]) -> bool:
    frames = " ".join(acc.get("native_frames") or []) + (acc.get("native_function") or "")
    return acc.get("signal") in ("SIGSEGV", "SIGBUS", "SIGABRT") and (
        "libvulkan" in frames or "vk_icd" in frames or "lvp_" in frames or "radv" in frames)


def _ggml_assert(acc: dict[str, Any], flags: frozenset[str]) -> bool:
    return acc.get("signal") == "SIGABRT" and bool(acc.get("assert"))


CAUSES: tuple[KnownCause, ...] = (
    KnownCause(
        "amx-repack", _amx,
        cause="ggml's AMX kernels crash on multi-token passes of quantized models on Intel CPUs with AMX "
              "(llama.cpp issue #20824, unfixed; also ollama #17205)",
        advice="run with --no-repack (-nr): the weights then stay in the plain CPU buffer and the AMX "
               "kernels are not used",
        retry={"no_repack": True}),
    KnownCause(
        "vulkan-driver", _vulkan_driver,
        cause="the crash is inside the Vulkan driver (Mesa's lavapipe 22.3 crashed this way; 25.0 ran)",
        advice="update the GPU driver (Mesa from your distribution's backports), or run on the CPU with -ngl 0",
        retry={"gpu_layers": 0}),
    KnownCause(
        "ggml-assert", _ggml_assert,
        cause="llama.cpp stopped on a failed assertion (GGML_ASSERT)",
        advice="the assertion names what llama.cpp refused; if the model file and settings are valid, "
               "report it to llama.cpp with this trace"),
)


def death_causes(settings: EngineSettings | None) -> DeathCauses:
    """llama.cpp's known causes, read against whether ``settings`` keep the weights unrepacked."""
    return DeathCauses(CAUSES, {"no_repack": getattr(settings, "no_repack", None)})
