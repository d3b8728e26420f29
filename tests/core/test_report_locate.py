"""specview report of a locate file, and a trace report's departure line."""

from __future__ import annotations

import json

import pytest
from test_report import hostile_trace

from specview.core.config import EngineSettings
from specview.core.errors import SpecviewError
from specview.core.locate.find import Located, LogitsDiff, NodeDiff, NodeSource
from specview.core.report.facts import verdict_facts
from specview.core.report.write import read_input, write_report


def located() -> Located:
    w = NodeSource(name="blk.1.ffn_down.weight", op="NONE", type="q4_K", shape=(8, 8), buffer="CPU_REPACK", weight=True)
    nodes = [NodeDiff(index=0, name="embd", op="GET_ROWS", type="f32", shape=(8,), batched_shape=(8, 3), layer=None,
                      status="identical", part="input", n_elems=8),
             NodeDiff(index=1, name="ffn_out-1", op="MUL_MAT", type="f32", shape=(8,), batched_shape=(8, 3), layer=1,
                      status="differs", part="blk.1", sources=[w], max_abs=2.5e-7, n_diff=3, n_elems=8),
             NodeDiff(index=2, name="l_out-1", op="ADD", type="f32", shape=(8,), batched_shape=(8, 3), layer=1,
                      status="differs", part="blk.1", max_abs=4e-6, n_diff=8, n_elems=8)]
    return Located(target="toy <b>", backend="toy", settings=EngineSettings(), model={"quantization": "Q4_K_M"},
                   position=7, width=3, row=2, n_prompt=4, single_tokens=[1], batch_tokens=[1, 2, 3], selection="all",
                   observer_exact=True, nodes=nodes, logits=LogitsDiff(n_vocab=16, n_diff=9, max_abs=0.02,
                                                                       argmax_single=3, argmax_batched=4,
                                                                       margin_single=0.01))


def test_a_locate_file_gets_its_own_report_with_its_plot(tmp_path):
    loc = located()
    p = loc.save(tmp_path / "loc.json")
    kind, back = read_input(p)
    assert kind == "locate" and back.where() == loc.where()
    seen = []

    def plots(obj):
        seen.append(obj)
        return {"locate": b"\x89PNG fake", "margins": b"not for a locate"}

    out = write_report(p, tmp_path / "rep", plots=plots)
    html, md = out["html"].read_text(), out["markdown"].read_text()
    assert len(seen) == 1 and isinstance(seen[0], Located)
    assert "ffn_out-1" in md and "CPU_REPACK" in md and "argmax flips (3 -&gt; 4)" in html
    assert "toy &lt;b&gt;" in html and "<b>" not in html.split("<main>")[1].split("toy")[1][:5]
    assert (tmp_path / "rep" / "report-locate.png").read_bytes() == b"\x89PNG fake"
    assert "report-locate.png" in md and "margins" not in out  # a trace's plot is no locate's
    # growth: one row per part with compared nodes, its last node's |Δ| as the part's output
    assert "| blk.1 | 4e-06 | 4e-06 | 2 / 2 | ffn_out-1 |" in md.replace("\\", "")
    with pytest.raises(SpecviewError, match="--kernel-map"):
        write_report(p, tmp_path / "rep2", kernel_map=p)


def test_a_foreign_file_names_the_locate_schema_among_those_read(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"schema": "something/1"}))
    with pytest.raises(SpecviewError, match=r"locate \(specview\.locate/1\)"):
        read_input(p)


def test_a_trace_report_says_where_its_verify_pass_departs():
    loc = located()
    t = hostile_trace()
    assert "where the verify pass departs" not in dict(verdict_facts(t))
    t.diagnosis = {**t.diagnosis, "departure": loc.summary()}
    rows = dict(verdict_facts(t))
    assert rows["where the verify pass departs"] == f"row 2 of the width-3 pass: {loc.where()}"
    t.diagnosis = {**t.diagnosis, "departure": {"skipped": "llama-server shows no nodes"}}
    assert dict(verdict_facts(t))["where the verify pass departs"] == "not located (llama-server shows no nodes)"
