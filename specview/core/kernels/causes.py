"""Why the widths of a kernel map differ: the op a locate names first, and the widths grouped by it.

For every width of a map row that differs from single-token passes,
:func:`locate_causes` runs one :func:`~specview.core.locate.find.locate` at that
width's first differing row (the prompt, token and row the map recorded, on
the map's own teacher-forced sequence and settings) and keeps its summary as
the width's ``cause``.  Bit-identical widths need no locate.  The widths then
group by the node their difference starts at (its name without the layer
number, its op, the weight's type and buffer):

    1-3 identical; 4-7 differ first in the repacked q4_K mat-mul (ffn_out, MUL_MAT q4_K in CPU_REPACK);
    8 differs first in the q6_K mat-mul (ffn_out, MUL_MAT q6_K in CPU_Mapped)

and each cause says which setting removes it (:func:`remedies`): ``--no-repack``
when the weight sits in a repacked buffer, ``-fa off`` when the op is attention,
``-ub 1`` always (every verify row its own micro-batch), and an n_max below the
first differing width.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from ..errors import Cancelled, SpecviewError
from .text import ranges

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]

#: ops and node names (without the layer number) that are the attention itself, not a weight's mat-mul
ATTENTION_OPS = frozenset({"FLASH_ATTN_EXT", "SOFT_MAX"})
ATTENTION_NODES = frozenset({"kq", "kq_soft_max", "kq_soft_max_ext", "kqv", "kqv_out", "fattn"})
#: weight buffers whose kernels are picked for batched shapes (llama.cpp's "extra" buffer types)
REPACKED = ("REPACK", "AMX")


def stem(node: str) -> str:
    """``ffn_out-3`` -> ``ffn_out``: the node's name without its layer."""
    return re.sub(r"^blk\.\d+$", "layer", re.sub(r"-\d+$", "", node.split(" (")[0]))


def is_attention(c: dict[str, Any]) -> bool:
    s = stem(c.get("node") or "")
    return c.get("op") in ATTENTION_OPS or s in ATTENTION_NODES or s.startswith("__fattn__")


def is_repacked(c: dict[str, Any]) -> bool:
    buf = str(c.get("weight_buffer") or "")
    return any(k in buf.upper() for k in REPACKED)


def cause_key(c: dict[str, Any] | None) -> tuple:
    """What two widths must share to differ for the same reason."""
    if not c:
        return ("not located",)
    if c.get("skipped"):
        return ("not located",)
    if c.get("node") is None:
        return ("no node",)
    return (stem(c["node"]), c.get("op"), c.get("weight_type"), c.get("weight_buffer"))


def cause_words(c: dict[str, Any] | None) -> str:
    """What follows "differ": ``first in the repacked q4_K mat-mul (ffn_out, MUL_MAT q4_K in CPU_REPACK)``."""
    if not c or c.get("skipped"):
        why = f": {c['skipped']}" if c and c.get("skipped") else " (map with --locate to name the op)"
        return "where, not located" + why
    if c.get("node") is None:
        n = c.get("logits_differ")
        return ("in the map but not on the locate's single-token prefix" if not n else
                f"at {n} logits but at no observed node")
    op, wt, wb = c.get("op"), c.get("weight_type"), c.get("weight_buffer")
    if is_attention(c):
        kind = "attention"
    elif op == "MUL_MAT" and wt:
        kind = f"{'the repacked ' if is_repacked(c) else 'the '}{wt} mat-mul"
    else:
        kind = f"the {str(op).lower()}"
    detail = ", ".join(x for x in (stem(c["node"]), " ".join(x for x in (op, wt) if x)) if x)
    return f"first in {kind} ({detail}{f' in {wb}' if wb else ''})"


def width_groups(t: Any) -> list[dict[str, Any]]:
    """The widths of map row ``t`` grouped by cause, in width order: ``{"widths", "kind", "cause", "text"}``.

    ``kind`` is "identical", "control" (width 1 failed), or "differs"; a differing group's ``cause`` is the
    locate summary of its first width.
    """
    groups: list[dict[str, Any]] = []
    by_key: dict[tuple, dict[str, Any]] = {}
    for w in sorted(t.widths):
        st = t.widths[w]
        if st.rows == 0:
            continue
        if st.bit_identical:
            key, kind = ("identical",), "identical"
        elif w == 1:
            key, kind = ("control",), "control"
        else:
            key, kind = ("differs",) + cause_key(getattr(st, "cause", None)), "differs"
        g = by_key.get(key)
        if g is None:
            g = by_key[key] = {"widths": [], "kind": kind, "cause": getattr(st, "cause", None), "text": ""}
            groups.append(g)
        g["widths"].append(w)
    for g in groups:
        words = {"identical": "identical", "control": "control failed (not deterministic)"}.get(g["kind"])
        verb = "differs" if len(g["widths"]) == 1 else "differ"
        g["text"] = f"{ranges(g['widths'])} {words or verb + ' ' + cause_words(g['cause'])}"
    return groups


