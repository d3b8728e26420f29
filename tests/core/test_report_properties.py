"""Property-based tests for the files specview reads and the reports it writes from them.

Generated traces, matrix documents, TOML matrix specs and prompt files hold hostile values in every field
(markup, Markdown, control, right-to-left and zero-width characters; huge, negative, NaN and infinite numbers),
and are also corrupted one field or a few bytes at a time.  The properties:

* reading a file either succeeds or raises specview's own error (:class:`SpecviewError`), never anything else;
* a report made from whatever was read (HTML and Markdown) never contains markup that came from a field: the
  HTML parses to specview's own tags only, and the Markdown, rendered by a CommonMark parser with raw HTML
  allowed, yields only the elements specview writes, as many as it writes.  That includes a kernel map's own
  report, a trace report's "Kernel map" section and a matrix's citation of a map.

The examples are fixed (``derandomize``) and few, so the suite stays quick and repeatable.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from strategies import (corrupt_bytes, corrupt_field, hostile_floats, hostile_text, json_values, markup_text,
                        matrix_docs, toml_specs, traces)
from test_report import Collect, check_html, check_markdown

import markdown_it
from specview.core.errors import SpecviewError
from specview.core.matrix import (MatrixRun, MatrixSpec, expand, format_rates, grid, load_spec, rates, summarize,
                                  validate_matrix)
from specview.core.matrix.cells import cell_config
from specview.core.prompts import prompt_from_file, read_toml, suite_from_dict
from specview.core.kernels.evidence import STATUSES, kernel_map_from_json
from specview.core.report import (kernels_html, kernels_markdown, matrix_html, matrix_markdown, trace_html,
                                  trace_kernel_section, trace_markdown)
from specview.core.report.write import read_input
from specview.core.trace import Trace


FIXED = settings(derandomize=True, max_examples=20, deadline=None, database=None,
                 phases=(Phase.explicit, Phase.generate),  # a failure is reported as found: shrinking these takes minutes
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16  # the HTML writer embeds bytes as given; the checks parse tags only
PLOT_FILES = {"margins": "report-margins.png", "acceptance": "report-acceptance.png"}
MD_TAGS = {"h2", "h3", "h4", "p", "ul", "li", "table", "thead", "tbody", "tr", "th", "td", "code", "pre", "strong",
           "details", "summary", "sub", "img", "br"}


def rendered_markdown(md: str, *, strong: int, imgs: set[str]) -> None:
    """Render with CommonMark (+ tables, raw HTML on) and check that only specview's own elements come out."""
    check_markdown(md)
    page = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    c = Collect()
    c.feed(page)
    c.close()
    assert set(c.tags) <= MD_TAGS, set(c.tags) - MD_TAGS
    assert not [a for a in c.attrs if a[1].startswith("on")]
    assert c.tags.count("strong") == strong
    assert {i.get("src") for i in c.imgs} <= imgs
    for tag, k, v in c.attrs:
        if k in ("src", "href"):
            assert tag == "img" and v in imgs, (tag, k, v)


def _bold_cells(doc: dict) -> int:
    g = grid(doc)
    return sum(1 for cell in g.at.values() if cell.get("status") == "ok" and not cell.get("identical"))


def check_trace_reports(trace: Trace) -> None:
    check_html(trace_html(trace, {"margins": PNG, "acceptance": PNG}))
    rendered_markdown(trace_markdown(trace, PLOT_FILES), strong=1, imgs=set(PLOT_FILES.values()))


def check_matrix(doc: dict) -> None:
    """Everything a reader does with a matrix document that passed validation."""
    summarize(doc)
    format_rates(rates(doc))
    check_html(matrix_html(doc), bold=0)
    rendered_markdown(matrix_markdown(doc), strong=_bold_cells(doc), imgs=set())


# -- traces ----------------------------------------------------------------------------------

def read_written(data: bytes) -> tuple[str, object] | None:
    """``data`` written to a file and read back as ``specview report`` reads its input; None if refused."""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "input.json"
        f.write_bytes(data)
        try:
            return read_input(f)
        except SpecviewError:
            return None

