"""Reading a matrix file (``specview.matrix/1``): every field a reader uses is checked before it is used.

A matrix file can come from another machine, an older specview or a hand
edit.  :func:`validate_matrix` refuses anything the summary, the grid, the
rates, the reports or ``--resume`` could trip over (a value of the wrong
type, a number too large to format, nesting deeper than any matrix has) with
a :class:`MatrixError` naming the file and the field; strings may hold
anything, the front ends escape them.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ..config import _kind
from ..jsonfile import schema_of
from .spec import MatrixError, MatrixSpec, axis_fields, show

SCHEMA = "specview.matrix/1"
#: no matrix file nests deeper than this (a cell's config holds the engine block, a trace's environment a list)
MAX_DEPTH = 32
_BIG = 2 ** 63

NUM, INT, STR, BOOL, DICT, LIST = "number", "integer", "text", "true or false", "object", "list"

#: the fields of a cell a reader may use, with their type (None is always allowed)
CELL_FIELDS: dict[str, str] = {
    "identical": BOOL, "first_mismatch": INT, "agree": INT, "n_vanilla": INT, "n_speculative": INT,
    "verdict": STR, "diagnosed": BOOL, "gap": NUM, "near_tie_threshold": NUM, "far_threshold": NUM,
    "explanation": STR, "diagnosis_error": STR, "error": STR, "acceptance_rate": NUM, "mean_accepted": NUM,
    "n_drafted": INT, "n_accepted": INT, "vanilla_tokens_per_s": NUM, "speculative_tokens_per_s": NUM,
    "speedup": NUM, "target_quant": STR, "draft_quant": STR, "prompt_tokens": INT, "category": STR,
    "seconds": NUM, "config": DICT, "trace": STR, "fork": DICT, "stop_reason": LIST, "kernel_prediction": DICT,
    "speculative_digest": STR, "quality": DICT,
}
#: a cell's ``quality`` block (core/matrix/quality.py): its item and each arm's score
QUALITY_FIELDS = {"suite": STR, "item": STR, "expected": STR, "vanilla_pass": BOOL, "speculative_pass": BOOL,
                  "vanilla_got": STR, "speculative_got": STR, "vanilla_why": STR, "speculative_why": STR}
FORK_FIELDS = {"vanilla_token": INT, "speculative_token": INT, "vanilla_piece": STR, "speculative_piece": STR,
               "vanilla_margin": NUM}
TOP_FIELDS = {"status": STR, "specview": STR, "created": STR, "elapsed_s": NUM, "n_cells": INT,
              "environment": DICT, "counters": DICT, "summary": LIST, "kernel_map": DICT}
#: a cell's ``kernel_prediction`` (:meth:`KernelPrediction.to_json`); lists are checked item by item below
PREDICTION_FIELDS = {"status": STR, "target": STR, "settings": STR, "n_max": INT, "widths": LIST, "row": STR,
                     "safe_n_max": INT, "first_differing": INT, "identical_share": NUM, "max_delta": NUM,
                     "flips": INT, "missing": LIST, "evidence": STR, "map_file": STR, "map_reach": INT, "reach": INT,
                     "caveats": LIST, "reason": STR}
#: the cited map (:func:`~specview.core.kernels.evidence.citation`) and each of its ``targets``
CITATION_FIELDS = {"file": STR, "schema": STR, "backend": STR, "widths": LIST, "positions": INT, "prompts": LIST,
                   "targets": LIST, "environment": DICT}
CITED_TARGET_FIELDS = {"label": STR, "target": STR, "deterministic": BOOL, "safe_widths": LIST, "safe_n_max": INT,
                       "threads_used": INT}


def _ok(value: Any, kind: str) -> bool:
    if value is None:
        return True
    if kind == BOOL:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == INT:
        return isinstance(value, int) and -_BIG < value < _BIG
    if kind == NUM:
        return (isinstance(value, int) and -_BIG < value < _BIG) or isinstance(value, float)
    return isinstance(value, {STR: str, DICT: dict, LIST: list}[kind])


def _check(obj: dict[str, Any], table: dict[str, str], where: str) -> None:
    for key, kind in table.items():
        if key in obj and not _ok(obj[key], kind):
            raise MatrixError(f"{where}.{key} must be {'a' if kind != INT else 'an'} {kind} or null "
                              f"(got {type(obj[key]).__name__} {show(obj[key])})")


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``obj`` nests lists and dicts more than ``limit`` levels deep (checked without recursion)."""
    stack = [(obj, 0)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            items = o.values()
        elif isinstance(o, list):
            items = o
        else:
            continue
        if d >= limit:
            return True
        stack.extend((x, d + 1) for x in items if isinstance(x, (dict, list)))
    return False


def _check_params(p: Any, where: str) -> None:
    if not isinstance(p, dict):
        raise MatrixError(f"{where} needs 'params' and 'status'")
    for k in ("target", "drafter"):
        if not isinstance(p.get(k), str):
            raise MatrixError(f"{where}.params.{k} must be a string")
    for k in ("prompt", "part"):
        if not isinstance(p.get(k, ""), str):
            raise MatrixError(f"{where}.params.{k} must be a string")
    for f in axis_fields():
        v = p.get(f.name)
        kind = {int: INT, float: NUM, str: STR, bool: BOOL}.get(_kind(f), STR)
        if not _ok(v, kind) or (kind == NUM and isinstance(v, float) and not math.isfinite(v)):
            raise MatrixError(f"{where}.params.{f.name} must be a finite {kind} or null (got {show(v)})")


def _items(obj: dict[str, Any], key: str, kind: str, where: str) -> None:
    """``obj[key]``, a list (or null), holds only values of ``kind``."""
    for i, v in enumerate(obj.get(key) or []):
        if v is None or not _ok(v, kind):
            raise MatrixError(f"{where}.{key}[{i}] must be {'an' if kind == INT else 'a'} {kind} "
                              f"(got {type(v).__name__} {show(v)})")


def _check_prediction(p: dict[str, Any], where: str) -> None:
    from ..kernels.evidence import STATUSES

    _check(p, PREDICTION_FIELDS, where)
    if p.get("status") not in STATUSES:
        raise MatrixError(f"{where}.status must be one of {', '.join(STATUSES)} (got {show(p.get('status'))})")
    _items(p, "widths", INT, where)
    _items(p, "missing", STR, where)
    _items(p, "caveats", STR, where)


def _check_citation(c: dict[str, Any], where: str) -> None:
    _check(c, CITATION_FIELDS, where)
    if not isinstance(c.get("file"), str):
        raise MatrixError(f"{where}.file must be the kernel map's file name")
    _items(c, "widths", INT, where)
    _items(c, "prompts", STR, where)
    for i, t in enumerate(c.get("targets") or []):
        if not isinstance(t, dict):
            raise MatrixError(f"{where}.targets[{i}] must be an object")
        _check(t, CITED_TARGET_FIELDS, f"{where}.targets[{i}]")
        _items(t, "safe_widths", INT, f"{where}.targets[{i}]")


def validate_matrix(d: Any, *, source: str = "<matrix>") -> None:
    """Refuse a document that is not a usable ``specview.matrix/1`` file, naming ``source`` and the field."""
    schema = d.get("schema") if isinstance(d, dict) else None
    if not isinstance(schema, str) or not schema.startswith("specview.matrix/"):
        raise MatrixError(f"{source}: not a specview matrix ({schema_of(d)}; a matrix's schema is {SCHEMA!r})")
    if schema != SCHEMA:
        raise MatrixError(f"{source}: matrix schema {show(schema)} is not supported by this specview "
                          f"(reads {SCHEMA!r})")
    if too_deep(d):
        raise MatrixError(f"{source}: malformed specview matrix: nested more than {MAX_DEPTH} levels deep")
    if not isinstance(d.get("cells"), list) or not isinstance(d.get("spec"), dict):
        raise MatrixError(f"{source}: malformed specview matrix: needs 'spec' (object) and 'cells' (list)")
    _check(d, TOP_FIELDS, f"{source}: malformed specview matrix: ")
    for k, v in (d.get("counters") or {}).items():
        if not _ok(v, INT):
            raise MatrixError(f"{source}: malformed specview matrix: counters.{show(k)} must be an integer")
    if not all(isinstance(x, str) for x in d.get("summary") or []):
        raise MatrixError(f"{source}: malformed specview matrix: summary must be a list of sentences")
    MatrixSpec.from_json(d["spec"], source=f"{source}: malformed specview matrix")
    if d.get("kernel_map") is not None:
        _check_citation(d["kernel_map"], f"{source}: malformed specview matrix: kernel_map")
    for i, c in enumerate(d["cells"]):
        where = f"{source}: malformed specview matrix: cells[{i}]"
        if not isinstance(c, dict) or "status" not in c:
            raise MatrixError(f"{where} needs 'params' and 'status'")
        _check_params(c.get("params"), where)
        if c["status"] not in ("ok", "error"):
            raise MatrixError(f"{where}.status must be \"ok\" or \"error\" (got {show(c['status'])})")
        if not _ok(c.get("index"), INT) or c.get("index") is None or c["index"] < 0:
            raise MatrixError(f"{where}.index must be an integer >= 0")
        _check(c, CELL_FIELDS, where)
        if c["status"] == "ok" and not isinstance(c.get("identical"), bool):
            raise MatrixError(f"{where}.identical must be true or false in a finished cell")
        if c.get("first_mismatch") is not None and c["first_mismatch"] < 0:
            raise MatrixError(f"{where}.first_mismatch must be >= 0")
        if c.get("fork") is not None:
            _check(c["fork"], FORK_FIELDS, f"{where}.fork")
        if c.get("quality") is not None:
            _check(c["quality"], QUALITY_FIELDS, f"{where}.quality")
        if c.get("kernel_prediction") is not None:
            _check_prediction(c["kernel_prediction"], f"{where}.kernel_prediction")


def load_matrix(path: str | os.PathLike[str]) -> dict[str, Any]:
    from ..trace import read_json

    d = read_json(path, MatrixError)
    validate_matrix(d, source=str(Path(path)))
    return d
