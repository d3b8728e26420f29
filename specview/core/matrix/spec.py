"""A matrix's definition: its axes, the settings every cell shares, its prompts; read from TOML or JSON.

Nothing here lists a setting by hand.  The scalar axes are the settings
:mod:`specview.core.config` declares with ``axis=True`` (:func:`~specview.core.config.axes`);
every other declared setting of a run is a value all cells share (a top-level
key of a matrix TOML file, or of its ``[engine]`` table for an engine setting);
:mod:`.settings` derives both from the declarations, and :mod:`.validate` checks each value
(through :func:`~specview.core.config.check_value`) and the whole spec.  Only the matrix's own
structure is named here: the targets, drafters and prompts axes (which give a
cell its model, draft, spec type and prompt) and the engine choice.
"""

from __future__ import annotations

import os
from dataclasses import field, make_dataclass, replace
from pathlib import Path
from typing import Any

from ..config import (PER_MODEL, DEMO_DRAFT, DEMO_TARGET, EngineSettings, RunConfig, _kind, axes, default_of,
                      field_of, settings_class)
from ..prompts import (PromptError, PromptSpec, builtin_prompts, prompt_from_file, read_toml, suite_prompts,
                       user_path)
from .settings import NON_MODEL_DRAFTERS, axis_fields, cell_settings, drafter_parts, matrix_default
from .validate import (KIND_WORDS, MatrixError, as_list, check_block, checked, engine_settings, is_scalar,
                       parts_from_json, show, validate_spec)

#: top-level TOML keys that are not settings
OWN_KEYS = ("targets", "drafters", "prompts", "builtin_prompts", "suite", "chat", "backend", "engine", "diagnose",
            "kernel_map")


