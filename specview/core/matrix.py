"""The reproducer matrix: every combination of a few settings, both arms each, one verdict per cell.

A matrix answers "which setting makes speculative decoding differ from plain
greedy?" by running one cell per combination of the axes below and naming, in
plain words, which axis value alone flips the outcome.

Axes (llama.cpp names):

* ``targets``     target models: GGUF files or ``demo:QUANT`` names
* ``drafters``    draft models (files or demo names, meaning ``draft-simple``),
                  ``ngram-simple`` or ``none``
* ``n_max``       ``--spec-draft-n-max`` values (draft-simple cells only)
* ``p_min``       ``--spec-draft-p-min`` values (draft-simple cells only)
* ``flash_attn``  ``on`` / ``off`` / ``auto``
* ``prompts``     texts, files, the four built-in prompts, or raw token ids

One :class:`~specview.core.session.Session` serves the whole matrix, so every
model file is loaded once and the vanilla arm is computed once per target,
prompt and settings and shared by every speculative cell that needs it.
Results are rewritten atomically to the JSON file after every cell
(schema ``specview.matrix/1``, see ``docs/matrix.md``), so an interrupted
matrix keeps every finished cell.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .. import __version__
from .engine import EngineSettings, SpecviewError
from .trace import json_safe, write_atomic

SCHEMA = "specview.matrix/1"
AXES = ("targets", "drafters", "n_max", "p_min", "flash_attn", "prompts")
NON_MODEL_DRAFTERS = ("ngram-simple", "none")
FLASH_ATTN_VALUES = ("auto", "on", "off")
VERDICTS = ("identical", "near-tie", "state", "nondeterministic", "diverged", "error")
PROMPTS_DIR = Path(__file__).resolve().parent.parent / "resources" / "prompts"

#: keys a matrix TOML file may hold (besides the axes)
TOML_KEYS = set(AXES) | {
    "builtin_prompts",
    "max_tokens",
    "n_min",
    "chat",
    "ignore_eos",
    "top_k",
    "backend",
    "engine",
    "diagnose",
}
ENGINE_KEYS = {"n_ctx", "n_batch", "n_ubatch", "gpu_layers", "threads", "kv_type"}


class MatrixError(SpecviewError):
    """A matrix definition or a matrix file is unusable."""


# ---------------------------------------------------------------------------
# the definition
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptSpec:
    """One prompt of the matrix: text (with or without the chat template) or raw token ids."""

    name: str
    text: str | None = None
    tokens: tuple[int, ...] | None = None
    chat: bool = True

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.tokens is not None:
            d["tokens"] = list(self.tokens)
        else:
            d["text"] = self.text
            d["chat"] = self.chat
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "PromptSpec":
        toks = d.get("tokens")
        return cls(name=str(d["name"]), text=d.get("text"), tokens=tuple(int(t) for t in toks) if toks else None,
                   chat=bool(d.get("chat", True)) and not toks)


@dataclass
class MatrixSpec:
    """What to run: the axes and the settings every cell shares."""

    targets: list[str]
    drafters: list[str]
    n_max: list[int] = field(default_factory=lambda: [3])
    p_min: list[float] = field(default_factory=lambda: [0.0])
    flash_attn: list[str] = field(default_factory=lambda: ["auto"])
    prompts: list[PromptSpec] = field(default_factory=list)
    max_tokens: int = 128
    n_min: int = 0
    ignore_eos: bool = False
    top_k: int = 8
    backend: str = "llama.cpp"
    engine: EngineSettings = field(default_factory=EngineSettings)
    diagnose: bool = True

    def validate(self, *, check_files: bool = True) -> None:
        def need(name: str, values: Sequence[Any]) -> None:
            if not values:
                raise MatrixError(f"the matrix axis '{name}' is empty: give at least one value")

        for name in AXES:
            need(name, getattr(self, name))
        for n in self.n_max:
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise MatrixError(f"n_max values must be integers >= 0 (got {n!r})")
        for p in self.p_min:
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
                raise MatrixError(f"p_min values must be numbers between 0 and 1 (got {p!r})")
        for fa in self.flash_attn:
            if fa not in FLASH_ATTN_VALUES:
                raise MatrixError(f"flash_attn values must be {', '.join(FLASH_ATTN_VALUES)} (got {fa!r})")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise MatrixError(f"max_tokens must be an integer >= 1 (got {self.max_tokens!r})")
        names = [p.name for p in self.prompts]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise MatrixError(f"two prompts share the name {dup[0]!r}; give each a distinct name")
        if check_files:
            from .demo import demo_quant, is_demo_name

            for role, names_ in (("target", self.targets), ("drafter", self.drafters)):
                for name in names_:
                    if role == "drafter" and name in NON_MODEL_DRAFTERS:
                        continue
                    if is_demo_name(name):
                        demo_quant(name)  # raises on an unknown quantization
                    elif self.backend == "mlx":
                        # MLX models are folders, or Hugging Face ids (org/name) fetched at load time
                        is_id = not name.startswith(("/", ".", "~")) and name.count("/") == 1
                        if not (Path(name).expanduser().is_dir() or is_id):
                            raise MatrixError(f"{role} {name}: no such MLX model folder")
                    elif not Path(name).expanduser().is_file():
                        raise MatrixError(f"{role} {name}: no such file")

    def to_json(self) -> dict[str, Any]:
        return {
            "targets": list(self.targets),
            "drafters": list(self.drafters),
            "n_max": list(self.n_max),
            "p_min": [float(p) for p in self.p_min],
            "flash_attn": list(self.flash_attn),
            "prompts": [p.to_json() for p in self.prompts],
            "max_tokens": self.max_tokens,
            "n_min": self.n_min,
            "ignore_eos": self.ignore_eos,
            "top_k": self.top_k,
            "backend": self.backend,
            "engine": self.engine.to_dict(),
            "diagnose": self.diagnose,
        }


def builtin_prompts(names: Iterable[str] | None = None) -> list[PromptSpec]:
    """The built-in prompts (an essay, a technical explanation, code, a list), sorted by name."""
    files = sorted(PROMPTS_DIR.glob("*.txt"))
    if not files:
        raise MatrixError(f"no built-in prompts found in {PROMPTS_DIR}; reinstall specview")
    found = {f.stem: f for f in files}
    chosen = list(found) if names is None else list(names)
    out = []
    for n in chosen:
        if n not in found:
            raise MatrixError(f"unknown built-in prompt {n!r}; built-in prompts: {', '.join(found)}")
        out.append(PromptSpec(name=n, text=found[n].read_text(encoding="utf-8").strip(), chat=True))
    return out


def prompt_from_file(path: str | os.PathLike[str], *, chat: bool = True, name: str | None = None) -> PromptSpec:
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MatrixError(f"prompt file {p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MatrixError(f"prompt file {p}: cannot read it as UTF-8 text ({exc})") from None
    return PromptSpec(name=name or p.stem, text=text, chat=chat)


def _as_list(key: str, value: Any, source: str) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [value]
    raise MatrixError(f"{source}: '{key}' must be a list (got {type(value).__name__})")


def _prompt_entry(i: int, entry: Any, base: Path, chat: bool, source: str) -> PromptSpec:
    if isinstance(entry, str):
        return PromptSpec(name=f"prompt{i + 1}", text=entry, chat=chat)
    if not isinstance(entry, dict):
        raise MatrixError(f"{source}: prompts[{i}] must be a string or a table with text, file or tokens")
    unknown = set(entry) - {"name", "text", "file", "tokens", "chat"}
    if unknown:
        raise MatrixError(f"{source}: prompts[{i}] has unknown key(s) {', '.join(sorted(unknown))}; "
                          "known: name, text, file, tokens, chat")
    kinds = [k for k in ("text", "file", "tokens") if k in entry]
    if len(kinds) != 1:
        raise MatrixError(f"{source}: prompts[{i}] needs exactly one of text, file, tokens (got {kinds or 'none'})")
    name = entry.get("name")
    c = bool(entry.get("chat", chat))
    if "tokens" in entry:
        toks = entry["tokens"]
        if not isinstance(toks, list) or not toks or not all(isinstance(t, int) and t >= 0 for t in toks):
            raise MatrixError(f"{source}: prompts[{i}].tokens must be a non-empty list of token ids >= 0")
        return PromptSpec(name=str(name or f"tokens{i + 1}"), tokens=tuple(toks), chat=False)
    if "file" in entry:
        f = Path(str(entry["file"])).expanduser()
        if not f.is_absolute():
            f = base / f
        return prompt_from_file(f, chat=c, name=str(name) if name else None)
    return PromptSpec(name=str(name or f"prompt{i + 1}"), text=str(entry["text"]), chat=c)


def _model_path(name: str, base: Path) -> str:
    from .demo import is_demo_name

    if name in NON_MODEL_DRAFTERS or is_demo_name(name):
        return name
    p = Path(name).expanduser()
    if not p.is_absolute():
        p = base / p
    return str(p)


def spec_from_dict(d: dict[str, Any], *, base: Path | None = None, source: str = "<matrix>") -> MatrixSpec:
    """Build a spec from a TOML-shaped mapping; relative paths are taken from ``base``."""
    base = base or Path(".")
    unknown = set(d) - TOML_KEYS
    if unknown:
        raise MatrixError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}; "
                          f"the axes are {', '.join(AXES)}; other keys: "
                          f"{', '.join(sorted(TOML_KEYS - set(AXES)))}")
    from .demo import DEMO_DRAFT, DEMO_TARGET

    chat = d.get("chat", True)
    if not isinstance(chat, bool):
        raise MatrixError(f"{source}: 'chat' must be true or false")
    prompts: list[PromptSpec] = []
    for i, entry in enumerate(_as_list("prompts", d.get("prompts", []), source)):
        prompts.append(_prompt_entry(i, entry, base, chat, source))
    bp = d.get("builtin_prompts", not prompts)
    if bp is True:
        prompts = builtin_prompts() + prompts
    elif isinstance(bp, list):
        prompts = builtin_prompts([str(x) for x in bp]) + prompts
    elif bp is not False:
        raise MatrixError(f"{source}: 'builtin_prompts' must be true, false or a list of names")

    eng = d.get("engine", {})
    if not isinstance(eng, dict):
        raise MatrixError(f"{source}: [engine] must be a table")
    bad = set(eng) - ENGINE_KEYS
    if bad:
        raise MatrixError(f"{source}: unknown [engine] key(s) {', '.join(sorted(bad))}; known: "
                          f"{', '.join(sorted(ENGINE_KEYS))} (flash attention is the flash_attn axis)")
    try:
        engine = EngineSettings(**eng)
    except TypeError as exc:
        raise MatrixError(f"{source}: bad [engine] table ({exc})") from None

    def ints(key: str, default: list[int]) -> list[int]:
        vals = _as_list(key, d.get(key, default), source)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            raise MatrixError(f"{source}: '{key}' values must be integers (got {vals!r})")
        return vals

    def floats(key: str, default: list[float]) -> list[float]:
        vals = _as_list(key, d.get(key, default), source)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            raise MatrixError(f"{source}: '{key}' values must be numbers (got {vals!r})")
        return [float(v) for v in vals]

    def strs(key: str, default: list[str]) -> list[str]:
        vals = _as_list(key, d.get(key, default), source)
        if not all(isinstance(v, str) for v in vals):
            raise MatrixError(f"{source}: '{key}' values must be strings (got {vals!r})")
        return vals

    scalars: dict[str, Any] = {}
    for key, typ in (("max_tokens", int), ("n_min", int), ("top_k", int), ("ignore_eos", bool),
                     ("backend", str), ("diagnose", bool)):
        if key in d:
            v = d[key]
            if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
                raise MatrixError(f"{source}: '{key}' must be {typ.__name__} (got {v!r})")
            scalars[key] = v
    fa = [("on" if v else "off") if isinstance(v, bool) else v for v in _as_list("flash_attn", d.get("flash_attn", ["auto"]), source)]
    spec = MatrixSpec(
        targets=[_model_path(t, base) for t in strs("targets", [DEMO_TARGET])],
        drafters=[_model_path(t, base) for t in strs("drafters", [DEMO_DRAFT])],
        n_max=ints("n_max", [3]),
        p_min=floats("p_min", [0.0]),
        flash_attn=[str(x) for x in fa],
        prompts=prompts,
        engine=engine,
        **scalars,
    )
    return spec


def load_spec(path: str | os.PathLike[str]) -> MatrixSpec:
    """Read a matrix definition from a TOML file (``docs/matrix.md`` shows one)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    p = Path(path).expanduser()
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise MatrixError(f"{p}: no such file") from None
    except OSError as exc:
        raise MatrixError(f"{p}: cannot read it ({exc})") from None
    try:
        d = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise MatrixError(f"{p}: not UTF-8 text ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise MatrixError(f"{p}: not valid TOML ({exc})") from None
    return spec_from_dict(d, base=p.parent, source=str(p))


# ---------------------------------------------------------------------------
# cells
# ---------------------------------------------------------------------------
def model_label(name: str | None) -> str:
    """A short name for a model: the quantization of a demo name, else the file name."""
    if not name:
        return "-"
    if name in NON_MODEL_DRAFTERS:
        return name
    from .demo import is_demo_name

    if is_demo_name(name):
        return name.split(":", 1)[1].upper() if ":" in name else "Q4_1"
    return Path(name).name


@dataclass(frozen=True)
class CellParams:
    """The axis values of one cell.  ``n_max``/``p_min`` are None where they do not apply."""

    target: str
    drafter: str
    n_max: int | None
    p_min: float | None
    flash_attn: str
    prompt: str

    @property
    def spec_type(self) -> str:
        return self.drafter if self.drafter in NON_MODEL_DRAFTERS else "draft-simple"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "drafter": self.drafter,
            "spec_type": self.spec_type,
            "n_max": self.n_max,
            "p_min": self.p_min,
            "flash_attn": self.flash_attn,
            "prompt": self.prompt,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CellParams":
        return cls(target=d["target"], drafter=d["drafter"], n_max=d.get("n_max"), p_min=d.get("p_min"),
                   flash_attn=d.get("flash_attn", "auto"), prompt=d.get("prompt", ""))


def expand(spec: MatrixSpec) -> list[CellParams]:
    """Every cell, ordered so cells sharing a target, prompt and engine settings run together.

    n_max and p_min only mean something for a draft model; ngram-simple and none
    cells appear once, not once per n_max/p_min value.
    """
    cells: list[CellParams] = []
    seen: set[CellParams] = set()
    for target, prompt, fa, drafter in itertools.product(spec.targets, spec.prompts, spec.flash_attn, spec.drafters):
        if drafter in NON_MODEL_DRAFTERS:
            combos: Iterable[tuple[int | None, float | None]] = [(None, None)]
        else:
            combos = itertools.product(spec.n_max, [float(p) for p in spec.p_min])
        for n_max, p_min in combos:
            c = CellParams(target, drafter, n_max, p_min, fa, prompt.name)
            if c not in seen:
                seen.add(c)
                cells.append(c)
    return cells


def cell_config(spec: MatrixSpec, params: CellParams):
    """The :class:`RunConfig` of one cell."""
    from .session import RunConfig

    prompt = next(p for p in spec.prompts if p.name == params.prompt)
    st = params.spec_type
    return RunConfig(
        target=params.target,
        draft=params.drafter if st == "draft-simple" else None,
        spec_type=st,
        n_max=params.n_max if params.n_max is not None else 3,
        n_min=spec.n_min,
        p_min=params.p_min if params.p_min is not None else 0.0,
        max_tokens=spec.max_tokens,
        prompt=prompt.text if prompt.tokens is None else None,
        prompt_tokens=prompt.tokens,
        chat=prompt.chat and prompt.tokens is None,
        ignore_eos=spec.ignore_eos,
        top_k=spec.top_k,
        backend=spec.backend,
        engine=replace(spec.engine, flash_attn=params.flash_attn),
    )


def verdict_label(cell: dict[str, Any]) -> str:
    """What a cell shows: its verdict, or "diverged (not diagnosed)"."""
    v = cell.get("verdict")
    if cell.get("status") == "error":
        return "error"
    if v == "diverged":
        return "diverged (not diagnosed)"
    return str(v)


def _r(x: float | None, nd: int = 5) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), nd)


