"""The kernel map in reports: its prediction for a trace, its citation in a matrix, and a report of a map itself.

Qt-free and format-free: everything here is (label, value) rows, tables of
strings and sentences; :mod:`.html` and :mod:`.markdown` write them, escaping
every field as they escape the rest of a report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..kernels.evidence import (DIFFER, NOT_COVERED, NOT_DETERMINISTIC, PROVEN, STATUS_WORDS, KernelPrediction,
                               citation_text, contradiction_text, predict_trace)
from ..kernels.causes import cause_words, groups_line
from ..kernels.text import LEGEND, LEVELS, ranges, settings_label, verdict_line, width_note
from ..verdicts import WORDS
from .escape import text
from .facts import obj

#: background colours of the heatmap's cells, by the heatmap's own classes ("=" bit-identical, then max |Δ|)
HEAT_COLOURS = {"=": "#cfe8cf", ".": "#eef3c8", "o": "#f6e3a1", "O": "#f3c89b", "#": "#f2a7a7", " ": "#ffffff"}
WIDTH_HEADERS = ("width", "rows", "bit-identical", "max|Δ|", "p95|Δ|", "flips", "margin<max|Δ|", "")


def _num(x: Any) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return "n/a"
    if isinstance(x, int):
        return text(x)
    if not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "0"
    return f"{x:.1e}" if abs(x) < 1e-3 else (f"{x:.4f}" if abs(x) < 100 else f"{x:.1f}")


def width_rows(t: Any) -> list[list[str]]:
    """The per-width table of one map row, as strings (the columns of :data:`WIDTH_HEADERS`)."""
    out = []
    for w in sorted(t.widths):
        st = t.widths[w]
        note = width_note(w, st)
        c = getattr(st, "cause", None)
        if c and not st.bit_identical:
            note += (" " if note else "") + (f"first differs at {c['where'].removeprefix('first differs at ')}"
                                            if c.get("where") and c.get("node") else cause_words(c))
        share = f"{st.identical} ({100.0 * st.identical_share:.1f}%)"
        out.append([text(w), text(st.rows), share, _num(st.max_delta), _num(st.p95_delta), text(st.flips),
                    text(st.below_shift), note])
    return out


def heat_cell(st: Any) -> tuple[str, str, str]:
    """(symbol, colour, tooltip) of one heatmap cell, with the text heatmap's classes."""
    if st is None or st.rows == 0:
        return "", HEAT_COLOURS[" "], "not mapped"
    if st.bit_identical:
        sym = "="
    else:
        d = abs(st.max_delta) if st.max_delta == st.max_delta else math.inf
        sym = next((ch for lim, ch in LEVELS if d < lim), LEVELS[-1][1])  # NaN and infinity: the largest class
    tip = (f"width {st.width}: {st.identical} of {st.rows} rows bit-identical ({100 * st.identical_share:.1f}%), "
           f"max |Δ| {_num(st.max_delta)}, {st.flips} argmax flips")
    return sym + ("!" if st.flips else ""), HEAT_COLOURS[sym], tip


def target_facts(t: Any) -> list[tuple[str, str]]:
    """(label, value) rows of one map row: its model, settings, threads, coverage and what it proves."""
    m = obj(t.model)
    ps = ", ".join(f"{p.name} tokens 1-{p.positions} ({len(p.prompt_tokens)} prompt tokens)" for p in t.prompts)
    n = t.safe_n_max()
    return [
        ("target", text(t.target)),
        ("model file", f"{text(m.get('file'))} ({text(m.get('quantization'))}, {text(m.get('file_size'))} bytes)"),
        ("settings", settings_label(t.settings) or "the defaults"),
        ("threads used", text(t.threads_used) if t.threads_used is not None else "not recorded"),
        ("prompts", ps or "none"),
        ("width-1 control", "held: deterministic" if t.deterministic else "FAILED: the map proves nothing here"),
        ("bit-identical widths", ranges(t.safe_widths()) or "none"),
        ("proven lossless", f"n_max ≤ {n}" if n is not None else "no n_max"),
        ("in words", verdict_line(t)),
    ] + ([("widths by cause", by_cause)] if (by_cause := groups_line(t)) else [])


