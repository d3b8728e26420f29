"""A matrix that cites a kernel map: each cell's prediction, and the plain words that compare them with the cells.

The matrix file records the map it cites under ``kernel_map`` (its file and
what it proves, :func:`~specview.core.kernels.evidence.citation`) and, per
cell, the map's prediction for that cell under ``kernel_prediction``
(:class:`~specview.core.kernels.evidence.KernelPrediction` as JSON).  The
prediction is made when the cell finishes, from its trace: the target's file
facts, the thread count it used and its environment.  The summary and the
rates read only the file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..config import RunConfig, resolve_threads
from ..errors import SpecviewError
from ..stats import pct as _pct
from ..kernels.evidence import (DIFFER, NOT_COVERED, NOT_DETERMINISTIC, PROVEN, REACH_CAVEAT, STATUS_WORDS, STATUSES,
                               KernelPrediction, contradiction_text, predict_config)
from ..verdicts import WORDS, category
from .cells import CellParams, describe

#: at most this many distinct reasons and caveats are spelled out in a summary
MAX_REASONS = 4


def predict_cell(kmap: Any, cfg: RunConfig, trace: Any, map_file: str) -> KernelPrediction:
    """The map's prediction for a finished cell, from its trace (file facts, threads used, environment)."""
    models = trace.models if isinstance(trace.models, dict) else {}
    tokens = trace.prompt.get("tokens") if isinstance(trace.prompt, dict) else None
    reach = (len(tokens) if isinstance(tokens, list) else 0) + max(len(trace.vanilla.tokens),
                                                                   len(trace.speculative.tokens))
    used = trace.config.get("threads_used") if isinstance(trace.config, dict) else None
    return predict_config(kmap, cfg, model=models.get("target") if isinstance(models.get("target"), dict) else None,
                          threads_used=used if isinstance(used, int) else None,
                          environment=trace.environment if isinstance(trace.environment, dict) else None,
                          reach=reach, map_file=map_file)


def predict_planned(kmap: Any, cfg: RunConfig, map_file: str) -> KernelPrediction:
    """The prediction for a cell not run yet (``--dry-run``): by name, at the thread count it would get here."""
    return predict_config(kmap, cfg, threads_used=resolve_threads(cfg.engine.threads), map_file=map_file)


def predict_record(kmap: Any, rec: Mapping[str, Any], map_file: str,
                   environment: Mapping[str, Any] | None = None) -> KernelPrediction | None:
    """The prediction for a cell record kept from an earlier run (``--resume``): by name, from its settings."""
    raw = rec.get("config")
    if not isinstance(raw, dict):
        return None
    try:
        cfg = RunConfig.from_dict(raw)
    except SpecviewError:
        return None
    used = raw.get("threads_used")
    n = [rec.get(k) for k in ("prompt_tokens", "n_vanilla", "n_speculative")]
    reach = (n[0] + max(n[1], n[2])) if all(isinstance(x, int) and not isinstance(x, bool) for x in n) else None
    return predict_config(kmap, cfg, threads_used=used if isinstance(used, int) and not isinstance(used, bool)
                          else None, environment=environment, reach=reach, map_file=map_file)


# -- reading a document ---------------------------------------------------------------------
def prediction_of(cell: Mapping[str, Any]) -> KernelPrediction | None:
    d = cell.get("kernel_prediction")
    return KernelPrediction.from_json(d) if isinstance(d, dict) else None


def _map_name(doc: Mapping[str, Any], preds: Sequence[KernelPrediction]) -> str:
    cite = doc.get("kernel_map")
    f = cite.get("file") if isinstance(cite, dict) else None
    f = f if isinstance(f, str) and f else next((p.map_file for p in preds if p.map_file), None)
    return Path(f).name if f else "the kernel map"


def _fork_position(cell: Mapping[str, Any]) -> int | None:
    a, b = cell.get("prompt_tokens"), cell.get("first_mismatch")
    if all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b)):
        return a + b
    return None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _num(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.4g}"


def contradiction_lines(doc: Mapping[str, Any]) -> list[str]:
    """One loud sentence per cell the map proves lossless that forked anyway."""
    out = []
    for c in doc.get("cells", []):
        p = prediction_of(c) if c.get("status") == "ok" else None
        if p is None or not p.contradicts(c.get("identical")):
            continue
        fk = c.get("fork") if isinstance(c.get("fork"), dict) else {}
        line = contradiction_text(p, where=describe(CellParams.from_json(c["params"])), fork=c.get("first_mismatch"),
                                  pieces=(fk.get("vanilla_piece"), fk.get("speculative_piece")),
                                  fork_position=_fork_position(c))
        if c.get("diagnosed"):
            cat = category(c) or "diverged"
            line += f" Its diagnosis: {WORDS.get(cat, cat)}."
        out.append(line)
    return out