@FIXED
@given(traces())
def test_trace_reports_never_leak_markup(trace: Trace):
    with tempfile.TemporaryDirectory() as d:
        back = Trace.load(trace.save(Path(d) / "t.json"))
    check_trace_reports(back)


@FIXED
@given(traces(), st.data())
def test_a_trace_with_one_field_of_another_type_reads_or_is_refused(trace: Trace, data):
    doc = data.draw(corrupt_field(json.loads(trace.dumps())))
    got = read_written(json.dumps(doc).encode("utf-8"))
    if got is None:  # refused with specview's own error
        return
    kind, obj = got
    if kind == "trace":
        check_trace_reports(obj)
    elif kind == "kernels":
        check_kernel_map(obj)
    else:
        check_matrix(obj)


@settings(FIXED, max_examples=12)
@given(traces(), st.data())
def test_a_trace_file_with_corrupted_bytes_reads_or_is_refused(trace: Trace, data):
    raw = data.draw(corrupt_bytes(trace.dumps().encode("utf-8")))
    got = read_written(raw)
    if got is None:  # refused with specview's own error
        return
    kind, obj = got
    if kind == "trace":
        check_trace_reports(obj)


# -- matrix documents ------------------------------------------------------------------------
@FIXED
@given(matrix_docs())
def test_matrix_reports_never_leak_markup(doc: dict):
    validate_matrix(doc, source="generated")
    check_matrix(doc)
    MatrixSpec.from_json(doc["spec"])


@FIXED
@given(matrix_docs(), st.data())
def test_a_matrix_with_one_field_of_another_type_reads_or_is_refused(doc: dict, data):
    bad = data.draw(corrupt_field(doc))
    try:
        validate_matrix(bad, source="corrupted")
    except SpecviewError:
        return
    check_matrix(bad)


@settings(FIXED, max_examples=12)
@given(matrix_docs(), st.data())
def test_a_matrix_file_with_corrupted_bytes_reads_or_is_refused(doc: dict, data):
    raw = data.draw(corrupt_bytes(json.dumps(doc).encode("utf-8")))
    got = read_written(raw)
    if got is None:  # refused with specview's own error
        return
    kind, obj = got
    if kind == "matrix":
        check_matrix(obj)


# -- kernel maps -----------------------------------------------------------------------------
@st.composite
def kernel_maps(draw) -> dict:
    """A kernel map (``specview.kernels/1``) as ``specview kernels`` writes it, with markup in every label (targets,
    prompt names, file facts, environment) and hostile figures (NaN, infinite and huge shifts)."""
    widths = sorted(set(draw(st.lists(st.integers(1, 9), min_size=1, max_size=4))) | {1})
    small = st.integers(0, 2 ** 40)

    def width(w: int) -> dict:
        rows = draw(small)
        ident = draw(st.integers(0, rows)) if draw(st.booleans()) else rows
        return {"width": w, "rows": rows, "identical": ident, "flips": draw(small),
                "max_delta": draw(hostile_floats), "p95_delta": draw(hostile_floats), "below_shift": draw(small),
                "differing_by_row": draw(st.lists(small, max_size=3)),
                "flip_at": draw(st.lists(st.tuples(markup_text, small).map(list), max_size=2)),
                "first_difference": draw(st.one_of(st.none(), st.tuples(markup_text, small, small).map(list))),
                "stopped": draw(st.booleans())}

    names = draw(st.lists(markup_text, min_size=1, max_size=2, unique=True))
    targets = []
    for _ in range(draw(st.integers(1, 2))):
        targets.append({
            "target": draw(markup_text), "settings": {"flash_attn": draw(st.sampled_from(["auto", "on", "off"])),
                                                      "threads": draw(st.integers(0, 64))},
            "model": {"file": draw(markup_text), "quantization": draw(hostile_text), "path": draw(markup_text),
                      "file_size": draw(small)},
            "threads_used": draw(st.one_of(st.none(), st.integers(1, 64))), "seconds": draw(hostile_floats),
            "prompts": [{"name": n, "prompt_tokens": draw(st.lists(small, max_size=4)),
                         "tokens": draw(st.lists(small, max_size=4)), "positions": draw(st.integers(1, 2 ** 40))}
                        for n in names],
            "widths": [width(w) for w in widths]})
    env = draw(st.dictionaries(hostile_text, json_values, max_size=3))
    env.update({"cpu": draw(markup_text), "llama_cpp_python": draw(markup_text), "specview": draw(markup_text)})
    return json.loads(json.dumps({
        "schema": "specview.kernels/1", "backend": draw(st.one_of(st.just("llama.cpp"), markup_text)),
        "widths": widths, "positions": draw(st.integers(1, 2 ** 40)), "top_k": 8,
        "prompts": [{"name": n, "text": draw(markup_text), "chat": True} for n in names],
        "environment": env, "seconds": draw(hostile_floats), "targets": targets}, allow_nan=True))