def cell_record(index: int, params: CellParams, trace: Any, seconds: float,
                diagnosis: dict[str, Any] | None = None, diagnosis_error: str | None = None) -> dict[str, Any]:
    """The JSON record of a finished cell, from its trace."""
    v, s, c = trace.vanilla, trace.speculative, trace.comparison
    fm = c.first_mismatch
    if c.identical:
        verdict = "identical"
    elif diagnosis and diagnosis.get("verdict"):
        verdict = str(diagnosis["verdict"])
    else:
        verdict = "diverged"
    speed = s.tokens_per_s / v.tokens_per_s if v.tokens_per_s > 0 and s.tokens_per_s > 0 else None
    rec: dict[str, Any] = {
        "index": index,
        "params": params.to_json(),
        "status": "ok",
        "identical": bool(c.identical),
        "first_mismatch": None if fm is None else fm.index,
        "agree": c.agree,
        "n_vanilla": len(v.tokens),
        "n_speculative": len(s.tokens),
        "stop_reason": [v.stop_reason, s.stop_reason],
        "fork": None if fm is None else {
            "vanilla_token": fm.vanilla_token,
            "speculative_token": fm.speculative_token,
            "vanilla_piece": fm.vanilla_piece,
            "speculative_piece": fm.speculative_piece,
            "vanilla_margin": _r(v.steps[fm.index].margin) if fm.index < len(v.steps) else None,
        },
        "verdict": verdict,
        "diagnosed": diagnosis is not None,
        "gap": _r(diagnosis.get("gap")) if diagnosis and isinstance(diagnosis.get("gap"), (int, float)) else None,
        "explanation": diagnosis.get("explanation") if diagnosis else None,
        "diagnosis_error": diagnosis_error,
        "acceptance_rate": _r(s.acceptance_rate),
        "mean_accepted": _r(s.mean_accepted),
        "n_drafted": s.n_drafted,
        "n_accepted": s.n_accepted,
        "vanilla_tokens_per_s": _r(v.tokens_per_s, 3),
        "speculative_tokens_per_s": _r(s.tokens_per_s, 3),
        "speedup": _r(speed, 4),
        "target_quant": (trace.models.get("target") or {}).get("quantization"),
        "draft_quant": (trace.models.get("draft") or {}).get("quantization"),
        "prompt_tokens": len(trace.prompt.get("tokens", [])),
        "seconds": round(seconds, 3),
        "config": trace.config,
        "trace": None,
    }
    return rec