# -- a trace's section ----------------------------------------------------------------------
@dataclass
class TraceKernelSection:
    """What a trace report says of the kernel map: the prediction, the row's per-width table, the meaning."""

    prediction: KernelPrediction
    facts: list[tuple[str, str]]
    row_label: str | None
    table: list[list[str]] = field(default_factory=list)
    meaning: str = ""
    contradiction: bool = False


def _fork_step(trace: Any) -> Any:
    fm = trace.comparison.first_mismatch
    if fm is None or not isinstance(fm.index, int) or not 0 <= fm.index < len(trace.speculative.steps):
        return None
    return trace.speculative.steps[fm.index]


def fork_meaning(trace: Any, pred: KernelPrediction, row: Any = None) -> str:
    """What the prediction means for this run's outcome (its fork, or that it has none)."""
    c = trace.comparison
    if c.identical:
        if pred.status == PROVEN:
            return "The arms are identical, as the map predicts."
        if pred.status == DIFFER:
            return (f"The arms are identical, although the map finds width {pred.first_differing} differing: the "
                    "differing rows did not flip a token in this run (a fork was possible, not certain).")
        return f"The arms are identical; the map says nothing about this run ({pred.reason})."
    fm = c.first_mismatch
    if pred.status == PROVEN:
        n_prompt = len(trace.prompt.get("tokens") or []) if isinstance(trace.prompt, dict) else 0
        pos = n_prompt + fm.index if isinstance(fm.index, int) else None
        out = contradiction_text(pred, where="this run", fork=fm.index, pieces=(fm.vanilla_piece, fm.speculative_piece),
                                 fork_position=pos)
        verdict = obj(trace.diagnosis).get("verdict")
        if isinstance(verdict, str) and verdict:
            out += f" Its diagnosis: {WORDS.get(verdict, verdict)}."
        return out
    if pred.status == DIFFER:
        out = (f"The fork at token {text(fm.index)} is what the kernels predict is possible: the map finds width "
               f"{pred.first_differing} differing from single-token passes for {pred.row}.")
        st = _fork_step(trace)
        T = getattr(st, "batch_size", None)
        if row is not None and isinstance(T, int) and not isinstance(T, bool) and T > 0:
            ws = row.widths.get(T)
            if ws is None or ws.rows == 0:
                out += f" The speculative token came from a {T}-row pass, a width the map did not measure."
            elif ws.bit_identical:
                out += (f" The speculative token came from a {T}-row pass, a width the map finds bit-identical: the "
                        "difference reached it through K/V entries an earlier, wider verify pass wrote.")
            else:
                out += (f" The speculative token came from a {T}-row pass, a width the map finds differing "
                        f"({100 * ws.identical_share:.1f}% of its rows bit-identical, max |Δ| {_num(ws.max_delta)} "
                        "logits).")
        return out
    if pred.status == NOT_DETERMINISTIC:
        return f"The map proves nothing about this fork: {pred.reason}."
    return f"The map says nothing about this fork: {pred.reason}."


def trace_kernel_section(trace: Any, kmap: Any, map_file: str | None) -> TraceKernelSection:
    """The kernel-map section of a trace report: the map's prediction for this run and what it means here."""
    pred = predict_trace(kmap, trace, map_file=map_file)
    row = next((t for t in kmap.targets if t.label == pred.row), None) if pred.row else None
    facts = [
        ("kernel map", text(map_file) if map_file else "(given)"),
        ("this run", f"{text(pred.target)}" + (f" [{pred.settings}]" if pred.settings else "")
         + f", n_max {pred.n_max}, verify widths {ranges(pred.widths) or 'none'}"),
        ("map row", text(pred.row) if pred.row else "none matches"),
        ("prediction", STATUS_WORDS.get(pred.status, pred.status)),
        ("why", pred.reason),
    ]
    if pred.evidence:
        facts.append(("evidence", pred.evidence))
    for m in pred.missing:
        facts.append(("missing", m))
    for cv in pred.caveats:
        facts.append(("caveat", cv))
    return TraceKernelSection(prediction=pred, facts=facts, row_label=pred.row,
                              table=width_rows(row) if row is not None else [],
                              meaning=fork_meaning(trace, pred, row),
                              contradiction=pred.contradicts(trace.comparison.identical))