def check_kernel_map(km) -> None:
    check_html(kernels_html(km, "<b>k</b>.json"), bold=0)
    rendered_markdown(kernels_markdown(km, "<b>k</b>.json"), strong=0, imgs=set())


@FIXED
@given(kernel_maps())
def test_kernel_map_reports_never_leak_markup(d: dict):
    check_kernel_map(kernel_map_from_json(d, source="generated"))


@FIXED
@given(kernel_maps(), st.data())
def test_a_kernel_map_with_one_field_of_another_type_reads_or_is_refused(d: dict, data):
    bad = data.draw(corrupt_field(d))
    got = read_written(json.dumps(bad).encode("utf-8"))
    if got is None:  # refused with specview's own error
        return
    kind, obj = got
    if kind == "kernels":
        check_kernel_map(obj)


@FIXED
@given(traces(), kernel_maps(), st.booleans())
def test_a_trace_report_with_a_hostile_kernel_map_never_leaks_markup(trace: Trace, d: dict, same: bool):
    if same and isinstance(trace.config.get("engine"), dict):  # a row for this very run, so its table is shown
        d["targets"][0].update(target=str(trace.config.get("target")), settings=trace.config["engine"])
        d["backend"] = "llama.cpp"
    try:
        km = kernel_map_from_json(d, source="generated")
    except SpecviewError:
        return
    sec = trace_kernel_section(trace, km, "<b>k</b>.json")
    check_html(trace_html(trace, {"margins": PNG}, kernel=sec))
    rendered_markdown(trace_markdown(trace, {"margins": PLOT_FILES["margins"]}, kernel=sec), strong=1,
                      imgs={PLOT_FILES["margins"]})


prediction_dicts = st.fixed_dictionaries({
    "status": st.sampled_from(STATUSES), "target": markup_text, "settings": markup_text,
    "n_max": st.integers(0, 2 ** 40), "widths": st.lists(st.integers(1, 2 ** 40), max_size=3),
    "row": st.one_of(st.none(), markup_text), "safe_n_max": st.one_of(st.none(), st.integers(-1, 2 ** 40)),
    "first_differing": st.one_of(st.none(), st.integers(0, 2 ** 40)),
    "identical_share": st.one_of(st.none(), hostile_floats), "max_delta": st.one_of(st.none(), hostile_floats),
    "flips": st.one_of(st.none(), st.integers(0, 2 ** 40)), "missing": st.lists(markup_text, max_size=2),
    "evidence": markup_text, "map_file": st.one_of(st.none(), markup_text),
    "map_reach": st.one_of(st.none(), st.integers(0, 2 ** 40)), "reach": st.one_of(st.none(), st.integers(0, 2 ** 40)),
    "caveats": st.lists(markup_text, max_size=2), "reason": markup_text})


