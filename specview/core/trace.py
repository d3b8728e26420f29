"""What every run records, and its JSON form (``docs/trace-format.md``).

The trace is the one artefact the CLI, the GUI, reports and other tools share.
It is written atomically and validated on load: a malformed or foreign file is
refused with a message naming the file and what is wrong.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .engine import SpecviewError

SCHEMA = "specview.trace/1"
TOP_LEVEL_KEYS = (
    "schema",
    "config",
    "environment",
    "models",
    "prompt",
    "vanilla",
    "speculative",
    "comparison",
)


class TraceError(SpecviewError):
    """A trace file cannot be read: missing, not JSON, foreign, or malformed."""


@dataclass
class Step:
    """One emitted token."""

    index: int  # 0-based index in the arm's generated tokens
    token: int
    piece: str
    pos: int  # KV position the token will occupy (prompt length + index)
    top_ids: list[int]
    top_logits: list[float]
    # top-1 minus top-2 logit of the row that produced the token.  Engines that
    # report only probabilities (llama-server) give log-probability differences,
    # which equal logit differences; None where the engine reported nothing.
    margin: float | None
    # None below: the engine does not report it (llama-server gives no per-round data)
    round: int | None = 0  # speculative arm: round that emitted it (0 = prefill)
    from_draft: bool | None = False  # speculative arm: an accepted draft token
    batch_size: int | None = 1  # T of the forward pass whose logits chose it
    batch_index: int | None = 0  # row of that pass
    # the row was computed as its own single-token pass of a serial verify (written only when true)
    serial: bool = False

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["top_logits"] = [round(float(x), 5) for x in self.top_logits]
        d["margin"] = None if self.margin is None else round(float(self.margin), 5)
        if not self.serial:
            del d["serial"]
        return d


@dataclass
class Round:
    """One speculative round: draft, verify, accept."""

    index: int
    drafted: int
    accepted: int
    draft_ms: float
    verify_ms: float
    batch_size: int  # T of the verify pass (1 + drafted), prefill chunk for round 0
    first_step: int  # index of the first token this round emitted
    draft_tokens: list[int] = field(default_factory=list)
    # the verify pass ran as batch_size single-token passes (serial verify; written only when true)
    serial: bool = False

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["draft_ms"] = round(self.draft_ms, 3)
        d["verify_ms"] = round(self.verify_ms, 3)
        if not self.serial:
            del d["serial"]
        return d


@dataclass
class ArmResult:
    """Everything one arm produced."""

    name: str  # "vanilla" or "speculative"
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    steps: list[Step] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)  # speculative arm only
    prompt_ms: float = 0.0
    gen_ms: float = 0.0
    eval_ms: float | None = 0.0  # time inside forward passes (target and drafter); None if unknown
    stop_reason: str = ""  # "max_tokens", "eos", "cancelled", "context"
    drafter: str | None = None
    # Draft totals reported by an engine that gives no per-round data (llama-server's
    # timings.draft_n / draft_n_accepted); None means "sum the rounds".
    reported_drafted: int | None = None
    reported_accepted: int | None = None

    @property
    def tokens_per_s(self) -> float:
        # from the millisecond figure as the JSON stores it, so a reloaded trace reports the same speed
        gen_ms = round(self.gen_ms, 3)
        return len(self.tokens) / (gen_ms / 1000.0) if gen_ms > 0 else 0.0

    @property
    def n_drafted(self) -> int:
        if self.reported_drafted is not None:
            return self.reported_drafted
        return sum(r.drafted for r in self.rounds)

    @property
    def n_accepted(self) -> int:
        if self.reported_accepted is not None:
            return self.reported_accepted
        return sum(r.accepted for r in self.rounds)

    @property
    def acceptance_rate(self) -> float | None:
        d = self.n_drafted
        return self.n_accepted / d if d else None

    @property
    def mean_accepted(self) -> float | None:
        """Mean tokens emitted per verify round (accepted drafts + the target's own), round 0 excluded."""
        rs = [r for r in self.rounds if r.index > 0]
        if not rs:
            return None
        return sum(r.accepted + 1 for r in rs) / len(rs)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "tokens": list(self.tokens),
            "text": self.text,
            "stop_reason": self.stop_reason,
            "prompt_ms": round(self.prompt_ms, 3),
            "gen_ms": round(self.gen_ms, 3),
            "eval_ms": None if self.eval_ms is None else round(self.eval_ms, 3),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "steps": [s.to_json() for s in self.steps],
        }
        if self.name == "speculative":
            d["drafter"] = self.drafter
            d["rounds"] = [r.to_json() for r in self.rounds]
            d["n_drafted"] = self.n_drafted
            d["n_accepted"] = self.n_accepted
            d["acceptance_rate"] = None if self.acceptance_rate is None else round(self.acceptance_rate, 5)
            d["mean_accepted"] = None if self.mean_accepted is None else round(self.mean_accepted, 5)
        return d

    @classmethod
    def from_json(cls, name: str, d: dict[str, Any]) -> "ArmResult":
        arm = cls(name=name)
        arm.tokens = [int(t) for t in d["tokens"]]
        arm.text = str(d.get("text", ""))
        arm.stop_reason = str(d.get("stop_reason", ""))
        arm.prompt_ms = float(d.get("prompt_ms", 0.0))
        arm.gen_ms = float(d.get("gen_ms", 0.0))
        ev = d.get("eval_ms", 0.0)
        arm.eval_ms = None if ev is None else float(ev)
        arm.drafter = d.get("drafter")
        arm.steps = [Step(**s) for s in d["steps"]]
        arm.rounds = [Round(**r) for r in d.get("rounds", [])]
        if not arm.rounds and d.get("n_drafted") is not None:  # totals without rounds: an engine's own counts
            arm.reported_drafted = int(d["n_drafted"])
            arm.reported_accepted = int(d.get("n_accepted") or 0)
        return arm


