"""The grid and the plain-words summary of a matrix, computed from its cells, never canned.

The grid's rows are target × prompt × the engine axes (flash attention), its
columns drafter × the draft-model axes (n_max, p_min); both lists of axes come
from the settings' declarations.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .. import verdicts
from ..config import LLAMA_SPEC_TYPES, default_of
from ..diagnose.words import zero_draft, zero_draft_setting
from ..errors import SpecviewError
from .cells import CellParams, describe, expand, model_label
from .settings import axis_fields, axis_label, axis_short, draft_axes, engine_axes
from .spec import MatrixSpec

ROW_AXES = ("part", "target", "prompt", *engine_axes())  # "part": a preset's parts (absent elsewhere)
COL_AXES = ("drafter", *draft_axes())
AXIS_NAMES = {"part": "part", "target": "target", "drafter": "drafter", "prompt": "prompt",
              **{a: axis_label(a) for a in (*draft_axes(), *engine_axes())}}
#: every axis a summary sentence may name, in the order it names them
ALL_AXES = ("target", "drafter", *draft_axes(), *engine_axes(), "prompt")

_DEFAULTS = {f.name: default_of(f) for f in axis_fields()}
#: an axis with more values than this is not spelled out value by value (a prompt suite's prompts)
MAX_NAMED = 8
#: drafters are named up to one per llama.cpp spec type (a matrix over every type: --drafters all)
MAX_DRAFTERS_NAMED = len(LLAMA_SPEC_TYPES)


def axis_value_label(axis: str, value: Any) -> str:
    if value is None:
        return "-"
    if axis in ("target", "drafter"):
        return model_label(value)
    if isinstance(value, float):
        return f"{value:g}"
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
        return " · ".join(axis_part(a, v) for a, v in zip(self.row_axes, row)) or "all"

    def col_label(self, col: tuple) -> str:
        if not self.col_axes:
            return "outcome"
        return " ".join(axis_part(a, v) for a, v in zip(self.col_axes, col) if v is not None) or "all"


def axis_part(axis: str, value: Any) -> str:
    """One axis value as a setting's label shows it: ``n_max=3``, ``fa=on``, or the value alone."""
    label = axis_value_label(axis, value)
    if axis in draft_axes():
        return f"{axis}={label}"
    if axis in engine_axes():
        return f"{axis_short(axis)}={label}"
    return label


def grid(doc: dict[str, Any]) -> Grid:
    """Lay out a matrix document's cells (planned cells not yet run are absent from ``at``)."""
    cells = doc.get("cells", [])
    spec = doc.get("spec") or {}
    planned: list[dict[str, Any]] = []
    try:
        planned = [{"params": c.to_json()} for c in expand(MatrixSpec.from_json(spec))]
    except SpecviewError:
        planned = []
    every = planned or cells
    if spec.get("parts"):  # a preset: one row per cell, named by its part and whatever varies, one outcome column
        row_axes = ["part", *_varying(every, ALL_AXES)]
        col_axes: list[str] = []
    else:
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
    return s if s.startswith(draft_axes()) else s[:1].upper() + s[1:]


def _uncap(s: str) -> str:
    return s[:1].lower() + s[1:] if s[:2] != s[:2].upper() else s


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _value_phrase(axis: str, values: Sequence[Any]) -> str:
    labels = [axis_value_label(axis, v) for v in values]
    if axis in draft_axes():
        return f"{axis} = {_join(labels)}"
    if axis in engine_axes():
        return f"{AXIS_NAMES[axis].replace(' ', '-')}-{_join(labels)}"
    if axis == "drafter":
        return "the " + _join(labels) + " drafter" + ("s" if len(labels) > 1 else "")
    if axis == "prompt":
        return _join([f"'{x}'" for x in labels]) + " prompt"
    return _join(labels)


