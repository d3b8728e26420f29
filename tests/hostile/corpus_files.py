"""The properties of the hostile-input corpus, one per kind of file specview reads, run by ``test_corpus.py`` in
a bounded child (``bounded.py``): each input's read, and whatever is made of what was read (a report, a
comparison, the words of a result), must end normally or in specview's own error naming the file, within
its deadline and the child's memory.

Every property is deterministic (``derandomize``) and small: a few dozen inputs of a few kilobytes each, so
the corpus costs seconds and says the same on every run.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bounded import deadline
from strategies import corrupt_bytes, corrupt_field, json_values, matrix_docs
from strategies_trace import trace_docs, wrong_type

from specview.core.errors import SpecviewError

#: no shrinking: a failing input is reported as drawn (shrinking one that nears its deadline takes minutes)
CORPUS = settings(derandomize=True, max_examples=30, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
REAL_TRACE = Path(__file__).parent / "data" / "real-trace.json"


def _tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="specview-hostile-"))


SEEN: Counter[str] = Counter()


def refused_or_read(read: Callable[[], Any], path: Path, *, what: str) -> Any:
    """``read()`` within its deadline: its value, or None when it raised specview's own error, one line that
    names ``path``.  Anything else (a traceback, a hang, a MemoryError) fails the property."""
    try:
        with deadline(what=what):
            got = read()
    except SpecviewError as exc:
        msg = str(exc)
        assert str(path) in msg or path.name in msg, f"the error does not name the file: {msg}"
        assert len(msg) < 4000, f"the error is {len(msg)} characters long"
        SEEN[f"{what} refused"] += 1
        return None
    SEEN[f"{what} read"] += 1
    return got


def both_seen(what: str) -> None:
    """The inputs were neither all refused nor all read: the property met valid and invalid files alike."""
    assert SEEN[f"{what} read"] and SEEN[f"{what} refused"], dict(SEEN)


def _write(data: Any) -> Path:
    p = _tmp() / "input.json"
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(json.dumps(data, allow_nan=True), encoding="utf-8")  # ASCII: a lone surrogate as an escape
    return p


def _report(obj: Any, path: Path) -> None:
    """A report of what was read, without plots (the app's widgets draw those, from the same checked values)."""
    from specview.core.report.write import write_report

    refused_or_read(lambda: write_report(obj, path.parent / "report"), path, what="the report")


# -- traces --------------------------------------------------------------------------------------------------
def _real_diagnosis() -> dict[str, Any]:
    return json.loads(REAL_TRACE.read_text(encoding="utf-8"))["diagnosis"]


@st.composite
def hostile_trace_files(draw) -> bytes | dict[str, Any]:
    """A trace document whose diagnosis has the real one's shape, then one field of another type anywhere, or a
    few bytes flipped, dropped or inserted."""
    doc = draw(trace_docs())
    doc["diagnosis"] = draw(st.one_of(st.just(_real_diagnosis()), corrupt_field(_real_diagnosis())))
    how = draw(st.sampled_from(["field", "bytes", "as is"]))
    if how == "field":
        return draw(wrong_type(doc))[0]
    if how == "bytes":
        return draw(corrupt_bytes(json.dumps(doc, ensure_ascii=True).encode()))
    return doc


def traces() -> None:
    from specview.commands.compare import compare_traces, format_comparison
    from specview.core.trace import Trace

    good = Trace.load(REAL_TRACE)

    @CORPUS
    @given(hostile_trace_files())
    def prop(data):
        p = _write(data)
        t = refused_or_read(lambda: Trace.load(p), p, what="Trace.load")
        if t is None:
            return
        _report(t, p)

        def both():
            res = compare_traces(good, t, names=("good", str(p)))
            return format_comparison(res, good, t, ("good", str(p)))

        refused_or_read(both, p, what="compare")

    prop()
    both_seen("Trace.load")


# -- suites ----------------------------------------------------------------------------------------------------
#: a suite item as a user writes one: a prompt, and an answer (text or a number, maybe a match) or a test
good_items = st.fixed_dictionaries({"prompt": st.text(min_size=1, max_size=8).filter(str.strip)}, optional={
    "id": st.text(max_size=5), "match": st.sampled_from(["exact", "number", "regex"])}).flatmap(
    lambda d: st.one_of(st.fixed_dictionaries({**{k: st.just(v) for k, v in d.items()},
                                               "answer": st.one_of(st.integers(0, 999), st.text(max_size=6))}),
                        st.fixed_dictionaries({"prompt": st.just(d["prompt"]), "test": st.text(max_size=8),
                                               "entry_point": st.sampled_from(["f", "g"])})))
#: a line that is anything at all, or one of the lines that used to end in a traceback
bad_lines = st.one_of(
    json_values.map(lambda v: json.dumps(v, allow_nan=True)),
    st.fixed_dictionaries({"prompt": st.text(max_size=8)}, optional={
        "answer": json_values, "match": json_values, "id": json_values, "test": json_values,
        "entry_point": json_values}).map(lambda d: json.dumps(d, allow_nan=True)),
    st.sampled_from(["[" * 50_000 + "]" * 50_000, '{"prompt": "x", "answer": ' + "9" * 6000 + "}",
                     '{"prompt": "x", "answer": "(" , "match": "regex"}', "", "\x00", '{"prompt": NaN}']))


@st.composite
def suite_lines(draw) -> list[str]:
    lines = [json.dumps(d) for d in draw(st.lists(good_items, min_size=1, max_size=4))]
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), draw(bad_lines))
    return lines


