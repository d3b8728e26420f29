"""The kernel map in reports: a map's own report, a trace report's "Kernel map" section, a matrix's citation.

Maps come from the toy engines of test_kernels (a planted kernel switch at a known width), so what each
section must say follows from the plant; hostile labels (markup in target names, prompt names, file facts
and environment strings) must come out as text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path


import markdown_it
from specview import cli
from specview.core.config import RunConfig
from specview.core.kernels.map import KernelMap, kernel_map
from specview.core.report import kernels_html, kernels_markdown, trace_html, trace_markdown, trace_kernel_section
from specview.core.report.write import write_report
from test_kernels import PROMPTS, toy  # noqa: F401  (the fixture)
from test_report import SCRIPT, check_html, check_markdown

HOSTILE = SCRIPT + " | `x` **b** <img src=x onerror=alert(1)>"


def _map(session, targets=("dispatch:4:1.0", "dispatch:9:1.0"), widths=range(1, 6)) -> KernelMap:
    return kernel_map(session, list(targets), PROMPTS, widths=widths, positions=8, backend="kernels-toy")


def _hostile(km: KernelMap) -> KernelMap:
    """The same map with markup in every label a report shows."""
    d = json.loads(json.dumps(km.to_json()))
    d["environment"] = {"cpu": HOSTILE, "llama_cpp_python": HOSTILE, "created": HOSTILE}
    for t in d["targets"]:
        t["target"] = HOSTILE + t["target"]
        t["model"] = {"file": HOSTILE, "quantization": "<b>Q</b>", "path": HOSTILE}
        for p in t["prompts"]:
            p["name"] = "<i>" + p["name"]
    for p in d["prompts"]:
        p["name"] = "<i>" + p["name"]
    return KernelMap.from_json(d)


def _render(md: str) -> str:
    return markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(md)


def test_a_map_report_has_the_heatmap_the_tables_and_what_it_proves(toy, tmp_path: Path):  # noqa: F811
    km = _map(toy)
    f = km.save(tmp_path / "k.json")
    out = tmp_path / "rep"
    assert cli.main(["report", str(f), "-o", str(out)]) == 0
    page = (out / "report.html").read_text(encoding="utf-8")
    c = check_html(page, bold=0)
    text = "".join(c.text)
    # the heatmap: one coloured cell per target and width, "=" where every row was bit-identical
    cells = re.findall(r"<td style='background:(#[0-9a-f]{6})' title='([^']*)'>([^<]*)</td>", page)
    assert len(cells) == 2 * 5
    syms = [s for _, _, s in cells]
    assert syms[:3] == ["=", "=", "="] and all(s != "=" for s in syms[3:5])  # dispatch:4: widths 4-5 differ
    assert syms[5:] == ["="] * 5  # dispatch:9: every width mapped is below its switch
    assert {col for col, _, s in cells if s == "="} == {"#cfe8cf"}
    assert "n_max ≤ 2" in text and "n_max ≤ 4" in text and "widths 1-5" in text
    md = (out / "report.md").read_text(encoding="utf-8")
    check_markdown(md)
    assert "| dispatch:4:1.0 | \\= | \\= | \\= |" in md
    assert md.count("| width | rows | bit-identical |") == 2


def test_a_map_report_escapes_hostile_labels(toy):  # noqa: F811
    km = _hostile(_map(toy))
    page = kernels_html(km, "<b>k</b>.json")
    c = check_html(page, bold=0)
    assert SCRIPT in "".join(c.text) and "<i>" not in page.replace("&lt;i&gt;", "")
    md = kernels_markdown(km, "<b>k</b>.json")
    check_markdown(md)
    rendered = _render(md)
    assert "<script" not in rendered and "<img" not in rendered and "<b>" not in rendered and "<i>" not in rendered
    assert "onerror" in rendered  # shown, as text


def _trace(session, target: str, n_max: int):
    cfg = RunConfig(target=target, draft="dispatch:99:0", prompt_tokens=(1, 5, 9, 11), prompt=None, n_max=n_max,
                    max_tokens=8, ignore_eos=True, backend="kernels-toy")
    return session.run(cfg)


def test_a_trace_report_says_what_the_map_predicts_for_its_run(toy, tmp_path: Path):  # noqa: F811
    km = _map(toy)
    f = km.save(tmp_path / "k.json")
    t = _trace(toy, "dispatch:9:1.0", 2)
    assert t.comparison.identical
    sec = trace_kernel_section(t, km, str(f))
    assert sec.prediction.status == "proven-lossless" and sec.row_label == "dispatch:9:1.0"
    assert sec.meaning == "The arms are identical, as the map predicts." and not sec.contradiction
    assert [r[0] for r in sec.table] == ["1", "2", "3", "4", "5"]
    t4 = _trace(toy, "dispatch:4:1.0", 4)
    sec4 = trace_kernel_section(t4, km, str(f))
    assert sec4.prediction.status == "kernels-differ" and sec4.prediction.first_differing == 4
    if t4.comparison.identical:
        assert "a fork was possible, not certain" in sec4.meaning
    else:
        assert "is what the kernels predict is possible" in sec4.meaning
    t.save(tmp_path / "t.json")
    out = tmp_path / "rep"
    assert cli.main(["report", str(tmp_path / "t.json"), "--kernel-map", str(f), "-o", str(out)]) == 0
    page = (out / "report.html").read_text(encoding="utf-8")
    check_html(page)
    assert "<h2>Kernel map</h2>" in page and "proven lossless" in page and "as the map predicts" in page
    md = (out / "report.md").read_text(encoding="utf-8")
    check_markdown(md)
    assert "### Kernel map" in md and "| width | rows | bit-identical |" in md
    # without --kernel-map the report has no such section
    assert cli.main(["report", str(tmp_path / "t.json"), "-o", str(tmp_path / "plain")]) == 0
    assert "Kernel map" not in (tmp_path / "plain" / "report.html").read_text(encoding="utf-8")


def test_a_trace_section_with_a_hostile_map_is_escaped(toy):  # noqa: F811
    km = _hostile(_map(toy))
    t = _trace(toy, "dispatch:4:1.0", 4)
    sec = trace_kernel_section(t, km, "<b>k</b>.json")
    assert sec.prediction.status == "not-covered" and SCRIPT in sec.prediction.missing[0]  # names the rows it has
    check_html(trace_html(t, {}, kernel=sec))
    md = trace_markdown(t, {}, kernel=sec)
    check_markdown(md)
    rendered = _render(md)
    assert "<script" not in rendered and "<b>" not in rendered and rendered.count("<strong>") == 1


def test_kernel_map_refusals(toy, tmp_path: Path, capsys):  # noqa: F811
    km = _map(toy)
    f = km.save(tmp_path / "k.json")
    t = _trace(toy, "dispatch:9:1.0", 2)
    t.save(tmp_path / "t.json")
    assert cli.main(["report", str(f), "--kernel-map", str(f), "-o", str(tmp_path / "r")]) == 2
    assert "is a kernel map already" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"schema": "specview.trace/1"}')
    for bad, words in [(tmp_path / "none.json", "no such file"), (tmp_path / "bad.json", "not a specview kernel map")]:
        assert cli.main(["report", str(tmp_path / "t.json"), "--kernel-map", str(bad), "-o", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert str(bad) in err and words in err


def test_a_matrix_report_cites_its_map_or_the_one_given(tmp_path: Path):
    from test_matrix import FakeSession, spec

    from specview.core.config import EngineSettings
    from specview.core.matrix import load_matrix, run_matrix
    from specview.core.registry import Runner
    from specview.core.report import matrix_html, matrix_markdown

    # a map made on this machine: its row records the settings as decided here, as the matrix's cells do (no repack
    # where the crash probe crashed, or where $SPECVIEW_REPACK_PROBE plants that)
    decided = Runner.resolve_settings(EngineSettings(), backend="llama.cpp")[0]
    km = KernelMap.from_json({
        "schema": "specview.kernels/1", "backend": "llama.cpp", "widths": [1, 2, 3], "positions": 8, "top_k": 8,
        "prompts": [{"name": "p", "tokens": [1]}], "environment": {},
        "targets": [{"target": "demo:Q8_0", "settings": {"no_repack": decided.no_repack}, "model": {},
                     "threads_used": None,
                     "prompts": [{"name": "p", "prompt_tokens": [1], "tokens": [2], "positions": 8}],
                     "widths": [{"width": w, "rows": 8, "identical": 8, "flips": 0} for w in (1, 2, 3)]}]})
    f = km.save(tmp_path / "k.json")
    run_matrix(spec(targets=["demo:Q8_0", "demo:F16"], drafters=["demo:Q4_0"], p_min=[0.0]), FakeSession(),
               out=tmp_path / "m.json")
    doc = load_matrix(tmp_path / "m.json")
    assert "kernel_map" not in doc
    out = tmp_path / "rep"
    written = write_report(tmp_path / "m.json", out, kernel_map=f)
    page = written["html"].read_text(encoding="utf-8")
    check_html(page, bold=0)
    assert f"kernel map {f}: widths 1-3" in page
    # the fake forks every Q8_0 cell that drafts, at n_max 1 and 4: n_max 1 is proven lossless here, so those
    # forks contradict the map; n_max 4 needs width 5, which the map lacks; F16 is not in the map
    assert page.count("class=contra") == 2 and "CONTRADICTION" in page
    assert "not covered by the map" in page and "no row for demo:F16" in page
    md = written["markdown"].read_text(encoding="utf-8")
    check_markdown(md)
    assert md.count("⚠ CONTRADICTION") == 2 and "### Kernel map" in md
    # a matrix that ran with a map: its report cites it with no flag
    doc2 = run_matrix(spec(targets=["demo:Q8_0"], drafters=["demo:Q4_0"], p_min=[0.0], kernel_map=str(f)),
                      FakeSession(), out=tmp_path / "m2.json").to_json()
    page = matrix_html(doc2)
    check_html(page, bold=0)
    assert "<h2>Kernel map</h2>" in page and f"kernel map {f}" in page
    check_markdown(matrix_markdown(doc2))