def groups_line(t: Any) -> str:
    """``1-3 identical; 4-8 differ first in ...``; '' when no width differs or none was located."""
    gs = width_groups(t)
    if not any(g["kind"] == "differs" and g["cause"] for g in gs):
        return ""
    return "; ".join(g["text"] for g in gs)


def remedies(c: dict[str, Any] | None, settings: Any) -> list[tuple[str, str]]:
    """(setting, why) pairs that remove the cause ``c``: the batched kernel it names, or batching itself."""
    out: list[tuple[str, str]] = []
    if c and c.get("node") and is_repacked(c):
        out.append(("--no-repack", f"its weight is in {c['weight_buffer']}, repacked for batched kernels"))
    if c and c.get("node") and is_attention(c) and str(getattr(settings, "flash_attn", "")) != "off":
        out.append(("-fa off", "it is attention, whose flash kernel is chosen by the number of rows"))
    if getattr(settings, "n_ubatch", None) != 1:
        out.append(("-ub 1", "every verify row its own single-token micro-batch"))
    return out


def first_differing(t: Any) -> int | None:
    """The narrowest width of map row ``t`` that differs (width 1 excluded: that is the control)."""
    return next((w for w in sorted(t.widths) if w > 1 and t.widths[w].rows and not t.widths[w].bit_identical), None)


def prescription_lines(t: Any) -> list[str]:
    """What a prescription says of map row ``t``'s causes: the groups and, per cause, the settings that remove it."""
    line = groups_line(t)
    if not line:
        return []
    out = [f"{t.label}: widths by cause: {line}"]
    for g in width_groups(t):
        if g["kind"] != "differs" or not g["cause"]:
            continue
        fixes = remedies(g["cause"], t.settings)
        if fixes:
            what = "width" if len(g["widths"]) == 1 else "widths"
            out.append(f"    {what} {ranges(g['widths'])}: removed by " + "; ".join(f"{s} ({why})" for s, why in fixes))
    first = first_differing(t)
    if first is not None and first >= 3:
        out.append(f"    or --spec-draft-n-max {first - 2}: verify widths stay below {first}, the first that differs")
    if any(g["cause"] and is_repacked(g["cause"]) for g in width_groups(t) if g["kind"] == "differs"):
        out.append("    (--no-repack removes the repacked kernel; whether the kernel that replaces it is "
                   "bit-identical, only a map with --no-repack says)")
    return out


def locate_causes(session: Any, kmap: Any, *, progress: ProgressFn | None = None,
                  cancel: CancelFn | None = None) -> Any:
    """``kmap`` with a ``cause`` on every differing width of every row: one locate at its first differing row.

    A job for a runner (``runner.job(locate_causes, kmap)``).  A width whose
    locate cannot run records ``{"skipped": why}``; ``kmap.seconds`` grows by
    the time taken, and each row's ``locate_seconds`` says how much.
    """
    from ..locate.find import locate

    say = progress or (lambda msg: None)
    t_all = time.perf_counter()
    for t in kmap.targets:
        t0 = time.perf_counter()
        seqs = {p.name: p for p in t.prompts}
        todo = [w for w in sorted(t.widths) if w > 1 and t.widths[w].rows and not t.widths[w].bit_identical
                and t.widths[w].first_difference is not None]
        for n, w in enumerate(todo, 1):
            if cancel is not None and cancel():
                raise Cancelled("kernel map cancelled")
            prompt, j, i = t.widths[w].first_difference
            seq = seqs.get(prompt)
            say(f"kernel map: locating width {w} of {t.label} ({n}/{len(todo)}): {prompt} token {j}, row {i}")
            if seq is None:
                t.widths[w].cause = {"skipped": f"the map has no sequence for prompt {prompt!r}"}
                continue
            try:
                loc = locate(session, t.target, width=w, row=i, position=j, prompt_tokens=seq.prompt_tokens,
                             settings=t.settings, backend=kmap.backend, teacher=seq.tokens, cancel=cancel)
            except Cancelled:
                raise
            except SpecviewError as exc:
                t.widths[w].cause = {"skipped": str(exc)}
                continue
            t.widths[w].cause = {**loc.summary(), "prompt": prompt, "seconds": loc.seconds.get("total")}
        t.locate_seconds = round(time.perf_counter() - t0, 3)
        t.seconds += t.locate_seconds
    kmap.seconds += time.perf_counter() - t_all
    return kmap


__all__ = ["cause_key", "cause_words", "groups_line", "is_attention", "is_repacked", "locate_causes",
           "first_differing", "prescription_lines", "remedies", "stem", "width_groups"]
