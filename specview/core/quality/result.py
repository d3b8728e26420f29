"""What a quality run records: each item's paired outcome, the 2x2 table, the test, the rates (``specview.quality/1``).

The JSON document (:meth:`QualityResult.to_dict`) is what ``specview quality
-o DIR`` writes as ``DIR/quality.json`` after every item, what ``--resume``
reads back, what the report and the app show; its shape is in
``docs/quality.md``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ... import __version__
from ..jsonfile import json_safe, read_json, schema_of, write_atomic
from ..verdicts import VERDICTS
from .near_ties import ItemTies, summarise
from .score import Score
from .stats import mcnemar_exact, wilson
from .suites import QualityError, Suite

SCHEMA = "specview.quality/1"
STATUSES = ("running", "complete", "interrupted")
OUTCOMES = ("both-pass", "both-fail", "only-vanilla", "only-speculative")


def _opt(d: dict[str, Any], key: str, kinds: tuple[type, ...], where: str) -> Any:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
        raise QualityError(f"{where}.{key} must be {' or '.join(k.__name__ for k in kinds)} or null (got {v!r})")
    return v


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
    #: why a fork that was to be diagnosed has no verdict (the diagnosis failed), else None
    diagnosis_error: str | None = None
    #: each arm's steps and near-tie steps, and the fork's margin (:mod:`.near_ties`); None where not counted
    ties: ItemTies | None = None

    @property
    def outcome(self) -> str:
        """``both-pass``, ``both-fail``, ``only-vanilla``, ``only-speculative`` (or ``error``)."""
        if self.error is not None:
            return "error"
        v, s = self.vanilla.passed, self.speculative.passed
        return "both-pass" if v and s else "both-fail" if not (v or s) else "only-vanilla" if v else "only-speculative"

    @property
    def discordant(self) -> bool:
        """One arm passed and the other failed: the answer changed."""
        return self.outcome in ("only-vanilla", "only-speculative")

    def to_dict(self) -> dict[str, Any]:
        return {"item": self.item_id, "outcome": self.outcome, "identical": self.identical,
                "vanilla": self.vanilla.to_dict(), "speculative": self.speculative.to_dict(),
                "fork": self.fork_index, "fork_context": self.fork_context, "vanilla_piece": self.vanilla_piece,
                "speculative_piece": self.speculative_piece, "verdict": self.verdict, "rule": self.rule,
                "gap": self.gap, "trace": self.trace_path, "error": self.error, "diagnosis_error": self.diagnosis_error,
                "seconds": round(self.seconds, 3), "ties": None if self.ties is None else self.ties.to_dict()}

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "item") -> "ItemOutcome":
        if not isinstance(d, dict):
            raise QualityError(f"{where} must be an object")
        if not isinstance(d.get("item"), str):
            raise QualityError(f"{where}.item must be the item's id (text)")
        if not isinstance(d.get("identical"), bool):
            raise QualityError(f"{where}.identical must be true or false")
        verdict = _opt(d, "verdict", (str,), where)
        if verdict is not None and verdict not in VERDICTS:
            raise QualityError(f"{where}.verdict must be one of {', '.join(VERDICTS)} (got {verdict!r})")
        fork = _opt(d, "fork", (int,), where)
        gap = _opt(d, "gap", (int, float), where)
        seconds = _opt(d, "seconds", (int, float), where) or 0.0
        if (gap is not None and not math.isfinite(gap)) or not math.isfinite(seconds):
            raise QualityError(f"{where}: gap and seconds must be finite numbers")
        out = cls(item_id=d["item"], vanilla=Score.from_dict(d.get("vanilla"), where=f"{where}.vanilla"),
                  speculative=Score.from_dict(d.get("speculative"), where=f"{where}.speculative"),
                  identical=d["identical"], fork_index=fork,
                  fork_context=_opt(d, "fork_context", (str,), where), verdict=verdict,
                  trace_path=_opt(d, "trace", (str,), where), rule=_opt(d, "rule", (str,), where),
                  gap=None if gap is None else float(gap),
                  vanilla_piece=_opt(d, "vanilla_piece", (str,), where),
                  speculative_piece=_opt(d, "speculative_piece", (str,), where),
                  error=_opt(d, "error", (str,), where), seconds=float(seconds),
                  diagnosis_error=_opt(d, "diagnosis_error", (str,), where),
                  ties=None if d.get("ties") is None else ItemTies.from_dict(d["ties"], where=f"{where}.ties"))
        if out.identical and out.vanilla.passed != out.speculative.passed:
            raise QualityError(f"{where}: the arms are identical but their scores differ")
        if out.ties is not None and out.ties.forked != (out.fork_index is not None):
            raise QualityError(f"{where}.ties.fork must be set exactly when the item has a fork (fork is "
                               f"{out.fork_index!r})")
        return out


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
        got = [o.outcome for o in items]
        return cls(both_pass=got.count("both-pass"), both_fail=got.count("both-fail"),
                   only_vanilla=got.count("only-vanilla"), only_speculative=got.count("only-speculative"))

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
        low, high = wilson(k, n)
        return cls(k, n, low, high)

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "n": self.n, "rate": self.rate, "low": self.low, "high": self.high}


@dataclass
class QualityResult:
    """A quality run, finished or in progress: the suite, the run's config, every item's outcome and the figures.

    ``table``, ``p_mcnemar``, ``vanilla_rate``, ``spec_rate`` and ``near_ties`` (each
    arm's near-tie density and the forks at near-ties, :func:`.near_ties.summarise`)
    are derived from ``items`` (:meth:`refresh`); ``status`` is ``running``, ``complete`` or
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
    #: with ``execute``: what the sandbox enforced (``SandboxReport.to_dict``), else empty
    sandbox: dict[str, Any] = field(default_factory=dict)
    near_ties: dict[str, Any] = field(default_factory=lambda: summarise([]))

    def refresh(self) -> "QualityResult":
        """Recompute the table, the test, the rates and the near-tie figures from ``items``; returns self."""
        t = self.table = Table.of(self.items)
        self.p_mcnemar = mcnemar_exact(t.only_vanilla, t.only_speculative)
        self.vanilla_rate = Rate.of(t.both_pass + t.only_vanilla, t.n)
        self.spec_rate = Rate.of(t.both_pass + t.only_speculative, t.n)
        self.near_ties = summarise(self.items)
        return self

    @property
    def errors(self) -> list[ItemOutcome]:
        """The items that could not be run (outside the table)."""
        return [o for o in self.items if o.error is not None]

    def outcome_of(self, item_id: str) -> ItemOutcome | None:
        return next((o for o in self.items if o.item_id == item_id), None)

    @property
    def discordant(self) -> list[ItemOutcome]:
        """The items whose answer changed (one arm passed, the other failed), in suite order."""
        return [o for o in self.items if o.discordant]

    def to_dict(self) -> dict[str, Any]:
        self.refresh()
        return {
            "schema": SCHEMA,
            "specview": __version__,
            "status": self.status,
            "created": self.created or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "elapsed_s": round(self.elapsed, 3),
            "execute": self.execute,
            "suite": self.suite.to_dict(),
            "config": self.config,
            "table": self.table.to_dict(),
            "p_mcnemar": self.p_mcnemar,
            "vanilla_rate": self.vanilla_rate.to_dict(),
            "spec_rate": self.spec_rate.to_dict(),
            "near_ties": self.near_ties,
            "n_items": len(self.suite.items),
            "n_done": len(self.items),
            "n_errors": len(self.errors),
            "items": [o.to_dict() for o in self.items],
            "environment": self.environment,
            "sandbox": self.sandbox,
        }

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "<quality>") -> "QualityResult":
        """The inverse of :meth:`to_dict`, every field checked; :class:`QualityError` names ``source`` and the
        field.  The derived figures are recomputed from the items, not trusted."""
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise QualityError(f"{source}: not a specview quality result ({schema_of(d)}; a quality run's "
                               f"schema is {SCHEMA!r})")
        try:
            suite = Suite.from_dict(d.get("suite"), where="suite")
            if not isinstance(d.get("config"), dict):
                raise QualityError("config must be an object (the run's settings)")
            status = d.get("status")
            if status not in STATUSES:
                raise QualityError(f"status must be one of {', '.join(STATUSES)} (got {status!r})")
            raw = d.get("items")
            if not isinstance(raw, list):
                raise QualityError("items must be a list")
            items = [ItemOutcome.from_dict(x, where=f"items[{i}]") for i, x in enumerate(raw)]
            ids = {it.id for it in suite.items}
            seen: set[str] = set()
            for i, o in enumerate(items):
                if o.item_id not in ids:
                    raise QualityError(f"items[{i}].item {o.item_id!r} is not an item of the suite")
                if o.item_id in seen:
                    raise QualityError(f"items[{i}].item {o.item_id!r} is recorded twice")
                seen.add(o.item_id)
            env = d.get("environment") or {}
            elapsed = d.get("elapsed_s") or 0.0
            if not isinstance(env, dict) or isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)):
                raise QualityError("environment must be an object and elapsed_s a number")
            sandbox = d.get("sandbox") or {}
            if not isinstance(sandbox, dict):
                raise QualityError("sandbox must be an object (what the sandbox enforced)")
        except QualityError as exc:
            raise QualityError(f"{source}: malformed quality result: {exc}") from None
        return cls(suite=suite, config=d["config"], items=items, elapsed=float(elapsed), status=status,
                   execute=bool(d.get("execute")), environment=env, created=str(d.get("created") or ""),
                   sandbox=sandbox).refresh()

    @classmethod
    def load(cls, path: Any) -> "QualityResult":
        p = Path(path)
        if not p.exists():
            raise QualityError(f"{p}: no such file")
        return cls.from_dict(read_json(p, QualityError), source=str(p))

    def save(self, path: Any) -> Path:
        """Write the document atomically (a reader never sees half a file); returns the path."""
        return write_atomic(path, json.dumps(json_safe(self.to_dict()), ensure_ascii=False, indent=1))

    def with_items(self, items: list[ItemOutcome]) -> "QualityResult":
        """A copy holding ``items`` (in suite order), its figures recomputed."""
        order = {it.id: i for i, it in enumerate(self.suite.items)}
        return replace(self, items=sorted(items, key=lambda o: order.get(o.item_id, len(order)))).refresh()


__all__ = ["SCHEMA", "ItemOutcome", "QualityResult", "Rate", "Table"]