def cell_drafted_nothing(cell: Mapping[str, Any] | None) -> bool:
    """Whether a cell is identical only because its speculative arm drafted no token, so that it tested nothing
    speculative (inconclusive).  Known from its settings (spec type none, n_max 0, p_min 1) or from its verify
    rounds; a cell whose engine reported no rounds (mlx_lm.server, llama-server without per-round data) records no
    such evidence, and stays identical."""
    if not isinstance(cell, Mapping) or cell.get("status") != "ok" or not cell.get("identical"):
        return False
    if cell.get("n_drafted") != 0:
        return False
    return cell.get("mean_accepted") is not None or zero_draft_setting(_settings(cell)) is not None


def _settings(cell: Mapping[str, Any]) -> Mapping[str, Any]:
    cfg = cell.get("config")
    return cfg if isinstance(cfg, Mapping) else cell.get("params") or {}


def cell_category(cell: Mapping[str, Any] | None) -> str | None:
    """A cell's display category (:func:`specview.core.verdicts.category`), inconclusive for one that drafted
    nothing."""
    return "inconclusive" if cell_drafted_nothing(cell) else verdicts.category(cell)


def cell_label(cell: Mapping[str, Any] | None) -> str:
    """What a cell says in words (:func:`specview.core.verdicts.cell_label`), "inconclusive (nothing drafted)" for
    one that drafted nothing."""
    return "inconclusive (nothing drafted)" if cell_drafted_nothing(cell) else verdicts.cell_label(cell)


def cell_text(cell: Mapping[str, Any] | None, *, sep: str = " · ") -> str:
    """The short text of a grid cell (:func:`specview.core.verdicts.cell_text`), ``inconclusive · nothing
    drafted`` for one that drafted nothing."""
    if cell_drafted_nothing(cell):
        return f"inconclusive{': ' if sep == ' ' else sep}nothing drafted"  # a bare space would run the words on
    return verdicts.cell_text(cell, sep=sep)


def summarize(doc: dict[str, Any], *, kernel_map: bool = True) -> list[str]:
    """Plain sentences naming what the matrix shows, computed from its cells.

    When the matrix cites a kernel map, the sentences comparing its predictions with the cells follow
    (:func:`~specview.core.matrix.evidence.kernel_lines`; ``kernel_map=False`` leaves them out).
    """
    from .preset import findings_lines

    lines = findings_lines(doc) + _summary(doc)
    if kernel_map:
        from .evidence import kernel_lines

        lines += kernel_lines(doc)
    return lines


def _summary(doc: dict[str, Any]) -> list[str]:
    cells = doc.get("cells", [])
    ok = [c for c in cells if c.get("status") == "ok"]
    errors = [c for c in cells if c.get("status") == "error"]
    if not cells:
        return ["No cell has finished yet."]
    lines = [_head_line(doc, ok, errors)]
    if not ok:
        return lines
    forks = [c for c in ok if not c["identical"]]
    lines.extend(_nothing_drafted(ok))
    lines.extend(_outcomes([c for c in ok if not cell_drafted_nothing(c)], any(map(cell_drafted_nothing, ok))))
    lines.extend(_rollback_texts(ok))
    if forks:
        # a file may lack a fork's index (it is checked only where present): such a cell sorts last
        first = min(forks, key=lambda c: c["first_mismatch"] if isinstance(c.get("first_mismatch"), int) else 1 << 63)
        lines.append(f"Earliest fork: token {first.get('first_mismatch')} "
                     f"({describe(CellParams.from_json(first['params']))}).")
        gaps = [c["gap"] for c in forks if isinstance(c.get("gap"), (int, float))]
        if gaps:
            lines.append(f"Top-1/top-2 gap at the diagnosed forks: {min(gaps):.4g} to {max(gaps):.4g} logits.")
    if errors:
        lines.append(f"{_plural(len(errors), 'cell')} failed: " + "; ".join(
            f"{describe(CellParams.from_json(c['params']))}: {c.get('error')}" for c in errors[:3])
            + (" ..." if len(errors) > 3 else "") + ".")
    return lines


