"""Preset matrices: the localising matrices of the public reports, as files that ship, and what their cells establish.

A preset (``resources/presets/NAME.toml``) is a few *parts*, each a small
matrix of its own (a target, a drafter, an axis value or two, the first prompt
or all of them) with a *role* that says what its cells are evidence of:

==================  ==========================================================================
``determinism``     vanilla against a second plain run (the ``none`` drafter): is plain decoding
                    deterministic at all?
``lossless-control`` a drafter that drafts from the text itself (n-gram): is the speculative loop
                    (verify, accept, roll back) sound when something is accepted?
``subject``         the path the report is about: does it fork here, where, and what verdict?
``toggle``          the subject with one setting changed (``-fa off``, ``n_max 1``): does that
                    setting move the fork?
``zero-draft``      the subject with ``p_min 1``: nothing drafted, so no verify batch
``reference``       the subject's drafter on a full-precision target, over the prompts
==================  ==========================================================================

Models are named by role (``{quantized}``, ``{reference}``, ``{draft}``), each
with a default on the demo; ``specview matrix --preset NAME --model ROLE=FILE``
puts the user's own files in their place.  :func:`findings` reads the finished
cells part by part and says, in the reports' own terms, what they establish;
every sentence is computed from the cells, never canned.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import SpecviewError
from ..prompts import RESOURCES, read_toml
from .cells import model_label
from .spec import MatrixError, MatrixSpec, _model_path, axes, axis_fields, show, spec_from_dict
from .validate import ROLES

PRESETS_DIR = RESOURCES / "presets"
#: what a part may set besides its axes
PART_KEYS = ("name", "role", "label", "targets", "drafters", "prompts")
_ROLE_REF = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def preset_names() -> list[str]:
    """The presets that ship, by file name."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def is_preset_file(path: str) -> bool:
    """Whether a matrix TOML file is a preset (it has [[part]] tables): a copy of a shipped one, edited."""
    from ..prompts import user_path

    try:
        d = read_toml(user_path(path), MatrixError)
    except SpecviewError:
        return False
    return isinstance(d, dict) and "part" in d


def preset_path(name: str) -> Path:
    """A shipped preset's file by its name, or the preset file ``name`` names."""
    if name.endswith(".toml"):
        from ..prompts import user_path

        p = user_path(name)
        if not p.is_file():
            raise MatrixError(f"{p}: no such preset file")
        return p
    p = PRESETS_DIR / f"{name}.toml"
    if not p.is_file():
        names = preset_names()
        raise MatrixError(f"no preset named {name!r}; the presets are {', '.join(names) if names else '(none installed)'}")
    return p


def preset_roles(name: str) -> dict[str, dict[str, str]]:
    """A preset's model roles: role -> {"default": model, "means": what it is}."""
    d = read_toml(preset_path(name), MatrixError)
    return _roles(d, str(preset_path(name)))


def _roles(d: Mapping[str, Any], source: str) -> dict[str, dict[str, str]]:
    models = d.get("models", {})
    if not isinstance(models, dict) or not models:
        raise MatrixError(f"{source}: [models] must name the preset's model roles")
    out: dict[str, dict[str, str]] = {}
    for role, v in models.items():
        if not isinstance(v, dict) or not isinstance(v.get("default"), str) or not isinstance(v.get("means", ""), str):
            raise MatrixError(f"{source}: [models.{role}] needs default = \"MODEL\" and means = \"...\"")
        out[role] = {"default": v["default"], "means": v.get("means", "")}
    return out