# -- the spec ----------------------------------------------------------------------------
class _SpecMethods:
    """The behaviour of :class:`MatrixSpec`; its fields are generated from the settings' declarations."""

    targets: list[str]
    drafters: list[str]
    prompts: list[PromptSpec]
    backend: str
    engine: EngineSettings
    diagnose: bool
    kernel_map: str | None
    source: str | None

    def _where(self) -> str:
        return f"{self.source}: " if self.source else ""

    def axis_values(self, name: str) -> list[Any]:
        return list(getattr(self, name))

    def set_axis(self, name: str, values: list[Any]) -> None:
        """Give the axis ``name`` these values, in each of a preset's parts too (a part carries every axis)."""
        setattr(self, name, list(values))
        for part in self.parts:
            part[name] = list(values)

    def decide(self, *, measure: bool = True) -> list[Any]:
        """What this machine decides for the engine axes the spec leaves unset, asked once for the whole matrix.

        Each decision becomes a one-value axis (so every part's cells, and their labels, carry it) and is
        kept in ``decided`` with its reason, which each cell's trace then records. A setting decided from the
        model (:data:`PER_MODEL`: the rollback, read from each target's header) is left to each cell's run,
        which decides it for that cell's target and drafter.
        """
        from ..registry import Runner

        free = [a for a in axes() if settings_class(a) is EngineSettings and getattr(self.engine, a) is None
                and a not in PER_MODEL
                and set(self.axis_values(a)) == {None} and all(set(p.get(a, [None])) == {None} for p in self.parts)]
        if not free:
            return []
        _, decisions = Runner.resolve_settings(replace(self.engine, **{a: None for a in free}), backend=self.backend,
                                               measure=measure)
        out = [d for d in decisions if d.setting in free]
        for d in out:
            self.set_axis(d.setting, [d.value])
        self.decided = tuple(self.decided) + tuple(out)
        return out

    def prompt_named(self, name: str) -> PromptSpec:
        for p in self.prompts:
            if p.name == name:
                return p
        raise MatrixError(f"{self._where()}no prompt called {name!r}")

    def validate(self, *, check_files: bool = True) -> None:
        """Refuse empty axes, values outside their declared range, duplicate prompt names and missing models
        (:func:`~specview.core.matrix.validate.validate_spec`)."""
        validate_spec(self, check_files=check_files)

    def load_kernel_map(self) -> Any:
        """The :class:`~specview.core.kernels.map.KernelMap` the matrix cites, or a MatrixError naming its file."""
        from ..kernels.evidence import load_kernel_map
        from ..kernels.map import KernelMapError

        try:
            return load_kernel_map(self.kernel_map)
        except KernelMapError as exc:
            raise MatrixError(f"{self._where()}{exc}") from None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"targets": list(self.targets), "drafters": list(self.drafters)}
        for f in axis_fields():
            d[f.name] = [float(v) if _kind(f) is float else v for v in getattr(self, f.name)]
        d["prompts"] = [p.to_json() for p in self.prompts]
        for f in cell_settings(RunConfig):
            d[f.name] = getattr(self, f.name)
        d["backend"] = self.backend
        d["engine"] = self.engine.to_dict()
        d["diagnose"] = self.diagnose
        if self.kernel_map is not None:
            d["kernel_map"] = self.kernel_map
        if self.quality:
            d["quality"] = dict(self.quality)
        if self.parts:
            d["parts"] = [dict(p) for p in self.parts]
            d["preset"] = self.preset
        return d

    @classmethod
    def from_json(cls, d: Any, *, source: str = "<matrix>") -> "MatrixSpec":
        """A spec from a matrix document's ``spec`` block (what :meth:`to_json` wrote; missing settings default)."""
        if not isinstance(d, dict):
            raise MatrixError(f"{source}: spec must be an object")
        kw: dict[str, Any] = {}
        for key in ("targets", "drafters", *axes()):
            if key in d:
                kw[key] = as_list(key, d[key], source)
        ps = as_list("prompts", d.get("prompts", []), source)
        try:
            kw["prompts"] = [PromptSpec.from_json(p, where=f"{source}: spec.prompts[{i}]") for i, p in enumerate(ps)]
        except PromptError as exc:
            raise MatrixError(str(exc)) from None
        for f in cell_settings(RunConfig):
            if d.get(f.name) is not None:
                kw[f.name] = checked(RunConfig, f.name, d[f.name], f"{source}: spec.{f.name}")
        eng = d.get("engine") or {}
        if not isinstance(eng, dict):
            raise MatrixError(f"{source}: spec.engine must be an object")
        kw["engine"] = engine_settings(eng, f"{source}: spec.engine", strict=False)
        for key, typ in (("backend", str), ("diagnose", bool)):
            if key in d:
                if not isinstance(d[key], typ):
                    raise MatrixError(f"{source}: spec.{key} must be {typ.__name__} (got {show(d[key])})")
                kw[key] = d[key]
        if d.get("kernel_map") is not None:
            if not isinstance(d["kernel_map"], str):
                raise MatrixError(f"{source}: spec.kernel_map must be a file name or null "
                                  f"(got {show(d['kernel_map'])})")
            kw["kernel_map"] = d["kernel_map"]
        if d.get("quality") is not None:
            kw["quality"] = dict(check_block(d["quality"], f"{source}: spec"))
        if d.get("parts"):
            kw["parts"] = parts_from_json(d["parts"], source)
            kw["preset"] = d.get("preset") if isinstance(d.get("preset"), dict) else None
        spec = MatrixSpec(**kw, source=source)
        spec.validate(check_files=False)
        spec.source = None
        return spec


def _spec_fields() -> list[tuple[str, Any, Any]]:
    out: list[tuple[str, Any, Any]] = [
        ("targets", list, field(default_factory=lambda: [DEMO_TARGET])),
        ("drafters", list, field(default_factory=lambda: [DEMO_DRAFT])),
    ]
    for f in axis_fields():
        out.append((f.name, list, field(default_factory=lambda d=default_of(f): [d])))
    out.append(("prompts", list, field(default_factory=list)))
    for f in cell_settings(RunConfig):
        out.append((f.name, f.type, field(default=matrix_default(f))))
    out += [
        ("backend", str, field(default=default_of(field_of(RunConfig, "backend")))),
        ("engine", EngineSettings, field(default_factory=EngineSettings)),
        ("diagnose", bool, field(default=True)),
        ("kernel_map", Any, field(default=None)),
        # a task suite whose items are the prompts, each cell's answers scored (core/matrix/quality.py), or None
        ("quality", Any, field(default=None)),
        # a preset's parts (core/matrix/preset.py): each a small matrix of its own, the cells their union
        ("parts", list, field(default_factory=list)),
        ("preset", Any, field(default=None)),
        ("source", Any, field(default=None, compare=False, repr=False)),
        # what this machine decided for the axes left unset (:meth:`_SpecMethods.decide`), with the reasons
        ("decided", tuple, field(default=(), compare=False, repr=False)),
    ]
    return out


