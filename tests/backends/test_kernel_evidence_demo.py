"""The kernel map as evidence on the real demo: a small map, then a matrix citing it, whose cells must agree.

Which widths are bit-identical depends on the machine's kernels, so nothing here says which; what must hold
anywhere is that every cell the map proves lossless is identical (a fork there would be a real finding: a
state bug, or a shape the map did not measure), that each prediction follows from the map's own rows, and
that a target named by its GGUF path is matched to the map's demo-name row by its file facts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specview.core.config import EngineSettings
from specview.core.kernels.evidence import DIFFER, NOT_COVERED, PROVEN, STATUSES
from specview.core.kernels.map import kernel_map
from specview.core.matrix import MatrixSpec, builtin_prompts, load_matrix, run_matrix
from specview.core.registry import Runner
from specview.core.report.write import write_report
from specview.core.session import Session
from specview.core.trace import Trace

pytestmark = pytest.mark.demo

SETTINGS = EngineSettings(threads=1)


def _nr_here() -> str:
    """The label part ``nr`` where this machine decides no repack for SETTINGS (the crash probe crashed, or
    $SPECVIEW_REPACK_PROBE plants that): a map's rows and a run's settings carry the decision, and its label."""
    return ", nr" if Runner.resolve_settings(SETTINGS, backend="llama.cpp")[0].no_repack else ""


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, demo_paths):
    tmp = tmp_path_factory.mktemp("evidence")
    with Session() as s:
        km = kernel_map(s, ["demo:Q8_0", "demo:Q4_K_M"], builtin_prompts(["essay"]), widths=range(1, 5),
                        positions=24, settings=SETTINGS)
        km_file = km.save(tmp / "k.json")
        # "none" drafts nothing, so its every pass is one token wide: the map's width-1 control proves it lossless
        # on any machine, and the proven branch below is never empty
        spec = MatrixSpec(targets=["demo:Q8_0", str(demo_paths["Q4_K_M"])], drafters=["demo:Q4_0", "none"],
                          n_max=[1, 2, 3],
                          p_min=[0.0], prompts=builtin_prompts(["essay", "code"]), max_tokens=48, diagnose=False,
                          engine=SETTINGS, kernel_map=str(km_file))
        run_matrix(spec, s, out=tmp / "m.json", traces_dir=tmp / "traces")
    return km, km_file, load_matrix(tmp / "m.json"), tmp


def test_every_cell_the_map_proves_lossless_is_identical(demo_run):
    km, km_file, doc, _ = demo_run
    assert doc["status"] == "complete" and doc["kernel_map"]["file"] == str(km_file)
    proven = []
    for c in doc["cells"]:
        assert c["status"] == "ok", c.get("error")
        p = c["kernel_prediction"]
        assert p["status"] in STATUSES and p["status"] != NOT_COVERED, p
        if p["status"] == PROVEN:
            proven.append(c)
            assert c["identical"], (f"the map {km_file} proves {c['params']} lossless but it forks at token "
                                    f"{c['first_mismatch']}: a state bug or a shape the map did not measure")
    assert not [line for line in doc["summary"] if line.startswith("CONTRADICTION")]
    assert {c["params"]["drafter"] for c in proven} >= {"none"}, [c["kernel_prediction"] for c in doc["cells"]]
    assert any(line.startswith("The kernel map k.json proves n_max ≤") and "as predicted" in line
                   for line in doc["summary"])


def test_each_prediction_follows_from_the_maps_own_rows(demo_run):
    km, _, doc, _ = demo_run
    for c in doc["cells"]:
        p = c["kernel_prediction"]
        row = km.target(p["row"])
        n = 0 if c["params"]["drafter"] == "none" else c["params"]["n_max"]  # "none" drafts nothing
        assert p["widths"] == list(range(1, n + 2))
        safe = set(row.safe_widths())
        if p["status"] == PROVEN:
            assert set(p["widths"]) <= safe and p["safe_n_max"] == row.safe_n_max()
        elif p["status"] == DIFFER:
            w = p["first_differing"]
            assert w in p["widths"] and w not in safe and all(x in safe for x in p["widths"] if x < w)
            assert p["identical_share"] == pytest.approx(row.widths[w].identical_share, abs=1e-5)


def test_a_gguf_path_is_matched_to_its_demo_row_by_file_facts(demo_run, demo_paths):
    km, _, doc, _ = demo_run
    cells = [c for c in doc["cells"] if c["params"]["target"] == str(demo_paths["Q4_K_M"])]
    assert cells
    row = km.target("demo:Q4_K_M")  # mapped as this machine decides: its label names no repack where decided
    assert row.label == f"demo:Q4_K_M [t 1{_nr_here()}]"
    for c in cells:
        p = c["kernel_prediction"]
        assert p["row"] == row.label
        assert not any("by name only" in cv for cv in p["caveats"])  # the facts decided, not the names


def test_the_trace_report_carries_the_prediction(demo_run, tmp_path: Path):
    _, km_file, doc, tmp = demo_run
    c = doc["cells"][0]
    trace = Trace.load(tmp / c["trace"] if not Path(c["trace"]).is_absolute() else c["trace"])
    # the trace's settings carry this machine's decision, and the map row they match is labelled with it
    nr = _nr_here()
    assert trace.config["engine"]["no_repack"] is bool(nr)
    written = write_report(trace, tmp_path, kernel_map=km_file)
    page = written["html"].read_text(encoding="utf-8")
    assert "<h2>Kernel map</h2>" in page and f"demo:Q8_0 [t 1{nr}]" in page
    words = {"proven-lossless": "proven lossless", "kernels-differ": "kernels differ"}[c["kernel_prediction"]["status"]]
    assert words in page