@dataclass
class Mismatch:
    index: int  # token index of the first disagreement
    char_offset: int  # character offset of it in both texts (the shared prefix length)
    vanilla_token: int | None
    speculative_token: int | None
    vanilla_piece: str | None
    speculative_piece: str | None


@dataclass
class Comparison:
    identical: bool
    agree: int  # number of leading tokens both arms share
    n_vanilla: int
    n_speculative: int
    first_mismatch: Mismatch | None

    def to_json(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "agree": self.agree,
            "n_vanilla": self.n_vanilla,
            "n_speculative": self.n_speculative,
            "first_mismatch": None if self.first_mismatch is None else asdict(self.first_mismatch),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Comparison":
        fm = d.get("first_mismatch")
        return cls(
            identical=bool(d["identical"]),
            agree=int(d.get("agree", 0)),
            n_vanilla=int(d.get("n_vanilla", 0)),
            n_speculative=int(d.get("n_speculative", 0)),
            first_mismatch=None if fm is None else Mismatch(**fm),
        )


@dataclass
class Trace:
    config: dict[str, Any]
    environment: dict[str, Any]
    models: dict[str, Any]  # {"target": {...}, "draft": {...} | None}
    prompt: dict[str, Any]  # {"text": ..., "chat": bool, "tokens": [...]}
    vanilla: ArmResult
    speculative: ArmResult
    comparison: Comparison
    diagnosis: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # -- JSON ------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema": SCHEMA,
            "config": self.config,
            "environment": self.environment,
            "models": self.models,
            "prompt": self.prompt,
            "vanilla": self.vanilla.to_json(),
            "speculative": self.speculative.to_json(),
            "comparison": self.comparison.to_json(),
        }
        if self.diagnosis is not None:
            d["diagnosis"] = self.diagnosis
        d.update(self.extra)
        return d

    def dumps(self) -> str:
        return json.dumps(json_safe(self.to_json()), ensure_ascii=False, indent=1)

    def save(self, path: str | os.PathLike[str]) -> Path:
        return write_atomic(path, self.dumps())

    @classmethod
    def from_json(cls, d: Any, *, source: str = "<trace>") -> "Trace":
        validate(d, source=source)
        known = set(TOP_LEVEL_KEYS) | {"diagnosis"}
        try:
            return cls(
                config=d["config"],
                environment=d["environment"],
                models=d["models"],
                prompt=d["prompt"],
                vanilla=ArmResult.from_json("vanilla", d["vanilla"]),
                speculative=ArmResult.from_json("speculative", d["speculative"]),
                comparison=Comparison.from_json(d["comparison"]),
                diagnosis=d.get("diagnosis"),
                extra={k: v for k, v in d.items() if k not in known},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"{source}: malformed specview trace ({type(exc).__name__}: {exc})") from exc

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Trace":
        p = Path(path)
        if not p.exists():
            raise TraceError(f"{p}: no such file")
        d = read_json(p, TraceError)
        return cls.from_json(d, source=str(p))


