"""What a quality run records: each item's paired outcome, the 2x2 table, the test, the rates (``specview.quality/1``).

The JSON document (:meth:`QualityResult.to_dict`) is what ``specview quality
-o DIR`` writes as ``DIR/quality.json`` after every item, what ``--resume``
reads back, what the report and the app show; its shape is in
``docs/quality.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .score import Score
from .suites import Suite

SCHEMA = "specview.quality/1"


@dataclass(frozen=True)
class ItemOutcome:
    """One item's two answers and, where they part, the fork and its diagnosis.

    ``identical``: the arms gave the same tokens (then one score serves both);
    ``fork_index`` / ``fork_context`` where they fork (the token index; the
    shared text before it with the two tokens, ``…text[[' a' | ' b']]``);
    ``verdict`` the diagnosis' word (one of :data:`specview.core.verdicts.VERDICTS`)
    where the fork was diagnosed; ``trace_path`` the item's saved trace, relative
    to the result file's folder.  ``error`` is set (and both scores fail with it)
    for an item that could not be run; such items are outside the table.
    """

    item_id: str
    vanilla: Score
    speculative: Score
    identical: bool
    fork_index: int | None = None
    fork_context: str | None = None
    verdict: str | None = None
    trace_path: str | None = None
    #: the diagnosis' rule and its gap at the fork (logits), where it ran
    rule: str | None = None
    gap: float | None = None
    #: the two tokens at the fork, as text
    vanilla_piece: str | None = None
    speculative_piece: str | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def outcome(self) -> str:
        """``both-pass``, ``both-fail``, ``only-vanilla``, ``only-speculative`` (or ``error``)."""
        raise NotImplementedError

    @property
    def discordant(self) -> bool:
        """One arm passed and the other failed: the answer changed."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "item") -> "ItemOutcome":
        raise NotImplementedError


@dataclass(frozen=True)
class Table:
    """The paired 2x2 table: counts of items by (vanilla passed, speculative passed)."""

    both_pass: int = 0
    both_fail: int = 0
    only_vanilla: int = 0
    only_speculative: int = 0

    @property
    def n(self) -> int:
        return self.both_pass + self.both_fail + self.only_vanilla + self.only_speculative

    @classmethod
    def of(cls, items: list[ItemOutcome]) -> "Table":
        """The table of the items that ran (an item with an error is in none of its cells)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, int]:
        return {"both_pass": self.both_pass, "both_fail": self.both_fail, "only_vanilla": self.only_vanilla,
                "only_speculative": self.only_speculative, "n": self.n}


@dataclass(frozen=True)
class Rate:
    """``k`` passes of ``n`` with the 95% Wilson interval [low, high]."""

    k: int
    n: int
    low: float
    high: float

    @property
    def rate(self) -> float | None:
        return self.k / self.n if self.n else None

    @classmethod
    def of(cls, k: int, n: int) -> "Rate":
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "n": self.n, "rate": self.rate, "low": self.low, "high": self.high}


@dataclass
class QualityResult:
    """A quality run, finished or in progress: the suite, the run's config, every item's outcome and the figures.

    ``table``, ``p_mcnemar``, ``vanilla_rate`` and ``spec_rate`` are derived from
    ``items`` (:meth:`refresh`); ``status`` is ``running``, ``complete`` or
    ``interrupted``; ``config`` is the base run's config (``RunConfig.to_dict()``;
    each item's own prompt is the item's).
    """

    suite: Suite
    config: dict[str, Any]
    items: list[ItemOutcome] = field(default_factory=list)
    table: Table = field(default_factory=Table)
    p_mcnemar: float = 1.0
    vanilla_rate: Rate = field(default_factory=lambda: Rate(0, 0, 0.0, 1.0))
    spec_rate: Rate = field(default_factory=lambda: Rate(0, 0, 0.0, 1.0))
    elapsed: float = 0.0
    status: str = "running"
    execute: bool = False
    environment: dict[str, Any] = field(default_factory=dict)
    created: str = ""

    def refresh(self) -> "QualityResult":
        """Recompute the table, the test and the rates from ``items``; returns self."""
        raise NotImplementedError

    @property
    def discordant(self) -> list[ItemOutcome]:
        """The items whose answer changed (one arm passed, the other failed), in suite order."""
        return [o for o in self.items if o.discordant]

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "<quality>") -> "QualityResult":
        """The inverse of :meth:`to_dict`, every field checked; :class:`QualityError` names ``source`` and the
        field.  The derived figures are recomputed from the items, not trusted."""
        raise NotImplementedError

    @classmethod
    def load(cls, path: Any) -> "QualityResult":
        raise NotImplementedError

    def save(self, path: Any) -> Any:
        """Write the document atomically (a reader never sees half a file); returns the path."""
        raise NotImplementedError


__all__ = ["SCHEMA", "ItemOutcome", "QualityResult", "Rate", "Table"]
