"""Which models can draft for a target, and why a hand-picked draft is refused: from headers alone."""

from __future__ import annotations

from typing import Iterable

from .info import DrafterFit, ModelInfo

#: spec types that draft from no second model: the target's own text (n-gram lookups, always available)
NO_DRAFTER_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def drafters_for(target: ModelInfo, models: Iterable[ModelInfo], spec_type: str | None = None) -> list[DrafterFit]:
    """The models that can draft for ``target``, smallest first, each with the spec types it serves.

    A separate draft model (``draft-simple``) needs the target's vocabulary
    (equal :class:`VocabPrint`); an EAGLE-3 / DFlash / DSpark head must have
    been made for this target (its vocabulary and hidden width); the target's
    own MTP heads serve ``draft-mtp`` (a fit whose ``model`` is None), and the
    n-gram types need no drafter at all (one fit, ``model`` None).
    ``spec_type`` keeps only the fits that serve it.
    """
    raise NotImplementedError


def check_drafter(target: ModelInfo, draft: ModelInfo, spec_type: str) -> str | None:
    """None when ``draft`` can draft for ``target`` with ``spec_type``; else the reason it cannot, in one line
    (a vocabulary mismatch names both fingerprints; a head made for another target says whose it is)."""
    raise NotImplementedError