def error_record(index: int, params: CellParams, message: str, seconds: float, config: dict | None) -> dict[str, Any]:
    return {
        "index": index,
        "params": params.to_json(),
        "status": "error",
        "error": message,
        "identical": None,
        "first_mismatch": None,
        "verdict": "error",
        "seconds": round(seconds, 3),
        "config": config,
        "trace": None,
    }


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------
def _diagnosis_module():
    try:
        from . import diagnose  # type: ignore[attr-defined]
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.endswith("diagnose"):
            return None
        raise
    return diagnose


@dataclass
class MatrixRun:
    """A matrix in progress or finished: the JSON document and where it is written."""

    spec: MatrixSpec
    cells: list[CellParams]
    records: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"  # running, complete, interrupted
    out: Path | None = None
    started: float = field(default_factory=time.time)
    environment: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc = {
            "schema": SCHEMA,
            "status": self.status,
            "specview": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
            "elapsed_s": round(time.time() - self.started, 3),
            "n_cells": len(self.cells),
            "spec": self.spec.to_json(),
            "environment": self.environment,
            "counters": self.counters,
            "cells": self.records,
        }
        doc["summary"] = summarize(doc)
        return doc

    def write(self) -> None:
        if self.out is not None:
            write_atomic(self.out, json.dumps(json_safe(self.to_json()), ensure_ascii=False, indent=1))


