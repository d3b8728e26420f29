"""Rates, not anecdotes: the prompt suite, divergence rates with Wilson intervals, fork positions, gap severity,
and cells that stop a fixed number of tokens after their fork.

The fake backend's target computes passes wider than one token with a planted error (``SEED:NOISE:EPS``),
so speculative runs fork at near-ties exactly as batched-versus-single numerics make them; the full run of
each cell is the independent reference for the stopped one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fakes import FakeBackend
from specview import cli
from specview.core.matrix import (MatrixSpec, PromptSpec, expand, format_rates, load_matrix, rates, run_matrix,
                                  wilson)
from specview.core.matrix.rates import GAP_EDGES, gap_bin, severity
from specview.core.prompts import SUITE_CATEGORIES, suite_prompts
from specview.core.registry import get_backend, register_backend, unregister_backend
from specview.core.session import Session


# ---------------------------------------------------------------------------
# the suite
# ---------------------------------------------------------------------------
def test_the_suite_has_at_least_forty_prompts_in_every_category():
    ps = suite_prompts()
    assert len(ps) >= 40
    assert len({p.name for p in ps}) == len(ps)
    assert {p.category for p in ps} == set(SUITE_CATEGORIES)
    assert all(sum(p.category == c for p in ps) >= 5 for c in SUITE_CATEGORIES)
    assert all(p.text and p.text == p.text.strip() and p.chat for p in ps)
    assert [p.name for p in suite_prompts(["code"])] == [p.name for p in ps if p.category == "code"]


def test_cli_suite_dry_run_defaults_to_the_demo_setting(capsys):
    from specview.core.config import DEMO_DRAFT, DEMO_TARGET, RunConfig

    assert cli.main(["matrix", "--suite", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{len(suite_prompts())} cells" in out
    from specview.commands.matrix import add_parser, spec_from_args  # the spec behind it
    import argparse

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    spec = spec_from_args(p.parse_args(["matrix", "--suite", "math-reasoning,code"]))
    assert spec.targets == [DEMO_TARGET] and spec.drafters == [DEMO_DRAFT]
    assert spec.max_tokens == RunConfig.__dataclass_fields__["max_tokens"].default
    assert spec.stop_after_fork == 16 and {p.category for p in spec.prompts} == {"math-reasoning", "code"}
    assert spec_from_args(p.parse_args(["matrix", "--suite", "--full-text"])).stop_after_fork is None
    assert cli.main(["matrix", "--suite", "poetry", "--dry-run"]) == 2
    assert "unknown suite category 'poetry'" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# the interval
# ---------------------------------------------------------------------------
def _score_interval(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson interval found independently: the p whose score test |k/n - p| <= z sqrt(p(1-p)/n) accepts."""
    phat = k / n

    def inside(p: float) -> bool:
        return abs(phat - p) <= z * math.sqrt(p * (1 - p) / n) + 1e-15

    def edge(lo: float, hi: float, want_inside_at_hi: bool) -> float:
        for _ in range(200):
            mid = (lo + hi) / 2
            if inside(mid) == want_inside_at_hi:
                hi = mid
            else:
                lo = mid
        return (lo + hi) / 2

    low = 0.0 if inside(0.0) else edge(0.0, phat, True)
    high = 1.0 if inside(1.0) else edge(phat, 1.0, False)
    return low, high


@pytest.mark.parametrize("k, n", [(0, 10), (5, 10), (10, 10), (1, 40), (7, 42), (39, 40), (3, 3), (0, 1)])
def test_wilson_interval_matches_the_score_test(k, n):
    lo, hi = wilson(k, n)
    elo, ehi = _score_interval(k, n)
    assert lo == pytest.approx(elo, abs=1e-9) and hi == pytest.approx(ehi, abs=1e-9)
    assert 0.0 <= lo <= k / n <= hi <= 1.0


def test_wilson_textbook_values():
    assert wilson(0, 10)[1] == pytest.approx(0.2775, abs=5e-5)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=5e-5)


