"""Hypothesis strategies for specview traces: valid documents with hostile values, and ways to break them.

* :func:`trace_objects` -- a :class:`~specview.core.trace.Trace` as an engine makes it: arms whose steps,
  rounds and comparison agree, every typed field at its edges (0, the 64-bit maximum, None where an engine
  reports nothing, llama-server's totals without rounds, serial verify), and every free-form field (settings,
  models, environment, prompt, diagnosis, extra top-level keys) holding hostile values: huge, negative, NaN
  and infinite numbers, control characters, right-to-left and zero-width text, lone surrogates, HTML and
  Markdown -- model paths and prompt text included.
* :func:`trace_docs` -- the JSON form of one of those, as ``json.loads`` would give it.
* :func:`wrong_type` -- a document with one field, anywhere, replaced by a value of another JSON type (or an
  out-of-range number, or deleted); :func:`corrupt_bytes` -- a file with bytes flipped, dropped or inserted.

The hostile primitives come from ``strategies`` (shared with the matrix and report tests).
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import strategies as st

from strategies import MARKUP, SPECIAL_CHARS, corrupt_bytes, hostile_floats, huge_ints, json_paths, json_values
from specview.core.trace import ArmResult, Comparison, Round, Step, Trace

__all__ = ["INT_MAX", "corrupt_bytes", "hostile_strings", "json_paths", "trace_docs", "trace_objects", "wrong_type"]

INT_MAX = 2**63 - 1  # the largest id, position or count a trace holds
LONE_SURROGATES = ["a\ud800b", "x\udfffy", "a\udc80b"]  # never a high then a low: JSON reads that as one pair

#: any string, hostile more often than not: markup, Markdown, control/RTL/zero-width characters, lone surrogates
hostile_strings = st.lists(
    st.one_of(st.sampled_from(MARKUP), st.sampled_from(SPECIAL_CHARS), st.sampled_from(LONE_SURROGATES),
              st.text(max_size=5)),
    max_size=4,
).map("".join)
ids = st.one_of(st.integers(0, 60000), st.sampled_from([0, 1, 2**31 - 1, 2**31, INT_MAX]))
counts = st.one_of(st.integers(0, 64), st.sampled_from([INT_MAX]))
timings = st.one_of(st.floats(0, 1e6), st.sampled_from([0.0, 1e300]))
free_values = st.one_of(json_values, hostile_strings, st.sampled_from([math.nan, math.inf, -math.inf, 10**400,
                                                                        -(10**30), -0.0, 5e-324]))
free_dicts = st.dictionaries(hostile_strings, free_values, max_size=4)


@st.composite
def _steps(draw, tokens: list[int], *, n_prompt: int, reported: bool) -> list[Step]:
    out = []
    for i, t in enumerate(tokens):
        k = draw(st.integers(0, 3))
        out.append(Step(
            index=i, token=t, piece=draw(hostile_strings), pos=n_prompt + i,
            top_ids=draw(st.lists(ids, min_size=k, max_size=k)),
            top_logits=draw(st.lists(st.one_of(hostile_floats, st.none()), min_size=k, max_size=k)),
            margin=draw(st.one_of(st.none(), hostile_floats)),
            round=draw(counts) if reported else None,
            from_draft=draw(st.booleans()) if reported else None,
            batch_size=draw(counts) if reported else None,
            batch_index=draw(counts) if reported else None,
            serial=draw(st.booleans()) if reported else False,
        ))
    return out


@st.composite
def _rounds(draw, n_tokens: int) -> list[Round]:
    out = []
    for r in range(draw(st.integers(0, 4))):
        drafted = draw(counts)
        out.append(Round(
            index=r, drafted=drafted, accepted=draw(st.integers(0, drafted)),
            draft_ms=draw(st.one_of(st.none(), timings)), verify_ms=draw(st.one_of(st.none(), timings)),
            batch_size=draw(counts), first_step=draw(st.integers(0, n_tokens)),
            draft_tokens=draw(st.lists(ids, max_size=3)), serial=draw(st.booleans()),
        ))
    return out


@st.composite
def _arm(draw, name: str, tokens: list[int], *, n_prompt: int) -> ArmResult:
    reported = draw(st.booleans())  # False: an engine that reports no per-round data (llama-server)
    steps = draw(_steps(tokens, n_prompt=n_prompt, reported=reported))
    arm = ArmResult(name=name, tokens=list(tokens), text=draw(hostile_strings), steps=steps,
                    prompt_ms=draw(timings), gen_ms=draw(timings), eval_ms=draw(st.one_of(st.none(), timings)),
                    stop_reason=draw(st.one_of(st.sampled_from(["max_tokens", "eos", "cancelled", "context"]),
                                               hostile_strings)))
    if name == "speculative":
        arm.drafter = draw(st.one_of(st.none(), st.sampled_from(["draft-simple", "ngram-simple"]), hostile_strings))
        if reported:
            arm.rounds = draw(_rounds(len(tokens)))
        else:
            drafted = draw(counts)
            arm.reported_drafted, arm.reported_accepted = drafted, draw(st.integers(0, drafted))
    return arm


@st.composite
def trace_objects(draw) -> Trace:
    """A consistent trace (arms, steps, rounds, comparison) with hostile values in every field."""
    n = draw(st.integers(0, 6))
    vt = draw(st.lists(ids, min_size=n, max_size=n))
    how = draw(st.sampled_from(["same", "fork", "shorter", "longer"]))
    if how == "fork" and n:
        i = draw(st.integers(0, n - 1))
        st_tokens = vt[:i] + [(vt[i] + 1) % INT_MAX] + draw(st.lists(ids, max_size=3))
    elif how == "shorter":
        st_tokens = vt[: draw(st.integers(0, n))]
    elif how == "longer":
        st_tokens = vt + draw(st.lists(ids, min_size=1, max_size=2))
    else:
        st_tokens = list(vt)
    n_prompt = draw(st.integers(0, 2**40))
    vanilla = draw(_arm("vanilla", vt, n_prompt=n_prompt))
    speculative = draw(_arm("speculative", st_tokens, n_prompt=n_prompt))
    raw = draw(st.booleans())
    prompt: dict[str, Any] = {"text": None if raw else draw(hostile_strings), "chat": not raw and draw(st.booleans()),
                              "raw_tokens": raw, "tokens": draw(st.lists(ids, min_size=1, max_size=5))}
    if prompt["chat"] and draw(st.booleans()):
        prompt["chat_note"] = draw(hostile_strings)
    prompt.update(draw(st.dictionaries(st.sampled_from(["extra", "note"]), free_values, max_size=1)))

    def model() -> dict[str, Any]:
        m = {"path": draw(hostile_strings), "file": draw(hostile_strings), "quantization": draw(hostile_strings),
             "architecture": draw(hostile_strings), "n_params": draw(free_values), "file_size": draw(huge_ints)}
        m.update(draw(free_dicts))
        return m

    config = {"target": draw(hostile_strings), "draft": draw(st.one_of(st.none(), hostile_strings)),
              "prompt": prompt["text"], "n_max": draw(huge_ints), "p_min": draw(hostile_floats),
              "engine": draw(free_dicts), "threads_used": draw(huge_ints)}
    config.update(draw(free_dicts))
    extra = draw(st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda k: k not in _RESERVED),
                                 free_values, max_size=2))
    return Trace(config=config, environment=draw(free_dicts),
                 models={"target": model(), "draft": None if draw(st.booleans()) else model()},
                 prompt=prompt, vanilla=vanilla, speculative=speculative,
                 comparison=Comparison.of(vanilla, speculative),
                 diagnosis=draw(st.one_of(st.none(), free_dicts)), extra=extra)


_RESERVED = {"schema", "config", "environment", "models", "prompt", "vanilla", "speculative", "comparison",
             "diagnosis"}


def trace_docs() -> st.SearchStrategy[dict[str, Any]]:
    """The JSON form of :func:`trace_objects`, as ``json.loads`` gives it back from a file."""
    return trace_objects().map(lambda t: json.loads(t.dumps()))


_KINDS = {
    "string": st.one_of(hostile_strings, st.sampled_from(["1", "true", "null", ""])),
    "integer": st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([-1, INT_MAX + 1, 10**400])),
    "number": st.one_of(hostile_floats, st.sampled_from([1.5, -0.5])),
    "boolean": st.booleans(),
    "null": st.none(),
    "list": st.lists(st.one_of(st.integers(-3, 3), hostile_strings, st.none()), max_size=3),
    "object": st.dictionaries(st.sampled_from(["a", "index", "token", ""]), st.integers(-3, 3), max_size=2),
}


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    return {float: "number", str: "string", type(None): "null", list: "list", dict: "object"}[type(v)]


@st.composite
def wrong_type(draw, doc: Any) -> tuple[Any, tuple, Any]:
    """``(document, path, value)``: a copy of ``doc`` with the field at ``path`` replaced by ``value`` of another
    JSON kind than it had (or an out-of-range integer where it held an integer; ``value`` is ``...`` when the
    field was deleted)."""
    doc = json.loads(json.dumps(doc))
    paths = json_paths(doc, limit=2000)
    path = draw(st.sampled_from(paths))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    old = parent[path[-1]]
    if isinstance(parent, dict) and draw(st.integers(0, 7)) == 0:
        del parent[path[-1]]
        return doc, path, ...
    kinds = [k for k in _KINDS if k != _kind(old)]
    if _kind(old) == "integer":
        kinds.append("out of range")
    kind = draw(st.sampled_from(kinds))
    value = draw(st.sampled_from([-1, INT_MAX + 1, -(2**70)])) if kind == "out of range" else draw(_KINDS[kind])
    parent[path[-1]] = value
    return doc, path, value