#: What to run: the axes and the settings every cell shares.  Its fields are generated from the
#: declarations in :mod:`specview.core.config`: ``targets``, ``drafters``, one list per axis
#: (``n_max``, ``p_min``, ``flash_attn``), ``prompts``, one value per shared run setting
#: (``max_tokens``, ``n_min``, ``top_k`` ...), ``backend``, ``engine`` (the shared engine settings),
#: ``diagnose``, ``kernel_map`` (a kernel map file whose predictions the matrix cites, or None) and
#: ``quality`` (the task suite whose items are the prompts, its cells' answers scored, or None).
MatrixSpec = make_dataclass("MatrixSpec", _spec_fields(), bases=(_SpecMethods,),
                            namespace={"__module__": __name__})


# -- reading a definition -----------------------------------------------------------------
def toml_keys() -> list[str]:
    """Every top-level key a matrix TOML file may hold."""
    return [*OWN_KEYS, *axes(), *(f.name for f in cell_settings(RunConfig))]


def _prompt_entry(i: int, entry: Any, base: Path, chat: bool, source: str) -> PromptSpec:
    where = f"{source}: prompts[{i}]"
    if isinstance(entry, str):
        return PromptSpec(name=f"prompt{i + 1}", text=entry, chat=chat)
    if not isinstance(entry, dict):
        raise MatrixError(f"{where} must be a string or a table with text, file, tokens or builtin")
    known = ("name", "text", "file", "tokens", "builtin", "chat", "category")
    unknown = set(entry) - set(known)
    if unknown:
        raise MatrixError(f"{where} has unknown key(s) {', '.join(sorted(map(str, unknown)))}; known: "
                          f"{', '.join(known)}")
    kinds = [k for k in ("text", "file", "tokens", "builtin") if k in entry]
    if len(kinds) != 1:
        raise MatrixError(f"{where} needs exactly one of text, file, tokens, builtin (got {kinds or 'none'})")
    name, cat, c = entry.get("name"), entry.get("category"), entry.get("chat", chat)
    for key, val, typ in (("name", name, str), ("category", cat, str), ("chat", c, bool)):
        if val is not None and not isinstance(val, typ):
            raise MatrixError(f"{where}.{key} must be {'text' if typ is str else 'true or false'}")
    if "builtin" in entry:  # one of the built-in prompts by its name, in this place of the list
        if not isinstance(entry["builtin"], str):
            raise MatrixError(f"{where}.builtin must be the name of a built-in prompt")
        try:
            b = builtin_prompts([entry["builtin"]])[0]
        except PromptError as exc:
            raise MatrixError(f"{where}: {exc}") from None
        return replace(b, name=name or b.name, chat=c, category=cat)
    if "tokens" in entry:
        toks = entry["tokens"]
        if (not isinstance(toks, list) or not toks
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in toks)):
            raise MatrixError(f"{where}.tokens must be a non-empty list of token ids >= 0")
        return PromptSpec(name=name or f"tokens{i + 1}", tokens=tuple(toks), chat=False, category=cat)
    if "file" in entry:
        if not isinstance(entry["file"], str):
            raise MatrixError(f"{where}.file must be a file name")
        f = user_path(entry["file"])
        if not f.is_absolute():
            f = base / f
        try:
            return prompt_from_file(f, chat=c, name=name, category=cat)
        except PromptError as exc:
            raise MatrixError(f"{where}: {exc}") from None
    if not isinstance(entry["text"], str):
        raise MatrixError(f"{where}.text must be text")
    return PromptSpec(name=name or f"prompt{i + 1}", text=entry["text"], chat=c, category=cat)


def _model_path(name: str, base: Path, *, drafter: bool = False) -> str:
    from ..demo import is_demo_name
    from ..models import is_store_name

    if drafter:
        st, model = drafter_parts(name)
        if model is None:
            return name
        if model != name:  # TYPE:MODEL
            return f"{st}:{_model_path(model, base)}"
    if name in NON_MODEL_DRAFTERS or is_demo_name(name) or is_store_name(name):
        return name
    p = user_path(name)
    if not p.is_absolute():
        p = base / p
    return str(p)