# ---------------------------------------------------------------------------
# rates from cells
# ---------------------------------------------------------------------------
def _cell(i, prompt, cat, *, target="demo:Q8_0", fork=None, gap=None, far=None, status="ok"):
    return {"index": i, "status": status, "category": cat,
            "params": {"target": target, "drafter": "demo:Q4_0", "spec_type": "draft-simple", "n_max": 3,
                       "p_min": 0.0, "flash_attn": "auto", "prompt": prompt},
            "identical": None if status != "ok" else fork is None, "first_mismatch": fork,
            "verdict": "identical" if fork is None else ("near-tie" if gap is not None else "diverged"),
            "gap": gap, "far_threshold": far}


def test_rates_count_forks_positions_and_severity_per_setting_and_category():
    cells = [
        _cell(0, "a", "math", fork=10, gap=0.005, far=2.0),   # near-tie, bin 0
        _cell(1, "b", "math", fork=200, gap=0.3, far=0.2),    # material, bin 2
        _cell(2, "c", "code"),
        _cell(3, "d", "code", fork=40),                       # undiagnosed
        _cell(4, "e", "code", status="error"),
        _cell(5, "a", "math", target="demo:F16"),
        _cell(6, "b", "math", target="demo:F16", fork=64, gap=3.0, far=4.0),  # near-tie (within its own threshold), bin 4
    ]
    doc = {"spec": {"max_tokens": 256, "prompts": []}, "cells": cells}
    r = rates(doc)
    q8, f16 = r["settings"]
    assert q8["label"].startswith("Q8_0 with Q4_0 n_max=3 p_min=0") and f16["label"].startswith("F16")
    assert (q8["n"], q8["forks"], q8["errors"]) == (4, 3, 1)
    assert q8["rate"] == pytest.approx(3 / 4) and (q8["low"], q8["high"]) == pytest.approx(wilson(3, 4))
    assert q8["positions"]["values"] == [10, 40, 200] and q8["positions"]["median"] == 40
    assert q8["positions"]["bin_width"] == 32 and sum(q8["positions"]["histogram"]) == 3
    assert q8["positions"]["histogram"][0] == 1 and q8["positions"]["histogram"][1] == 1
    assert q8["positions"]["histogram"][6] == 1
    assert q8["severity"] == {"near-tie": 1, "material": 1, "undiagnosed": 1}
    assert q8["gaps"][0] == {"near-tie": 1, "material": 0} and q8["gaps"][2] == {"near-tie": 0, "material": 1}
    cats = {c["category"]: c for c in q8["categories"]}
    assert (cats["math"]["n"], cats["math"]["forks"]) == (2, 2) and (cats["code"]["n"], cats["code"]["forks"]) == (2, 1)
    assert cats["code"]["errors"] == 1
    assert f16["severity"]["near-tie"] == 1 and f16["gaps"][len(GAP_EDGES) - 1]["near-tie"] == 1
    text = "\n".join(format_rates(r))
    assert "3 of 4 fork (75.0%, 95% CI" in text and "math" in text and "code" in text


@pytest.mark.parametrize("gap", [0.0, 0.009, 0.01, 0.099, 0.5, 1.99, 2.0, 250.0])
def test_gap_bins_hold_their_edges(gap):
    i = gap_bin(gap)
    assert GAP_EDGES[i] <= gap and (i == len(GAP_EDGES) - 1 or gap < GAP_EDGES[i + 1])


def test_severity_uses_the_cells_own_threshold():
    assert severity({"gap": 0.2, "far_threshold": 0.25}) == "near-tie"
    assert severity({"gap": 0.2, "far_threshold": 0.1}) == "material"
    assert severity({"gap": None}) == "undiagnosed"
    assert severity({"gap": 1.9}) == severity({"gap": -1.9}) == "near-tie"  # no threshold recorded: 2 logits
    assert severity({"gap": 2.5}) == "material"


# ---------------------------------------------------------------------------
# stopping after the fork, on the real Session with a forking toy target
# ---------------------------------------------------------------------------
class ToyNames(FakeBackend):
    name = "toy-suite"
    model_kind = "name"


@pytest.fixture()
def toy():
    register_backend("toy-suite", ToyNames)
    yield get_backend("toy-suite")
    unregister_backend("toy-suite")


PROMPTS = [PromptSpec(f"p{i}", text=t, chat=False, category=("math" if i % 2 else "code"))
           for i, t in enumerate(["hello world", "the cat sat", "one two three", "abc def ghi", "zz top",
                                  "quick brown fox", "lorem ipsum", "a b c d e"])]


