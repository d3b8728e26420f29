"""Every setting of a run, declared once.

Each field of :class:`EngineSettings` and :class:`RunConfig` carries its
default, its allowed values, llama.cpp's flag names, a help text and the app's
label in ``dataclasses.field(metadata=...)``.  Everything else is derived from
that one declaration:

* the CLI flags of ``run`` and ``matrix`` (``specview.commands.common``),
* the app's controls (``specview.gui.controls``),
* the matrix file's keys and axes (``specview.core.matrix.spec``),
* the trace's ``config`` block (:meth:`RunConfig.to_dict` / :meth:`RunConfig.from_dict`,
  the only converters there are).

Validation is derived too (:func:`check_value`), and its errors name the
setting by its field name (``p_min``), which is also its key in a trace or a
matrix file; a front end adds its own way of naming it (a flag, a control).
"""

from __future__ import annotations

import math
import os
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from typing import Any, Iterator, Sequence

from .errors import ConfigError

SPEC_TYPES_IN_PROCESS = ("draft-simple", "ngram-simple", "none")
#: every spec type llama.cpp names (``common/speculative.cpp``), in its order; a llama-server binary
#: offers the ones its ``--help`` lists
LLAMA_SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
                    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
#: spec types whose drafter is a separate model file (the others draft from the target or the text)
DRAFT_FILE_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")
#: spec types that read ``--spec-draft-n-max`` / ``-n-min`` / ``-p-min`` (the draft-model family, MTP included)
DRAFT_PARAM_TYPES = ("draft-simple", "draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark")
FLASH_ATTN_VALUES = ("auto", "on", "off")
#: how a rejected draft leaves a context's memory (``backends/llama_cpp/memory.py``); auto: as llama-server does
ROLLBACK_CHOICES = ("auto", "seq-rm", "snapshots", "checkpoint")
KV_TYPES = ("f16", "f32", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

#: the engines that run llama.cpp and so read the GGML_VK_* knobs (in-process and the server)
VULKAN_ENGINES = ("llama.cpp", "llama-server")

#: the demo the CLI and the app open with (the names resolve in the llama.cpp backend)
DEMO_TARGET = "demo:Q4_K_M"  # K-quant weights: batched (>= 4 rows) and single-token passes take different kernels
DEMO_DRAFT = "demo:Q4_0"
#: tiny random-weight drafters written for the demo target, one per spec type whose drafter is an
#: architecture of its own (``backends/llama_cpp/tiny_drafters``); they propose tokens the target nearly
#: always rejects, which exercises the path: every verify pass is 1 + n_drafted tokens wide
DEMO_DRAFTERS = {"draft-eagle3": "eagle3", "draft-dflash": "dflash", "draft-dspark": "dspark"}


def demo_drafter(name: str | None) -> str | None:
    """The spec type of a demo drafter name (``demo:dspark`` -> ``draft-dspark``), None for any other name."""
    if not name or not name.lower().startswith("demo:"):
        return None
    kind = name.split(":", 1)[1].lower()
    return next((st for st, k in DEMO_DRAFTERS.items() if k == kind), None)


def setting(
    default: Any = MISSING,
    *,
    flags: Sequence[str] = (),
    help: str = "",
    label: str = "",
    group: str = "",
    min: float | None = None,
    max: float | None = None,
    choices: Sequence[Any] | None = None,
    axis: bool = False,
    gui: bool = True,
    only_for: Sequence[str] = (),
    default_factory: Any = MISSING,
    metavar: str | None = None,
    env: str = "",
    cli_default: Any = MISSING,
    off_flags: Sequence[str] = (),
    plain: Any = MISSING,
) -> Any:
    """A dataclass field that carries everything a front end needs to show and check it.

    ``axis`` marks a setting a matrix may vary (its file key then takes a list);
    ``only_for`` names the engines it applies to (the app hides it for others);
    ``gui=False`` keeps it out of the generated controls (the app has its own
    widget for it, or it makes no sense there); ``cli_default`` is the flag's
    default where it differs (None: "decided from other flags", or by the
    machine); ``off_flags`` name the flags that set a true/false setting to
    false explicitly (``--repack`` for ``--no-repack``); ``plain`` marks a setting that may be left
    unset (None) for the machine to decide (:mod:`specview.core.resolve`), and the value it takes when
    nothing decides it.
    """
    meta = {
        "flags": tuple(flags),
        "help": help,
        "label": label,
        "group": group,
        "min": min,
        "max": max,
        "choices": tuple(choices) if choices is not None else None,
        "axis": axis,
        "gui": gui,
        "only_for": tuple(only_for),
        "metavar": metavar,
        "cli_default": cli_default,
        # the environment variable llama.cpp reads this setting from (ggml's start-up knobs): set in the
        # engine's process before llama.cpp loads, and a command line's environment prefix in reports
        "env": env,
        "off_flags": tuple(off_flags),
    }
    if plain is not MISSING:
        meta["plain"] = plain
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


#: llama.cpp's load log names each weight buffer (``load_tensors:   CPU_REPACK model buffer size =  56.95 MiB``);
#: these are the repacked ones, whose batched kernels differ from the plain buffer's (CPU_REPACK: ggml-cpu's
#: interleaved layouts; AMX: its AMX tiles).  A model's ``weight_buffers`` fact names the ones its load used.
REPACKED_BUFFERS = ("CPU_REPACK", "AMX")


@dataclass(frozen=True)
class EngineSettings:
    """Context settings, named after llama.cpp's flags."""

    n_ctx: int = setting(0, flags=("-c", "--n-ctx", "--ctx-size"), min=0, group="engine", label="Context",
                         help="context size (0 = auto, sized to the run)")
    n_batch: int = setting(512, flags=("-b", "--n-batch", "--batch-size"), min=1, group="engine",
                           label="Batch (-b)", help="logical batch size, also the prompt prefill chunk")
    n_ubatch: int = setting(512, flags=("-ub", "--n-ubatch", "--ubatch-size"), min=1, group="engine",
                            label="Micro-batch (-ub)",
                            help="physical batch size; 1 computes every row of a verify pass on its own")
    flash_attn: str = setting("auto", flags=("-fa", "--flash-attn"), choices=FLASH_ATTN_VALUES, axis=True,
                              group="engine", label="Flash attention", help="flash attention")
    gpu_layers: int = setting(-1, flags=("-ngl", "--gpu-layers", "--n-gpu-layers"), min=-1, group="engine",
                              label="GPU layers", help="layers to offload to the GPU; -1 = all")
    threads: int = setting(0, flags=("-t", "--threads"), min=0, group="engine", label="Threads",
                           help="CPU threads; 0 = every core, or $SPECVIEW_THREADS (the thread count can change "
                           "the logits, so traces record it)")
    kv_type: str = setting("f16", flags=("--kv-type", "--cache-type"), choices=KV_TYPES, group="engine",
                           label="KV cache type", help="KV cache type for K and V")
    no_op_offload: bool = setting(False, flags=("--no-op-offload",), axis=True, group="engine",
                                  label="No op offload",
                                  help="llama.cpp's --no-op-offload: ops on weights kept in host memory stay on the "
                                  "CPU; by default a GPU build computes batches of 32 tokens or more on the GPU even "
                                  "at -ngl 0 (the backend check's CPU reference sets it, so its reference is the CPU)")
    # Vulkan's own numerics knobs: ggml-vulkan reads them from the environment once, when it starts, so
    # they reach llama.cpp as environment variables (the engine process's, a server's, a report command's
    # prefix), never as flags; a build without Vulkan ignores them
    vk_disable_mmvq: bool = setting(False, flags=("--vk-disable-mmvq",), env="GGML_VK_DISABLE_MMVQ", axis=True,
                                    group="vulkan", label="No MMVQ", only_for=VULKAN_ENGINES,
                                    help="Vulkan builds: GGML_VK_DISABLE_MMVQ=1, no integer-dot mat-vec kernels "
                                    "(Q8_1 activations) on quantized weights, so widths 1-8 all take the float "
                                    "mat-vec path (the N=1 vs N=2..8 mismatch of llama.cpp #28489)")
    vk_force_mmvq: bool = setting(False, flags=("--vk-force-mmvq",), env="GGML_VK_FORCE_MMVQ", axis=True,
                                  group="vulkan", label="Force MMVQ", only_for=VULKAN_ENGINES,
                                  help="Vulkan builds: GGML_VK_FORCE_MMVQ=1, integer-dot mat-vec kernels wherever "
                                  "the device has integer dot product, also where ggml-vulkan would pick float")
    vk_disable_f16: bool = setting(False, flags=("--vk-disable-f16",), env="GGML_VK_DISABLE_F16", axis=True,
                                   group="vulkan", label="No fp16", only_for=VULKAN_ENGINES,
                                   help="Vulkan builds: GGML_VK_DISABLE_F16=1, no fp16 arithmetic in the shaders "
                                   "even where the device has it")
    vk_disable_coopmat: bool = setting(False, flags=("--vk-disable-coopmat",), env="GGML_VK_DISABLE_COOPMAT",
                                       axis=True, group="vulkan", label="No coopmat", only_for=VULKAN_ENGINES,
                                       help="Vulkan builds: GGML_VK_DISABLE_COOPMAT=1, no cooperative-matrix "
                                       "(matrix core) mat-mat kernels")
    vk_visible_devices: str = setting("", flags=("--vk-visible-devices",), env="GGML_VK_VISIBLE_DEVICES",
                                      group="vulkan", label="Vulkan devices", only_for=VULKAN_ENGINES,
                                      metavar="IDS",
                                      help="Vulkan builds: GGML_VK_VISIBLE_DEVICES, the Vulkan devices ggml uses, "
                                      "by index ('0', '0,1'); empty: every GPU, and a CPU-type device (Mesa's "
                                      "lavapipe) only when named here")
    no_repack: bool | None = setting(None, flags=("-nr", "--no-repack"), off_flags=("--repack",), axis=True,
                                     group="engine", label="No repack (-nr)", cli_default=None, plain=False,
                                     help="llama.cpp engines: keep the weights in the plain CPU buffer (llama.cpp's "
                                     "--no-repack): no repacked Q4_0/Q4_K/AMX layouts, so batches take other kernels "
                                     "(it moves the numerics); on by default only where a short multi-token decode "
                                     "crashed this llama.cpp build (the AMX bug, llama.cpp #20824); --repack keeps "
                                     "repacking there")
    rollback: str | None = setting(None, flags=("--rollback",), choices=ROLLBACK_CHOICES, axis=True, group="engine",
                                   label="Rollback", only_for=("llama.cpp",), cli_default=None, plain="auto",
                                   help="llama.cpp engine: how a rejected draft is dropped from the target's and the "
                                   "draft model's memory: seq-rm (llama_memory_seq_rm, a KV cache only), snapshots "
                                   "(n_rs_seq = n_max kept recurrent states; qwen35, lfm2, nemotron_h and a few "
                                   "more), checkpoint (the state saved before each verify pass, restored and the "
                                   "accepted tokens decoded again); auto: what llama-server does for this "
                                   "architecture and spec type")
    server_bin: str = setting("", flags=("--server-bin",), group="engine", label="Server binary",
                              only_for=("llama-server", "mlx-server"), metavar="PATH",
                              help="llama-server binary (default: $SPECVIEW_LLAMA_SERVER, then PATH, then the copy "
                              "scripts/build-llama-server.sh builds); with mlx-server the mlx_lm.server program "
                              "(default: $SPECVIEW_MLX_SERVER, then the one beside this Python, then PATH)")
    server_args: str = setting("", flags=("--server-args",), group="engine", label="Server flags",
                               only_for=("llama-server", "mlx-server"), metavar="FLAGS",
                               help="extra llama-server flags, passed through verbatim: --spec-* and draft flags "
                               "(-ngld, -devd, -ctkd ...) to the speculative server only, the rest to both; with "
                               "mlx-server, extra mlx_lm.server flags for both servers")

    def __post_init__(self) -> None:
        check_all(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def environment(self) -> dict[str, str]:
        """The environment variables these settings ask llama.cpp for (``GGML_VK_*``), only those set."""
        return settings_environment(self.to_dict())

    @classmethod
    def from_dict(cls, d: Any) -> "EngineSettings":
        return cls(**_known(cls, d, "engine"))

    @property
    def context_key(self) -> "EngineSettings":
        """The settings that decide a context's numerics, without its size (contexts are reused across sizes)."""
        return replace(self, n_ctx=0)


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run.  Names follow llama.cpp's flags."""

    target: str = setting(DEMO_TARGET, flags=("-m", "--target", "--model"), group="models", gui=False,
                          metavar="MODEL", cli_default=None,
                          help=f"target model: a GGUF file, an MLX folder, or a demo name like demo:F16 "
                          f"(default {DEMO_TARGET})")
    draft: str | None = setting(DEMO_DRAFT, flags=("-md", "--draft", "--model-draft"), group="models", gui=False,
                                metavar="MODEL", cli_default=None,
                                help=f"draft model for draft-simple (default {DEMO_DRAFT} with a demo target)")
    spec_type: str = setting("draft-simple", flags=("--spec-type",), group="speculation", gui=False, metavar="TYPE",
                             help="how tokens are drafted: draft-simple, ngram-simple or none; with --engine "
                             "llama-server any type the binary lists in its --help (draft-mtp, ngram-mod, ...)")
    n_max: int = setting(3, flags=("--n-max", "--spec-draft-n-max"), min=0, axis=True, group="speculation",
                         label="n_max", help="most tokens drafted per round (llama.cpp's default)")
    n_min: int = setting(0, flags=("--n-min", "--spec-draft-n-min"), min=0, group="speculation", label="n_min",
                         help="drop a draft shorter than this")
    p_min: float = setting(0.0, flags=("--p-min", "--spec-draft-p-min", "--draft-p-min"), min=0.0, max=1.0, axis=True,
                           group="speculation", label="p_min",
                           help="stop drafting when the draft's top-10 softmax probability is below this; "
                           "1 drafts nothing: the zero-draft control")
    ngram_size_n: int = setting(12, flags=("--spec-ngram-simple-size-n",), min=1, group="speculation",
                                label="n-gram size", only_for=(), help="ngram-simple: n-gram looked up in the history")
    ngram_size_m: int = setting(48, flags=("--spec-ngram-simple-size-m",), min=1, group="speculation",
                                label="n-gram draft", help="ngram-simple: most tokens copied after a match")
    serial_verify: bool = setting(False, flags=("--serial-verify",), group="speculation", label="Serial verify",
                                  help="compute every verify pass as single-token passes, one per row: the "
                                  "control that must reproduce vanilla exactly when only the batched numerics differ")
    max_tokens: int = setting(256, flags=("-n", "--max-tokens", "--n-predict"), min=1, group="prompt",
                              label="Tokens", help="tokens to generate per arm")
    prompt: str | None = setting(None, flags=("-p", "--prompt"), group="prompt", gui=False,
                                 help="prompt text")
    prompt_tokens: tuple[int, ...] | None = setting(None, flags=("--tokens",), group="prompt", gui=False,
                                                    metavar="IDS", help="raw prompt token ids ('1,2,3'), fed as "
                                                    "they are: no BOS, no template")
    chat: bool = setting(True, flags=("--chat",), group="prompt", label="Chat template",
                         help="wrap the prompt in the model's chat template (a model without one gets the plain text)")
    ignore_eos: bool = setting(False, flags=("--ignore-eos",), group="prompt", label="Ignore EOS",
                               help="ban every end-of-generation token and keep generating, as llama.cpp's "
                               "--ignore-eos does (a -inf logit bias: none is ever emitted)")
    stop_after_fork: int | None = setting(None, min=0, group="prompt", label="Stop after fork", gui=False,
                                          help="stop the speculative arm this many tokens after its first "
                                          "difference from vanilla (a rate needs only the fork); none: run "
                                          "max_tokens")
    top_k: int = setting(8, flags=("--top-k",), min=2, max=64, group="prompt", gui=False,
                         help="alternatives recorded per token")
    backend: str = setting("llama.cpp", flags=("--engine",), group="engine", gui=False, metavar="ENGINE",
                           help="inference engine: llama.cpp (in-process), mlx, llama-server, or a plug-in's")
    engine: EngineSettings = field(default_factory=EngineSettings)

    def __post_init__(self) -> None:
        check_all(self)
        if self.uses_draft_model and not self.draft:
            raise ConfigError(f"spec_type {self.spec_type} needs a draft model: give a draft (or demo:Q4_0), or use "
                              "ngram-simple, which needs none", setting="draft")
        if self.uses_draft_model and self.draft:
            st = demo_drafter(self.draft)
            if st is not None and st != self.spec_type:
                raise ConfigError(f"{self.draft} is the demo's {st} drafter: use it with --spec-type {st} "
                                  f"(the spec type here is {self.spec_type})", setting="draft")
        if self.prompt is None and not self.prompt_tokens:
            raise ConfigError("no prompt: give a prompt text, a prompt file or token ids", setting="prompt")
        if self.prompt_tokens is not None:
            for t in self.prompt_tokens:
                if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                    raise ConfigError(f"prompt_tokens: {t!r} is not a token id (an integer >= 0)",
                                      setting="prompt_tokens")

    @property
    def uses_draft_model(self) -> bool:
        return self.spec_type in DRAFT_FILE_TYPES

    def prompt_ids(self, n_vocab: int) -> list[int] | None:
        """The prompt as token ids when it is given as ids, each checked against the target's vocabulary; else None."""
        if not self.prompt_tokens:
            return None
        ids = [int(t) for t in self.prompt_tokens]
        bad = [t for t in ids if not 0 <= t < n_vocab]
        if bad:
            raise ConfigError(f"prompt_tokens: id {bad[0]} is outside the target's vocabulary (0..{n_vocab - 1})",
                              setting="prompt_tokens")
        return ids

    @property
    def draft_width(self) -> int:
        """The most tokens one verify pass can carry beyond the target's own (for sizing the context)."""
        if self.uses_draft_model:
            return self.n_max
        if self.spec_type == "ngram-simple":
            return self.ngram_size_m
        return 0 if self.spec_type == "none" else self.n_max

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["engine"] = self.engine.to_dict()
        d["prompt_tokens"] = list(self.prompt_tokens) if self.prompt_tokens else None
        if not self.uses_draft_model:
            d["draft"] = None
        return d

    @classmethod
    def from_dict(cls, d: Any) -> "RunConfig":
        """The inverse of :meth:`to_dict` (keys it does not know, like ``threads_used``, are ignored)."""
        kw = _known(cls, d, "config")
        eng = kw.pop("engine", None)
        toks = kw.pop("prompt_tokens", None)
        if toks is not None and not isinstance(toks, (list, tuple)):
            raise ConfigError(f"prompt_tokens must be a list of token ids (got {type(toks).__name__})",
                              setting="prompt_tokens")
        return cls(engine=EngineSettings.from_dict(eng or {}), prompt_tokens=tuple(toks) if toks else None, **kw)

    def spec_cache_key(self) -> tuple:
        return (self.spec_type, self.draft if self.uses_draft_model else None, self.n_max, self.n_min,
                self.p_min, self.ngram_size_n, self.ngram_size_m, self.serial_verify)


# -- settings read from the environment ---------------------------------------------------
def environment_settings() -> dict[str, str]:
    """{field name: environment variable} of the EngineSettings llama.cpp reads from its environment."""
    return {f.name: f.metadata["env"] for f in declared(EngineSettings) if f.metadata.get("env")}


def settings_environment(engine: Any) -> dict[str, str]:
    """The environment an engine block (a dict, as in a trace's ``config.engine``) asks for.

    A true/false knob is ``1`` when true and absent when false (ggml tests only
    that the variable exists); a text knob is its text when not empty.
    """
    engine = engine or {}
    out: dict[str, str] = {}
    for name, var in environment_settings().items():
        v = engine.get(name)
        if v is True:
            out[var] = "1"
        elif isinstance(v, str) and v.strip():
            out[var] = v.strip()
    return out


# -- derived checks ------------------------------------------------------------------
def declared(cls: type) -> Iterator[Field]:
    """The declared settings of ``cls`` (fields with a flag or a label), in declaration order."""
    for f in fields(cls):
        if f.metadata.get("flags") or f.metadata.get("label"):
            yield f


def field_of(cls: type, name: str) -> Field:
    for f in fields(cls):
        if f.name == name:
            return f
    raise KeyError(name)


def default_of(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def typed_default(f: Field) -> Any:
    """The default a front end shows and types a setting by: its default, or for a setting the machine may
    decide (default None, a ``plain`` value declared) the plain value."""
    d = default_of(f)
    return f.metadata.get("plain", d) if d is None else d


def _kind(f: Field) -> type:
    """The value type a field takes: int, float, str or bool (None also allowed where the default is None)."""
    d = default_of(f)
    if isinstance(d, bool):
        return bool
    if isinstance(d, (int, float, str)):
        return type(d)
    ann = str(f.type)
    for name, t in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if ann.startswith(name):
            return t
    return object


def check_value(cls: type, name: str, value: Any) -> Any:
    """Check one value against its declaration; return it normalized (an int given for a float becomes a float).

    Raises :class:`ConfigError` naming the setting.
    """
    f = field_of(cls, name)
    meta = f.metadata
    kind = _kind(f)
    if value is None:
        if default_of(f) is None or str(f.type).replace(" ", "").endswith("|None"):
            return None
        raise ConfigError(f"{name} needs a value", setting=name)
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false (got {value!r})", setting=name)
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer (got {value!r})", setting=name)
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number (got {value!r})", setting=name)
        value = float(value)
    elif kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be text (got {value!r})", setting=name)
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and hi is not None and not lo <= value <= hi:
        raise ConfigError(f"{name} must be between {lo:g} and {hi:g} (got {value!r})", setting=name)
    if lo is not None and value < lo:
        raise ConfigError(f"{name} must be >= {lo:g} (got {value!r})", setting=name)
    if hi is not None and value > hi:
        raise ConfigError(f"{name} must be <= {hi:g} (got {value!r})", setting=name)
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(map(str, choices))} (got {value!r})", setting=name)
    return value


def check_all(obj: Any) -> None:
    """Check every declared setting of a frozen dataclass instance, normalizing values in place."""
    for f in declared(type(obj)):
        v = getattr(obj, f.name)
        nv = check_value(type(obj), f.name, v)
        if type(nv) is not type(v):  # an int given for a float setting
            object.__setattr__(obj, f.name, nv)


def _known(cls: type, d: Any, what: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ConfigError(f"the {what} block must be an object (got {type(d).__name__})")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def axes() -> tuple[str, ...]:
    """The scalar settings a matrix may vary (besides targets, drafters and prompts)."""
    return tuple(f.name for c in (RunConfig, EngineSettings) for f in declared(c) if f.metadata.get("axis"))


def settings_class(name: str) -> type:
    """Which class declares ``name``: RunConfig or EngineSettings."""
    for c in (RunConfig, EngineSettings):
        if any(f.name == name for f in fields(c)):
            return c
    raise KeyError(name)


def with_setting(cfg: RunConfig, name: str, value: Any) -> RunConfig:
    """``cfg`` with one setting changed, wherever it is declared (checked as declared)."""
    if settings_class(name) is EngineSettings:
        return replace(cfg, engine=replace(cfg.engine, **{name: value}))
    return replace(cfg, **{name: value})


def get_setting(cfg: RunConfig, name: str) -> Any:
    return getattr(cfg.engine if settings_class(name) is EngineSettings else cfg, name)


# -- settings the machine may decide (specview.core.resolve) -------------------------------
def plain_value(f: Any) -> Any:
    """The value an unset setting takes when nothing decides it (its declaration's ``plain``)."""
    return f.metadata.get("plain", MISSING)


def unset(settings: EngineSettings | RunConfig) -> list[str]:
    """The declared settings of ``settings`` left unset (None where a plain value is declared)."""
    return [f.name for f in declared(type(settings))
            if plain_value(f) is not MISSING and getattr(settings, f.name) is None]


def fill_plain(settings: EngineSettings) -> EngineSettings:
    """``settings`` with every setting still unset at its plain value."""
    fill = {f.name: plain_value(f) for f in declared(EngineSettings)
            if plain_value(f) is not MISSING and getattr(settings, f.name) is None}
    return replace(settings, **fill) if fill else settings


#: engine settings a backend decides from the model's header (the rollback), so for each run's own target, never once
#: for a whole matrix
PER_MODEL = ("rollback",)


def settings_label(settings: EngineSettings) -> str:
    """The settings that differ from the defaults, short: ``fa on, ub 1`` ('' for the defaults)."""
    short = {"flash_attn": "fa", "n_ubatch": "ub", "n_batch": "b", "threads": "t", "kv_type": "kv",
             "gpu_layers": "ngl", "no_repack": "nr", "no_op_offload": "nopo", "vk_disable_mmvq": "vk-no-mmvq",
             "vk_force_mmvq": "vk-mmvq", "vk_disable_f16": "vk-no-f16", "vk_disable_coopmat": "vk-no-coopmat",
             "vk_visible_devices": "vk-devices"}
    base = fill_plain(EngineSettings())  # a setting the machine may decide reads as its plain value
    settings = fill_plain(settings)
    parts = []
    for name, abbr in short.items():
        v = getattr(settings, name)
        if v != getattr(base, name):
            parts.append(abbr if v is True else f"{abbr} {v}")
    return ", ".join(parts)


# -- threads ----------------------------------------------------------------------------
THREADS_VARIABLE = "SPECVIEW_THREADS"


def default_threads() -> int:
    """Threads when --threads is 0: ``$SPECVIEW_THREADS`` if set to a positive number, else every usable core.

    llama.cpp's worker threads spin at barriers, so on a busy machine fewer
    threads than cores can be much faster; the variable lets a user (or a
    shared build machine) say so once.  ``0`` (or unset) means every core; any
    other value that is not a whole number is refused rather than ignored, since
    the thread count can move the logits.
    """
    env = os.environ.get(THREADS_VARIABLE, "").strip()
    if env:
        if not env.isdigit():
            raise ConfigError(
                f"${THREADS_VARIABLE}={env!r} is not a whole number of threads; set it to a number "
                "such as 2 (0 means every core), or unset it", setting="threads")
        if int(env) > 0:
            return int(env)
    return usable_cores()


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, else every core)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int) -> int:
    """The thread count a context really gets for the ``threads`` setting (0: :func:`default_threads`)."""
    return int(threads) if threads and threads > 0 else default_threads()