def describe(params: CellParams) -> str:
    """One line naming a cell: ``Q8_0 · Q4_0 n_max=4 p_min=0 · fa=auto · essay``."""
    d = model_label(params.drafter)
    if params.n_max is not None:
        d += f" n_max={params.n_max}"
    if params.p_min is not None:
        d += f" p_min={params.p_min:g}"
    return f"{model_label(params.target)} · {d} · fa={params.flash_attn} · {params.prompt}"


def fmt_seconds(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def run_matrix(
    spec: MatrixSpec,
    session: Any,
    *,
    out: str | os.PathLike[str] | None = None,
    traces_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    on_cell: Callable[[dict[str, Any]], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    resume: dict[str, Any] | None = None,
) -> MatrixRun:
    """Run every cell of ``spec`` on ``session``; stream results to ``out``; return the finished run.

    ``cancel`` is checked between cells and inside each run; a cell cut short is
    not recorded.  KeyboardInterrupt is caught the same way: the finished cells
    are written with ``status = "interrupted"`` and the run is returned.
    ``resume`` is an earlier (interrupted) matrix document of the same spec: its
    finished cells are kept and only the others run.
    """
    spec.validate()
    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    cells = expand(spec)
    run = MatrixRun(spec=spec, cells=cells, out=Path(out) if out is not None else None)
    done_before: set[int] = set()
    if resume is not None:
        validate_matrix(resume, source="--resume")
        if _comparable_spec(resume["spec"]) != _comparable_spec(json_safe(spec.to_json())):
            raise MatrixError("cannot resume: the matrix file was made with other axes or settings; "
                              "give the same definition, or write to another file")
        run.records = [r for r in resume["cells"] if r.get("status") == "ok"
                       and 0 <= int(r.get("index", -1)) < len(cells)
                       and r["params"] == cells[int(r["index"])].to_json()]
        done_before = {int(r["index"]) for r in run.records}
        if done_before:
            say(f"resuming: {len(done_before)} of {len(cells)} cells already done")
    tdir = Path(traces_dir) if traces_dir is not None else None
    if tdir is not None:
        tdir.mkdir(parents=True, exist_ok=True)
    dmod = _diagnosis_module() if spec.diagnose else None
    if spec.diagnose and dmod is None:
        say("the diagnosis module is not available: forks are reported as 'diverged (not diagnosed)'")

    def counters() -> dict[str, int]:
        return {k: int(getattr(session, k, 0)) for k in ("loads", "vanilla_runs", "speculative_runs")}

    run.counters = counters()
    run.write()
    t_start = time.perf_counter()
    n_run = 0
    todo = len(cells) - len(done_before)
    try:
        for i, params in enumerate(cells):
            if i in done_before:
                continue
            if cancel():
                run.status = "interrupted"
                break
            t0 = time.perf_counter()
            cfg = None
            try:
                cfg = cell_config(spec, params)
                trace = session.run(cfg, cancel=cancel)
                if trace.vanilla.stop_reason == "cancelled" or trace.speculative.stop_reason == "cancelled":
                    run.status = "interrupted"
                    break
                diag, derr = None, None
                if trace.diagnosis is not None and not trace.comparison.identical:
                    diag = trace.diagnosis  # diagnosed by the engine itself (llama-server, from the outside)
                elif dmod is not None and not trace.comparison.identical:
                    try:
                        diag = dmod.diagnose(session, cfg, trace, controls=False, cancel=cancel)
                    except SpecviewError as exc:
                        derr = str(exc)
                    if cancel():
                        run.status = "interrupted"
                        break
                rec = cell_record(i, params, trace, time.perf_counter() - t0, diag, derr)
                if not run.environment:
                    run.environment = dict(trace.environment)
                if tdir is not None:
                    p = trace.save(tdir / f"cell-{i:03d}.json")
                    rec["trace"] = _relative(p, run.out)
            except SpecviewError as exc:
                if cancel():  # a cell cut short by a cancel is not an error, and is not recorded
                    run.status = "interrupted"
                    break
                rec = error_record(i, params, str(exc), time.perf_counter() - t0,
                                   cfg.to_dict() if cfg is not None else None)
            run.records.append(rec)
            run.records.sort(key=lambda r: r["index"])
            run.counters = counters()
            run.write()
            if on_cell is not None:
                on_cell(rec)
            n_run += 1
            done = len(run.records)
            elapsed = time.perf_counter() - t_start
            eta = elapsed / n_run * (todo - n_run)
            outcome = "error: " + rec["error"] if rec["status"] == "error" else (
                "identical" if rec["identical"] else f"fork at token {rec['first_mismatch']} ({verdict_label(rec)})")
            say(f"[{done}/{len(cells)}] {describe(params)}: {outcome} "
                f"({rec['seconds']:.1f} s; ETA {fmt_seconds(eta)})")
        else:
            run.status = "complete"
    except KeyboardInterrupt:
        run.status = "interrupted"
    run.counters = counters()
    run.write()
    return run


def _comparable_spec(d: dict[str, Any]) -> dict[str, Any]:
    """A spec as JSON, without what may change between a run and its resumption."""
    d = json.loads(json.dumps(d))
    d.pop("diagnose", None)
    return d


def _relative(p: Path, out: Path | None) -> str:
    if out is None:
        return str(p)
    try:
        return os.path.relpath(p, out.parent if str(out.parent) else ".")
    except ValueError:
        return str(p)


# ---------------------------------------------------------------------------
# reading a matrix file
# ---------------------------------------------------------------------------
def validate_matrix(d: Any, *, source: str = "<matrix>") -> None:
    if not isinstance(d, dict):
        raise MatrixError(f"{source}: not a specview matrix (the top level is {type(d).__name__})")
    schema = d.get("schema")
    if not isinstance(schema, str) or not schema.startswith("specview.matrix/"):
        raise MatrixError(f"{source}: not a specview matrix (schema is {schema!r}, expected {SCHEMA!r})")
    if schema != SCHEMA:
        raise MatrixError(f"{source}: matrix schema {schema!r} is not supported by this specview (reads {SCHEMA!r})")
    if not isinstance(d.get("cells"), list) or not isinstance(d.get("spec"), dict):
        raise MatrixError(f"{source}: malformed specview matrix: needs 'spec' (object) and 'cells' (list)")
    for i, c in enumerate(d["cells"]):
        if not isinstance(c, dict) or not isinstance(c.get("params"), dict) or "status" not in c:
            raise MatrixError(f"{source}: malformed specview matrix: cells[{i}] needs 'params' and 'status'")
        for k in ("target", "drafter"):
            if not isinstance(c["params"].get(k), str):
                raise MatrixError(f"{source}: malformed specview matrix: cells[{i}].params.{k} must be a string")


def load_matrix(path: str | os.PathLike[str]) -> dict[str, Any]:
    from .trace import read_json

    d = read_json(path, MatrixError)
    validate_matrix(d, source=str(Path(path)))
    return d


# ---------------------------------------------------------------------------
# the grid and the summary
# ---------------------------------------------------------------------------
ROW_AXES = ("target", "prompt", "flash_attn")
COL_AXES = ("drafter", "n_max", "p_min")
AXIS_NAMES = {
    "target": "target",
    "drafter": "drafter",
    "n_max": "n_max",
    "p_min": "p_min",
    "flash_attn": "flash attention",
    "prompt": "prompt",
}


def axis_value_label(axis: str, value: Any) -> str:
    if value is None:
        return "-"
    if axis in ("target", "drafter"):
        return model_label(value)
    if axis == "p_min":
        return f"{float(value):g}"
    return str(value)


def _varying(cells: Sequence[dict[str, Any]], axes: Sequence[str]) -> list[str]:
    return [a for a in axes if len({c["params"].get(a) for c in cells}) > 1]


@dataclass
class Grid:
    """Cells laid out as rows (target, prompt, flash attention) by columns (drafter, n_max, p_min)."""

    row_axes: list[str]
    col_axes: list[str]
    rows: list[tuple]
    cols: list[tuple]
    at: dict[tuple[tuple, tuple], dict[str, Any]]

    def row_label(self, row: tuple) -> str:
        return " · ".join(_part(a, v) for a, v in zip(self.row_axes, row)) or "all"

    def col_label(self, col: tuple) -> str:
        return " ".join(_part(a, v) for a, v in zip(self.col_axes, col) if v is not None) or "all"


def _part(axis: str, value: Any) -> str:
    label = axis_value_label(axis, value)
    if axis in ("n_max", "p_min"):
        return f"{axis}={label}"
    if axis == "flash_attn":
        return f"fa={label}"
    return label


def grid(doc: dict[str, Any]) -> Grid:
    """Lay out a matrix document's cells (planned cells not yet run are absent from ``at``)."""
    cells = doc.get("cells", [])
    spec = doc.get("spec") or {}
    planned: list[dict[str, Any]] = []
    try:
        s = MatrixSpec(targets=spec["targets"], drafters=spec["drafters"], n_max=spec["n_max"],
                       p_min=spec["p_min"], flash_attn=spec["flash_attn"],
                       prompts=[PromptSpec.from_json(p) for p in spec["prompts"]])
        planned = [{"params": c.to_json()} for c in expand(s)]
    except (KeyError, TypeError, ValueError):
        planned = []
    every = planned or cells
    row_axes = _varying(every, ROW_AXES) or ["target"]
    col_axes = _varying(every, COL_AXES) or ["drafter"]
    rows: list[tuple] = []
    cols: list[tuple] = []
    for c in every:
        r = tuple(c["params"].get(a) for a in row_axes)
        k = tuple(c["params"].get(a) for a in col_axes)
        if r not in rows:
            rows.append(r)
        if k not in cols:
            cols.append(k)
    at = {}
    for c in cells:
        r = tuple(c["params"].get(a) for a in row_axes)
        k = tuple(c["params"].get(a) for a in col_axes)
        at[(r, k)] = c
        if r not in rows:
            rows.append(r)
        if k not in cols:
            cols.append(k)
    return Grid(row_axes, col_axes, rows, cols, at)


def _join(words: Sequence[str], conj: str = "and") -> str:
    words = list(words)
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + f" {conj} " + words[-1]


def _mixed_phrase(axis: str, values: Sequence[Any]) -> str:
    return _value_phrase(axis, values).removeprefix("the ").replace(" drafters", " drafter")


def _cap(s: str) -> str:
    return s if s.startswith(("p_min", "n_max")) else s[:1].upper() + s[1:]


def _uncap(s: str) -> str:
    return s[:1].lower() + s[1:] if s[:2] != s[:2].upper() else s


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _value_phrase(axis: str, values: Sequence[Any]) -> str:
    labels = [axis_value_label(axis, v) for v in values]
    if axis in ("n_max", "p_min"):
        return f"{axis} = {_join(labels)}"
    if axis == "flash_attn":
        return f"flash-attention-{_join(labels)}"
    if axis == "drafter":
        return "the " + _join(labels) + " drafter" + ("s" if len(labels) > 1 else "")
    if axis == "prompt":
        return _join([f"'{x}'" for x in labels]) + " prompt"
    return _join(labels)


def summarize(doc: dict[str, Any]) -> list[str]:
    """Plain sentences naming what the matrix shows, computed from its cells."""
    cells = doc.get("cells", [])
    ok = [c for c in cells if c.get("status") == "ok"]
    errors = [c for c in cells if c.get("status") == "error"]
    n_total = doc.get("n_cells", len(cells))
    lines: list[str] = []
    if not cells:
        return ["No cell has finished yet."]
    forks = [c for c in ok if not c["identical"]]
    same = [c for c in ok if c["identical"]]
    head = f"{_plural(len(cells), 'cell')}"
    if n_total and n_total != len(cells):
        head += f" of {n_total} finished"
    parts = [f"{len(forks)} fork", f"{len(same)} identical"]
    if errors:
        parts.append(f"{len(errors)} failed")
    verdicts: dict[str, int] = {}
    for c in forks:
        verdicts[verdict_label(c)] = verdicts.get(verdict_label(c), 0) + 1
    vtxt = "; forks: " + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items(), key=lambda x: -x[1])) if forks else ""
    lines.append(f"{head}: {', '.join(parts)}{vtxt}.")
    if not ok:
        return lines
    if not forks:
        lines.append("Every cell is identical: no setting here makes speculative decoding differ from plain greedy.")
    elif not same:
        lines.append("Every cell forks: no setting here keeps speculative decoding equal to plain greedy.")
    else:
        lines.extend(_determinants(ok))
        lines.extend(_by_setting(ok))
        lines.extend(_flips(ok))
    if forks:
        first = min(forks, key=lambda c: c["first_mismatch"] if c["first_mismatch"] is not None else 1 << 30)
        lines.append(f"Earliest fork: token {first['first_mismatch']} ({describe(CellParams.from_json(first['params']))}).")
        gaps = [c["gap"] for c in forks if isinstance(c.get("gap"), (int, float))]
        if gaps:
            lines.append(f"Top-1/top-2 gap at the diagnosed forks: {min(gaps):.4g} to {max(gaps):.4g} logits.")
    if errors:
        lines.append(f"{_plural(len(errors), 'cell')} failed: " + "; ".join(
            f"{describe(CellParams.from_json(c['params']))}: {c.get('error')}" for c in errors[:3])
            + (" ..." if len(errors) > 3 else "") + ".")
    return lines


