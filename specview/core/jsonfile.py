"""JSON files as specview reads and writes them: depth-safe reading, atomic writing, typed fields.

* :func:`read_json` refuses nesting deeper than any specview file has, before
  anything walks the document recursively (a file nested 100,000 levels deep is
  an error naming the file, never a ``RecursionError``), and reads only regular
  files, with a bound (:mod:`.userfiles`: a FIFO or ``/dev/zero`` is refused).
* :func:`write_atomic` leaves the old file or the new, never half of one (and writes a lone surrogate,
  which UTF-8 cannot hold, as its ``\\uXXXX`` escape).
* :func:`json_safe` writes NaN and infinity as null: JSON has neither.
* The ``field`` checkers raise :class:`Malformed` naming the field's path, so a
  loader can say exactly what is wrong and its callers can trust the types.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from .errors import SpecviewError, WriteError
from .userfiles import read_user_file

#: deeper than any file specview writes; deeper input is refused before anything walks it recursively
MAX_DEPTH = 64
#: the most a JSON file specview reads may hold: more than any trace, matrix or map it writes
MAX_JSON_BYTES = 1 << 30
_CONTAINERS = (dict, list)


def read_json(path: str | os.PathLike[str], error: type[SpecviewError] = SpecviewError,
              *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse a JSON file, or raise ``error`` naming the file and what is wrong with it.

    Nesting deeper than ``max_depth`` is refused (a file nested 100,000 levels
    deep gives this error, never a RecursionError), so whatever reads the result
    may walk it recursively.
    """
    p = Path(path)
    data = read_user_file(p, what="a JSON file", limit=MAX_JSON_BYTES, error=error)
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{p}: not UTF-8 text (byte {exc.start:,} is {data[exc.start]:#04x}), so not a JSON file specview "
                    "wrote") from None
    too_deep = error(f"{p}: nested more than {max_depth} levels deep; no specview file is, so it is not one")
    try:
        d = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise error(f"{p}: not valid JSON ({_why_not_json(raw, exc)})") from None
    except RecursionError:
        raise too_deep from None
    except ValueError as exc:  # e.g. an integer literal too long for Python to convert
        raise error(f"{p}: not valid JSON ({exc})") from None
    if json_depth(d, limit=max_depth) > max_depth:
        raise too_deep
    return d


_KINDS = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
          bool: "true or false", type(None): "null"}


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words ("an array"), for a message that says what a file holds."""
    return _KINDS.get(type(value), type(value).__name__)


def schema_of(d: Any) -> str:
    """What a document that should be a specview file declares, for the message that refuses it: its schema
    (quoted), that it has none, or that its top level is not an object."""
    if not isinstance(d, dict):
        return f"its top level is {json_kind(d)}, not an object"
    if "schema" not in d:
        return 'it has no "schema" field'
    schema = d["schema"]
    if isinstance(schema, str):
        return f"its schema is {schema[:77] + '...' if len(schema) > 80 else schema!r}"
    return f"its schema is {json_kind(schema)}, not a string"


def _why_not_json(raw: str, exc: json.JSONDecodeError) -> str:
    """What is wrong with ``raw``, said so that a file written only in part reads as that, not as a syntax error."""
    if not raw.strip():
        return "the file is empty; write it again"
    if exc.msg.startswith("Unterminated string") or exc.pos >= len(raw.rstrip()):
        return (f"it stops in the middle, at line {raw.count(chr(10)) + 1} after {len(raw.encode('utf-8')):,} bytes: "
                "the file was cut short; write it again or copy the whole file")
    what = "more after the end of its JSON" if exc.msg == "Extra data" else exc.msg
    return f"{what}, line {exc.lineno}, column {exc.colno}"


def declares_schema(path: str | os.PathLike[str], family: str) -> bool:
    """True when a JSON file's first bytes name a ``family/...`` schema (specview writes its ``schema`` key first).

    For choosing how to open a file without reading all of it; a file that says
    so is still validated in full when it is read.
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO's open would wait for a writer: the read says why not
            return False
        with open(path, "rb") as fh:
            head = fh.read(512)
    except OSError:
        return False
    return f'"{family}/'.encode() in head


