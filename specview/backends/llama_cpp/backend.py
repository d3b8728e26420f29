"""The llama.cpp backend as the registry sees it: GGUF files, ``demo:QUANT`` names, a Session runner."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ...core.config import ConfigError, EngineSettings, RunConfig, environment_settings, fill_plain
from ...core.doctor import gpu_build_advice
from ...core.engine import WrappedModel
from ...core.errors import SpecviewError
from ...core.facts import Fact
from ...core.demo import is_demo_name
from ...core.inprocess import InProcessBackend
from ...core.registry import Runner
from ...core.resolve import DecidedSettings, Decision, require_decided
from . import demo
from .engine import LlamaEngine, model_memory
from .lib import LIB_PATH_VARIABLE, _lib, apply_environment, builds_backend, llama_environment
from .memory import (ATTENTION, AUTO, SNAPSHOTS, check_mode, decide_rollback, draft_rollback, file_architecture,
                     memory_kind)
from .model import LlamaModel, has_mtp_heads
from .demo_pick import cached_pick, pick_demo_target
from .probe import repack_decision
from .probe import setup_facts as probe_facts


class LlamaLoaded(WrappedModel):
    """A loaded GGUF file; every arm, drafter and replay opens its own context on it."""

    def new_engine(self, settings: DecidedSettings, n_ctx: int) -> LlamaEngine:
        return LlamaEngine(self.model, require_decided(settings, "a llama.cpp context"), n_ctx=n_ctx)

    def draft_settings(self, settings: DecidedSettings) -> tuple[DecidedSettings, str]:
        """llama-server opens its draft context with ``n_rs_seq = 0`` (common/common.cpp): a draft model's memory
        never keeps snapshots and rolls back as its own memory does, seq_rm for a KV cache, checkpoint and replay
        for a recurrent state, whatever the target's takes. ``(settings, why)``: the draft context's settings, and
        one line where its rollback differs from the target's."""
        arch, kind = model_memory(self.model)
        mode, why = draft_rollback(arch, kind)
        if settings.rollback == mode or (settings.rollback == AUTO and kind == ATTENTION):
            return settings, ""
        return replace(settings, rollback=mode), (f"the draft context: {mode}, as llama-server opens it (n_rs_seq = 0, "
                                                  f"no snapshots): {why}")

    def observed_engine(self, settings: DecidedSettings, n_ctx: int, selection: str = "all") -> LlamaEngine:
        """A context whose passes can be observed node by node (``specview locate``)."""
        from .graph import ObservedEngine

        return ObservedEngine(self.model, require_decided(settings, "an observed llama.cpp context"), n_ctx=n_ctx,
                              selection=selection)


