"""A matrix's checks: each refuses a bad definition or matrix file with a :class:`MatrixError` naming the field.

A value is checked against its setting's declaration (:func:`checked`, through
:func:`~specview.core.config.check_value`), so a matrix refuses what a single run refuses, in the
same words, after the file and the key it came from.  :func:`validate_spec` checks a whole spec:
no empty axis, every value in its declared range, distinct prompt names and, when the files are
checked, models that exist, drafters the engine runs and every target with every drafter by their
headers, before any cell loads.
"""

from __future__ import annotations

import reprlib
from typing import Any

from ..config import SPEC_TYPES_IN_PROCESS, EngineSettings, RunConfig, _kind, axes, check_value, field_of, settings_class
from ..errors import ConfigError, SpecviewError
from ..prompts import user_path
from .settings import axis_fields, cell_settings, drafter_parts, engine_axes

#: what a preset part's cells are evidence of (core/matrix/preset.py says it in words)
ROLES = ("determinism", "lossless-control", "subject", "toggle", "zero-draft", "reference")
#: the keys of a matrix spec's ``quality`` block (the task suite whose items are its prompts), with their types
QUALITY_KEYS = {"suite": str, "items": int, "seed": int, "execute": bool}
#: how a message names the values of a setting's kind
KIND_WORDS = {int: "integers", float: "numbers", str: "strings", bool: "true or false"}


class MatrixError(SpecviewError):
    """A matrix definition or a matrix file is unusable."""