@FIXED
@given(matrix_docs(), st.data())
def test_a_matrix_citing_a_hostile_kernel_map_never_leaks_markup(doc: dict, data):
    doc["kernel_map"] = data.draw(st.fixed_dictionaries({
        "file": markup_text, "schema": markup_text, "backend": markup_text,
        "widths": st.lists(st.integers(0, 2 ** 40), max_size=3), "positions": st.integers(0, 2 ** 40),
        "prompts": st.lists(markup_text, max_size=2),
        "targets": st.lists(st.fixed_dictionaries({
            "label": markup_text, "target": markup_text, "deterministic": st.booleans(),
            "safe_widths": st.lists(st.integers(0, 9), max_size=3),
            "safe_n_max": st.one_of(st.none(), st.integers(-1, 2 ** 40)),
            "threads_used": st.one_of(st.none(), st.integers(0, 64))}), max_size=2),
        "environment": st.dictionaries(hostile_text, json_values, max_size=2)}))
    for c in doc["cells"]:
        if data.draw(st.booleans()):
            c["kernel_prediction"] = data.draw(prediction_dicts)
    doc = json.loads(json.dumps(doc, allow_nan=True))
    validate_matrix(doc, source="generated")
    check_matrix(doc)
    bad = data.draw(corrupt_field(doc))
    try:
        validate_matrix(bad, source="corrupted")
    except SpecviewError:
        return
    check_matrix(bad)


# -- TOML matrix specs -----------------------------------------------------------------------
def _spec_or_refusal(path: Path) -> MatrixSpec | None:
    try:
        spec = load_spec(path)
        spec.validate(check_files=False)
    except SpecviewError:
        return None
    try:
        spec.validate()  # its model names are no files here: refused, never a crash
    except SpecviewError:
        pass
    return spec


def _check_spec(spec: MatrixSpec) -> None:
    cells = expand(spec)
    for p in cells[:20]:
        try:
            cell_config(spec, p)
        except SpecviewError:
            pass
    doc = json.loads(json.dumps(MatrixRun(spec=spec, cells=cells).to_json()))
    validate_matrix(doc, source="from a TOML spec")
    check_matrix(doc)


@FIXED
@given(toml_specs())
def test_a_toml_spec_with_hostile_values_reads_or_is_refused(text: str):
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "m.toml"
        f.write_text(text, encoding="utf-8")
        spec = _spec_or_refusal(f)
    if spec is not None:
        _check_spec(spec)


@settings(FIXED, max_examples=12)
@given(toml_specs(), st.data())
def test_a_toml_spec_with_corrupted_bytes_reads_or_is_refused(text: str, data):
    raw = data.draw(corrupt_bytes(text.encode("utf-8")))
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "m.toml"
        f.write_bytes(raw)
        spec = _spec_or_refusal(f)
    if spec is not None:
        _check_spec(spec)


# -- prompt files and the suite --------------------------------------------------------------
@settings(FIXED, max_examples=12)
@given(st.one_of(markup_text.map(lambda s: s.encode("utf-8", "surrogatepass")), st.binary(max_size=64)))
def test_a_prompt_file_reads_as_its_text_or_is_refused(raw: bytes):
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "p.txt"
        f.write_bytes(raw)
        try:
            p = prompt_from_file(f, category="x")
        except SpecviewError:
            with pytest.raises(UnicodeDecodeError):
                raw.decode("utf-8")
            return
    assert p.text == raw.decode("utf-8") and p.name == "p" and p.category == "x"


@settings(FIXED, max_examples=12)
@given(st.data())
def test_a_suite_file_with_corrupted_bytes_reads_or_is_refused(data):
    from specview.core.prompts import SUITE_FILE

    raw = data.draw(corrupt_bytes(SUITE_FILE.read_bytes()[:3000]))
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "suite.toml"
        f.write_bytes(raw)
        try:
            prompts = suite_from_dict(read_toml(f), source=str(f))
        except SpecviewError:
            return
    assert all(isinstance(p.text, str) and p.text and isinstance(p.category, str) for p in prompts)
