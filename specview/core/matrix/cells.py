"""A matrix's cells: their axis values, their run settings, and the record a finished cell leaves."""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import field, make_dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..config import DRAFT_PARAM_TYPES, RunConfig, axes, with_setting
from ..diagnose.ties import tie_density
from .settings import (NON_MODEL_DRAFTERS, axis_fields, axis_short, cell_settings, draft_axes, drafter_parts,
                       engine_axes)
from .spec import MatrixSpec


def model_label(name: str | None) -> str:
    """A short name for a model: the quantization of a demo name, else the file name."""
    if not name:
        return "-"
    from ..demo import demo_drafter, is_demo_name

    if name in NON_MODEL_DRAFTERS:
        return name
    st, model = drafter_parts(name)
    if model is not None and model != name:  # TYPE:MODEL
        return model_label(model) if demo_drafter(model) == st else f"{st}:{model_label(model)}"
    if demo_drafter(name):
        return str(demo_drafter(name))  # the demo's tiny drafter of a spec type is named by the type
    if is_demo_name(name):
        return name.split(":", 1)[1].upper() if ":" in name else "Q4_1"
    return Path(name).name


class _CellMethods:
    target: str
    drafter: str
    prompt: str

    @property
    def spec_type(self) -> str:
        return drafter_parts(self.drafter)[0]

    @property
    def draft(self) -> str | None:
        """The draft model file or demo name, None for a drafter that is a spec type alone."""
        return drafter_parts(self.drafter)[1]

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"target": self.target, "drafter": self.drafter, "spec_type": self.spec_type}
        for name in axes():
            d[name] = getattr(self, name)
        d["prompt"] = self.prompt
        if self.part:
            d["part"] = self.part
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CellParams":
        kw = {name: d.get(name) for name in draft_axes()}
        for f in axis_fields():
            if f.name not in kw:
                kw[f.name] = d.get(f.name, f.default)
        part = d.get("part") if isinstance(d.get("part"), str) else ""
        return CellParams(target=d["target"], drafter=d["drafter"], prompt=d.get("prompt", ""), part=part, **kw)


#: The axis values of one cell: ``target``, ``drafter``, one field per axis (None where an axis does not
#: apply: n_max and p_min in ngram-simple and none cells), ``prompt`` (its name) and ``part`` (the name of
#: the preset part the cell belongs to, "" outside a preset).
CellParams = make_dataclass(
    "CellParams",
    [("target", str), ("drafter", str),
     *[(f.name, Any, field(default=None)) for f in axis_fields()],
     ("prompt", str, field(default="")), ("part", str, field(default=""))],
    bases=(_CellMethods,), frozen=True, namespace={"__module__": __name__})


def expand(spec: MatrixSpec) -> list[CellParams]:
    """Every cell, ordered so cells sharing a target, prompt and engine settings run together.

    The draft-model axes (n_max, p_min) only mean something for the spec types that read them
    (draft-simple, draft-mtp, draft-eagle3, draft-dflash, draft-dspark); n-gram and none cells appear once,
    not once per value.
    """
    if spec.parts:  # a preset: the union of its parts' cells, in the parts' order, each named by its part
        return [replace(c, part=p["name"]) for p in spec.parts for c in expand(part_spec(spec, p))]
    cells: list[CellParams] = []
    seen: set[CellParams] = set()
    eng = [spec.axis_values(a) for a in engine_axes()]
    drf = [spec.axis_values(a) for a in draft_axes()]
    for target, prompt, *eng_values, drafter in itertools.product(spec.targets, spec.prompts, *eng, spec.drafters):
        combos: Iterable[tuple] = (itertools.product(*drf) if drafter_parts(drafter)[0] in DRAFT_PARAM_TYPES
                                   else [tuple(None for _ in drf)])
        for dvals in combos:
            kw = dict(zip(engine_axes(), eng_values))
            kw.update(zip(draft_axes(), dvals))
            c = CellParams(target=target, drafter=drafter, prompt=prompt.name, **kw)
            if c not in seen:
                seen.add(c)
                cells.append(c)
    return cells


def part_spec(spec: MatrixSpec, part: Mapping[str, Any]) -> MatrixSpec:
    """One part as a plain matrix: the preset's shared settings and prompts with the part's own axes."""
    kw: dict[str, Any] = {"targets": list(part["targets"]), "drafters": list(part["drafters"]), "parts": [],
                          "prompts": list(spec.prompts[:1] if part.get("prompts", "first") == "first" else spec.prompts)}
    for f in axis_fields():  # a preset part carries every axis (load_preset fills in the shared values)
        kw[f.name] = list(part.get(f.name, getattr(spec, f.name)))
    return replace(spec, **kw)