def toy_spec(**kw) -> MatrixSpec:
    d = dict(targets=["0:0:0.5"], drafters=["0"], n_max=[4], prompts=PROMPTS, max_tokens=96, ignore_eos=True,
             backend="toy-suite", diagnose=False)
    d.update(kw)
    return MatrixSpec(**d)


def test_cells_stop_a_fixed_number_of_tokens_after_their_fork(toy, tmp_path: Path):
    N = 5
    full_runner, stop_runner = Session(), Session()
    try:
        full = run_matrix(toy_spec(), full_runner, out=tmp_path / "full.json", traces_dir=tmp_path / "tf")
        stopped = run_matrix(toy_spec(stop_after_fork=N), stop_runner, out=tmp_path / "stop.json",
                             traces_dir=tmp_path / "ts")
    finally:
        full_runner.close()
        stop_runner.close()
    forks = 0
    from specview.core.trace import Trace

    for a, b in zip(full.records, stopped.records):
        ta, tb = Trace.load(tmp_path / a["trace"]), Trace.load(tmp_path / b["trace"])
        assert tb.vanilla.tokens == ta.vanilla.tokens  # vanilla is never stopped
        assert a["first_mismatch"] == b["first_mismatch"] and a["identical"] == b["identical"]
        assert tb.speculative.tokens == ta.speculative.tokens[:len(tb.speculative.tokens)]
        if a["identical"]:
            assert tb.speculative.tokens == ta.speculative.tokens and tb.speculative.stop_reason == "max_tokens"
            continue
        fork = a["first_mismatch"]
        n = len(tb.speculative.tokens)
        if fork + N + 1 < len(ta.speculative.tokens):
            forks += 1
            assert tb.speculative.stop_reason == "after-fork" and b["stop_reason"][1] == "after-fork"
            assert fork + N < n <= fork + N + 1 + 4  # stopped at the first round boundary past fork + N
    assert forks >= 2, "the planted batched-pass error should fork on several of these prompts"
    # the vanilla arm is still computed once per prompt and reused: stopping never cuts it short
    assert stop_runner.vanilla_runs == len(PROMPTS)
    doc = load_matrix(tmp_path / "stop.json")
    assert doc["spec"]["stop_after_fork"] == N and doc["cells"][0]["config"]["stop_after_fork"] == N
    g = doc["rates"]["settings"][0]
    assert g["n"] == len(PROMPTS) and g["forks"] == sum(not c["identical"] for c in doc["cells"])
    assert {c["category"] for c in g["categories"]} == {"math", "code"}


def test_a_user_cancel_still_interrupts_a_stopping_cell(toy, tmp_path: Path):
    s = Session()
    calls = {"n": 0}

    def cancel():
        calls["n"] += 1
        return calls["n"] > 40

    try:
        run = run_matrix(toy_spec(stop_after_fork=3), s, out=tmp_path / "m.json", cancel=cancel)
    finally:
        s.close()
    assert run.status == "interrupted"
    assert all(r["stop_reason"][1] != "cancelled" for r in run.records)


def test_cli_suite_on_the_toy_engine_prints_rates(toy, tmp_path: Path, capsys, monkeypatch):
    import specview.core.matrix.suite as suite_mod

    monkeypatch.setattr(suite_mod, "suite_prompts", lambda cats=None: [p for p in PROMPTS])
    out = tmp_path / "m.json"
    rc = cli.main(["matrix", "--suite", "--engine", "toy-suite", "--targets", "0:0:0.5", "--drafters", "0",
                   "--no-chat", "--ignore-eos", "-n", "64", "--no-diagnose", "-o", str(out)])
    captured = capsys.readouterr()
    assert rc in (0, 1), captured.err
    doc = json.loads(out.read_text())
    assert len(doc["cells"]) == len(PROMPTS) and doc["spec"]["stop_after_fork"] == 16
    g = doc["rates"]["settings"][0]
    assert f"{g['forks']} of {g['n']} fork" in captured.out and "95% CI" in captured.out
    assert "rates over the prompts" in captured.out
    assert len(expand(toy_spec())) == len(PROMPTS)