class LlamaBackend(InProcessBackend):
    """GGUF files through llama-cpp-python; ``demo:QUANT`` names the bundled demo model."""

    name = "llama.cpp"
    label = "llama.cpp"
    model_kind = "gguf"

    def __init__(self) -> None:
        _lib()  # fail now, clearly, if llama-cpp-python is missing

    def resolve(self, name: str, *, progress=None) -> str:
        return str(demo.resolve(name, progress=progress))

    def decide(self, cfg: RunConfig, *, measure: bool = True, default_target: bool = False,
               progress=None) -> list[Decision]:
        """Every decision of this engine, for runs and jobs alike: no repack where a multi-token decode of repacked
        weights crashed this build on this CPU (:mod:`.probe`); how a rejected draft leaves the target's memory
        (:mod:`.memory`: what llama-server does for the target's architecture and this spec type, read from the
        files' headers); and, with ``default_target``, the demo quantization whose verify passes can fork on this
        build, on the engine settings the run will have."""
        out: list[Decision] = []
        repack = repack_decision(cfg.engine, measure=measure)
        if repack is not None:
            out.append(repack)
        if cfg.engine.rollback in (None, AUTO):  # auto: what llama-server does, decided here
            target, draft = self._architectures(cfg)
            # a KV cache alone (target and draft model) has one rollback, seq_rm: nothing to decide, nothing to say
            if any(memory_kind(a) != ATTENTION for a in (target, draft) if a):
                value, why = decide_rollback(target, draft, cfg.spec_type, cfg.n_max)
                out.append(Decision("rollback", value, why))
        if default_target and is_demo_name(cfg.target):
            settings = cfg.engine if repack is None else replace(cfg.engine, no_repack=repack.value)
            settings = fill_plain(settings)
            pick = pick_demo_target(settings, default=cfg.target, progress=progress) if measure else \
                cached_pick(settings, cfg.target)
            if pick is not None and pick.reason:  # the default kept, because it can fork here, is no decision
                out.append(Decision("target", pick.target, pick.reason))
        return out

    def check(self, cfg: RunConfig) -> None:
        """A rollback the target's (or the draft model's) memory cannot run is refused before anything loads."""
        super().check(cfg)
        mode = cfg.engine.rollback
        if mode in (None, AUTO):
            return
        if mode == SNAPSHOTS and cfg.n_max > 0 and cfg.engine.n_ubatch <= cfg.n_max + 1:
            # llama-memory-recurrent.cpp: the trailing (1 + n_rs_seq) tokens of a sequence stay in one ubatch,
            # and split_equal asserts n_ubatch > 1 + n_rs_seq: a smaller -ub aborts the process
            raise ConfigError(f"--rollback snapshots keeps the states of the last n_max = {cfg.n_max} positions, "
                              f"which llama.cpp computes in one micro-batch with the token before them: -ub "
                              f"{cfg.engine.n_ubatch} must be more than n_max + 1 = {cfg.n_max + 1} (llama.cpp "
                              "aborts otherwise: GGML_ASSERT(n_ubatch > n_keep_tail)); raise -ub, or use "
                              "--rollback checkpoint", setting="n_ubatch")
        target, draft = self._architectures(cfg)
        for arch, role in ((target, "target"), (draft, "draft model")):
            if arch is None:
                continue
            try:
                check_mode(mode, arch)
            except ConfigError as exc:
                raise ConfigError(f"{exc} (the {role})", setting="rollback") from None

    def _architectures(self, cfg: RunConfig) -> tuple[str | None, str | None]:
        """The target's and the draft model's architectures (None: none, or unreadable), from their headers."""
        def arch(name: str | None) -> str | None:
            if not name:
                return None
            try:  # a demo name: the shipped file's (its quantizations share it); nothing is derived here
                return file_architecture(demo.shipped_path() if is_demo_name(name) else demo.resolve(name))
            except SpecviewError:
                return None

        return arch(cfg.target), arch(cfg.draft) if cfg.uses_draft_model else None

    def has_mtp_heads(self, target: str) -> bool:
        return has_mtp_heads(target)

    def demo_models(self, *, derive: list[str] | None = None, progress=None) -> tuple[str, list[dict[str, Any]]]:
        """The demo cache folder and its names (``demo:QUANT`` and the tiny drafters), after deriving ``derive``."""
        for q in derive or ():
            demo.resolve(f"demo:{q}", progress=progress)
        return str(demo.demo_dir()), demo.available()

    def derive_variant(self, source: str, quant: str, *, dest: str | None = None, progress=None) -> str:
        """``dest`` written as ``quant`` from ``source`` with llama.cpp's own quantizer."""
        from .quantize import quantize

        if dest is None:
            raise ConfigError("a GGUF quantization needs the file to write", setting="target")
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        return str(quantize(source, dest, quant))

    def model_key(self, name: str, settings: DecidedSettings) -> tuple:
        # repacked and plain weights live in different buffers: a model loaded one way cannot serve the other
        settings = require_decided(settings, "LlamaBackend.model_key")
        return (str(Path(name).expanduser().resolve()), settings.gpu_layers, settings.no_repack)

    def load(self, name: str, settings: DecidedSettings) -> LlamaLoaded:
        settings = require_decided(settings, "LlamaBackend.load")  # a load never runs on an undecided setting
        late = apply_environment(self.worker_env(settings))
        if late:
            raise ConfigError(
                f"{', '.join(late)}: llama.cpp is already loaded in this process with another value, and ggml reads "
                "it only when it starts; run with it in a new process (set it in the environment, or start again)",
                setting=next(k for k, v in environment_settings().items() if v == late[0]))
        return LlamaLoaded(LlamaModel(name, gpu_layers=settings.gpu_layers, no_repack=settings.no_repack))

    def environment(self) -> dict[str, Any]:
        return llama_environment()

    def builds_backend(self, api: str) -> bool:
        """Whether this llama.cpp build has the ggml backend ``api`` ("vulkan", "cuda" ...), from its files."""
        return builds_backend(api)

    def worker_env(self, settings: EngineSettings) -> dict[str, str]:
        """ggml's start-up knobs these settings ask for (``GGML_VK_*``): the engine's process must have them in its
        environment before llama.cpp loads, since ggml-vulkan reads them once, when it starts."""
        return settings.environment()

    def death_causes(self, settings: EngineSettings | None) -> Any:
        """llama.cpp's known ways to kill its worker (:mod:`.crashes`: the AMX kernels, a Vulkan driver, a
        failed GGML_ASSERT), read against whether ``settings`` repack the weights."""
        from .crashes import death_causes

        return death_causes(settings)

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


