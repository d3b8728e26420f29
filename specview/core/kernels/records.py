"""The kernel map's records: per-width figures, per-target rows, the whole map and its JSON file form."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import EngineSettings
from ..errors import SpecviewError
from ..config import fill_plain
from ..registry import Runner
from ..prompts import PromptError, PromptSpec, builtin_names, builtin_prompts
from ..jsonfile import schema_of
from ..trace import json_safe, read_json, write_atomic
from .text import heatmap, ranges, settings_label, table

SCHEMA = "specview.kernels/1"
DEFAULT_WIDTHS = tuple(range(1, 17))
DEFAULT_POSITIONS = 128
DEFAULT_TOP_K = 8

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]


class KernelMapError(SpecviewError):
    """A kernel map file that cannot be read, or a map that cannot be computed as asked."""


# -- inputs ------------------------------------------------------------------------------
def as_prompts(items: Iterable[Any]) -> list[PromptSpec]:
    """Prompts from :class:`PromptSpec`s, built-in names, texts or token-id lists."""
    out: list[PromptSpec] = []
    builtin = set(builtin_names())
    for i, it in enumerate(items):
        if isinstance(it, PromptSpec):
            out.append(it)
        elif isinstance(it, str):
            out.append(builtin_prompts([it])[0] if it in builtin else PromptSpec(name=f"prompt{i + 1}", text=it))
        elif isinstance(it, (list, tuple)) and it and all(isinstance(t, int) and t >= 0 for t in it):
            out.append(PromptSpec(name=f"tokens{i + 1}", tokens=tuple(int(t) for t in it), chat=False))
        else:
            raise KernelMapError(f"prompt {i + 1}: {it!r} is neither a prompt, a built-in name, a text nor token ids")
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise KernelMapError(f"prompt names must differ (got {', '.join(names)})")
    if not out:
        raise KernelMapError("the kernel map needs at least one prompt")
    return out


# -- results -----------------------------------------------------------------------------
@dataclass
class WidthStats:
    """One width's figures for one target (over every prompt)."""

    width: int
    rows: int = 0
    identical: int = 0
    max_delta: float = 0.0
    p95_delta: float = 0.0
    flips: int = 0
    below_shift: int = 0
    #: per row index of the pass: rows that were not bit-identical
    differing_by_row: list[int] = field(default_factory=list)
    #: (prompt, token index) of every argmax flip
    flip_at: list[tuple[str, int]] = field(default_factory=list)
    #: the first row that was not bit-identical: (prompt, token index, row of the pass), or None
    first_difference: tuple[str, int, int] | None = None
    #: measuring stopped at the first differing row (the figures cover the rows measured)
    stopped: bool = False
    #: where its first differing row first departs (a locate's summary, ``specview kernels --locate``), or None
    cause: dict[str, Any] | None = None

    @property
    def bit_identical(self) -> bool:
        return self.rows > 0 and self.identical == self.rows

    @property
    def identical_share(self) -> float:
        return self.identical / self.rows if self.rows else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "width": self.width, "rows": self.rows, "identical": self.identical,
            "bit_identical": self.bit_identical,
            "max_delta": self.max_delta, "p95_delta": self.p95_delta, "flips": self.flips,
            "below_shift": self.below_shift, "differing_by_row": list(self.differing_by_row),
            "flip_at": [list(x) for x in self.flip_at],
            "first_difference": list(self.first_difference) if self.first_difference else None,
            "stopped": self.stopped, **({"cause": self.cause} if self.cause is not None else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WidthStats:
        fd = d.get("first_difference")
        return cls(
            width=int(d["width"]), rows=int(d["rows"]), identical=int(d["identical"]),
            max_delta=float(d["max_delta"]) if d.get("max_delta") is not None else math.nan,
            p95_delta=float(d["p95_delta"]) if d.get("p95_delta") is not None else math.nan,
            flips=int(d["flips"]), below_shift=int(d.get("below_shift", 0)),
            differing_by_row=[int(x) for x in d.get("differing_by_row", [])],
            flip_at=[(str(p), int(j)) for p, j in d.get("flip_at", [])],
            first_difference=(str(fd[0]), int(fd[1]), int(fd[2])) if fd else None,
            stopped=bool(d.get("stopped", False)),
            cause=dict(d["cause"]) if isinstance(d.get("cause"), dict) else None,
        )


@dataclass
class PromptSequence:
    """The teacher-forced sequence of one prompt on one target, and the positions measured on it."""

    name: str
    prompt_tokens: list[int]
    tokens: list[int]  # the greedy single-token continuation, token 0 onwards
    positions: int  # tokens 1..positions are measured at every width (wider widths reach a little further)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "prompt_tokens": list(self.prompt_tokens), "tokens": list(self.tokens),
                "positions": self.positions}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PromptSequence:
        return cls(name=str(d["name"]), prompt_tokens=[int(t) for t in d["prompt_tokens"]],
                   tokens=[int(t) for t in d["tokens"]], positions=int(d["positions"]))