class _Short(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:  # repr() refuses integers of more than 4300 digits
        return repr(x) if x.bit_length() <= 256 else f"<a {x.bit_length()}-bit integer>"


_short = _Short()
_short.maxlevel, _short.maxstring, _short.maxother, _short.maxlist, _short.maxdict = 2, 60, 60, 6, 6


def show(value: Any) -> str:
    """A short repr of an untrusted value (bounded in depth and length, whatever it holds)."""
    return _short.repr(value)


# -- values -----------------------------------------------------------------------------------
def is_scalar(v: Any) -> bool:
    """Whether ``v`` is a single value a setting may take (None, a flag, a number or text)."""
    return v is None or isinstance(v, (bool, int, float, str))


def checked(cls: type, name: str, value: Any, what: str, *, plural: bool = False) -> Any:
    """``value`` checked against the declaration of ``name``, or a MatrixError starting with ``what``."""
    f = field_of(cls, name)
    if not is_scalar(value):  # never hand a nested value to a message that repr()s it
        raise MatrixError(f"{what} must be {KIND_WORDS.get(_kind(f), 'single values') if plural else 'a single value'}"
                          f" (got {type(value).__name__} {show(value)})")
    try:
        return check_value(cls, name, value)
    except ConfigError as exc:
        msg = str(exc)
        if msg.startswith(name + " "):
            msg = msg[len(name) + 1:]
        raise MatrixError(f"{what} {msg}") from None


def as_list(key: str, value: Any, source: str) -> list[Any]:
    """An axis's values: a list as it is, a single value as a list of one, else a MatrixError naming ``key``."""
    if isinstance(value, list):
        return value
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [value]
    raise MatrixError(f"{source}: '{key}' must be a list (got {type(value).__name__})")


def engine_settings(eng: dict[str, Any], where: str, *, strict: bool) -> EngineSettings:
    """The engine settings every cell shares, each checked; ``strict`` (a TOML ``[engine]`` table) also refuses
    an unknown key, and says so when it is an axis (a top-level key)."""
    allowed = {f.name for f in cell_settings(EngineSettings)}
    if strict:
        bad = set(eng) - allowed
        if bad:
            hint = [a for a in engine_axes() if a in bad]
            raise MatrixError(f"{where}: unknown [engine] key(s) {', '.join(sorted(map(str, bad)))}; known: "
                              f"{', '.join(sorted(allowed))}"
                              + (f" ({', '.join(hint)} is an axis: a top-level key)" if hint else ""))
    prefix = f"{where}: [engine] " if strict else f"{where}."
    kw = {k: checked(EngineSettings, k, v, f"{prefix}{k}") for k, v in eng.items() if k in allowed}
    return EngineSettings(**kw)


def check_block(block: Any, where: str) -> dict[str, Any]:
    """``block`` checked as a spec's ``quality`` block (a task suite, core/matrix/quality.py), or a MatrixError
    naming ``where`` and the key."""
    if not isinstance(block, dict) or not isinstance(block.get("suite"), str) or not block["suite"]:
        raise MatrixError(f"{where}: quality must name a task suite (got {show(block)})")
    for key, typ in QUALITY_KEYS.items():
        v = block.get(key)
        if v is not None and (not isinstance(v, typ) or (typ is int and isinstance(v, bool))):
            raise MatrixError(f"{where}: quality.{key} must be {typ.__name__} (got {show(v)})")
    if isinstance(block.get("items"), int) and block["items"] < 1:
        raise MatrixError(f"{where}: quality.items must be at least 1 (got {block['items']})")
    return block


def parts_from_json(parts: Any, source: str) -> list[dict[str, Any]]:
    """A matrix document's ``spec.parts``, checked."""
    if not isinstance(parts, list):
        raise MatrixError(f"{source}: spec.parts must be a list")
    out = []
    for i, p in enumerate(parts):
        ok = (isinstance(p, dict) and all(isinstance(p.get(k), str) for k in ("name", "role", "label", "prompts"))
              and p.get("role") in ROLES and p.get("prompts") in ("first", "all")
              and all(isinstance(p.get(k), list) and p[k] and all(isinstance(x, str) for x in p[k])
                      for k in ("targets", "drafters"))
              and all(isinstance(p[a], list) and p[a] for a in axes() if a in p))
        if not ok:
            raise MatrixError(f"{source}: spec.parts[{i}] is not a preset part (name, role, label, prompts, "
                              f"targets, drafters and axis lists)")
        out.append(dict(p))
    return out


# -- a whole spec -----------------------------------------------------------------------------
def validate_spec(spec: Any, *, check_files: bool = True) -> None:
    """Refuse empty axes, values outside their declared range, duplicate prompt names and missing models.

    Every message starts with the spec's source (its file) when it has one.  ``check_files`` also looks
    for the models (:func:`check_models`, :func:`check_pairs`) and reads the cited kernel map.
    """
    where = f"{spec.source}: " if spec.source else ""
    for name in ("targets", "drafters", *axes(), "prompts"):
        if not getattr(spec, name):
            raise MatrixError(f"{where}the matrix axis '{name}' is empty: give at least one value")
    for f in axis_fields():
        cls = settings_class(f.name)
        for v in getattr(spec, f.name):
            checked(cls, f.name, v, f"{where}{f.name} values", plural=True)
    for cls in (RunConfig, EngineSettings):
        for f in cell_settings(cls):
            obj = spec.engine if cls is EngineSettings else spec
            checked(cls, f.name, getattr(obj, f.name), f"{where}{f.name}")
    for key in ("targets", "drafters"):
        for v in getattr(spec, key):
            if not isinstance(v, str) or not v:
                raise MatrixError(f"{where}{key} values must be non-empty text (got {show(v)})")
    names = [p.name for p in spec.prompts]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise MatrixError(f"{where}two prompts share the name {dup[0]!r}; give each a distinct name")
    if spec.kernel_map is not None and (not isinstance(spec.kernel_map, str) or not spec.kernel_map):
        raise MatrixError(f"{where}kernel_map must be the name of a kernel map file (got {show(spec.kernel_map)})")
    if check_files:
        check_models(spec, where)
        if spec.kernel_map:
            spec.load_kernel_map()


def check_models(spec: Any, where: str) -> None:
    """Every drafter's spec type one the engine runs, and every model one this engine can find: a demo name, a
    store name, a model folder or a GGUF file; then every pair (:func:`check_pairs`)."""
    from ..demo import check_demo_name, is_demo_name
    from ..models import is_store_name, resolve_name
    from ..registry import get_backend

    backend = get_backend(spec.backend)
    kind = backend.model_kind
    wanted = [drafter_parts(d)[0] for d in spec.drafters]
    if any(st not in SPEC_TYPES_IN_PROCESS for st in wanted):
        try:
            offered = backend.spec_types(spec.engine)
        except SpecviewError as exc:
            raise MatrixError(f"{where}{exc}") from None
        missing = [st for st in dict.fromkeys(wanted) if st not in offered]
        if missing:
            hint = ("; the llama-server engine runs every type its binary lists (--engine llama-server)"
                    if backend.in_process else "")
            raise MatrixError(f"{where}drafter {missing[0]}: the {spec.backend} engine runs "
                              f"{', '.join(offered)}{hint}")
    for role, names_ in (("target", spec.targets), ("drafter", spec.drafters)):
        for name in names_:
            st = None
            if role == "drafter":
                st, name = drafter_parts(name)
                if name is None:
                    continue
            if is_demo_name(name):
                try:
                    check_demo_name(name, drafter_of=st)  # an unknown quantization, a drafter out of place
                except SpecviewError as exc:
                    raise MatrixError(f"{where}{role} {exc}") from None
            elif is_store_name(name):  # ollama:..., hf:...: found in the stores, of this engine's kind
                try:
                    resolve_name(name, kind)
                except SpecviewError as exc:
                    raise MatrixError(f"{where}{role} {exc}") from None
            elif kind == "folder":
                # model folders, or Hugging Face ids (org/name) fetched at load time
                is_id = not name.startswith(("/", ".", "~")) and name.count("/") == 1
                if not (user_path(name).is_dir() or is_id):
                    raise MatrixError(f"{where}{role} {name}: no such {spec.backend} model folder")
            elif kind == "gguf" and not user_path(name).is_file():
                raise MatrixError(f"{where}{role} {name}: no such file")
    check_pairs(spec, where, kind)


def check_pairs(spec: Any, where: str, kind: str) -> None:
    """Every target with every drafter, by their headers, before any cell loads (the run's own check)."""
    from ..models.preflight import refusal

    for target in spec.targets:
        for d in spec.drafters:
            st, name = drafter_parts(d)
            try:
                why = refusal(target, name, st, kind)
            except SpecviewError as exc:
                raise MatrixError(f"{where}{exc}") from None
            if why:
                raise MatrixError(f"{where}drafter {d} with target {target}: {why}")