def read_json(path: str | os.PathLike[str], error: type[SpecviewError] = SpecviewError) -> Any:
    """Parse a JSON file, or raise ``error`` naming the file and what is wrong with it."""
    p = Path(path)
    if not p.exists():
        raise error(f"{p}: no such file")
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{p}: cannot read it as UTF-8 text ({exc})") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise error(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None


def json_safe(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null rather than emit invalid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def validate(d: Any, *, source: str = "<trace>") -> None:
    """Raise :class:`TraceError` unless ``d`` is a specview trace this version can read."""
    if not isinstance(d, dict):
        raise TraceError(f"{source}: not a specview trace (the top level is {type(d).__name__}, not an object)")
    schema = d.get("schema")
    if not isinstance(schema, str) or not schema.startswith("specview.trace/"):
        raise TraceError(
            f"{source}: not a specview trace (schema is {schema!r}, expected {SCHEMA!r}). "
            "Open a file written by `specview run --json` or the app's Save."
        )
    if schema != SCHEMA:
        raise TraceError(f"{source}: trace schema {schema!r} is not supported by this specview (reads {SCHEMA!r})")
    missing = [k for k in TOP_LEVEL_KEYS if k not in d]
    if missing:
        raise TraceError(f"{source}: malformed specview trace, missing key(s): {', '.join(missing)}")
    models = d["models"]
    if not isinstance(models, dict) or "target" not in models or "draft" not in models:
        raise TraceError(f"{source}: malformed specview trace: 'models' needs 'target' and 'draft'")
    if not isinstance(d["prompt"], dict) or not isinstance(d["prompt"].get("tokens"), list):
        raise TraceError(f"{source}: malformed specview trace: 'prompt.tokens' must be a list of token ids")
    for arm in ("vanilla", "speculative"):
        a = d[arm]
        if not isinstance(a, dict):
            raise TraceError(f"{source}: malformed specview trace: '{arm}' must be an object")
        for key, typ in (("tokens", list), ("steps", list), ("text", str)):
            if not isinstance(a.get(key), typ):
                raise TraceError(f"{source}: malformed specview trace: '{arm}.{key}' must be a {typ.__name__}")
        if len(a["tokens"]) != len(a["steps"]):
            raise TraceError(
                f"{source}: malformed specview trace: '{arm}' has {len(a['tokens'])} tokens "
                f"but {len(a['steps'])} steps"
            )
        if not all(isinstance(t, int) for t in a["tokens"]):
            raise TraceError(f"{source}: malformed specview trace: '{arm}.tokens' must hold integers")
    if not isinstance(d["speculative"].get("rounds"), list):
        raise TraceError(f"{source}: malformed specview trace: 'speculative.rounds' must be a list")
    comp = d["comparison"]
    if not isinstance(comp, dict) or "identical" not in comp or "first_mismatch" not in comp:
        raise TraceError(f"{source}: malformed specview trace: 'comparison' needs 'identical' and 'first_mismatch'")


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` so that readers see the old file or the new, never half of one."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise SpecviewError(f"{p}: the folder {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would surprise whoever shares the file
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p
