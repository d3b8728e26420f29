"""What every run records, and its JSON form (``docs/trace-format.md``).

The trace is the one artefact the CLI, the GUI, reports and other tools share.
It is written atomically and validated on load: a malformed or foreign file is
refused with a message naming the file and what is wrong.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .errors import SpecviewError
from .jsonfile import (  # noqa: F401  (read_json, json_safe, write_atomic are imported from here too)
    MAX_DEPTH,
    Malformed,
    as_bool,
    as_dict,
    as_int,
    as_list,
    as_num,
    as_str,
    json_depth,
    json_safe,
    read_json,
    check_spec,
    schema_of,
    short,
    write_atomic,
)

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


#: the stop reason of an arm whose engine died (specview.core.worker)
CRASHED = "crashed"


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
    top_logits: list[float | None]  # None: a logit JSON cannot hold (NaN, infinity), as written to file
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
        d["top_logits"] = [None if x is None else round(float(x), 5) for x in self.top_logits]
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
    draft_ms: float | None  # None: the engine does not time drafting and verifying apart (llama-server)
    verify_ms: float | None
    batch_size: int  # T of the verify pass (1 + drafted), prefill chunk for round 0
    first_step: int  # index of the first token this round emitted
    draft_tokens: list[int] = field(default_factory=list)
    # the verify pass ran as batch_size single-token passes (serial verify; written only when true)
    serial: bool = False
    # how the rejected drafts were dropped: "seq-rm", "snapshots" (an n_rs_seq snapshot), "state-copy" (a
    # snapshot context's state kept by a copy after a single-token pass) or "checkpoint" ("" nothing was
    # rejected, or the engine does not say); written only when set
    rollback: str = ""
    # the width of the replay pass after a checkpoint restore (0: none; written only when not 0).  A replay
    # verifies [id_last] + the accepted tokens + the target's token again, and its rows chose this round's
    # tokens: it emits one token more than accepted + 1
    replay: int = 0

    @property
    def emitted(self) -> int:
        """Tokens this round emits when nothing ends the run inside it: accepted + 1, and one more after a replay."""
        return self.accepted + 1 + (1 if self.replay and self.rollback == "checkpoint" else 0)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["draft_ms"] = None if self.draft_ms is None else round(self.draft_ms, 3)
        d["verify_ms"] = None if self.verify_ms is None else round(self.verify_ms, 3)
        for key, unset in (("serial", False), ("rollback", ""), ("replay", 0)):
            if d[key] == unset:
                del d[key]
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
    stop_reason: str = ""  # "max_tokens", "eos", "cancelled", "context", "crashed"
    drafter: str | None = None
    # Draft totals reported by an engine that gives no per-round data (llama-server's
    # timings.draft_n / draft_n_accepted); None means "sum the rounds".
    reported_drafted: int | None = None
    reported_accepted: int | None = None
    # speculative arm: how many rollbacks of each mechanism (specview.core.engine.ROLLBACK_MECHANISMS) each of its
    # contexts did, {"target": {...}, "draft": {...}}; empty where the engine does not say (written only when set)
    rollbacks: dict[str, dict[str, int]] = field(default_factory=dict)

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
        """Mean tokens emitted per verify round (accepted drafts + the target's own, + the replay's next token
        after a checkpoint restore), round 0 excluded."""
        rs = [r for r in self.rounds if r.index > 0]
        if not rs:
            return None
        return sum(r.emitted for r in rs) / len(rs)

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
            if self.rollbacks:
                d["rollbacks"] = {k: dict(v) for k, v in self.rollbacks.items()}
        return d

    @classmethod
    def from_json(cls, name: str, d: Any) -> "ArmResult":
        """The arm ``name`` from its JSON form; :class:`Malformed` names the first field that is wrong."""
        a = as_dict(d, name)
        arm = cls(name=name)
        arm.tokens = [as_int(t, f"{name}.tokens[{i}]") for i, t in enumerate(as_list(a.get("tokens"), f"{name}.tokens"))]
        arm.text = as_str(a.get("text"), f"{name}.text")
        arm.stop_reason = as_str(a.get("stop_reason", ""), f"{name}.stop_reason")
        arm.prompt_ms = as_num(a.get("prompt_ms", 0.0), f"{name}.prompt_ms")
        arm.gen_ms = as_num(a.get("gen_ms", 0.0), f"{name}.gen_ms")
        arm.eval_ms = as_num(a.get("eval_ms", 0.0), f"{name}.eval_ms", none=True)
        arm.drafter = as_str(a.get("drafter"), f"{name}.drafter", none=True)
        steps = as_list(a.get("steps"), f"{name}.steps")
        if len(steps) != len(arm.tokens):
            raise Malformed(name, f"has {len(arm.tokens)} tokens but {len(steps)} steps")
        arm.steps = [_step(s, i, arm.tokens, f"{name}.steps[{i}]") for i, s in enumerate(steps)]
        rounds = a.get("rounds", [])
        if name == "speculative" and "rounds" not in a:
            raise Malformed(f"{name}.rounds", "is missing (an empty list when the engine reports no rounds)")
        arm.rounds = [_round(r, len(arm.tokens), f"{name}.rounds[{i}]")
                      for i, r in enumerate(as_list(rounds, f"{name}.rounds"))]
        rb = as_dict(a.get("rollbacks") or {}, f"{name}.rollbacks")
        arm.rollbacks = {str(ctx): {str(m): as_int(c, f"{name}.rollbacks.{ctx}.{m}")
                                    for m, c in as_dict(counts, f"{name}.rollbacks.{ctx}").items()}
                         for ctx, counts in rb.items()}
        if any(c < 0 for v in arm.rollbacks.values() for c in v.values()):
            raise Malformed(f"{name}.rollbacks", "holds a negative count")
        if not arm.rounds and a.get("n_drafted") is not None:  # totals without rounds: an engine's own counts
            arm.reported_drafted = as_int(a["n_drafted"], f"{name}.n_drafted")
            arm.reported_accepted = as_int(a.get("n_accepted") or 0, f"{name}.n_accepted")
        return arm


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ, counting a length difference; None if equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


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
    def of(cls, vanilla: ArmResult, speculative: ArmResult) -> "Comparison":
        """Compare two arms token by token.

        Arms that stop at different lengths (one hit EOS, one was cancelled) but
        agree on every token they share are *not* identical; the mismatch is at
        the shorter length with ``None`` for the arm that has no token there.
        An arm cut short because the engine crashed (stop reason ``"crashed"``)
        has not forked where it stopped: such arms are compared on the tokens
        both have, and agree if those are equal.
        """
        i = first_difference(vanilla.tokens, speculative.tokens)
        if i is not None and CRASHED in (vanilla.stop_reason, speculative.stop_reason) \
                and i >= min(len(vanilla.tokens), len(speculative.tokens)):
            i = None
            n = min(len(vanilla.tokens), len(speculative.tokens))
            return cls(True, n, len(vanilla.tokens), len(speculative.tokens), None)
        if i is None:
            n = len(vanilla.tokens)
            return cls(True, n, n, n, None)

        def at(arm: ArmResult) -> tuple[int | None, str | None]:
            if i < len(arm.tokens):
                return arm.tokens[i], arm.steps[i].piece if i < len(arm.steps) else None
            return None, None

        (vt, vp), (st, sp) = at(vanilla), at(speculative)
        offset = sum(len(s.piece) for s in vanilla.steps[:i])
        return cls(False, i, len(vanilla.tokens), len(speculative.tokens), Mismatch(i, offset, vt, st, vp, sp))

    @classmethod
    def from_json(cls, d: Any, vanilla: ArmResult | None = None, speculative: ArmResult | None = None) -> "Comparison":
        """The comparison from its JSON form; given the arms, it must also be the one they make."""
        c = as_dict(d, "comparison")
        for key in ("identical", "first_mismatch"):
            if key not in c:
                raise Malformed("comparison", f"needs {key!r}")
        fm = c["first_mismatch"]
        if fm is not None:
            f = as_dict(fm, "comparison.first_mismatch")
            unknown = sorted(set(f) - _MISMATCH_KEYS)
            if unknown:
                raise Malformed("comparison.first_mismatch", f"has unknown key(s) {', '.join(map(repr, unknown))}")
            w = "comparison.first_mismatch"
            fm = Mismatch(
                index=as_int(f.get("index"), f"{w}.index"),
                char_offset=as_int(f.get("char_offset"), f"{w}.char_offset"),
                vanilla_token=as_int(f.get("vanilla_token"), f"{w}.vanilla_token", none=True),
                speculative_token=as_int(f.get("speculative_token"), f"{w}.speculative_token", none=True),
                vanilla_piece=as_str(f.get("vanilla_piece"), f"{w}.vanilla_piece", none=True),
                speculative_piece=as_str(f.get("speculative_piece"), f"{w}.speculative_piece", none=True),
            )
        comp = cls(
            identical=as_bool(c["identical"], "comparison.identical"),
            agree=as_int(c.get("agree", 0), "comparison.agree"),
            n_vanilla=as_int(c.get("n_vanilla", 0), "comparison.n_vanilla"),
            n_speculative=as_int(c.get("n_speculative", 0), "comparison.n_speculative"),
            first_mismatch=fm,
        )
        if vanilla is None or speculative is None:
            return comp
        # derived data: it must say what the arms say (a reader indexes the arms with it)
        want = cls.of(vanilla, speculative)
        for key in ("identical", "agree", "n_vanilla", "n_speculative", "first_mismatch"):
            if key in c and getattr(comp, key) != getattr(want, key):
                raise Malformed(f"comparison.{key}", f"is {short(getattr(comp, key))} but the arms give "
                                                     f"{short(getattr(want, key))}")
        return want


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
        d = json_safe(self.to_json())
        text = json.dumps(d, ensure_ascii=False, indent=1)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate read from a \\uD800 escape: keep it as an escape
            text = json.dumps(d, ensure_ascii=True, indent=1)
        return text

    def save(self, path: str | os.PathLike[str]) -> Path:
        return write_atomic(path, self.dumps())

    @classmethod
    def from_json(cls, d: Any, *, source: str = "<trace>") -> "Trace":
        """A trace from its JSON form, every field checked; :class:`TraceError` names the file and the field."""
        validate(d, source=source)
        known = set(TOP_LEVEL_KEYS) | {"diagnosis"}
        try:
            vanilla = ArmResult.from_json("vanilla", d["vanilla"])
            speculative = ArmResult.from_json("speculative", d["speculative"])
            return cls(
                config=d["config"],
                environment=d["environment"],
                models=d["models"],
                prompt=d["prompt"],
                vanilla=vanilla,
                speculative=speculative,
                comparison=Comparison.from_json(d["comparison"], vanilla, speculative),
                diagnosis=d.get("diagnosis"),
                extra={k: v for k, v in d.items() if k not in known},
            )
        except Malformed as exc:
            raise TraceError(f"{source}: malformed specview trace: {exc}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Trace":
        p = Path(path)
        if not p.exists():
            raise TraceError(f"{p}: no such file")
        d = read_json(p, TraceError)
        return cls.from_json(d, source=str(p))


def validate(d: Any, *, source: str = "<trace>") -> None:
    """Raise :class:`TraceError` unless ``d`` has a specview trace's header and blocks.

    The arms and the comparison are checked field by field as they are read
    (:meth:`Trace.from_json`).
    """
    schema = d.get("schema") if isinstance(d, dict) else None
    if not isinstance(schema, str) or not schema.startswith("specview.trace/"):
        raise TraceError(
            f"{source}: not a specview trace ({schema_of(d)}; a trace's schema is {SCHEMA!r}). "
            "Open a file written by `specview run --json` or the app's Save."
        )
    if schema != SCHEMA:
        raise TraceError(f"{source}: trace schema {short(schema)} is not supported by this specview (reads {SCHEMA!r})")
    missing = [k for k in TOP_LEVEL_KEYS if k not in d]
    if missing:
        raise TraceError(f"{source}: malformed specview trace, missing key(s): {', '.join(missing)}")
    try:
        for key in ("config", "environment"):
            as_dict(d[key], key)
        models = as_dict(d["models"], "models")
        if "target" not in models or "draft" not in models:
            raise Malformed("models", "needs 'target' and 'draft'")
        as_dict(models["target"], "models.target")
        as_dict(models["draft"], "models.draft", none=True)
        prompt = as_dict(d["prompt"], "prompt")
        for i, t in enumerate(as_list(prompt.get("tokens"), "prompt.tokens")):
            as_int(t, f"prompt.tokens[{i}]")
        as_str(prompt.get("text"), "prompt.text", none=True)
        as_str(prompt.get("chat_note"), "prompt.chat_note", none=True)
        for key in ("chat", "raw_tokens"):
            if key in prompt:
                as_bool(prompt[key], f"prompt.{key}")
        check_spec(d.get("diagnosis"), DIAGNOSIS_SPEC, "diagnosis")
        check_spec(d.get("crash"), CRASH_SPEC, "crash")
        check_spec(d["config"], CONFIG_SPEC, "config")
        _check_settings(d["config"])
        decided = as_dict(d["config"].get("decided"), "config.decided", none=True) or {}
        for key, dec in decided.items():
            check_spec(dec, {"why": "str"}, f"config.decided.{key}")
    except Malformed as exc:
        raise TraceError(f"{source}: malformed specview trace: {exc}") from None


# -- reading: every field checked, so whatever reads a loaded trace can trust its types ----------------
_STEP_KEYS = {f for f in Step.__dataclass_fields__}
_ROUND_KEYS = {f for f in Round.__dataclass_fields__}
#: a round's ``rollback`` values ("": nothing rejected, or not reported)
ROUND_ROLLBACKS = ("", "seq-rm", "snapshots", "state-copy", "checkpoint")
_MISMATCH_KEYS = {f for f in Mismatch.__dataclass_fields__}


def _step(d: Any, i: int, tokens: list[int], where: str) -> Step:
    s = as_dict(d, where)
    unknown = sorted(set(s) - _STEP_KEYS)
    if unknown:
        raise Malformed(where, f"has unknown key(s) {', '.join(map(short, unknown))}")
    for key in ("index", "token", "piece", "pos", "top_ids", "top_logits", "margin"):
        if key not in s:
            raise Malformed(where, f"needs {key!r}")
    step = Step(
        index=as_int(s["index"], f"{where}.index"),
        token=as_int(s["token"], f"{where}.token"),
        piece=as_str(s["piece"], f"{where}.piece"),
        pos=as_int(s["pos"], f"{where}.pos"),
        top_ids=[as_int(t, f"{where}.top_ids[{k}]") for k, t in enumerate(as_list(s["top_ids"], f"{where}.top_ids"))],
        top_logits=[as_num(x, f"{where}.top_logits[{k}]", none=True)
                    for k, x in enumerate(as_list(s["top_logits"], f"{where}.top_logits"))],
        margin=as_num(s["margin"], f"{where}.margin", none=True),
        round=as_int(s.get("round", 0), f"{where}.round", none=True),
        from_draft=as_bool(s.get("from_draft", False), f"{where}.from_draft", none=True),
        batch_size=as_int(s.get("batch_size", 1), f"{where}.batch_size", none=True),
        batch_index=as_int(s.get("batch_index", 0), f"{where}.batch_index", none=True),
        serial=as_bool(s.get("serial", False), f"{where}.serial"),
    )
    if step.index != i:
        raise Malformed(f"{where}.index", f"is {step.index}; step {i} must say {i}")
    if step.token != tokens[i]:
        raise Malformed(f"{where}.token", f"is {step.token} but the arm's token {i} is {tokens[i]}")
    return step


def _round(d: Any, n_tokens: int, where: str) -> Round:
    r = as_dict(d, where)
    unknown = sorted(set(r) - _ROUND_KEYS)
    if unknown:
        raise Malformed(where, f"has unknown key(s) {', '.join(map(short, unknown))}")
    for key in ("index", "drafted", "accepted", "batch_size", "first_step"):
        if key not in r:
            raise Malformed(where, f"needs {key!r}")
    rnd = Round(
        index=as_int(r["index"], f"{where}.index"),
        drafted=as_int(r["drafted"], f"{where}.drafted"),
        accepted=as_int(r["accepted"], f"{where}.accepted"),
        draft_ms=as_num(r.get("draft_ms"), f"{where}.draft_ms", none=True),
        verify_ms=as_num(r.get("verify_ms"), f"{where}.verify_ms", none=True),
        batch_size=as_int(r["batch_size"], f"{where}.batch_size"),
        first_step=as_int(r["first_step"], f"{where}.first_step"),
        draft_tokens=[as_int(t, f"{where}.draft_tokens[{k}]")
                      for k, t in enumerate(as_list(r.get("draft_tokens", []), f"{where}.draft_tokens"))],
        serial=as_bool(r.get("serial", False), f"{where}.serial"),
        rollback=as_str(r.get("rollback", ""), f"{where}.rollback"),
        replay=as_int(r.get("replay", 0), f"{where}.replay"),
    )
    if rnd.rollback not in ROUND_ROLLBACKS:
        raise Malformed(f"{where}.rollback", f"is {short(rnd.rollback)}, not one of {', '.join(ROUND_ROLLBACKS[1:])}")
    if rnd.replay < 0:
        raise Malformed(f"{where}.replay", f"is {rnd.replay}; a pass width is never negative")
    if rnd.accepted > rnd.drafted:
        raise Malformed(f"{where}.accepted", f"is {rnd.accepted}, more than the {rnd.drafted} drafted")
    if rnd.first_step > n_tokens:
        raise Malformed(f"{where}.first_step", f"is {rnd.first_step}, past the arm's {n_tokens} tokens")
    return rnd


# -- the free-form blocks' known keys: checked at load, so every reader (reports, compare, the app) gets the
# types it formats -----------------------------------------------------------------------------------------
# (the spec language: :func:`specview.core.jsonfile.check_spec`; keys not named pass unchecked, so newer keys are
# read by newer readers)
_REPLAY = {"token": "int", "logit_a": "num", "logit_b": "num", "gap": "num", "rank_a": "int", "rank_b": "int",
           "shape": "str", "reproduced": "bool", "reproduces_token": "bool", "first_deviation": "int",
           "max_recorded_delta": "num", "rerun_consistent": "bool"}
_KL = {"positions": "int", "non_finite": "int", "kl_mean": "num", "kl_p99": "num", "kl_max": "num",
       "same_top1": "num", "max_logit_delta": "num", "ppl_reference": "num", "ppl_test": "num"}
_GRAPH = {"index": ["int"], "name": ["str"], "op": ["str"], "type": ["str"], "buffer": ["str"], "weight": ["str"],
          "part": ["str"], "max_abs": ["num"], "status": "str", "n_nodes": "int"}
_REPEAT = {"identical": "bool", "first_mismatch": "int", "n_tokens": "int", "seconds": "num"}
DIAGNOSIS_SPEC: dict[str, Any] = {
    "version": "int", "verdict": "str", "rule": "str", "fork": "int", "vanilla_token": "int",
    "speculative_token": "int", "vanilla_piece": "str", "speculative_piece": "str", "gap": "num",
    "explanation": "str", "seconds": "num", "at_risk": ["int"],
    "serial_verify": {"form": "str", "identical_to_vanilla": "bool", "first_mismatch": "int", "n_tokens": "int",
                      "seconds": "num", "description": "str", "passes": "int", "reused_run": "bool",
                      "vanilla_repeat": _REPEAT, "n_drafted": "int", "n_accepted": "int",
                      "vanilla_matches_run": "bool", "speculative_rounds": "int", "vanilla_shape": "str",
                      "skipped": "str", "unproven": "int"},
    "reference": {"kind": "str", "reference_label": "str", "test_label": "str", "target": "str", "ok": "bool",
                  "problems": ["str"], "skipped": "str", "seconds": "num", "continuation": "int", "totals": _KL,
                  "prompts": [{"name": "str", **_KL}], "limits": {"kl_mean": "num", "same_top1": "num"}},
    # "series" is left unchecked: in process it is a number per position, llama-server's diagnosis writes an object
    # per position ({"shift": ...}), and refusing either would refuse a trace `specview run --json` just wrote
    "envelope": {"max": "num", "p95": "num", "median": "num", "at_fork": "num", "positions": "int", "top_k": "int"},
    "thresholds": {"logit_tol": "num", "far_factor": "num", "far_floor": "num", "near_tie": "num", "far": "num",
                   "at_risk": "num"},
    "replays": {"positions": "int", "passes": "int", "seconds": "num", "single": _REPLAY, "speculative": _REPLAY},
    "controls": [{"name": "str", "description": "str", "identical": "bool", "first_mismatch": "int",
                  "n_tokens": "int", "n_drafted": "int", "seconds": "num", "skipped": "str"}],
    "departure": {"skipped": "str", "where": "str", "width": "int", "row": "int", "position": "int",
                  "identical": "bool", "observer_exact": "bool", "selection": "str", "granularity": "str",
                  "node": "str", "op": "str", "part": "str", "max_abs": "num", "weight_type": "str",
                  "weight_buffer": "str", "computed_in": "str", "logits_differ": "int", "n_vocab": "int",
                  "graph": _GRAPH},
}
#: the engine's death (``crash``, :func:`specview.core.worker.death.message` reads it)
CRASH_SPEC: dict[str, Any] = {
    "during": "str", "activity": "str", "hung": "bool", "hung_seconds": "num", "signal": "str", "exitcode": "int",
    "native_function": "str", "assert": "str", "log": "str", "known_cause": {"cause!": "str", "advice!": "str"}}
#: the config's own blocks (``quality``: the suite item the prompt came from); its settings are checked as
#: ``RunConfig.from_dict`` reads them, where a reader asks for that
CONFIG_SPEC: dict[str, Any] = {
    "quality": {"suite": "str", "item": "str", "expected": "str", "vanilla_pass": "bool",
                "speculative_pass": "bool", "vanilla_got": "str", "speculative_got": "str"},
}


def _check_settings(config: dict[str, Any]) -> None:
    """A declared setting's number must be one a float holds: ``RunConfig.from_dict`` (the app's re-run, the
    report's commands) reads it as a number, and 10**400 is none."""
    from dataclasses import fields

    from .config import EngineSettings, RunConfig

    for block, cls, where in ((config, RunConfig, "config"), (config.get("engine"), EngineSettings, "config.engine")):
        if not isinstance(block, dict):
            continue
        for f in fields(cls):
            v = block.get(f.name)
            if isinstance(v, int) and not isinstance(v, bool):
                as_num(v, f"{where}.{f.name}")
