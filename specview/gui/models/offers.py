"""The pickers' lists kept in step with the run: the found models for the target, the drafters that fit it.

:class:`ModelOffers` belongs to the run controls.  When a scan ends it lists
the found models in the target picker; whenever the target, the spec type or
the engine's model kind changes it lists in the draft picker only the drafters
that fit (:meth:`Catalog.draft_offer`), says under the picker when none does
and why, and says so, disabled, for the spec types that load no draft model.
A draft the user types or browses to that does not fit is refused with the
reason: the line under the picker turns red, :attr:`ModelOffers.sigRefused`
carries the reason to the window's error bar, and :meth:`refusal` makes the
controls' ``config()`` refuse the run before anything loads.
"""

from __future__ import annotations

import re
from typing import Any

from PySide6.QtCore import QObject, Signal

from ...core.config import DRAFT_FILE_TYPES
from ...core.demo import is_demo_name
from ...core.models import Scan
from .catalog import Catalog, DraftOffer, Entry, Group
from .picker import ModelPicker

RECENT_GROUP = "Used before"
_FINGERPRINTS = re.compile(r" \((?:target|draft) [^()]*\)")
_LEADING_PATH = re.compile(r"^(/[^:]*/)([^/:]+): ")


def short_reason(why: str) -> str:
    """A refusal short enough for the line under the picker: no vocabulary fingerprints, a leading path cut to
    its file name (the error bar and the tool tip keep the whole reason)."""
    return _LEADING_PATH.sub(r"\2: ", _FINGERPRINTS.sub("", why))


class ModelOffers(QObject):
    """Fills the target and draft pickers of ``controls`` from the last scan."""

    sigRefused = Signal(str)  # why the draft the user just chose cannot draft for the target

    def __init__(self, target: ModelPicker, draft: ModelPicker, spec_type: Any, parent: QObject | None = None):
        super().__init__(parent)
        self.target, self.draft = target, draft
        self.spec_type = spec_type  # the spec type combo (its current data is the type)
        self.catalog = Catalog()
        self.offer = DraftOffer()
        self.scanned = False
        self._refused = ""
        draft.show_recent = False  # a recent draft is offered only when it fits (see _recent_group)

    @property
    def kind(self) -> str:
        return self.target.model_kind or "gguf"

    def current_spec_type(self) -> str:
        return str(self.spec_type.currentData() or "")

    def set_scan(self, scan: Scan) -> None:
        """A scan ended: list what it found."""
        self.catalog.set_scan(scan)
        self.scanned = True
        self.refresh_targets()
        self.refresh_draft()

    def refresh_targets(self) -> None:
        self.target.set_groups(self.catalog.target_groups(self.kind))

    def refresh_draft(self, *, follow: bool = True) -> None:
        """List the drafters that fit the target and spec type now chosen, and say what the picker needs;
        ``follow``: a demo draft left from a demo target may give way to one that fits (not while a saved run
        is shown, which stays exactly as saved)."""
        st = self.current_spec_type()
        self.offer = offer = self.catalog.draft_offer(self.target.value(), st, self.kind)
        if follow:
            self._follow_target(offer)
        groups = list(offer.groups)
        recent = self._recent_group(offer)
        if recent is not None:
            groups.append(recent)
        self.draft.set_groups(groups)
        self.check(user=False)

    def _recent_group(self, offer: DraftOffer) -> Group | None:
        """The drafts used before that are not found by the scan but fit this target (checked from their headers)."""
        if not offer.enabled:
            return None
        listed = set(offer.names)
        t, st = self.target.value(), self.current_spec_type()
        fit = [n for n in self.draft.recent if n not in listed and not is_demo_name(n)
               and self.catalog.info(n, self.kind)[0] is not None and self.catalog.refusal(t, n, st, self.kind) is None]
        return Group(RECENT_GROUP, tuple(Entry(n) for n in fit)) if fit else None

    def _follow_target(self, offer: DraftOffer) -> None:
        """A demo draft left over from a demo target gives way to the first drafter that fits the new target
        (a file the user chose stays, refused or not)."""
        cur = self.draft.value()
        if not offer.enabled or not cur or not is_demo_name(cur) or is_demo_name(self.target.value()):
            return
        names = offer.names
        if names and cur not in names and self.refusal() is not None:
            self.draft.set_value(names[0])  # quietly: the target's change is what the run hears of

    def refusal(self, target: str | None = None, draft: str | None = None, spec_type: str | None = None) -> str | None:
        """Why the draft cannot draft for the target with the spec type (the pickers' own by default); None: it
        fits, or nothing can be read yet (the engine says when it loads)."""
        t = self.target.value() if target is None else target
        d = self.draft.value() if draft is None else draft
        st = self.current_spec_type() if spec_type is None else spec_type
        return self.catalog.refusal(t, d, st, self.kind)

    def spec_refusal(self, target: str, spec_type: str) -> str | None:
        """Why the target cannot run the spec type without a draft model (draft-mtp and no MTP heads)."""
        return self.catalog.spec_refusal(target, spec_type, self.kind)

    def check(self, *, user: bool = True) -> str | None:
        """Show under the draft picker what fits or why the draft is refused; ``user``: the user just chose it, so
        a refusal also goes to the window's error bar."""
        offer, st = self.offer, self.current_spec_type()
        why = self.refusal() if st in DRAFT_FILE_TYPES else None
        if why:
            extra = f"\n{offer.note}" if offer.note else ""
            self.draft.set_note(f"Refused: {short_reason(why)}{extra}", "error", tip=f"Refused: {why}{extra}")
            if user and why != self._refused:
                self.sigRefused.emit(f"the draft model is refused: {why}")
        elif offer.none_fit:
            self.draft.set_note(offer.note, "warn")
        else:
            self.draft.set_note(offer.note, "info")
        self._refused = why or ""
        return why
