"""The llama.cpp backend as the registry sees it: GGUF files, ``demo:QUANT`` names, a Session runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.config import EngineSettings
from ...core.doctor import gpu_build_advice
from ...core.engine import WrappedModel
from ...core.errors import SpecviewError
from ...core.facts import Fact
from ...core.inprocess import InProcessBackend
from . import demo
from .engine import LlamaEngine
from .lib import _lib, llama_environment
from .model import LlamaModel
from .probe import setup_facts as probe_facts


class LlamaLoaded(WrappedModel):
    """A loaded GGUF file; every arm, drafter and replay opens its own context on it."""

    def new_engine(self, settings: EngineSettings, n_ctx: int) -> LlamaEngine:
        return LlamaEngine(self.model, settings, n_ctx=n_ctx)

    def observed_engine(self, settings: EngineSettings, n_ctx: int, selection: str = "all") -> LlamaEngine:
        """A context whose passes can be observed node by node (``specview locate``)."""
        from .graph import ObservedEngine

        return ObservedEngine(self.model, settings, n_ctx=n_ctx, selection=selection)


class LlamaBackend(InProcessBackend):
    """GGUF files through llama-cpp-python; ``demo:QUANT`` names the bundled demo model."""

    name = "llama.cpp"
    label = "llama.cpp"
    model_kind = "gguf"

    def __init__(self) -> None:
        _lib()  # fail now, clearly, if llama-cpp-python is missing

    def resolve(self, name: str, *, progress=None) -> str:
        return str(demo.resolve(name, progress=progress))

    def model_key(self, name: str, settings: EngineSettings) -> tuple:
        # repacked and plain weights live in different buffers: a model loaded one way cannot serve the other
        return (str(Path(name).expanduser().resolve()), settings.gpu_layers, settings.no_repack)

    def load(self, name: str, settings: EngineSettings) -> LlamaLoaded:
        return LlamaLoaded(LlamaModel(name, gpu_layers=settings.gpu_layers, no_repack=settings.no_repack))

    def environment(self) -> dict[str, Any]:
        return llama_environment()

    def setup_facts(self, settings: EngineSettings, *, deep: bool = True) -> list[Fact]:
        return setup_facts(settings, deep=deep)


def cpu_features(system_info: str | None) -> list[str]:
    """The CPU features llama.cpp's kernels use on this build ("AVX2", "AVX512", "DOTPROD" ...), from its system info."""
    out: list[str] = []
    for part in (system_info or "").replace("CPU :", "|").split("|"):
        name, _, val = part.partition("=")
        if val.strip() == "1" and name.strip():
            out.append(name.strip())
    return out


def setup_facts(settings: EngineSettings, *, deep: bool = True, devices: list[dict[str, str]] | None = None,
                placement: dict[str, int] | None = None) -> list[Fact]:
    """What ``specview doctor`` says of llama.cpp here.  ``devices``/``placement`` replace what the build
    reports (the tests fake a GPU machine with them)."""
    env = llama_environment()
    devices = env["ggml_devices"] if devices is None else devices
    gpus = [d for d in devices if d.get("type", "CPU" if d.get("name") == "CPU" else "GPU") != "CPU"]
    name = "llama.cpp"
    facts = [
        Fact(name, "version", env.get("llama_cpp_python"), f"llama-cpp-python {env.get('llama_cpp_python')}", "ok"),
        Fact(name, "backends", env.get("ggml_backends"),
             "built with the ggml backends: " + (", ".join(env.get("ggml_backends") or []) or "unknown"), "info"),
        Fact(name, "devices", [d["name"] for d in devices],
             "sees the devices: " + (", ".join(f"{d['name']} ({d.get('description') or d.get('type')})"
                                               for d in devices) or "none reported"), "info"),
    ]
    feats = cpu_features(env.get("llama_cpp_system_info"))
    facts.append(Fact(name, "cpu_features", feats,
                      "CPU features its kernels use: " + (", ".join(feats) or "none reported")
                      + " (they pick which kernel computes a batch, so they move the numerics)", "info"))
    facts.extend(probe_facts(env.get("llama_cpp_system_info"), deep=deep))  # AMX, and the crash probe
    asked = settings.gpu_layers
    if not gpus:
        if asked > 0:
            facts.append(Fact(name, "gpu", False,
                              f"-ngl {asked} asks for a GPU, but this llama-cpp-python was built without a GPU backend: "
                              "every layer runs on the CPU", "problem",
                              advice="Rebuild llama-cpp-python for your GPU (a stale or missing CMAKE_ARGS silently "
                              "gives a CPU-only build):\n" + gpu_build_advice()))
        else:
            facts.append(Fact(name, "gpu", False, "no GPU backend in this build: runs on the CPU", "info",
                              advice=None if asked == 0 else "for a GPU build:\n" + gpu_build_advice()))
    else:
        facts.append(Fact(name, "gpu", [d["name"] for d in gpus],
                          "GPU backend present: " + ", ".join(d["name"] for d in gpus), "ok"))
    if deep:
        facts.append(_offload_fact(settings, gpus, placement))
    return facts


def _offload_fact(settings: EngineSettings, gpus: list[dict[str, str]], placement: dict[str, int] | None) -> Fact:
    """Load the demo's shipped GGUF with the asked -ngl and read back where its layers went."""
    name = "llama.cpp"
    ngl = settings.gpu_layers
    if placement is None:
        from ...core.demo import shipped_path

        try:
            path = shipped_path()
        except SpecviewError as exc:
            return Fact(name, "offload", None, f"offload not checked: {exc}", "info")
        model = LlamaModel(path, gpu_layers=ngl)
        try:
            placement = dict(model.layer_devices)
        finally:
            model.close()
    total = sum(placement.values())
    on_gpu = sum(n for dev, n in placement.items() if not dev.upper().startswith("CPU"))
    where = ", ".join(f"{n} on {dev}" for dev, n in placement.items()) or "no placement reported"
    text = f"offload check (demo model, -ngl {'all' if ngl < 0 else ngl}): {where} of {total} layers"
    if gpus and ngl != 0 and on_gpu == 0:
        return Fact(name, "offload", placement, text, "problem",
                    advice="the build sees a GPU but no layer moved to it: check the driver (e.g. `vulkaninfo`, "
                    "`rocminfo`, `nvidia-smi`) and that -ngl is not 0")
    return Fact(name, "offload", placement, text, "ok" if (on_gpu or not gpus or ngl == 0) else "warn")