@dataclass
class TargetMap:
    """One row of the map: a target under one set of engine settings."""

    target: str
    settings: EngineSettings
    model: dict[str, Any]
    threads_used: int | None
    prompts: list[PromptSequence]
    widths: dict[int, WidthStats]
    seconds: float = 0.0
    locate_seconds: float | None = None  # the locates of its differing widths (--locate), included in seconds

    @property
    def label(self) -> str:
        extra = settings_label(self.settings)
        return f"{self.target} [{extra}]" if extra else self.target

    @property
    def deterministic(self) -> bool:
        """The width-1 control: the same single-token pass after a rollback gave the same bits."""
        w1 = self.widths.get(1)
        return w1 is not None and w1.bit_identical

    def safe_widths(self) -> list[int]:
        """Widths whose every row was bit-identical to the single-token row (none if the control failed)."""
        if not self.deterministic:
            return []
        return [w for w, s in sorted(self.widths.items()) if s.bit_identical]

    def safe_n_max(self) -> int | None:
        """The largest n_max whose verify widths 1..n_max+1 were all measured and bit-identical.

        None when even width 2 is not (no draft length is proven lossless), or the control failed.
        """
        safe = set(self.safe_widths())
        n = 0
        while n + 2 in safe:
            n += 1
        return n if n >= 1 else None

    def evidence(self, widths: Iterable[int] | None = None) -> str:
        """What a claim about this target rests on: prompts, positions and rows per width."""
        ws = sorted(self.widths) if widths is None else sorted(widths)
        rows = sum(self.widths[w].rows for w in ws if w in self.widths)
        ps = ", ".join(f"{p.name} tokens 1-{p.positions}" for p in self.prompts)
        return f"{rows} rows at widths {ranges(ws)} on {ps}"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target, "label": self.label, "settings": self.settings.to_dict(),
            "model": self.model, "threads_used": self.threads_used, "seconds": round(self.seconds, 3),
            "deterministic": self.deterministic, "safe_widths": self.safe_widths(), "safe_n_max": self.safe_n_max(),
            "prompts": [p.to_json() for p in self.prompts],
            "widths": [self.widths[w].to_json() for w in sorted(self.widths)],
            **({"locate_seconds": self.locate_seconds} if self.locate_seconds is not None else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TargetMap:
        return cls(
            target=str(d["target"]), settings=fill_plain(EngineSettings.from_dict(d.get("settings") or {})),
            model=dict(d.get("model") or {}), threads_used=d.get("threads_used"),
            prompts=[PromptSequence.from_json(p) for p in d["prompts"]],
            widths={int(w["width"]): WidthStats.from_json(w) for w in d["widths"]},
            seconds=float(d.get("seconds") or 0.0),
            locate_seconds=float(d["locate_seconds"]) if d.get("locate_seconds") is not None else None,
        )


@dataclass
class KernelMap:
    """The map of every target and width; what ``specview kernels`` prints and saves."""

    backend: str
    widths: tuple[int, ...]
    positions: int
    top_k: int
    prompts: list[PromptSpec]
    targets: list[TargetMap]
    environment: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def target(self, name: str, settings: EngineSettings | None = None) -> TargetMap:
        """The row for a target name or label (and settings, where one target was mapped under several)."""
        rows = [t for t in self.targets if t.label == name] or [t for t in self.targets if t.target == name]
        if settings is not None:
            want = Runner.as_decided(settings, backend=self.backend).context_key
            rows = [t for t in rows if t.settings.context_key == want]
        if not rows:
            raise KeyError(f"{name!r} is not in this kernel map (it has {', '.join(t.label for t in self.targets)})")
        if len(rows) > 1:
            raise KeyError(f"{name!r} was mapped under several settings; name one of "
                           f"{', '.join(t.label for t in rows)}")
        return rows[0]

    def safe_widths(self, target: str | TargetMap, settings: EngineSettings | None = None) -> list[int]:
        t = target if isinstance(target, TargetMap) else self.target(target, settings)
        return t.safe_widths()

    def safe_n_max(self, target: str | TargetMap, settings: EngineSettings | None = None) -> int | None:
        t = target if isinstance(target, TargetMap) else self.target(target, settings)
        return t.safe_n_max()

    # -- JSON --------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return json_safe({
            "schema": SCHEMA, "backend": self.backend, "widths": list(self.widths), "positions": self.positions,
            "top_k": self.top_k, "prompts": [p.to_json() for p in self.prompts],
            "environment": self.environment, "seconds": round(self.seconds, 3),
            "targets": [t.to_json() for t in self.targets],
        })

    def save(self, path: str | Path) -> Path:
        import json

        return write_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def from_json(cls, d: Any, *, source: str = "<kernel map>") -> KernelMap:
        _validate(d, source)
        try:
            return cls(
                backend=str(d["backend"]), widths=tuple(int(w) for w in d["widths"]), positions=int(d["positions"]),
                top_k=int(d["top_k"]),
                prompts=[PromptSpec.from_json(p, where=f"{source}: prompts[{i}]") for i, p in enumerate(d["prompts"])],
                targets=[TargetMap.from_json(t) for t in d["targets"]],
                environment=dict(d.get("environment") or {}), seconds=float(d.get("seconds") or 0.0),
            )
        except PromptError as exc:
            raise KernelMapError(str(exc)) from None
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:  # int(inf): OverflowError
            raise KernelMapError(f"{source}: malformed kernel map ({type(exc).__name__}: {exc})") from None

    @classmethod
    def load(cls, path: str | Path) -> KernelMap:
        return cls.from_json(read_json(path, KernelMapError), source=str(path))

    # -- text --------------------------------------------------------------------------------
    def table(self) -> str:
        """Per target: the per-width table, what it proves, and its widths grouped by cause where located."""
        from .causes import groups_line

        return table(self, groups_line)

    def heatmap(self) -> str:
        """Target x width, ASCII."""
        return heatmap(self)

    def grid(self, metric: str = "identical_share") -> tuple[list[str], list[int], list[list[float | None]]]:
        """(row labels, widths, values) for a heatmap: any numeric :class:`WidthStats` field or property."""
        rows = []
        for t in self.targets:
            rows.append([float(getattr(t.widths[w], metric)) if w in t.widths else None for w in self.widths])
        return [t.label for t in self.targets], list(self.widths), rows


