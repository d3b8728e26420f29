"""Property-based tests of reading and writing traces, and the file that nests 100,000 levels deep.

Properties, over generated traces whose every field holds hostile values:

* a trace specview wrote reads back, and writing what was read gives the same file (the identity);
* a document with one field replaced by a value of another type (or an out-of-range number, or deleted)
  either reads -- and then writes and reads back unchanged, and `specview compare` and `specview run`'s
  summary handle it -- or is refused with :class:`TraceError` naming the file; never another exception;
* a file with a few bytes flipped, dropped or inserted: the same.

Examples are fixed (``derandomize``) and few, so these stay quick and repeatable.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from specview.cli import main as cli
from specview.core.jsonfile import MAX_DEPTH, json_depth, read_json
from specview.core.trace import SCHEMA, Trace, TraceError
from strategies_trace import INT_MAX, corrupt_bytes, trace_docs, trace_objects, wrong_type

FIXED = settings(derandomize=True, max_examples=25, deadline=None, database=None,
                 phases=(Phase.explicit, Phase.generate),  # a failure is reported as found; shrinking is slow
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def read_back(text: str) -> Trace:
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "t.json"
        f.write_bytes(text.encode("utf-8"))
        return Trace.load(f)


def quietly(*argv: str) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return cli(list(argv))


# -- the identity --------------------------------------------------------------------------------------
@FIXED
@given(trace_objects())
def test_writing_then_reading_a_trace_is_the_identity(trace: Trace):
    text = trace.dumps()
    back = read_back(text)
    assert back.dumps() == text
    again = read_back(back.dumps())
    assert again.dumps() == text
    # what is exact in memory stays exact on disk: tokens, pieces, rounds, the comparison, the prompt
    for a, b in ((trace.vanilla, back.vanilla), (trace.speculative, back.speculative)):
        assert b.tokens == a.tokens and [s.piece for s in b.steps] == [s.piece for s in a.steps]
        assert [(s.round, s.from_draft, s.batch_size, s.batch_index, s.serial) for s in b.steps] == [
            (s.round, s.from_draft, s.batch_size, s.batch_index, s.serial) for s in a.steps]
        assert [(r.index, r.drafted, r.accepted, r.batch_size, r.first_step, r.draft_tokens) for r in b.rounds] == [
            (r.index, r.drafted, r.accepted, r.batch_size, r.first_step, r.draft_tokens) for r in a.rounds]
        assert (b.n_drafted, b.n_accepted, b.text, b.stop_reason) == (a.n_drafted, a.n_accepted, a.text, a.stop_reason)
    assert back.comparison == trace.comparison
    assert back.prompt["tokens"] == trace.prompt["tokens"] and back.prompt.get("text") == trace.prompt.get("text")
    assert back.models["target"]["path"] == trace.models["target"]["path"]


@FIXED
@given(trace_docs())
def test_a_valid_document_reads_and_keeps_its_values(doc: dict):
    t = Trace.from_json(doc, source="generated")
    assert json.loads(t.dumps()) == doc


# -- one field of another type ------------------------------------------------------------------------------
@settings(FIXED, max_examples=80)
@given(trace_docs(), st.data())
def test_one_field_of_another_type_reads_or_is_refused_naming_the_file(doc: dict, data):
    bad, path, value = data.draw(wrong_type(doc))
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "one-field.json"
        good = Path(d) / "good.json"
        f.write_text(json.dumps(bad), encoding="utf-8")
        good.write_text(json.dumps(doc), encoding="utf-8")
        try:
            t = Trace.load(f)
        except TraceError as exc:
            assert str(f) in str(exc)
            assert quietly("compare", str(f), str(good)) == 2
            return
        assert read_back(t.dumps()).dumps() == t.dumps()
        from specview.commands.run import summary

        summary(t)
        assert quietly("compare", str(f), str(good)) in (0, 1, 2)


@settings(FIXED, max_examples=40)
@given(trace_docs(), st.data())
def test_a_file_with_corrupted_bytes_reads_or_is_refused(doc: dict, data):
    raw = data.draw(corrupt_bytes(json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8", "surrogatepass")))
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "bytes.json"
        f.write_bytes(raw)
        try:
            t = Trace.load(f)
        except TraceError as exc:
            assert str(f) in str(exc)
            return
        assert read_back(t.dumps()).dumps() == t.dumps()


@pytest.mark.parametrize("where, value, message", [
    (("vanilla", "steps", 0, "token"), "7", "'vanilla.steps[0].token' must be a whole number"),
    (("vanilla", "steps", 0, "token"), -1, "outside 0.."),
    (("vanilla", "steps", 0, "token"), INT_MAX + 1, "outside 0.."),
    (("vanilla", "steps", 0, "top_logits"), {"a": 1}, "must be a list"),
    (("vanilla", "steps", 0, "margin"), "0.5", "must be a number or null"),
    (("vanilla", "steps", 0, "index"), 3, "step 0 must say 0"),
    (("speculative", "rounds", 0, "first_step"), None, "must be a whole number"),
    (("speculative", "rounds", 0, "accepted"), 99, "more than the"),
    (("speculative", "rounds", 0, "drafted"), "<b>x</b>", "must be a whole number"),
    (("comparison", "first_mismatch"), None, "'comparison.first_mismatch' is None but the arms give"),
    (("comparison", "identical"), "yes", "must be true or false"),
    (("models", "target"), "model.gguf", "'models.target' must be an object"),
    (("prompt", "chat_note"), 3, "'prompt.chat_note' must be a string"),
    (("speculative", "prompt_ms"), 10**400, "too large"),
])
def test_the_refusal_names_the_field_and_what_is_wrong(tmp_path, where, value, message):
    doc = forked_doc()
    parent = doc
    for k in where[:-1]:
        parent = parent[k]
    parent[where[-1]] = value
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="malformed specview trace") as ei:
        Trace.load(f)
    assert str(f) in str(ei.value) and message in str(ei.value), str(ei.value)


def forked_doc() -> dict:
    """A small real-shaped trace whose arms fork at token 1."""
    def step(i, tok, piece):
        return {"index": i, "token": tok, "piece": piece, "pos": 5 + i, "top_ids": [tok, 9], "top_logits": [2.0, 1.0],
                "margin": 1.0, "round": i, "from_draft": False, "batch_size": 1, "batch_index": 0}
    return {
        "schema": SCHEMA, "config": {}, "environment": {}, "models": {"target": {"path": "t.gguf"}, "draft": None},
        "prompt": {"text": "hi", "chat": True, "raw_tokens": False, "tokens": [1, 2]},
        "vanilla": {"tokens": [4, 5], "text": "ab", "steps": [step(0, 4, "a"), step(1, 5, "b")], "stop_reason": "eos"},
        "speculative": {"tokens": [4, 6], "text": "ac", "steps": [step(0, 4, "a"), step(1, 6, "c")],
                        "rounds": [{"index": 0, "drafted": 0, "accepted": 0, "draft_ms": 0.0, "verify_ms": 1.0,
                                    "batch_size": 2, "first_step": 0, "draft_tokens": []},
                                   {"index": 1, "drafted": 2, "accepted": 0, "draft_ms": 0.5, "verify_ms": 1.0,
                                    "batch_size": 3, "first_step": 1, "draft_tokens": [5, 7]}],
                        "prompt_ms": 1.0, "stop_reason": "eos", "drafter": "draft-simple"},
        "comparison": {"identical": False, "agree": 1, "n_vanilla": 2, "n_speculative": 2,
                       "first_mismatch": {"index": 1, "char_offset": 1, "vanilla_token": 5, "speculative_token": 6,
                                          "vanilla_piece": "b", "speculative_piece": "c"}},
    }


def test_the_hand_written_trace_reads():
    t = Trace.from_json(forked_doc())
    assert t.comparison.first_mismatch.index == 1 and t.speculative.n_drafted == 2


# -- nesting ----------------------------------------------------------------------------------------------
def test_a_file_nested_100000_levels_deep_is_a_trace_error_naming_it(tmp_path):
    for name, text in (("lists.json", "[" * 100_000 + "]" * 100_000),
                       ("objects.json", '{"a":' * 100_000 + "1" + "}" * 100_000)):
        f = tmp_path / name
        f.write_text(text)
        with pytest.raises(TraceError, match="nested more than") as ei:
            Trace.load(f)
        assert str(f) in str(ei.value)


def test_report_and_compare_refuse_a_deep_file_with_exit_2_and_no_traceback(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(forked_doc()))
    for argv in (["compare", str(deep), str(good)], ["compare", str(good), str(deep)],
                 ["report", str(deep), "-o", str(tmp_path / "out")]):
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert str(deep) in err and "Traceback" not in err and "RecursionError" not in err


def test_depth_is_counted_without_recursion_and_the_limit_is_exact(tmp_path):
    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [1, {"b": []}]}) == 4
    nested: object = 1
    for _ in range(100_000):
        nested = [nested]
    assert json_depth(nested, limit=MAX_DEPTH) == MAX_DEPTH + 1  # stops just past the limit
    doc = forked_doc()
    inner: object = 1
    for _ in range(MAX_DEPTH - 1):  # the trace's object plus this: exactly MAX_DEPTH levels
        inner = {"k": inner}
    doc["config"] = inner
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(doc))
    assert Trace.load(ok).config == inner
    doc["config"] = {"k": inner}
    over = tmp_path / "over.json"
    over.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=f"nested more than {MAX_DEPTH}"):
        Trace.load(over)
    with pytest.raises(TraceError, match="nested more than 2"):
        read_json(ok, TraceError, max_depth=2)


def test_lone_surrogates_are_written_as_escapes_and_read_back(tmp_path):
    doc = forked_doc()
    doc["prompt"]["text"] = "a\ud800b"
    doc["models"]["target"]["path"] = "\udfff.gguf"
    t = Trace.from_json(doc)
    p = t.save(tmp_path / "s.json")
    assert "\\ud800" in p.read_text(encoding="utf-8")
    back = Trace.load(p)
    assert back.prompt["text"] == "a\ud800b" and back.models["target"]["path"] == "\udfff.gguf"


def test_numbers_python_cannot_print_or_hold_are_refused_with_their_size(tmp_path):
    doc = forked_doc()
    doc["vanilla"]["steps"][0]["token"] = 10**5000  # a document built in memory: repr() of it raises
    with pytest.raises(TraceError, match="an integer of about 5000 digits"):
        Trace.from_json(doc)
    f = tmp_path / "long.json"
    f.write_text(json.dumps(forked_doc()).replace('"tokens": [1, 2]', '"tokens": [1' + "0" * 5000 + "]"))
    with pytest.raises(TraceError, match="not valid JSON") as ei:  # json.loads itself refuses it
        Trace.load(f)
    assert str(f) in str(ei.value)