#: ggml backends that compute on the CPU (every other one is a GPU API: Vulkan, CUDA, ROCm, Metal, SYCL ...)
HOST_BACKENDS = ("CPU", "BLAS", "RPC")


def gpu_backends(backends: list[str]) -> list[str]:
    return [b for b in backends if b.upper() not in HOST_BACKENDS]


def device_text(d: dict[str, Any]) -> str:
    """One device as doctor names it: ``Vulkan0 (llvmpipe (LLVM 19.1.7, 256 bits), 24105 MiB, fp16, no int dot)``."""
    bits = [d.get("description") or d.get("type") or "?"]
    if d.get("memory_mib"):
        bits.append(f"{d['memory_mib']} MiB")
    if "vk_fp16" in d:
        bits.append("fp16" if d["vk_fp16"] else "no fp16")
    if "vk_int_dot" in d:  # decides whether quantized mat-vec takes MMVQ (integer dot) or the float path
        bits.append("int dot" if d["vk_int_dot"] else "no int dot")
    if "vk_matrix_cores" in d:
        bits.append(f"matrix cores: {d['vk_matrix_cores']}")
    return f"{d['name']} ({', '.join(str(b) for b in bits)})"


def setup_facts(settings: EngineSettings, *, deep: bool = True, devices: list[dict[str, str]] | None = None,
                placement: dict[str, int] | None = None, backends: list[str] | None = None) -> list[Fact]:
    """What ``specview doctor`` says of llama.cpp here.  ``devices``/``placement``/``backends`` replace what the
    build reports (the tests fake a GPU machine with them; faked devices imply their backends)."""
    late = apply_environment(settings.environment())  # the knobs ggml reads at start-up, before it starts here
    env = llama_environment()
    if backends is None:
        backends = list(env.get("ggml_backends") or []) if devices is None else \
            sorted({str(d["name"]).rstrip("0123456789") for d in devices})
    devices = env["ggml_devices"] if devices is None else devices
    gpus = [d for d in devices if d.get("type", "CPU" if d.get("name") == "CPU" else "GPU") != "CPU"]
    name = "llama.cpp"
    lib = env.get("llama_lib_dir")
    where = f" (libllama from ${LIB_PATH_VARIABLE}={lib})" if lib and env.get("ggml_env", {}).get(LIB_PATH_VARIABLE) \
        else ""
    facts = [
        Fact(name, "version", env.get("llama_cpp_python"), f"llama-cpp-python {env.get('llama_cpp_python')}", "ok"),
        Fact(name, "backends", backends,
             "built with the ggml backends: " + (", ".join(backends) or "unknown") + where, "info"),
        Fact(name, "devices", [d["name"] for d in devices],
             "sees the devices: " + (", ".join(device_text(d) for d in devices) or "none reported"), "info"),
    ]
    for d in gpus:
        if d.get("software"):
            facts.append(Fact(name, "software_device", d["name"],
                              f"{d['name']} is a CPU rasteriser ({d.get('description')}), not a GPU: the Vulkan path "
                              "is real (llama.cpp's shaders, its kernel choice by width, the offload), the numerics "
                              "and the speed are not a GPU's", "info"))
    knobs = {k: v for k, v in (env.get("ggml_env") or {}).items() if k.startswith("GGML_VK_")}
    if knobs or late:
        facts.append(Fact(name, "ggml_env", knobs, "ggml's start-up knobs in effect: "
                          + (" ".join(f"{k}={v}" for k, v in knobs.items()) or "none"), "warn" if late else "info",
                          advice=f"{', '.join(late)} came too late: llama.cpp had started in this process" if late
                          else None))
    feats = cpu_features(env.get("llama_cpp_system_info"))
    facts.append(Fact(name, "cpu_features", feats,
                      "CPU features its kernels use: " + (", ".join(feats) or "none reported")
                      + " (they pick which kernel computes a batch, so they move the numerics)", "info"))
    facts.extend(probe_facts(env.get("llama_cpp_system_info"), deep=deep))  # AMX, and the crash probe
    asked = settings.gpu_layers
    built = gpu_backends(backends)
    if built and not gpus:
        hint = ("check the driver (`vulkaninfo --summary`); ggml-vulkan skips a CPU-type device (Mesa's lavapipe) "
                "unless GGML_VK_VISIBLE_DEVICES names it (--vk-visible-devices 0)") if "Vulkan" in built else \
            "check the driver (`rocminfo`, `nvidia-smi`)"
        facts.append(Fact(name, "gpu", False,
                          f"built with {', '.join(built)}, but it sees no {'/'.join(built)} device: every layer runs "
                          "on the CPU", "problem" if asked > 0 else "warn" if asked < 0 else "info", advice=hint))
    elif not gpus:
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
                          "GPU backend present: " + ", ".join(d["name"] for d in gpus)
                          + (f" ({', '.join(built)})" if built else ""), "ok"))
    if deep:
        facts.append(_offload_fact(settings, gpus, placement))
    return facts