def json_depth(obj: Any, *, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of parsed JSON (a scalar is 0), counted without recursion; stops past ``limit``."""
    level = [obj] if type(obj) in _CONTAINERS else []
    depth = 0
    while level and depth <= limit:
        depth += 1
        nxt: list[Any] = []
        for x in level:
            nxt += [v for v in (x.values() if type(x) is dict else x) if type(v) is dict or type(v) is list]
        level = nxt
    return depth


def json_safe(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null rather than emit invalid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _temp_beside(p: Path) -> tuple[int, str]:
    """A new temporary file in ``p``'s folder (descriptor, path), or :class:`.errors.WriteError` saying why the
    folder takes none."""
    if p.is_dir():
        raise WriteError(f"{p}: is a folder; name a file in it")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        there = next((a for a in (parent, *parent.parents) if a.exists()), None)
        if there is not None and not there.is_dir():  # a path "through" a file
            raise WriteError(f"{p}: {there} is a file, not a folder")
        raise WriteError(f"{p}: the folder {parent} does not exist")
    try:
        return tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise WriteError(f"{p}: cannot write a file in {parent} ({exc.strerror or exc}); choose another folder") \
            from None


def check_writable(path: str | os.PathLike[str]) -> Path:
    """Refuse, before any work is done for it, a file that :func:`write_atomic` could not write there: a folder
    in its place, its folder missing or taking no files.  Nothing is left behind."""
    p = Path(path)
    fd, tmp = _temp_beside(p)
    os.close(fd)
    os.unlink(tmp)
    return p


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` so that readers see the old file or the new, never half of one; a write the
    folder or the disk refuses is a :class:`.errors.WriteError` naming the file."""
    p = Path(path)
    fd, tmp = _temp_beside(p)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would surprise whoever shares the file
        # a lone surrogate (a file's \ud800 escape, read back) has no UTF-8: it is written as that escape, which
        # JSON reads back as the same character and a page shows as text
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, SpecviewError):
            was = "as it was" if p.exists() else "not written"
            raise WriteError(f"{p}: writing it failed ({exc.strerror or exc}); the file is {was}") from exc
        raise
    return p


# -- typed fields ----------------------------------------------------------------------------------
_MAX_INT = 2**63 - 1  # ids, positions, counts: whatever reads a trace may hold them in 64-bit arrays


class Malformed(ValueError):
    """One field of a trace is wrong: ``where`` is its path (``vanilla.steps[3].token``)."""

    def __init__(self, where: str, what: str):
        super().__init__(f"'{where}' {what}")
        self.where = where


def short(v: Any) -> str:
    """A bounded repr for error messages (an integer too long for Python to print gets its size instead)."""
    try:
        r = repr(v)
    except ValueError:  # int max_str_digits
        return f"an integer of about {int(v.bit_length() * 0.30103)} digits"
    return r if len(r) <= 40 else r[:37] + "..."


def type_name(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def as_dict(v: Any, where: str, *, none: bool = False) -> Any:
    if v is None and none:
        return None
    if not isinstance(v, dict):
        raise Malformed(where, f"must be an object{' or null' if none else ''}, not {type_name(v)}")
    return v


def as_list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise Malformed(where, f"must be a list, not {type_name(v)}")
    return v


def as_str(v: Any, where: str, *, none: bool = False) -> Any:
    if v is None and none:
        return None
    if not isinstance(v, str):
        raise Malformed(where, f"must be a string{' or null' if none else ''}, not {type_name(v)}")
    return v


def as_bool(v: Any, where: str, *, none: bool = False) -> Any:
    if v is None and none:
        return None
    if not isinstance(v, bool):
        raise Malformed(where, f"must be true or false{' or null' if none else ''}, not {type_name(v)}")
    return v


def as_int(v: Any, where: str, *, none: bool = False) -> Any:
    if v is None and none:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise Malformed(where, f"must be a whole number{' or null' if none else ''}, not {type_name(v)}")
    if not 0 <= v <= _MAX_INT:
        raise Malformed(where, f"is {short(v)}, outside 0..{_MAX_INT}")
    return v


def as_num(v: Any, where: str, *, none: bool = False) -> Any:
    if v is None and none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Malformed(where, f"must be a number{' or null' if none else ''}, not {type_name(v)}")
    try:
        return float(v)
    except OverflowError:
        raise Malformed(where, f"is {short(v)}, too large for a number") from None


def check_spec(v: Any, spec: Any, where: str) -> None:
    """Raise :class:`Malformed` naming the first field of ``v`` whose type is not the one ``spec`` gives.

    A spec is a leaf type (``"int"``, ``"num"``, ``"str"``, ``"bool"``), a dict of known keys (a key ending in
    ``!`` is required; keys it does not name pass unchecked) or a one-element list (a list of that).  null is
    accepted everywhere: readers treat a missing and a null value alike.  A whole number must be one a float
    holds, since a reader may format it as one.
    """
    if v is None:
        return
    if isinstance(spec, str):
        if spec == "int":
            if isinstance(v, bool) or not isinstance(v, int):
                raise Malformed(where, f"must be a whole number or null, not {type_name(v)}")
            as_num(v, where)  # a reader may format it as a number: past a float's range it is none
        elif spec == "num":
            as_num(v, where, none=True)
        elif spec == "str":
            as_str(v, where, none=True)
        else:
            as_bool(v, where, none=True)
    elif isinstance(spec, dict):
        d = as_dict(v, where, none=True)
        for key, sub in spec.items():
            name = key.rstrip("!")
            if name in d:
                check_spec(d[name], sub, f"{where}.{name}")
            elif key.endswith("!"):
                raise Malformed(where, f"needs {name!r}")
    else:
        for i, x in enumerate(as_list(v, where)):
            check_spec(x, spec[0], f"{where}[{i}]")