def load_preset(name: str, models: Mapping[str, str] | None = None) -> MatrixSpec:
    """The preset's matrix, with ``models`` (role -> file or demo name) in place of the role defaults."""
    path = preset_path(name)
    source = str(path)
    d = read_toml(path, MatrixError)
    if not isinstance(d, dict):
        raise MatrixError(f"{source}: a preset is a table of keys")
    roles = _roles(d, source)
    given = dict(models or {})
    unknown = [r for r in given if r not in roles]
    if unknown:
        raise MatrixError(f"--model {unknown[0]}=...: preset {name} has no model role {unknown[0]!r}; its roles: "
                          + ", ".join(f"{r} ({v['means']}, default {v['default']})" for r, v in roles.items()))
    # a model given on the command line is relative to the working folder; a default, to the preset's own
    chosen = {r: _model_path(given[r], Path.cwd(), drafter=True) if r in given else v["default"]
              for r, v in roles.items()}

    def fill(text: str, where: str) -> str:
        def sub(m: re.Match) -> str:
            if m.group(1) not in chosen:
                raise MatrixError(f"{source}: {where} names the model role {{{m.group(1)}}}, which [models] "
                                  "does not declare")
            return chosen[m.group(1)]
        return _ROLE_REF.sub(sub, text)

    raw_parts = d.get("part")
    if not isinstance(raw_parts, list) or not raw_parts or not all(isinstance(p, dict) for p in raw_parts):
        raise MatrixError(f"{source}: a preset needs [[part]] tables")
    shared = {k: v for k, v in d.items() if k not in ("part", "models", "title", "about", "targets", "drafters")}
    base = spec_from_dict({**shared, "targets": ["-"], "drafters": ["none"]}, base=path.parent, source=source)
    parts: list[dict[str, Any]] = []
    for i, p in enumerate(raw_parts):
        where = f"part {i + 1}" + (f" ({p['name']})" if isinstance(p.get("name"), str) else "")
        bad = [k for k in p if k not in PART_KEYS and k not in axes()]
        if bad:
            raise MatrixError(f"{source}: {where}: unknown key(s) {', '.join(map(str, bad))}; a part sets "
                              f"{', '.join(PART_KEYS)} and the axes {', '.join(axes())}")
        for key in ("name", "role", "label"):
            if not isinstance(p.get(key), str) or not p[key]:
                raise MatrixError(f"{source}: {where}: '{key}' must be text")
        if p["role"] not in ROLES:
            raise MatrixError(f"{source}: {where}: role {p['role']!r} is not one of {', '.join(ROLES)}")
        sel = p.get("prompts", "first")
        if sel not in ("first", "all"):
            raise MatrixError(f"{source}: {where}: prompts must be \"first\" or \"all\" (got {show(sel)})")
        one = {"targets": [fill(t, where) for t in _strings(p, "targets", source, where)],
               "drafters": [fill(t, where) for t in _strings(p, "drafters", source, where)],
               **{a: p[a] for a in axes() if a in p}}
        # each part's values are checked (and its paths resolved) as a matrix of its own
        sub = spec_from_dict({**shared, **one}, base=path.parent, source=f"{source}: {where}")
        part = {"name": p["name"], "role": p["role"], "label": p["label"], "prompts": sel,
                "targets": list(sub.targets), "drafters": list(sub.drafters)}
        for a in axes():  # every axis, the shared value where the part sets none
            part[a] = list(getattr(sub, a))
        parts.append(part)
    names = [p["name"] for p in parts]
    if len(set(names)) != len(names):
        raise MatrixError(f"{source}: two parts share a name; give each its own")
    if not any(p["role"] == "subject" for p in parts):
        raise MatrixError(f"{source}: a preset needs a part with role \"subject\"")
    varied = sorted({a for p in raw_parts for a in axes() if a in p})
    spec = replace(base, parts=parts, preset={"name": path.stem, "title": str(d.get("title", name)),
                                              "about": str(d.get("about", "")), "axes": varied,
                                              "models": {r: {"model": chosen[r], "means": v["means"]}
                                                         for r, v in roles.items()}},
                   source=source)
    union(spec)
    return spec


def _strings(p: Mapping[str, Any], key: str, source: str, where: str) -> list[str]:
    v = p.get(key)
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise MatrixError(f"{source}: {where}: '{key}' must be a list of model names")
    return v


def union(spec: MatrixSpec) -> MatrixSpec:
    """Set a preset spec's own axes to the union of its parts' values, so checking the spec checks every part."""
    def merged(key: str, default: list[Any]) -> list[Any]:
        out: list[Any] = []
        for p in spec.parts:
            for v in p.get(key, default):
                if v not in out:
                    out.append(v)
        return out

    spec.targets = merged("targets", [])
    spec.drafters = merged("drafters", [])
    for f in axis_fields():
        setattr(spec, f.name, merged(f.name, list(getattr(spec, f.name))))
    return spec


# -- what the cells establish -------------------------------------------------------------
def _label(part: Mapping[str, Any]) -> str:
    return str(part.get("label") or part["name"])


def _tokens(cells: Sequence[Mapping[str, Any]]) -> int:
    return min((int(c.get("n_vanilla") or 0) for c in cells), default=0)


def _fork_words(c: Mapping[str, Any]) -> str:
    from ..verdicts import cell_label

    f = c.get("fork") or {}
    words = f"forks at token {c.get('first_mismatch')} ({cell_label(c)})"
    if f.get("vanilla_piece") is not None and f.get("speculative_piece") is not None:
        words += f": vanilla {f['vanilla_piece']!r}, speculative {f['speculative_piece']!r}"
    if isinstance(c.get("gap"), (int, float)):
        words += f", gap {c['gap']:.4g}"
    return words


def _outcome(cells: Sequence[Mapping[str, Any]]) -> str:
    """"identical", "forks", "mixed", "error" or "not run" for a part's finished cells."""
    if not cells:
        return "not run"
    ok = [c for c in cells if c.get("status") == "ok"]
    if not ok:
        return "error"
    forks = [c for c in ok if not c.get("identical")]
    if not forks:
        return "identical" if len(ok) == len(cells) else "error"
    return "forks" if len(forks) == len(ok) else "mixed"