# -- a matrix's section -----------------------------------------------------------------------
def matrix_kernel_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    """One row per finished cell with a prediction: the cell, its prediction, its outcome, and whether they agree."""
    from ..matrix import CellParams, describe
    from ..matrix.evidence import prediction_of
    from ..matrix.summary import cell_text

    out = []
    for c in doc.get("cells", []):
        if c.get("status") != "ok":
            continue
        p = prediction_of(c)
        if p is None:
            continue
        if p.contradicts(c.get("identical")):
            agree = "CONTRADICTS the map"
        elif p.status == PROVEN:
            agree = "as predicted"
        elif p.status == DIFFER:
            agree = "a fork was possible" + ("" if c.get("identical") else ": it happened")
        else:
            agree = "no prediction"
        detail = {PROVEN: f"n_max ≤ {p.safe_n_max}", DIFFER: f"width {p.first_differing} differs",
                  NOT_COVERED: "; ".join(p.missing) or p.reason, NOT_DETERMINISTIC: "control failed"}.get(p.status, "")
        out.append([describe(CellParams.from_json(c["params"])), STATUS_WORDS.get(p.status, p.status), detail,
                    cell_text(c), agree])
    return out


def matrix_citation(doc: Mapping[str, Any]) -> str | None:
    cite = doc.get("kernel_map")
    return citation_text(cite) if isinstance(cite, dict) else None


def cite_in_matrix(doc: dict[str, Any], kmap: Any, map_file: str) -> dict[str, Any]:
    """A copy of a matrix document citing ``kmap``: each finished cell predicted from its recorded settings (by
    name: a matrix file keeps no model file facts), for a report of a matrix run without a map."""
    from ..kernels.evidence import citation
    from ..matrix.evidence import predict_record

    out = dict(doc)
    out["kernel_map"] = citation(kmap, map_file)
    cells = []
    env = doc.get("environment") if isinstance(doc.get("environment"), dict) else None
    for c in doc.get("cells", []):
        c = dict(c)
        p = predict_record(kmap, c, map_file, env) if c.get("status") == "ok" else None
        if p is not None:
            c["kernel_prediction"] = p.to_json()
        else:
            c.pop("kernel_prediction", None)
        cells.append(c)
    out["cells"] = cells
    return out


def map_title(kmap: Any, file: str | None) -> str:
    name = Path(file).name if file else "kernel map"
    return f"{name}: {len(kmap.targets)} target row(s), widths {ranges(kmap.widths)}, {kmap.positions} positions"


def map_intro(kmap: Any) -> str:
    ps = ", ".join(p.name for p in kmap.prompts) or "no prompts"
    return (f"Each target's own greedy continuation of {ps}, teacher-forced: every position computed as a single-token "
            f"pass and as row j of a width-T verify pass on the same KV prefix, for widths {ranges(kmap.widths)}, "
            f"positions 1-{kmap.positions} of every prompt ({kmap.seconds:.1f} s). A width is bit-identical when "
            "every row equals its single-token row bit for bit; a draft of n_max tokens uses widths 1..n_max+1, so "
            "n_max is proven lossless for these prompts where all of those widths are.")


__all__ = ["HEAT_COLOURS", "LEGEND", "TraceKernelSection", "WIDTH_HEADERS", "cite_in_matrix", "fork_meaning",
           "heat_cell", "map_intro", "map_title", "matrix_citation", "matrix_kernel_rows", "target_facts",
           "trace_kernel_section", "width_rows"]