def layer_placement_of(path: str, gpu_layers: int, no_repack: bool = False) -> dict[str, int]:
    """Load ``path`` with ``gpu_layers`` and return how many layers llama.cpp put on each device."""
    model = LlamaModel(path, gpu_layers=gpu_layers, no_repack=no_repack)
    try:
        return dict(model.layer_devices)
    finally:
        model.close()


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
        from ...core.errors import EngineCrashed
        from ...core.worker import run_isolated

        try:  # a GPU driver that crashes on load costs the worker, not doctor
            no_repack = Runner.resolve_settings(settings, backend="llama.cpp")[0].no_repack  # as a run here loads it
            placement = run_isolated(layer_placement_of, str(path), ngl, no_repack, env=settings.environment(),
                                     timeout=600)
        except EngineCrashed as exc:
            return Fact(name, "offload", None, f"offload check (demo model, -ngl {'all' if ngl < 0 else ngl}): "
                        f"the engine crashed loading it: {str(exc).splitlines()[0]}", "problem",
                        advice="\n".join(str(exc).splitlines()[1:]) or None)
    total = sum(placement.values())
    on_gpu = sum(n for dev, n in placement.items() if not dev.upper().startswith("CPU"))
    where = ", ".join(f"{n} on {dev}" for dev, n in placement.items()) or "no placement reported"
    text = f"offload check (demo model, -ngl {'all' if ngl < 0 else ngl}): {where} of {total} layers"
    if gpus and ngl != 0 and on_gpu == 0:
        return Fact(name, "offload", placement, text, "problem",
                    advice="the build sees a GPU but no layer moved to it: check the driver (e.g. `vulkaninfo`, "
                    "`rocminfo`, `nvidia-smi`) and that -ngl is not 0")
    return Fact(name, "offload", placement, text, "ok" if (on_gpu or not gpus or ngl == 0) else "warn")