def cell_config(spec: MatrixSpec, params: CellParams) -> RunConfig:
    """The :class:`RunConfig` of one cell: the shared settings, then each axis value that applies."""
    prompt = spec.prompt_named(params.prompt)
    st = params.spec_type
    shared = {f.name: getattr(spec, f.name) for f in cell_settings(RunConfig)}
    cfg = RunConfig(target=params.target, draft=params.draft, spec_type=st,
                    prompt=prompt.text if prompt.tokens is None else None, prompt_tokens=prompt.tokens,
                    chat=prompt.chat and prompt.tokens is None, backend=spec.backend, engine=spec.engine, **shared)
    for name in axes():
        value = getattr(params, name)
        if value is not None:
            cfg = with_setting(cfg, name, value)
    return cfg


def describe(params: CellParams) -> str:
    """One line naming a cell: ``Q8_0 · Q4_0 n_max=4 p_min=0 · fa=auto · essay``."""
    d = model_label(params.drafter)
    for name in draft_axes():
        v = getattr(params, name)
        if v is not None:
            d += f" {name}={v:g}" if isinstance(v, float) else f" {name}={v}"
    # a true/false axis is named only where it is on ("nr"), so the common case keeps its label short
    eng = " · ".join(axis_short(a) if getattr(params, a) is True else f"{axis_short(a)}={getattr(params, a)}"
                     for a in engine_axes() if getattr(params, a) not in (False, None))
    line = " · ".join(x for x in (model_label(params.target), d, eng, params.prompt) if x != "")
    return f"{params.part}: {line}" if params.part else line


def _r(x: float | None, nd: int = 5) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), nd)


def _num(d: Any, key: str) -> float | None:
    v = d.get(key) if isinstance(d, dict) else None
    return _r(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def cell_record(index: int, params: CellParams, trace: Any, seconds: float,
                diagnosis: dict[str, Any] | None = None, diagnosis_error: str | None = None,
                category: str | None = None) -> dict[str, Any]:
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
    thresholds = (diagnosis or {}).get("thresholds") or {}
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
        "gap": _num(diagnosis, "gap"),
        "near_tie_threshold": _num(thresholds, "near_tie"),
        "far_threshold": _num(thresholds, "far"),
        "explanation": diagnosis.get("explanation") if diagnosis else None,
        "diagnosis_error": diagnosis_error,
        "acceptance_rate": _r(s.acceptance_rate),
        "mean_accepted": _r(s.mean_accepted),
        "n_drafted": s.n_drafted,
        "n_accepted": s.n_accepted,
        "ties": tie_density(trace, diagnosis=diagnosis),  # positions in each tie band and the flips among them (diagnose/ties.py)
        # which text the speculative arm gave, in 16 hex digits: two cells whose settings differ in one way (the
        # rollback) can be told to give the same or other text without keeping every token
        "speculative_digest": token_digest(s.tokens),
        "vanilla_tokens_per_s": _r(v.tokens_per_s, 3),
        "speculative_tokens_per_s": _r(s.tokens_per_s, 3),
        "speedup": _r(speed, 4),
        "target_quant": (trace.models.get("target") or {}).get("quantization"),
        "draft_quant": (trace.models.get("draft") or {}).get("quantization"),
        "prompt_tokens": len(trace.prompt.get("tokens", [])),
        "category": category,
        "seconds": round(seconds, 3),
        "config": trace.config,
        "trace": None,
    }
    return rec


def token_digest(tokens: Sequence[int]) -> str:
    """A short hash of a token sequence (the same tokens, the same digest on every machine)."""
    return hashlib.sha256(",".join(str(int(t)) for t in tokens).encode()).hexdigest()[:16]


def error_record(index: int, params: CellParams, message: str, seconds: float, config: dict | None,
                 category: str | None = None) -> dict[str, Any]:
    return {
        "index": index,
        "params": params.to_json(),
        "status": "error",
        "error": message,
        "identical": None,
        "first_mismatch": None,
        "verdict": "error",
        "category": category,
        "seconds": round(seconds, 3),
        "config": config,
        "trace": None,
    }