def kernel_lines(doc: Mapping[str, Any]) -> list[str]:
    """Plain sentences citing the map: every contradiction first, then what it proves and whether the cells agree,
    where it predicts forks, what it does not cover, and its caveats."""
    cells = [c for c in doc.get("cells", []) if c.get("status") == "ok"]
    pairs = [(c, p) for c in cells for p in [prediction_of(c)] if p is not None]
    if not isinstance(doc.get("kernel_map"), dict) and not pairs:
        return []
    preds = [p for _, p in pairs]
    name = _map_name(doc, preds)
    if not pairs:
        return [f"The kernel map {name} is cited; no finished cell has its prediction yet."]
    lines = contradiction_lines(doc)
    groups: dict[tuple[str, str], list[tuple[dict, KernelPrediction]]] = {}
    for c, p in pairs:
        groups.setdefault((p.status, p.row or p.target), []).append((c, p))
    for (status, row), members in groups.items():
        k = len(members)
        same = sum(1 for c, _ in members if c.get("identical"))
        forked = k - same
        if status == PROVEN:
            safe = members[0][1].safe_n_max
            drafting = [p.n_max for _, p in members if not (p.widths == [1] and p.n_max > 0)]
            at = f"at n_max ≤ {max(drafting)}" if drafting else "(each verify row its own single-token pass)"
            head = f"The kernel map {name} proves n_max ≤ {safe} lossless for {row}"
            if forked == 0:
                lines.append(f"{head}; its {_plural(k, 'cell')} {at} {'is' if k == 1 else 'are'} identical, "
                             "as predicted.")
            else:
                lines.append(f"{head}; of its {_plural(k, 'cell')} {at}, {same} {'is' if same == 1 else 'are'} "
                             f"identical, as predicted, and {forked} CONTRADICT{'S' if forked == 1 else ''} it "
                             "(see above).")
        elif status == DIFFER:
            by_width: dict[int | None, list[tuple[dict, KernelPrediction]]] = {}
            for c, p in members:
                by_width.setdefault(p.first_differing, []).append((c, p))
            for w, ms in by_width.items():
                p0 = ms[0][1]
                nf = sum(1 for c, _ in ms if not c.get("identical"))
                lines.append(f"For {row} the map finds width {w} differing from single-token passes "
                             f"({_pct(p0.identical_share)} of its rows bit-identical, max |Δ| {_num(p0.max_delta)} "
                             f"logits): forks are possible at n_max ≥ {(w or 1) - 1}; {nf} of its "
                             f"{_plural(len(ms), 'cell')} there fork.")
        elif status == NOT_DETERMINISTIC:
            lines.append(f"The map's width-1 control failed for {row}: it proves nothing for its "
                         f"{_plural(k, 'cell')} ({forked} fork).")
    uncovered = [(c, p) for c, p in pairs if p.status == NOT_COVERED]
    if uncovered:
        reasons: dict[str, int] = {}
        for _, p in uncovered:
            r = p.missing[0] if p.missing else (p.reason or "no reason recorded")
            reasons[r] = reasons.get(r, 0) + 1
        shown = [f"{r} ({n})" for r, n in list(reasons.items())[:MAX_REASONS]]
        more = f"; {len(reasons) - MAX_REASONS} other reasons" if len(reasons) > MAX_REASONS else ""
        lines.append(f"The kernel map {name} does not cover {_plural(len(uncovered), 'cell')}: "
                     + "; ".join(shown) + more + ".")
    caveats: list[str] = []
    long = [p for p in preds if any(cv.startswith(REACH_CAVEAT) for cv in p.caveats)]
    if long:
        furthest = max(p.reach for p in long if p.reach is not None) if any(p.reach is not None for p in long) else None
        measured = sorted({p.map_reach for p in long if p.map_reach is not None})
        caveats.append(f"{_plural(len(long), 'proven cell')} reach{'es' if len(long) == 1 else ''} further into the "
                       f"context than the map measured (up to KV position {furthest}; the map measured up to "
                       f"{', '.join(map(str, measured)) or '?'}): there the claim assumes the kernels do not change "
                       "with the context length, which they can (map as far as you generate)")
    for p in preds:
        for cv in p.caveats:
            if cv not in caveats and not cv.startswith(REACH_CAVEAT):
                caveats.append(cv)
    for cv in caveats[:MAX_REASONS]:
        lines.append(f"Caveat: {cv}.")
    if len(caveats) > MAX_REASONS:
        lines.append(f"({len(caveats) - MAX_REASONS} more caveats in the cells' kernel_prediction.)")
    return lines


def group_prediction(cells: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """What the map predicted for a group of cells (a setting's prompts): its status where they share one,
    the count of each, and the contradictions; None when no cell has a prediction."""
    preds = [(c, p) for c in cells if c.get("status") == "ok" for p in [prediction_of(c)] if p is not None]
    if not preds:
        return None
    counts = {s: 0 for s in STATUSES}
    for _, p in preds:
        counts[p.status] = counts.get(p.status, 0) + 1
    used = [s for s, n in counts.items() if n]
    return {
        "status": used[0] if len(used) == 1 else "mixed",
        "counts": counts,
        "contradictions": sum(1 for c, p in preds if p.contradicts(c.get("identical"))),
    }


def group_prediction_text(g: Mapping[str, Any]) -> str:
    """``proven lossless for all 4 prompts; 0 contradictions``."""
    counts = g.get("counts") or {}
    if g.get("status") in STATUS_WORDS:
        n = sum(v for v in counts.values() if isinstance(v, int) and not isinstance(v, bool))
        head = f"{STATUS_WORDS[g['status']]} ({_plural(n, 'cell')})"
    else:
        head = "; ".join(f"{STATUS_WORDS.get(s, s)} ({_plural(n, 'cell')})" for s, n in counts.items()
                         if isinstance(n, int) and not isinstance(n, bool) and n > 0)
    n = g.get("contradictions") or 0
    return head + (f"; {n} CONTRADICTION{'S' if n != 1 else ''}" if n else "")


__all__ = ["MAX_REASONS", "contradiction_lines", "group_prediction", "group_prediction_text", "kernel_lines",
           "predict_cell", "predict_planned", "predict_record", "prediction_of"]
