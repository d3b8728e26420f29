"""What a probe found: one row per trigger and engine, and the report that holds them (JSON ``specview.probe/1``).

A row's ``result`` is one of :data:`RESULTS`:

* ``identical``: the trigger happened (the row's evidence counts it) and the
  speculative arm equals plain greedy token for token;
* ``near-tie proven``: the arms fork, and the control (the same script with
  every verify row its own single-token pass in-process, the same server with
  ``-ub 1``) reproduces plain greedy exactly: the fork is batched numerics;
* ``state``: the control forks too while plain greedy repeats itself: the loop,
  its rollback or its memory is wrong, whatever the numerics;
* ``unproven``: the trigger did not happen, or the control could not decide (it
  does not walk the path that forked, plain greedy does not repeat itself); the
  evidence says which.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecviewError
from ..jsonfile import json_safe, read_json, write_atomic

SCHEMA = "specview.probe/1"
IDENTICAL, NEAR_TIE, STATE, UNPROVEN = "identical", "near-tie proven", "state", "unproven"
RESULTS = (IDENTICAL, NEAR_TIE, STATE, UNPROVEN)
IN_PROCESS, SERVER = "in-process", "llama-server"


class ProbeError(SpecviewError):
    """A probe report cannot be read: missing, not JSON, foreign, or malformed."""


@dataclass
class TriggerResult:
    """One trigger on one engine: what was run, whether the trigger happened, and the proven result."""

    trigger: str
    label: str  # the variant: a rollback mode, a spec type, a script
    engine: str  # IN_PROCESS or SERVER
    result: str
    evidence: str  # one line: what happened and what decided the result
    reached: bool  # the trigger happened (its evidence counts it)
    n_tokens: int = 0
    first_mismatch: int | None = None
    control: dict[str, Any] | None = None  # the control's form, tokens and first mismatch (None: not needed)
    counts: dict[str, Any] = field(default_factory=dict)  # rounds, drafted, accepted, rollbacks by mode ...
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.result not in RESULTS:
            raise ValueError(f"a probe result is one of {', '.join(RESULTS)} (got {self.result!r})")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["seconds"] = round(self.seconds, 3)
        return json_safe(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TriggerResult":
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class ProbeReport:
    """Every row of one probe of one target, with what it ran on."""

    target: str
    rows: list[TriggerResult] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # the probe's settings (tokens, n_max, prompt ...)
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what could not run, and why
    seconds: dict[str, float] = field(default_factory=dict)  # per engine

    def extend(self, other: "ProbeReport") -> None:
        """The rows, notes and times of another part of the same probe (the server half)."""
        self.rows.extend(other.rows)
        self.notes.extend(other.notes)
        self.seconds.update(other.seconds)
        for k, v in other.environment.items():
            self.environment.setdefault(k, v)

    @property
    def worst(self) -> str:
        """``state`` if any row reads state, else ``unproven`` if any is, else the mildest result seen."""
        seen = {r.result for r in self.rows}
        for r in (STATE, UNPROVEN, NEAR_TIE, IDENTICAL):
            if r in seen:
                return r
        return UNPROVEN

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "target": self.target, "config": json_safe(self.config),
                "environment": json_safe(self.environment), "notes": list(self.notes),
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "rows": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "probe report") -> "ProbeReport":
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise ProbeError(f"{where} is not a specview probe report (schema {SCHEMA})")
        rows = d.get("rows")
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ProbeError(f"{where}: 'rows' must be a list of objects")
        try:
            parsed = [TriggerResult.from_dict(r) for r in rows]
        except (TypeError, ValueError) as exc:
            raise ProbeError(f"{where}: a row is malformed ({exc})") from None
        return cls(target=str(d.get("target", "")), rows=parsed, config=dict(d.get("config") or {}),
                   environment=dict(d.get("environment") or {}), notes=[str(n) for n in d.get("notes") or []],
                   seconds={str(k): float(v) for k, v in (d.get("seconds") or {}).items()})

    def save(self, path: str | os.PathLike[str]) -> Path:
        return write_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "ProbeReport":
        return cls.from_dict(read_json(path, ProbeError), where=str(path))