def _head_line(doc: dict[str, Any], ok: Sequence[dict[str, Any]], errors: Sequence[dict[str, Any]]) -> str:
    """ "8 cells: 1 fork, 3 identical, 4 inconclusive (nothing drafted); forks: 1 near-tie." """
    cells = doc.get("cells", [])
    n_total = doc.get("n_cells", len(cells))
    forks = [c for c in ok if not c["identical"]]
    blank = [c for c in ok if cell_drafted_nothing(c)]
    head = f"{_plural(len(cells), 'cell')}"
    if n_total and n_total != len(cells):
        head += f" of {n_total} finished"
    parts = [f"{len(forks)} fork", f"{len(ok) - len(forks) - len(blank)} identical"]
    if blank:
        parts.append(f"{len(blank)} inconclusive (nothing drafted)")
    if errors:
        parts.append(f"{len(errors)} failed")
    labels: dict[str, int] = {}
    for c in forks:
        labels[cell_label(c)] = labels.get(cell_label(c), 0) + 1
    vtxt = "; forks: " + ", ".join(f"{n} {v}" for v, n in sorted(labels.items(), key=lambda x: -x[1])) if forks else ""
    return f"{head}: {', '.join(parts)}{vtxt}."


def _outcomes(tested: Sequence[dict[str, Any]], some_blank: bool) -> list[str]:
    """What decides identical against fork, among the cells that drafted (``some_blank``: others did not)."""
    which = "cell that drafted" if some_blank else "cell"
    if not tested:
        return ["No cell drafted a token, so this matrix tested nothing speculative: give it settings that draft "
                "(n_max above 0, p_min below 1, a draft model)."]
    if all(c["identical"] for c in tested):
        return [f"Every {which} is identical: no setting here makes speculative decoding differ from plain greedy."]
    if not any(c["identical"] for c in tested):
        return [f"Every {which} forks: no setting here keeps speculative decoding equal to plain greedy."]
    return _determinants(tested) + _by_setting(tested) + _flips(tested)