def suites() -> None:
    from specview.core.quality import load_suite

    @CORPUS
    @given(suite_lines(), st.sampled_from(["plain", "bytes", "gzip"]), st.data())
    def prop(lines, how, data):
        raw = "\n".join(lines).encode("utf-8", "surrogatepass")
        if how == "bytes":
            raw = data.draw(corrupt_bytes(raw))
        p = _tmp() / ("suite.jsonl.gz" if how == "gzip" else "suite.jsonl")
        p.write_bytes(gzip.compress(raw) if how == "gzip" else raw)
        suite = refused_or_read(lambda: load_suite(str(p)), p, what="load_suite")
        if suite is not None:
            assert suite.items and all(isinstance(it.prompt, str) for it in suite.items)

    prop()
    both_seen("load_suite")


# -- quality results --------------------------------------------------------------------------------------------
def _quality_doc() -> dict[str, Any]:
    from specview.core.quality import ItemOutcome, QualityResult, Score, load_suite

    suite = load_suite("mixed", 4)
    p, f = Score(True, "1", "ok"), Score(False, "<b>2</b>", "no | **x**")
    items = [ItemOutcome(suite.items[0].id, p, p, identical=True),
             ItemOutcome(suite.items[1].id, p, f, identical=False, fork_index=3, fork_context="a[['<x>' | '`']]",
                         verdict="near-tie", gap=0.02, trace_path="traces/002.json"),
             ItemOutcome(suite.items[2].id, f, f, identical=False, fork_index=0, diagnosis_error="boom"),
             ItemOutcome(suite.items[3].id, f, f, identical=False, error="not run: <script>")]
    res = QualityResult(suite=suite, config={"target": "t", "n_max": 3}, items=items, status="complete").refresh()
    return json.loads(json.dumps(res.to_dict()))


def quality_results() -> None:
    from specview.core.quality import QualityResult
    from specview.core.quality.text import format_result

    base = _quality_doc()

    @CORPUS
    @given(st.one_of(corrupt_field(base), st.just(base)), st.booleans(), st.data())
    def prop(doc, as_bytes, data):
        p = _write(data.draw(corrupt_bytes(json.dumps(doc).encode())) if as_bytes else doc)
        res = refused_or_read(lambda: QualityResult.load(p), p, what="QualityResult.load")
        if res is None:
            return
        with deadline(what="format_result"):
            format_result(res)
        _report(p, p)

    prop()
    both_seen("QualityResult.load")


# -- matrices ----------------------------------------------------------------------------------------------------
def matrices() -> None:
    from specview.core.report.write import read_input

    @CORPUS
    @given(matrix_docs(), st.sampled_from(["field", "bytes", "as is"]), st.data())
    def prop(doc, how, data):
        if how == "field":
            doc = data.draw(corrupt_field(doc))
        p = _write(data.draw(corrupt_bytes(json.dumps(doc, allow_nan=True).encode())) if how == "bytes" else doc)
        got = refused_or_read(lambda: read_input(p), p, what="read_input")
        if got is not None:
            _report(p, p)

    prop()
    both_seen("read_input")


# -- GGUF headers and model stores (through the public functions of specview.core.models) ---------------------
def _tiny_header() -> bytes:
    from stores import header_gguf  # tests/models/stores.py: a model's header with small zero tensors

    p = header_gguf(_tmp() / "base.gguf", "llama", meta={"llama.context_length": 2048, "llama.block_count": 2})
    return p.read_bytes()


@st.composite
def hostile_ggufs(draw, base: bytes) -> bytes:
    """A GGUF header with bytes flipped, dropped or inserted, cut short anywhere, or a count field (version,
    tensors, keys, or a length inside the metadata) set to any 64-bit value."""
    import struct

    how = draw(st.sampled_from(["bytes", "cut", "count", "length"]))
    if how == "bytes":
        return draw(corrupt_bytes(base))
    if how == "cut":
        return base[:draw(st.integers(0, len(base)))]
    b = bytearray(base)
    value = draw(st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**24 - 1, 2**31, 2**63, 2**64 - 1])))
    at = draw(st.sampled_from([8, 16])) if how == "count" else draw(st.integers(24, max(24, len(b) - 8)))
    b[at:at + 8] = struct.pack("<Q", value)
    return bytes(b)