def _outcome(c: dict[str, Any]) -> bool:
    return bool(c["identical"])


def _uniform_values(ok: Sequence[dict[str, Any]], axis: str) -> tuple[list, list, list]:
    """Values of ``axis`` whose cells all fork, all are identical, or go both ways."""
    values = []
    for c in ok:
        v = c["params"].get(axis)
        if v is not None and v not in values:
            values.append(v)
    fork_vals, same_vals, mixed = [], [], []
    if len(values) < 2:
        return fork_vals, same_vals, mixed
    for v in values:
        outs = {_outcome(c) for c in ok if c["params"].get(axis) == v}
        (same_vals if outs == {True} else fork_vals if outs == {False} else mixed).append(v)
    return fork_vals, same_vals, mixed


SETTING_AXES = ("drafter", "p_min", "n_max")


def _determinants(ok: Sequence[dict[str, Any]], axes: Sequence[str] = ("target", "drafter", "p_min", "n_max",
                                                                        "flash_attn", "prompt")) -> list[str]:
    """Sentences for axis values whose cells all share one outcome while other cells do not."""
    out: list[tuple[int, str]] = []
    for axis in axes:
        fork_vals, same_vals, mixed = _uniform_values(ok, axis)
        if not fork_vals and not same_vals:
            continue
        phrases = []
        if fork_vals:
            phrase = _value_phrase(axis, fork_vals).removeprefix("the ")
            phrases.append(f"{'every' if len(fork_vals) == 1 else 'all'} {phrase} "
                           f"cell{'s' if len(fork_vals) > 1 else ''} fork{'s' if len(fork_vals) == 1 else ''}")
        if same_vals:
            if axis in SETTING_AXES:
                phrases.append(f"{_value_phrase(axis, same_vals)} {'is' if len(same_vals) == 1 else 'are'} "
                               "identical everywhere")
            else:
                phrases.append(f"every {_value_phrase(axis, same_vals)} cell is identical")
        sentence = "; ".join(phrases)
        if not mixed:
            out.append((0, f"The {AXIS_NAMES[axis]} alone decides the outcome: {sentence}."))
        else:
            out.append((1, f"{_cap(sentence)}; {_mixed_phrase(axis, mixed)} cells go both ways."))
    out.sort(key=lambda x: x[0])
    lines = [s for _, s in out]
    # the controls (settings identical everywhere, e.g. p_min = 1 or no drafter) set aside: what decides the rest?
    controls = [(a, v) for a in SETTING_AXES if a in axes for v in _uniform_values(ok, a)[1]]
    if controls:
        rest = [c for c in ok if not any(c["params"].get(a) == v for a, v in controls)]
        if rest and len({_outcome(c) for c in rest}) == 2:
            sub = _determinants(rest, [a for a in axes if not any(a == ca for ca, _ in controls)])
            if sub:
                names = _join([_value_phrase(a, [v]) for a, v in controls])
                lines.append(f"Setting aside {names}: " + " ".join([_uncap(sub[0])] + sub[1:]))
    return lines


