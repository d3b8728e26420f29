"""``specview probe`` in-process, on real llama.cpp contexts: both tiny hybrids and the demo target.

Every trigger runs once per model (one module fixture each): the scripted drafter forces it (so every scripted
trigger must be counted as reached), the row's result must be proven (identical, or near-tie proven by the
serial-verify control; never state on a correct engine), and each rollback mode the architecture allows has
its row, run by that mode's own path.  A stale state planted after a zero-draft round, in the real memory
restore (``plants_triggers.StaleAfterZeroDraft``), must read ``state``.

Nothing pins this machine: whether a row is identical or a proven near-tie depends on the kernels; what must
hold on every machine is asserted (the trigger happened, the result is proven, the counts add up).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from plants_triggers import PlantedBackend  # noqa: E402
from tinyhybrid import hybrid_pair  # noqa: E402

from specview.core.config import EngineSettings  # noqa: E402
from specview.core.probe import IDENTICAL, NAMES, NEAR_TIE, STATE  # noqa: E402
from specview.core.probe.runner import probe_in_session  # noqa: E402
from specview.core.registry import get_backend, register_backend, unregister_backend  # noqa: E402
from specview.core.session import Session  # noqa: E402

pytestmark = [pytest.mark.slow]

MODELS = ("qwen35", "lfm2", pytest.param("demo", marks=pytest.mark.demo))
N = 32
#: the long run: 2,000+ tokens where a pass is cheap (the tiny hybrids), fewer on the 135M demo target
LONG = {"qwen35": 2048, "lfm2": 2048, "demo": 256}
SCRIPTED = tuple(n for n in NAMES if n != "ngram-loop")  # forced by construction: each must be reached
PROVEN = (IDENTICAL, NEAR_TIE)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    d = tmp_path_factory.mktemp("triggers")
    out = {arch: str(hybrid_pair(arch, d)[0]) for arch in ("qwen35", "lfm2")}
    out["demo"] = get_backend("llama.cpp").resolve("demo:Q8_0")
    return out


def probe(target: str, *, backend: str = "llama.cpp", **kw):
    session = Session()
    try:
        return session.job(probe_in_session, target=target, settings=EngineSettings(threads=1), backend=backend,
                           n=N, **kw)
    finally:
        session.close()


@pytest.fixture(scope="module", params=MODELS)
def report(request, targets):
    return request.param, probe(targets[request.param], long_n=LONG[request.param])


def test_every_trigger_has_a_proven_row_and_each_scripted_one_happened(report):
    model, rep = report
    assert {r.trigger for r in rep.rows} == set(NAMES)
    for r in rep.rows:
        assert r.engine == "in-process"
        assert r.result != STATE, (model, r.trigger, r.evidence)
        if r.trigger in SCRIPTED:
            assert r.reached and r.result in PROVEN, (model, r.trigger, r.label, r.evidence)
        if r.result == NEAR_TIE:  # proven by a control that ran and reproduced plain greedy
            assert r.control and r.control["identical"] and r.first_mismatch is not None
        if r.result == IDENTICAL:
            assert r.first_mismatch is None and r.control is None


def test_the_counts_say_what_each_trigger_forced(report):
    model, rep = report
    rows = {(r.trigger, r.label): r for r in rep.rows}
    by = {r.trigger: r for r in rep.rows}
    assert by["zero-after-accept"].counts["zero_after_accept"] > 0
    assert by["whole-reject"].counts["whole_rejections"] > 0
    deep = by["deep-rollback"].counts
    assert deep["deepest_drop"] > 3  # deeper than the three states a context keeps by default
    long = by["long-run"]
    assert long.n_tokens == LONG[model] and long.counts["rounds"] > 0 and long.counts["rollbacks"]
    edge = by["context-edge"]
    e = edge.counts["edge"]
    # the run fills the context as far as a run may (prompt + tokens + 1 = n_ctx), and its last draft was cut
    assert e["cut"] > 0 and e["end"] == e["n_ctx"] - 2
    modes = {r.label for r in rep.rows if r.trigger == "rollback-modes"}
    if model == "demo":  # a KV cache only: seq-rm, and the checkpoint (whose restore is a seq-rm)
        assert modes == {"seq-rm", "checkpoint"} and any("snapshots" in n for n in rep.notes)
        assert deep["rollback_mode"] == "seq-rm"
    else:  # a hybrid: its n_rs_seq snapshots and the checkpoint; seq-rm refused, and said so
        assert modes == {"snapshots", "checkpoint"} and any("seq-rm" in n for n in rep.notes)
        snap = rows[("rollback-modes", "snapshots")].counts["mechanisms"]
        assert snap.get("n_rs_seq", 0) > 0, snap
        ckpt = rows[("rollback-modes", "checkpoint")].counts["mechanisms"]
        assert ckpt.get("checkpoint", 0) > 0 and ckpt.get("replay", 0) > 0, ckpt
        # the deep rollback ran in snapshots mode and fell back to the checkpoint for what no snapshot kept
        assert deep["rollback_mode"] == "snapshots" and deep["mechanisms"].get("checkpoint", 0) > 0


@pytest.mark.parametrize("model", MODELS)
def test_a_stale_state_after_a_zero_draft_round_reads_state(targets, model):
    be = PlantedBackend(get_backend("llama.cpp"), name="planted-stale")
    register_backend("planted-stale", lambda: be)
    try:
        rep = probe(targets[model], backend="planted-stale", triggers=["zero-after-accept"])
    finally:
        unregister_backend("planted-stale")
    (row,) = rep.rows
    assert sum(p.fired for p in be.engines) >= 2  # the speculative arm and its control each read it
    assert row.result == STATE and row.reached, row.evidence
    assert row.control["identical"] is False and row.control["vanilla_repeats"] is True
