"""Check before load: every drafter check a run's headers can answer, made before any model loads.

The CLI (``specview run``), the matrix and the app all ask :func:`refusal`
before they hand a run to an engine: a draft model with another vocabulary, a
model given where a spec type needs an EAGLE-3 / DFlash / DSpark head, a head
made for another target, ``draft-mtp`` on a target with no MTP heads, or a
file that is not a model at all, is refused in one line that names each model
by the name the user typed (``lmstudio:x/OtherVocab``, not its blob's path).
What no header here can answer (a demo file not derived yet, a Hugging Face id
an engine fetches, a name of an engine's own) is left to the engine.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..config import DRAFT_FILE_TYPES
from ..demo import DEMO_FILE, demo_drafter, demo_quant, is_demo_name, shipped_path
from ..errors import SpecviewError
from .drafters import check_drafter
from .header import read_header
from .info import ModelHeaderError, ModelInfo, NotAModel, Scan
from .names import is_store_name, resolve_name


def _demo_file(name: str) -> Path | None:
    """The demo quantization's file when it is on disk (the shipped one, or a copy already derived)."""
    from .scan import specview_cache

    if demo_drafter(name):
        return None  # a tiny head written for the demo target on first use
    try:
        q = demo_quant(name)
        shipped = shipped_path()
    except SpecviewError:
        return None
    if shipped.name == DEMO_FILE.replace("Q4_1", q):
        return shipped
    p = specview_cache() / "demo" / DEMO_FILE.replace("Q4_1", q)
    return p if p.is_file() else None


def model_info(name: str | None, kind: str, *, scan: Scan | None = None) -> ModelInfo | None:
    """What the header of the model ``name`` says, named ``name`` (as typed); None when nothing here can be read
    before the engine loads it.  Raises :class:`~specview.core.errors.ModelFileError` for a store name that
    names nothing (listing what the store has) and :class:`ModelHeaderError` for a file whose header cannot
    be read (:class:`~.info.NotAModel` for one no engine runs: a FIFO, a projector, a vocabulary-only file)."""
    if not name:
        return None
    if is_demo_name(name):
        p = _demo_file(name)
        info = read_header(p) if p is not None and kind == "gguf" else None
    elif is_store_name(name):
        info = resolve_name(name, kind, scan=scan)
    else:
        p = Path(name).expanduser()
        if not (p.is_dir() if kind == "folder" else p.exists() and not p.is_dir()):
            return None  # a Hugging Face id, an engine's own name, a missing file: the engine says
        info = read_header(p)
    return replace(info, name=name) if info is not None else None


def _header(name: str, role: str, kind: str, scan: Scan | None) -> ModelInfo | None:
    """The header of ``name``; None when this reader cannot read it (a GGUF version or layout it does not know,
    an engine's own stand-in file: the engine decides); a file no engine runs as a model is refused."""
    try:
        return model_info(name, kind, scan=scan)
    except NotAModel as exc:
        who = f"the {role}" if exc.path == str(Path(name).expanduser()) else f"the {role} {name}"
        raise NotAModel(exc.path, f"{exc.why}; {who} is refused before anything loads") from None
    except ModelHeaderError:
        return None


def refusal(target: str | None, draft: str | None, spec_type: str, kind: str, *,
            scan: Scan | None = None) -> str | None:
    """Why ``draft`` (or the target's own heads, for ``draft-mtp``) cannot draft for ``target`` with
    ``spec_type``, from headers alone, in one line naming both as given; None when the headers say it fits or
    cannot say.  A model that is not one raises (see :func:`model_info`)."""
    if not target:
        return None
    uses_draft = spec_type in DRAFT_FILE_TYPES and bool(draft)
    if is_demo_name(target) and (not uses_draft or is_demo_name(draft or "")):
        return None  # the demo's own pairs (RunConfig checks a demo head's spec type)
    t = _header(target, "target", kind, scan)
    if spec_type == "draft-mtp":
        if t is not None and not t.mtp:
            return check_drafter(t, t, spec_type)
        return None
    if not uses_draft:
        return None
    d = _header(draft or "", "draft", kind, scan)
    if t is None or d is None:
        return None
    why = check_drafter(t, d, spec_type)
    if why is None:
        return None
    if why.startswith(d.name):
        return why
    return f"{d.name} cannot draft for {t.name} with {spec_type}: {why}"