def gguf_headers() -> None:
    from specview.core import models as M

    base = _tiny_header()

    @CORPUS
    @given(hostile_ggufs(base))
    def prop(data):
        p = _tmp() / "model.gguf"
        p.write_bytes(data)
        info = refused_or_read(lambda: M.read_header(p), p, what="read_header")
        if info is not None:
            assert info.path and info.name

    prop()
    both_seen("read_header")


#: what a store keeps beside its models, as each tool writes it, by the store's own relative path
def _store_files(blob_digest: str) -> dict[str, Any]:
    manifest = {"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{blob_digest}", "size": 10}]}
    return {
        ".ollama/models/manifests/registry.ollama.ai/library/tiny/8b": manifest,
        ".cache/huggingface/hub/models--org--repo/refs/main": "0123456789abcdef0123456789abcdef01234567",
        ".lmstudio/settings.json": {"downloadsFolder": "~/.lmstudio/models"},
        ".cache/huggingface/hub/models--org--mlx/snapshots/r1/config.json": {"model_type": "llama",
                                                                               "hidden_size": 64},
        ".config/specview/models.json": {"folders": []},
        ".cache/specview/models/headers.json": {"schema": "specview.headers/1", "entries": {}},
    }


@st.composite
def hostile_stores(draw) -> dict[str, bytes]:
    """Each store file as its tool writes it, then one of them with a field of another kind, its bytes
    corrupted, or any JSON at all in its place."""
    files = _store_files("ab" * 32)
    target = draw(st.sampled_from(sorted(files)))
    out = {}
    for rel, doc in files.items():
        raw = doc.encode() if isinstance(doc, str) else json.dumps(doc).encode()
        if rel == target:
            how = draw(st.sampled_from(["field", "bytes", "anything"]))
            if how == "field" and not isinstance(doc, str):
                raw = json.dumps(draw(corrupt_field(doc)), allow_nan=True).encode()
            elif how == "anything":
                raw = json.dumps(draw(json_values), allow_nan=True).encode()
            else:
                raw = draw(corrupt_bytes(raw))
        out[rel] = raw
    return out


def store_manifests() -> None:
    from specview.core import models as M

    base = _tiny_header()

    @CORPUS
    @given(hostile_stores())
    def prop(files):
        home = _tmp()
        for rel, raw in files.items():
            (home / rel).parent.mkdir(parents=True, exist_ok=True)
            (home / rel).write_bytes(raw)
        blobs = home / ".ollama" / "models" / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        (blobs / f"sha256-{'ab' * 32}").write_bytes(base)
        env = {"HOME": str(home), "SPECVIEW_CACHE": str(home / ".cache" / "specview"),
               "SPECVIEW_CONFIG_DIR": str(home / ".config" / "specview")}
        with deadline(what="scan"):
            found = M.scan(home=home, env=env)
        assert all("\n" not in p.why for p in found.problems), [p.why for p in found.problems]
        SEEN["scan read"] += 1
        SEEN["scan refused"] += bool(found.problems)

    prop()
    both_seen("scan")


def store_fifos() -> None:
    """A FIFO in place of each file a store keeps, and of a model: the scan finishes, naming each as a problem."""
    import os

    from specview.core import models as M

    for rel in [*_store_files("cd" * 32), ".lmstudio/models/pub/repo/x.gguf"]:
        home = _tmp()
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(home / rel)
        env = {"HOME": str(home), "SPECVIEW_CACHE": str(home / ".cache" / "specview"),
               "SPECVIEW_CONFIG_DIR": str(home / ".config" / "specview")}
        with deadline(what=f"scan with a FIFO at {rel}"):
            found = M.scan(home=home, env=env)
        assert not [m.path for m in found.models if m.path.startswith(str(home))]  # the demo's shipped files count
        if rel.endswith(".gguf"):
            assert any(p.path.endswith("x.gguf") for p in found.problems), found.problems


# -- matrix specs (TOML) ---------------------------------------------------------------------------------------
def matrix_specs() -> None:
    from strategies import toml_specs

    from specview.core.matrix.spec import load_spec

    @CORPUS
    @given(toml_specs(), st.booleans(), st.data())
    def prop(text, as_bytes, data):
        p = _tmp() / "matrix.toml"
        raw = text.encode("utf-8")
        p.write_bytes(data.draw(corrupt_bytes(raw)) if as_bytes else raw)
        refused_or_read(lambda: load_spec(p), p, what="load_spec")

    prop()
    both_seen("load_spec")