def _changed(part: Mapping[str, Any], subject: Mapping[str, Any]) -> list[str]:
    """The settings in which a part differs from the subject, as llama.cpp's flags say them."""
    out = []
    for key in ("targets", "drafters", *axes()):
        a, b = part.get(key), subject.get(key)
        if a is None or a == b:
            continue
        if key in ("targets", "drafters"):
            out.append(f"{key[:-1]} " + ", ".join(model_label(v) for v in a))
        else:
            flag = _flag(key)
            out.append(", ".join(f"{flag} {v:g}" if isinstance(v, float) else f"{flag} {v}" for v in a))
    return out


def _flag(axis: str) -> str:
    """An axis as llama.cpp's flag names it: ``--spec-draft-n-max``, ``-fa``."""
    from ..config import field_of, settings_class

    flags = list(field_of(settings_class(axis), axis).metadata.get("flags") or ())
    spec = [f for f in flags if f.startswith("--spec-")]
    short = [f for f in flags if not f.startswith("--")]
    return (spec or short or flags or [axis])[0]


def findings(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One finding per part: its role, outcome, the cells it rests on, and the sentence that says it."""
    spec = doc.get("spec") or {}
    parts = spec.get("parts") or []
    cells = [c for c in doc.get("cells", []) if isinstance(c, dict)]
    by_part: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        by_part.setdefault((c.get("params") or {}).get("part", ""), []).append(c)
    subject = next((p for p in parts if p["role"] == "subject"), None)
    subject_cells = by_part.get(subject["name"], []) if subject else []
    out = []
    for p in parts:
        cs = by_part.get(p["name"], [])
        outcome = _outcome(cs)
        ok = [c for c in cs if c.get("status") == "ok"]
        out.append({"part": p["name"], "role": p["role"], "outcome": outcome, "cells": [c["index"] for c in cs],
                    "evidence": _evidence(p["role"], outcome, ok),
                    "verdicts": sorted({str(c.get("verdict")) for c in ok if not c.get("identical")}),
                    "text": _sentence(p, cs, outcome, subject, subject_cells)})
    return out


def _evidence(role: str, outcome: str, ok: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a part's identical cells are the evidence its role needs (a control that drafted nothing is not)."""
    if outcome != "identical":
        return False
    if role == "lossless-control":
        return sum(int(c.get("n_accepted") or 0) for c in ok) > 0
    if role == "zero-draft":
        return sum(int(c.get("n_drafted") or 0) for c in ok) == 0
    return True


def _sentence(p: Mapping[str, Any], cs: Sequence[Mapping[str, Any]], outcome: str,
              subject: Mapping[str, Any] | None, subject_cells: Sequence[Mapping[str, Any]]) -> str:
    label, role = _label(p), p["role"]
    if outcome == "not run":
        return f"{label}: not run yet."
    if outcome == "error":
        errs = [c for c in cs if c.get("status") != "ok"]
        return f"{label}: failed ({errs[0].get('error') if errs else 'no result'}); it establishes nothing."
    ok = [c for c in cs if c.get("status") == "ok"]
    forks = [c for c in ok if not c.get("identical")]
    n = _tokens(ok)
    first = min(forks, key=lambda c: c.get("first_mismatch") or 0) if forks else None
    drafted = sum(int(c.get("n_drafted") or 0) for c in ok)
    accepted = sum(int(c.get("n_accepted") or 0) for c in ok)
    if role == "determinism":
        if outcome == "identical":
            return f"{label}: identical over {n} tokens. Plain greedy decoding is deterministic here, so a fork " \
                   "elsewhere is not run-to-run noise."
        return f"{label}: {_fork_words(first)}. Plain decoding is not deterministic here; no other cell can be " \
               "read as evidence until that is fixed."
    if role == "lossless-control":
        if outcome == "identical" and accepted > 0:
            return f"{label}: identical over {n} tokens with {accepted} of {drafted} drafted tokens accepted. " \
                   "Drafting from the text itself is lossless, so the speculative loop (verify, accept, roll " \
                   "back) is sound."
        if outcome == "identical":
            return f"{label}: identical over {n} tokens, but with {accepted} of {drafted} drafted tokens " \
                   "accepted it proves nothing about the speculative loop."
        return f"{label}: {_fork_words(first)}. Speculation forks even with no draft model: the loop, or " \
               "batched verify passes as such, are at fault, not the drafter."
    if role == "subject":
        if outcome == "identical":
            return f"{label}: identical over {n} tokens ({drafted} drafted, {accepted} accepted). The fork the " \
                   "report describes does not happen on this machine, build and thread count."
        where = f"on {len(forks)} of {len(ok)} prompts; first " if len(ok) > 1 else ""
        return f"{label}: {where}{_fork_words(first)} ({drafted} drafted, {accepted} accepted)."
    subj = _outcome(subject_cells)
    changed = _changed(p, subject) if subject else []
    setting = " and ".join(changed) or "this setting"
    if role == "zero-draft":
        if drafted > 0:
            return f"{label}: {drafted} tokens were still drafted, so this is not a zero-draft control and " \
                   "proves nothing."
        if outcome == "identical":
            tail = (" With a draft the subject forks, so the fork needs drafted tokens in the verify pass."
                    if subj in ("forks", "mixed") else "")
            return f"{label}: nothing drafted and identical over {n} tokens.{tail}"
        return f"{label}: nothing drafted, yet it {_fork_words(first)}: the difference is not in the verify " \
               "batch (look at the prompt's pass and the cache)."
    if role == "toggle":
        if subj == "not run" or subj == "error":
            return f"{label}: {'identical' if outcome == 'identical' else _fork_words(first)}; the subject has " \
                   "no result to compare with."
        same = (outcome == "identical") == (subj == "identical")
        now = f"identical over {n} tokens" if outcome == "identical" else _fork_words(first)
        if same and outcome == "identical":
            return f"{label}: {now}, as the subject is."
        if same:
            return f"{label}: still {now}; {setting} does not remove the fork."
        if outcome == "identical":
            return f"{label}: {now}; {setting} removes the subject's fork."
        return f"{label}: {now}, where the subject is identical; {setting} makes it fork."
    # reference: the drafter on a full-precision target, over the prompts
    if outcome == "identical":
        tail = (" The subject's fork needs the quantized weights." if subj in ("forks", "mixed") else "")
        every = "the prompt" if len(ok) == 1 else ("both prompts" if len(ok) == 2 else f"all {len(ok)} prompts")
        return f"{label}: identical on {every}, {n} tokens each.{tail}"
    return f"{label}: forks on {len(forks)} of {len(ok)} prompts; first {_fork_words(first)}. Full-precision " \
           "weights do not keep it lossless here, so it is not only a quantization effect."


def conclusion(found: Sequence[Mapping[str, Any]]) -> str | None:
    """The sentence the parts add up to, when they do (the way the reports conclude)."""
    by_role: dict[str, list[Mapping[str, Any]]] = {}
    for f in found:
        by_role.setdefault(f["role"], []).append(f)
    if any(f["outcome"] in ("not run", "error") for f in found):
        return None
    subject = by_role.get("subject", [])
    if not subject or all(f["outcome"] == "identical" for f in subject):
        return "Together: the subject does not fork here, so these cells localise nothing on this machine."
    if any(f["outcome"] != "identical" for f in by_role.get("determinism", [])):
        return "Together: plain decoding is not deterministic here, which must be fixed before anything else."

    def proven(role: str) -> bool:
        return role in by_role and all(f["evidence"] for f in by_role[role])

    facts = ["plain decoding is deterministic"] if proven("determinism") else []
    if proven("lossless-control"):
        facts.append("speculation that drafts from the text stays lossless")
    if proven("zero-draft"):
        facts.append("drafting nothing restores the output")
    reference = by_role.get("reference", [])
    if reference and proven("reference"):
        facts.append("full-precision weights stay identical")
        cause = "the quantized target's batched verify passes"
    elif reference:
        facts.append("full-precision weights fork too")
        cause = "batched verify passes, quantized weights or not"
    else:
        cause = "the batched verify passes"
    if not facts:
        return None
    text = ("Together: " + ", ".join(facts[:-1]) + (" and " if len(facts) > 1 else "") + facts[-1]
            + f", so the fork comes from {cause}: the signature of batched against single-token numerics.")
    states = [f for f in found if "state" in f["verdicts"]]
    if states:
        return text + (" But the diagnosis reads the fork of " + ", ".join(f["part"] for f in states)
                       + " as a state bug, not numerics: report that one with its trace.")
    return text + " Whether each fork is a harmless near-tie or a bug is its verdict."


def findings_lines(doc: Mapping[str, Any]) -> list[str]:
    """What a preset matrix establishes: a sentence per part and the conclusion; [] for a matrix that is no preset."""
    spec = doc.get("spec") or {}
    if not spec.get("parts"):
        return []
    preset = spec.get("preset") or {}
    found = findings(doc)
    lines = [f"Preset {preset.get('name', '?')}: {preset.get('title') or ''}".rstrip(": ") + "."]
    lines += [f["text"] for f in found]
    c = conclusion(found)
    if c:
        lines.append(c)
    return lines


def model_roles_text(name: str) -> str:
    """The roles a preset's --model takes, for help and errors."""
    try:
        roles = preset_roles(name)
    except SpecviewError as exc:
        return str(exc)
    return "; ".join(f"{r}: {v['means']} (default {v['default']})" for r, v in roles.items())