def _setting_label(params: dict[str, Any]) -> str:
    p = CellParams.from_json(params)
    d = model_label(p.drafter)
    if p.n_max is not None:
        d += f" n_max={p.n_max}"
    if p.p_min is not None:
        d += f" p_min={p.p_min:g}"
    return f"{model_label(p.target)} with {d}" + (f" fa={p.flash_attn}" if p.flash_attn != "auto" else "")


def _by_setting(ok: Sequence[dict[str, Any]]) -> list[str]:
    """Across prompts: the settings that fork on every prompt, and those that fork on some."""
    prompts = {c["params"].get("prompt") for c in ok}
    if len(prompts) < 2:
        return []
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in ok:
        key = tuple(c["params"].get(a) for a in ("target", "drafter", "n_max", "p_min", "flash_attn"))
        groups.setdefault(key, []).append(c)
    every, some = [], []
    for cs in groups.values():
        n_fork = sum(not _outcome(c) for c in cs)
        if n_fork and len(cs) >= 2:
            label = f"{_setting_label(cs[0]['params'])} ({n_fork} of {len(cs)})"
            (every if n_fork == len(cs) else some).append(label)
    lines = []
    if every:
        lines.append("Forks on every prompt: " + "; ".join(every) + ".")
    if some:
        lines.append("Forks on some prompts: " + "; ".join(some) + ".")
    return lines


def _flips(ok: Sequence[dict[str, Any]]) -> list[str]:
    """For each axis: among pairs of cells differing only in it, how often the outcome flips."""
    axes = ("target", "drafter", "n_max", "p_min", "flash_attn", "prompt")
    res: list[tuple[str, int, int]] = []
    for axis in axes:
        others = [a for a in axes if a != axis]
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for c in ok:
            if c["params"].get(axis) is None:
                continue
            key = tuple(c["params"].get(a) for a in others)
            groups.setdefault(key, []).append(c)
        pairs = flips = 0
        for g in groups.values():
            for a, b in itertools.combinations(g, 2):
                pairs += 1
                flips += _outcome(a) != _outcome(b)
        if pairs:
            res.append((axis, flips, pairs))
    if not res:
        return []
    flipping = [f"{AXIS_NAMES[a]} in {f} of {_plural(n, 'pair')}" for a, f, n in sorted(res, key=lambda x: -x[1] / x[2]) if f]
    never = [AXIS_NAMES[a] for a, f, n in res if not f]
    lines = []
    if flipping:
        lines.append("Changing one setting alone turns identical into a fork (or back): " + _join(flipping) + ".")
    if never:
        lines.append(f"Changing only the {_join(never, 'or')} never does.")
    return lines
