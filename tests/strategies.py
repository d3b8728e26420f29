"""Hypothesis strategies for the files specview reads: traces, matrix documents, TOML matrix specs, prompt files.

Each file is generated as a *valid* document whose values are hostile -- huge and negative numbers, NaN and
infinity, control characters, right-to-left and zero-width text, HTML and Markdown in every string field,
model paths and prompt texts included -- and can then be corrupted: one field at a time replaced by a value
of another type (:func:`corrupt_field`), or its bytes flipped, dropped or inserted (:func:`corrupt_bytes`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import strategies as st

from specview.core.arms.compare import compare_arms
from specview.core.trace import ArmResult, Round, Step, Trace

# -- hostile values --------------------------------------------------------------------------
MARKUP = [
    "<script>alert(1)</script>", "<img src=x onerror=alert(2)>", "</td></tr></table>", "<b>bold</b>", "<!--",
    "&amp;", "&lt;", "'", '"', "`", "```", "````js", "~~~", "|", "| a | b |", "**bold**", "_em_", "*em*",
    "[link](javascript:alert(3))", "![img](http://x/y.png)", "<http://example.com>", "# heading", "- item",
    "> quote", "1. item", "===", "---", "\\", "<details>", "</summary>", "<sub>", "{{x}}", "${x}", "$(whoami)",
]
SPECIAL_CHARS = ["\n", "\r", "\t", "\x00", "\x07", "\x1b[31m", "\u202e", "\u202d", "\u2066", "\u200b", "\u200d",
                 "\ufeff", "\u2028", "\u0301", "\U0001f600", "\ud7ff", "\uffff", " ", "  "]

hostile_text = st.lists(st.one_of(st.sampled_from(MARKUP + SPECIAL_CHARS), st.text(max_size=4)), max_size=4).map("".join)

#: a string that always holds markup, for checking that it never comes out as markup
markup_text = st.tuples(st.sampled_from(MARKUP), hostile_text).map("".join)

huge_ints = st.one_of(st.integers(-2 ** 70, 2 ** 70), st.sampled_from([0, -1, 2 ** 63, -2 ** 63, 10 ** 30]))
hostile_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                           st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324]))
hostile_numbers = st.one_of(huge_ints, hostile_floats)
scalars = st.one_of(st.none(), st.booleans(), hostile_numbers, hostile_text)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(hostile_text, inner, max_size=3)),
                           max_leaves=5)


# -- traces --------------------------------------------------------------------------------
@st.composite
def arms(draw, n_prompt: int = 4) -> tuple[ArmResult, ArmResult]:
    n = draw(st.integers(1, 8))
    vt = draw(st.lists(st.integers(0, 2 ** 31), min_size=n, max_size=n))
    fork = draw(st.one_of(st.none(), st.integers(0, n - 1)))
    stail = draw(st.lists(st.integers(0, 2 ** 31), min_size=0, max_size=n))
    spt = vt if fork is None else vt[:fork] + [vt[fork] + 1] + stail[: max(0, n - fork - 1)]
    pieces = draw(st.lists(hostile_text, min_size=len(vt) + len(spt), max_size=len(vt) + len(spt)))
    margin = st.one_of(st.none(), hostile_floats)

    def steps(tokens: list[int], off: int, spec: bool) -> list[Step]:
        out = []
        for i, t in enumerate(tokens):
            out.append(Step(index=i, token=t, piece=pieces[off + i], pos=n_prompt + i, top_ids=[t, t + 1],
                            top_logits=[draw(hostile_floats), draw(hostile_floats)], margin=draw(margin),
                            round=(i if spec else 0), from_draft=spec and i % 2 == 1, batch_size=2 if spec else 1,
                            batch_index=i % 2 if spec else 0))
        return out

    vs, ss = steps(vt, 0, False), steps(spt, len(vt), True)
    ms = st.floats(0, 1e6, allow_nan=False)
    v = ArmResult("vanilla", vt, "".join(s.piece for s in vs), vs, [], draw(ms), draw(ms), draw(ms),
                  draw(st.sampled_from(["max_tokens", "eos", "context"])))
    rounds = [Round(index=r, drafted=draw(st.integers(0, 8)), accepted=0, draft_ms=draw(ms), verify_ms=draw(ms),
                    batch_size=2, first_step=r, draft_tokens=[1, 2]) for r in range(len(spt))]
    s = ArmResult("speculative", spt, "".join(x.piece for x in ss), ss, rounds, draw(ms), draw(ms), draw(ms),
                  draw(st.sampled_from(["max_tokens", "eos", "after-fork"])), draw(hostile_text))
    return v, s


@st.composite
def traces(draw) -> Trace:
    v, s = draw(arms())
    text = hostile_text
    cfg = {"target": draw(markup_text), "draft": draw(markup_text), "spec_type": "draft-simple",
           "n_max": draw(st.integers(0, 64)), "n_min": 0, "p_min": draw(st.floats(0, 1)), "max_tokens": 16,
           "prompt": draw(markup_text), "chat": draw(st.booleans()), "ignore_eos": False, "top_k": 8,
           "backend": "llama.cpp", "n_ctx_used": draw(huge_ints), "threads_used": draw(huge_ints),
           "engine": {"n_ctx": 0, "n_batch": 512, "n_ubatch": 512, "flash_attn": "auto", "gpu_layers": -1,
                      "threads": 0, "kv_type": "f16", "server_bin": draw(text), "server_args": draw(text)}}
    if draw(st.booleans()):  # or settings of any shape
        cfg.update(draw(st.dictionaries(st.sampled_from(["n_max", "p_min", "spec_type", "engine", "extra"]),
                                        json_values, max_size=2)))
    model = st.fixed_dictionaries({"path": markup_text, "file": markup_text, "quantization": text,
                                   "architecture": text, "name": text, "description": markup_text,
                                   "n_params": hostile_numbers, "file_size": hostile_numbers,
                                   "vocab_fingerprint": text})
    env = draw(st.dictionaries(hostile_text, json_values, max_size=3))
    env.update({"cpu": draw(markup_text), "specview": draw(text), "created": draw(text)})
    diag = draw(st.one_of(st.none(), st.fixed_dictionaries({
        "verdict": st.one_of(st.sampled_from(["near-tie", "state", "nondeterministic"]), text),
        "rule": text, "gap": st.one_of(st.none(), hostile_numbers), "explanation": markup_text,
        "envelope": st.one_of(st.none(), st.fixed_dictionaries({"max": hostile_numbers, "p95": hostile_numbers,
                                                                "median": hostile_numbers, "positions": huge_ints,
                                                                "series": st.lists(hostile_floats, max_size=4)})),
        "thresholds": st.fixed_dictionaries({"near_tie": hostile_numbers, "far": hostile_numbers,
                                             "at_risk": hostile_numbers}),
        "at_risk": st.lists(st.integers(0, 20), max_size=3),
        "replays": st.fixed_dictionaries({"speculative": st.fixed_dictionaries({"gap": hostile_numbers,
                                                                                "shape": markup_text})}),
    })))
    raw = draw(st.booleans())
    prompt = {"text": None if raw else draw(markup_text), "chat": not raw, "raw_tokens": raw,
              "tokens": draw(st.lists(st.integers(0, 2 ** 31), min_size=1, max_size=6))}
    return Trace(config=cfg, environment=env, models={"target": draw(model), "draft": draw(model)}, prompt=prompt,
                 vanilla=v, speculative=s, comparison=compare_arms(v, s), diagnosis=diag)


# -- matrix documents ------------------------------------------------------------------------
@st.composite
def matrix_docs(draw) -> dict[str, Any]:
    """A matrix document as ``specview matrix`` writes it, with hostile strings and numbers in its fields."""
    from specview.core.matrix import MatrixSpec, PromptSpec, expand
    from specview.core.matrix.run import SCHEMA

    names = draw(st.lists(markup_text, min_size=1, max_size=2, unique=True))
    prompts = []
    for name in names:
        if draw(st.booleans()):
            prompts.append(PromptSpec(name, text=draw(markup_text), chat=draw(st.booleans()),
                                      category=draw(st.one_of(st.none(), markup_text))))
        else:
            prompts.append(PromptSpec(name, tokens=tuple(draw(st.lists(st.integers(0, 2 ** 40), min_size=1,
                                                                        max_size=4))), chat=False))
    spec = MatrixSpec(targets=draw(st.lists(markup_text, min_size=1, max_size=2, unique=True)),
                      drafters=draw(st.lists(st.one_of(st.sampled_from(["none", "ngram-simple"]),
                                                       markup_text), min_size=1, max_size=2,
                                             unique=True)),
                      n_max=draw(st.lists(st.integers(0, 2 ** 40), min_size=1, max_size=2, unique=True)),
                      p_min=draw(st.lists(st.floats(0, 1), min_size=1, max_size=2, unique=True)),
                      flash_attn=draw(st.lists(st.sampled_from(["auto", "on", "off"]), min_size=1, max_size=2,
                                               unique=True)),
                      prompts=prompts, max_tokens=draw(st.integers(1, 2 ** 40)),
                      stop_after_fork=draw(st.one_of(st.none(), st.integers(0, 2 ** 40))))
    cells = expand(spec)[:6]
    num = st.one_of(st.none(), hostile_floats, st.integers(-2 ** 62, 2 ** 62))  # what a matrix file may hold
    huge_ints = st.integers(-2 ** 62, 2 ** 62)
    records = []
    for i, p in enumerate(cells):
        if draw(st.integers(0, 9)) == 0:
            records.append({"index": i, "params": p.to_json(), "status": "error", "error": draw(markup_text),
                            "identical": None, "first_mismatch": None, "verdict": "error", "trace": None})
            continue
        fork = draw(st.one_of(st.none(), st.integers(0, 2 ** 40)))
        records.append({
            "index": i, "params": p.to_json(), "status": "ok", "identical": fork is None, "first_mismatch": fork,
            "fork": None if fork is None else {"vanilla_token": draw(huge_ints), "speculative_token": draw(huge_ints),
                                               "vanilla_piece": draw(markup_text),
                                               "speculative_piece": draw(st.one_of(st.none(), markup_text)),
                                               "vanilla_margin": draw(num)},
            "verdict": "identical" if fork is None else draw(st.one_of(
                st.sampled_from(["near-tie", "state", "nondeterministic", "diverged"]), markup_text)),
            "gap": draw(num), "near_tie_threshold": draw(num), "explanation": draw(hostile_text),
            "acceptance_rate": draw(num), "speedup": draw(num), "category": draw(st.one_of(st.none(), markup_text)),
            "trace": draw(st.one_of(st.none(), hostile_text)), "seconds": draw(num), "n_drafted": draw(huge_ints),
        })
    return json.loads(json.dumps({
        "schema": SCHEMA, "status": draw(markup_text), "specview": draw(markup_text), "created": draw(markup_text),
        "elapsed_s": draw(num), "n_cells": len(cells), "spec": spec.to_json(),
        "environment": draw(st.dictionaries(hostile_text, json_values, max_size=3)),
        "counters": {"loads": draw(huge_ints)}, "cells": records,
    }, allow_nan=True))


# -- TOML matrix specs -----------------------------------------------------------------------
def toml_value(v: Any) -> str:
    """A TOML literal for a Python value (strings escaped as TOML basic strings)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, str):
        out = []
        for ch in v:
            o = ord(ch)
            if ch in '"\\':
                out.append("\\" + ch)
            elif o < 0x20 or o == 0x7F or 0xD800 <= o <= 0xDFFF:
                out.append(f"\\u{o:04x}" if o < 0xD800 else "\\ufffd")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_value(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


toml_scalars = st.one_of(st.booleans(), st.integers(-2 ** 63, 2 ** 63 - 1), hostile_floats,
                         hostile_text.map(lambda s: s.replace("\ud7ff", "")))


@st.composite
def toml_specs(draw) -> str:
    """A matrix TOML file with hostile values in its string fields and extreme numbers in range; half of them
    with one key's value replaced by something of another type or out of range."""
    big = st.integers(0, 2 ** 62)
    prompt = st.one_of(markup_text, st.fixed_dictionaries({"name": markup_text, "text": markup_text,
                                                           "category": markup_text}),
                       st.fixed_dictionaries({"name": markup_text, "tokens": st.lists(big, min_size=1, max_size=3)}))
    values: dict[str, Any] = {
        "targets": draw(st.lists(markup_text.filter(bool), min_size=1, max_size=2)),
        "drafters": draw(st.lists(st.one_of(st.just("none"), markup_text.filter(bool)), min_size=1, max_size=2)),
        "n_max": draw(st.lists(big, min_size=1, max_size=2)),
        "p_min": draw(st.lists(st.floats(0, 1), min_size=1, max_size=2)),
        "flash_attn": draw(st.lists(st.sampled_from(["on", "off", "auto", True, False]), min_size=1, max_size=2)),
        "max_tokens": draw(st.integers(1, 2 ** 62)),
        "stop_after_fork": draw(big),
        "chat": draw(st.booleans()),
        "top_k": draw(st.integers(2, 64)),
        "builtin_prompts": False,
        "prompts": draw(st.lists(prompt, min_size=1, max_size=3, unique_by=lambda p: p if isinstance(p, str)
                                 else p["name"])),
    }
    engine = {"server_bin": draw(markup_text), "server_args": draw(markup_text),
              "kv_type": draw(st.sampled_from(["f16", "q8_0"])), "n_batch": draw(st.integers(1, 2 ** 62))}
    if draw(st.booleans()):  # one value of another type, or out of its declared range
        wrong = st.one_of(toml_scalars, st.lists(toml_scalars, max_size=2), st.integers(-2 ** 63, -1))
        key = draw(st.sampled_from([*values, *(f"engine.{k}" for k in engine), "colour", "n_min", "serial_verify"]))
        if key.startswith("engine."):
            engine[key[7:]] = draw(wrong)
        else:
            values[key] = draw(wrong)
    lines = [f"{k} = {toml_value(v)}" for k, v in values.items()]
    lines.append("[engine]")
    lines += [f"{k} = {toml_value(v)}" for k, v in engine.items()]
    return "\n".join(lines) + "\n"


# -- corruption ------------------------------------------------------------------------------
def json_paths(doc: Any, limit: int = 400) -> list[tuple]:
    """Every path (keys and indices) into a JSON document, breadth first, at most ``limit``."""
    out: list[tuple] = []
    queue: list[tuple[tuple, Any]] = [((), doc)]
    while queue and len(out) < limit:
        path, v = queue.pop(0)
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, x in items:
            out.append((*path, k))
            queue.append(((*path, k), x))
    return out


@st.composite
def corrupt_field(draw, doc: Any) -> Any:
    """``doc`` with one field, anywhere, replaced by a value of another kind (or deleted)."""
    doc = json.loads(json.dumps(doc))
    paths = json_paths(doc)
    if not paths:
        return doc
    path = draw(st.sampled_from(paths))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if isinstance(parent, dict) and draw(st.integers(0, 5)) == 0:
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    return doc


@st.composite
def corrupt_bytes(draw, data: bytes) -> bytes:
    """``data`` with a few bytes flipped, dropped or inserted."""
    b = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not b:
            break
        i = draw(st.integers(0, len(b) - 1))
        op = draw(st.sampled_from(["flip", "drop", "insert"]))
        if op == "flip":
            b[i] ^= draw(st.integers(1, 255))
        elif op == "drop":
            del b[i]
        else:
            b.insert(i, draw(st.integers(0, 255)))
    return bytes(b)