def _nothing_drafted(ok: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence on the cells that drafted nothing, by reason: they are left out of what follows."""
    blank = [c for c in ok if cell_drafted_nothing(c)]
    if not blank or len(blank) == len(ok):
        return []
    by_why: dict[str, list[dict[str, Any]]] = {}
    for c in blank:
        by_why.setdefault(zero_draft(_settings(c)).why, []).append(c)
    reasons = []
    for why, cs in by_why.items():
        drafters = sorted({model_label(c["params"]["drafter"]) for c in cs if c["params"].get("drafter")})
        drafters = [d for d in drafters if d not in why]  # a drafter the reason names is not named again
        reasons.append(f"{why} ({_plural(len(cs), 'cell')}{': ' + _join(drafters) if drafters else ''})")
    return [f"{_plural(len(blank), 'cell')} drafted nothing, so they tested nothing speculative and are left out "
            f"below: {'; '.join(reasons)}."]


def _rollback_texts(ok: Sequence[dict[str, Any]]) -> list[str]:
    """Whether two ways of rolling a hybrid target's memory back give the same speculative text.

    Snapshots and checkpoint-and-replay are numerics paths of their own (a replayed state comes from a pass of
    another width): among pairs of cells differing only in the rollback, the speculative arms' texts are
    compared (their digests), whether or not either forks from vanilla.
    """
    others = [a for a in ALL_AXES if a != "rollback"]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in ok:
        if c["params"].get("rollback") is not None and c.get("speculative_digest"):
            groups.setdefault(tuple(c["params"].get(a) for a in others), []).append(c)
    pairs = [(a, b) for g in groups.values() for a, b in itertools.combinations(g, 2)
             if a["params"]["rollback"] != b["params"]["rollback"]]
    if not pairs:
        return []
    differ = [(a, b) for a, b in pairs if a["speculative_digest"] != b["speculative_digest"]]
    if not differ:
        return [f"The rollbacks compared ({_join(sorted({str(c['params']['rollback']) for p in pairs for c in p}))}) "
                f"give the same speculative text in all {_plural(len(pairs), 'pair')} of cells."]
    a, b = differ[0]
    return [f"The rollback changes the text: {len(differ)} of {_plural(len(pairs), 'pair')} of cells that differ "
            f"only in it give other speculative text (first: {describe(CellParams.from_json(a['params']))} "
            f"against rollback={b['params']['rollback']}); a replayed or restored state is a numerics path of "
            "its own."]


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


#: the axes a control sits on (p_min = 1, no drafter): set aside to see what decides the rest
SETTING_AXES = ("drafter", *draft_axes())


def _determinants(ok: Sequence[dict[str, Any]], axes: Sequence[str] = ALL_AXES) -> list[str]:
    """Sentences for axis values whose cells all share one outcome while other cells do not."""
    out: list[tuple[int, str]] = []
    for axis in axes:
        fork_vals, same_vals, mixed = _uniform_values(ok, axis)
        if not fork_vals and not same_vals:
            continue
        if len(fork_vals) + len(same_vals) + len(mixed) > (MAX_DRAFTERS_NAMED if axis == "drafter" else MAX_NAMED):
            continue  # a long list of values says nothing a reader can take in; the rates count them instead
        phrases = []
        if fork_vals:
            phrase = _value_phrase(axis, fork_vals).removeprefix("the ")
            if phrase.endswith(" drafters"):
                phrase = phrase[:-1]  # "all Q4_0 and ngram-mod drafter cells fork"
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
    """A cell's setting without its prompt: ``Q8_0 with Q4_0 n_max=1 p_min=0`` (engine axes where not default)."""
    p = CellParams.from_json(params)
    d = " ".join(axis_part(a, getattr(p, a)) for a in ("drafter", *draft_axes()) if getattr(p, a) is not None)
    eng = "".join(f" {axis_part(a, getattr(p, a))}" for a in engine_axes() if getattr(p, a) != _DEFAULTS[a])
    return f"{model_label(p.target)} with {d}{eng}"


def setting_key(params: dict[str, Any]) -> tuple:
    """What identifies a cell's setting across prompts: every axis but the prompt."""
    return tuple(params.get(a) for a in ALL_AXES if a != "prompt")


def _by_setting(ok: Sequence[dict[str, Any]]) -> list[str]:
    """Across prompts: the settings that fork on every prompt, and those that fork on some."""
    prompts = {c["params"].get("prompt") for c in ok}
    if len(prompts) < 2:
        return []
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in ok:
        groups.setdefault(setting_key(c["params"]), []).append(c)
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
    axes = ALL_AXES
    res: list[tuple[str, int, int]] = []
    def comparable(a: dict[str, Any], b: dict[str, Any], axis: str) -> bool:
        # two drafters compare where each draft axis is equal or read by only one of them (an n-gram cell's
        # n_max is None): Q4_0 n_max=3 against ngram-simple is a change of the drafter alone
        if axis != "drafter":
            return True
        pa, pb = a["params"], b["params"]
        return pa.get(axis) != pb.get(axis) and all(
            pa.get(x) == pb.get(x) or pa.get(x) is None or pb.get(x) is None for x in draft_axes())

    for axis in axes:
        others = [a for a in axes if a != axis and not (axis == "drafter" and a in draft_axes())]
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for c in ok:
            if c["params"].get(axis) is None:
                continue
            key = tuple(c["params"].get(a) for a in others)
            groups.setdefault(key, []).append(c)
        pairs = flips = 0
        for g in groups.values():
            for a, b in itertools.combinations(g, 2):
                if not comparable(a, b, axis):
                    continue
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