def spec_from_dict(d: Any, *, base: Path | None = None, source: str | None = None) -> MatrixSpec:
    """Build a spec from a TOML-shaped mapping; relative paths are taken from ``base``.

    ``source`` (the file's name) starts every error message, and the spec's own later ones.
    """
    base = base or Path(".")
    spec_source, source = source, source or "<matrix>"
    if not isinstance(d, dict):
        raise MatrixError(f"{source}: a matrix definition is a table of keys")
    known = toml_keys()
    unknown = set(d) - set(known)
    if unknown:
        raise MatrixError(f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                          f"the axes are targets, drafters, {', '.join(axes())}, prompts; other keys: "
                          f"{', '.join(k for k in known if k not in ('targets', 'drafters', 'prompts', *axes()))}")
    chat = d.get("chat", True)
    if not isinstance(chat, bool):
        raise MatrixError(f"{source}: 'chat' must be true or false")
    try:
        prompts = [_prompt_entry(i, e, base, chat, source) for i, e in enumerate(as_list("prompts", d.get("prompts", []), source))]
        suite = d.get("suite", False)
        if suite is True:
            prompts = suite_prompts() + prompts
        elif isinstance(suite, list) and all(isinstance(x, str) for x in suite):
            prompts = suite_prompts(suite) + prompts
        elif suite is not False:
            raise MatrixError(f"{source}: 'suite' must be true, false or a list of categories")
        bp = d.get("builtin_prompts", not prompts)
        if bp is True:
            prompts = builtin_prompts() + prompts
        elif isinstance(bp, list) and all(isinstance(x, str) for x in bp):
            prompts = builtin_prompts(bp) + prompts
        elif bp is not False:
            raise MatrixError(f"{source}: 'builtin_prompts' must be true, false or a list of names")
    except PromptError as exc:
        raise MatrixError(f"{source}: {exc}") from None

    eng = d.get("engine", {})
    if not isinstance(eng, dict):
        raise MatrixError(f"{source}: [engine] must be a table")
    kw: dict[str, Any] = {"prompts": prompts, "engine": engine_settings(eng, source, strict=True), "source": spec_source}
    for key in ("targets", "drafters"):
        vals = as_list(key, d.get(key, [DEMO_TARGET if key == "targets" else DEMO_DRAFT]), source)
        if not all(isinstance(v, str) for v in vals):
            raise MatrixError(f"{source}: '{key}' values must be strings (got {show(vals)})")
        kw[key] = [_model_path(v, base, drafter=key == "drafters") for v in vals]
    for f in axis_fields():
        if f.name not in d:
            continue
        kind, choices = _kind(f), f.metadata.get("choices") or ()
        vals = as_list(f.name, d[f.name], source)
        if kind is str and {"on", "off"} <= set(choices):  # TOML's true/false for an on/off setting
            vals = [("on" if v else "off") if isinstance(v, bool) else v for v in vals]
        ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
              float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              str: lambda v: isinstance(v, str)}.get(kind, is_scalar)
        if not all(ok(v) for v in vals):
            raise MatrixError(f"{source}: '{f.name}' values must be {KIND_WORDS.get(kind, 'values')} "
                              f"(got {show(vals)})")
        kw[f.name] = [checked(settings_class(f.name), f.name, v, f"{source}: '{f.name}' values", plural=True)
                      for v in vals]
    for f in cell_settings(RunConfig):
        if f.name in d:
            kw[f.name] = checked(RunConfig, f.name, d[f.name], f"{source}: '{f.name}'")
    for key, typ in (("backend", str), ("diagnose", bool)):
        if key in d:
            if not isinstance(d[key], typ):
                raise MatrixError(f"{source}: '{key}' must be {typ.__name__} (got {show(d[key])})")
            kw[key] = d[key]
    if "kernel_map" in d:  # a kernel map file, relative to the TOML file's folder
        km = d["kernel_map"]
        if not isinstance(km, str) or not km:
            raise MatrixError(f"{source}: 'kernel_map' must be the name of a kernel map file (got {show(km)})")
        p = user_path(km)
        kw["kernel_map"] = str(p if p.is_absolute() else base / p)
    return MatrixSpec(**kw)


def load_spec(path: str | os.PathLike[str]) -> MatrixSpec:
    """Read a matrix definition from a TOML file (``docs/matrix.md`` shows one)."""
    p = user_path(path)
    return spec_from_dict(read_toml(p, MatrixError), base=p.parent, source=str(p))

