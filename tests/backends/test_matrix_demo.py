"""The reproducer matrix on the real demo model: cells equal independent single runs, loads and vanilla runs counted.

F16 / Q8_0 / Q4_K_M targets x (demo:Q4_0 draft at n_max 1 and 4, ngram-simple, none), 48 tokens of the
built-in technical prompt.  Every cell is re-run on its own in a second session, vanilla arm included
(no cache), and must give the same tokens and the same first mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specview.core.matrix import MatrixSpec, builtin_prompts, cell_config, expand, load_matrix, run_matrix
from specview.core.session import Session
from specview.core.trace import Trace

pytestmark = pytest.mark.demo

TARGETS = ["demo:F16", "demo:Q8_0", "demo:Q4_K_M"]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("matrix")
    spec = MatrixSpec(targets=TARGETS, drafters=["demo:Q4_0", "ngram-simple", "none"], n_max=[1, 4], p_min=[0.0],
                      prompts=builtin_prompts(["technical"]), max_tokens=48, diagnose=True)
    session = Session()
    try:
        run = run_matrix(spec, session, out=tmp / "m.json", traces_dir=tmp / "traces")
        counters = {"loads": session.loads, "vanilla_runs": session.vanilla_runs,
                    "speculative_runs": session.speculative_runs}
    finally:
        session.close()
    return spec, run, counters, tmp


def test_models_load_once_per_file_and_vanilla_runs_once_per_target(matrix):
    spec, run, counters, tmp = matrix
    assert len(run.records) == 12 and run.status == "complete"
    assert all(r["status"] == "ok" for r in run.records), [r.get("error") for r in run.records]
    # four files: three targets and the Q4_0 draft
    assert counters == {"loads": 4, "vanilla_runs": 3, "speculative_runs": 12}
    doc = load_matrix(tmp / "m.json")
    assert doc["counters"] == counters and doc["status"] == "complete"
    # the vanilla arm the cells of one target share is the very same run: same tokens and timing
    for target in TARGETS:
        arms = [Trace.load(tmp / r["trace"] if not Path(r["trace"]).is_absolute() else r["trace"]).vanilla
                for r in run.records if r["params"]["target"] == target]
        assert len({(tuple(a.tokens), a.gen_ms) for a in arms}) == 1


def test_cells_agree_with_independent_single_runs(matrix):
    spec, run, _, tmp = matrix
    session = Session()
    try:
        for params, rec in zip(expand(spec), run.records):
            assert rec["params"] == params.to_json()
            single = session.run(cell_config(spec, params), reuse_vanilla=False)
            saved = Trace.load(tmp / rec["trace"])
            assert single.vanilla.tokens == saved.vanilla.tokens, params
            assert single.speculative.tokens == saved.speculative.tokens, params
            fm = single.comparison.first_mismatch
            assert rec["first_mismatch"] == (None if fm is None else fm.index), params
            assert rec["identical"] is single.comparison.identical
            assert rec["n_drafted"] == single.speculative.n_drafted
        assert session.vanilla_runs == 12  # the independent check really re-ran vanilla every time
    finally:
        session.close()


def test_cell_records_carry_verdicts_and_figures(matrix):
    _, run, _, tmp = matrix
    for r in run.records:
        p = r["params"]
        if r["identical"]:
            assert r["verdict"] == "identical"
        else:  # nothing is wrong with llama.cpp's loop here: a fork of a real cell is batched numerics, diagnosed
            assert r["verdict"] == "near-tie", (p, r["explanation"])
            assert r["diagnosed"] and 0 < r["gap"] <= r["far_threshold"], (p, r["gap"], r["far_threshold"])
            assert r["fork"]["vanilla_token"] != r["fork"]["speculative_token"]
        if p["drafter"] == "none":
            assert r["identical"] and r["n_drafted"] == 0 and r["acceptance_rate"] is None
        if p["drafter"] == "demo:Q4_0":
            assert r["n_drafted"] > 0 and 0.0 <= r["acceptance_rate"] <= 1.0
            assert r["speedup"] is not None and r["speedup"] > 0
    doc = json.loads((tmp / "m.json").read_text())
    assert doc["summary"][0].startswith("12 cells:")