def _validate(d: Any, source: str) -> None:
    schema = d.get("schema") if isinstance(d, dict) else None
    if not isinstance(schema, str) or not schema.startswith("specview.kernels/"):
        raise KernelMapError(f"{source}: not a specview kernel map ({schema_of(d)}; a kernel map's schema is {SCHEMA!r}); "
                             "write one with `specview kernels -o FILE`")
    if schema != SCHEMA:
        raise KernelMapError(f"{source}: kernel map schema {schema!r} is not supported (this specview reads {SCHEMA!r})")
    for key, typ in (("backend", str), ("widths", list), ("positions", int), ("top_k", int), ("prompts", list),
                     ("targets", list)):
        if not isinstance(d.get(key), typ):
            raise KernelMapError(f"{source}: malformed kernel map: {key!r} must be a {typ.__name__}")
    for i, t in enumerate(d["targets"]):
        if not isinstance(t, dict) or not isinstance(t.get("widths"), list) or not isinstance(t.get("prompts"), list):
            raise KernelMapError(f"{source}: malformed kernel map: target {i + 1} needs 'widths' and 'prompts' lists")
        for w in t["widths"]:
            if not isinstance(w, dict) or any(not isinstance(w.get(k), int) or isinstance(w.get(k), bool)
                                              for k in ("width", "rows", "identical", "flips")):
                raise KernelMapError(f"{source}: malformed kernel map: target {i + 1} has a width entry without "
                                     "integer 'width', 'rows', 'identical' and 'flips'")
            if not 0 <= w["identical"] <= w["rows"]:
                raise KernelMapError(f"{source}: malformed kernel map: target {i + 1} width {w['width']} has "
                                     f"{w['identical']} identical rows of {w['rows']}")


