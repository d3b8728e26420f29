"""``specview probe`` through llama-server (``$SPECVIEW_LLAMA_SERVER``): both tiny hybrids and the demo target.

Every trigger runs once per model (one module fixture each), forced with what the server takes: the target's
Q4_0 copy as the drafter that agrees, a model of the same vocabulary with other weights as the one that
disagrees, ``p_min``, ``n_max``, ``-c``, the n-gram types the binary offers, ``-np 2`` for the neighbour.  No row
may read ``state`` on the real server, and the triggers the server is forced into by construction must be
counted as reached.  A cross-sequence leak planted at the HTTP level (``plants_triggers.LeakyProxy``: a real
server cannot be made to leak from outside) must read ``state``, proven by the ``-ub 1`` two-slot control.
Without a server these tests skip (required in CI with ``SPECVIEW_REQUIRE_SERVER=1``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from plants_triggers import LeakyProxy  # noqa: E402
from tinyhybrid import PAIRS, WRITERS, hybrid_pair  # noqa: E402

from test_server import find_binary  # noqa: E402

from specview.backends.llama_server import ServerRunner, neighbours  # noqa: E402
from specview.core.config import EngineSettings  # noqa: E402
from specview.core.probe import NAMES, STATE  # noqa: E402
from specview.core.probe.run import server_rollback  # noqa: E402
from specview.core.probe.server import ServerProbe, probe_server  # noqa: E402
from specview.core.registry import get_backend  # noqa: E402

pytestmark = [pytest.mark.slow]

MODELS = ("qwen35", "lfm2", pytest.param("demo", marks=pytest.mark.demo))
N = 32
#: the long run: 2,000 tokens on the tiny hybrids (their context holds 2,048, which a server does not exceed)
LONG = {"qwen35": 2000, "lfm2": 2000, "demo": 256}
#: forced by construction on any server: each must be reached
FORCED = ("whole-reject", "deep-rollback", "neighbour", "long-run", "rollback-modes")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{model: (target, agreeing drafter, disagreeing drafter)}."""
    d = tmp_path_factory.mktemp("triggers-server")
    out = {}
    for arch in ("qwen35", "lfm2"):
        target, q4 = hybrid_pair(arch, d)
        other = WRITERS[arch](d / f"tiny-{arch}-other.gguf", seed=7, **PAIRS[arch])
        out[arch] = (str(target), str(q4), str(other))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gui"))
    from vocab_copy import write_with_vocab_of  # a width-8 llama with the demo's vocabulary: it disagrees

    be = get_backend("llama.cpp")
    target = be.resolve("demo:Q8_0")
    out["demo"] = (target, be.resolve("demo:Q4_0"), str(write_with_vocab_of(target, d / "demo-other.gguf")))
    return out


def settings(binary: str) -> EngineSettings:
    from door import server_flags

    return EngineSettings(threads=1, server_bin=binary, server_args=" ".join(server_flags()))


@pytest.fixture(scope="module", params=MODELS)
def report(request, models):
    binary = find_binary()
    target, agree, disagree = models[request.param]
    s = settings(binary)
    with ServerRunner() as runner:
        rep = probe_server(runner, target=target, settings=s, n=N, long_n=LONG[request.param], accept_draft=agree,
                           reject_draft=disagree, rollback=server_rollback(target, agree, s))
    return request.param, rep


def test_every_trigger_has_a_row_none_reads_state_and_the_forced_ones_happened(report):
    model, rep = report
    assert {r.trigger for r in rep.rows} == set(NAMES), rep.notes
    for r in rep.rows:
        assert r.engine == "llama-server"
        assert r.result != STATE, (model, r.trigger, r.label, r.evidence)
        if r.trigger in FORCED:
            assert r.reached, (model, r.trigger, r.label, r.evidence)
        if r.first_mismatch is not None:  # a fork: the -ub 1 control ran
            assert r.control is not None and r.control["form"].startswith("ub1-server")


def test_the_server_rows_count_what_their_parameters_forced(report):
    model, rep = report
    by = {r.trigger: r for r in rep.rows}
    assert by["whole-reject"].counts["whole_rejections"] > 0
    assert by["deep-rollback"].counts["deepest_drop"] > 3
    assert by["long-run"].n_tokens == LONG[model]
    nb = by["neighbour"]
    assert nb.counts["neighbour_tokens_during"] > 0 and "-np" in nb.counts["server"]
    assert nb.counts["server"][nb.counts["server"].index("-np") + 1] == "2"
    modes = {r.label for r in rep.rows if r.trigger == "rollback-modes"}
    assert modes == ({"auto (draft-simple)"} if model == "demo" else {"checkpoint (draft-simple)"}), modes


@pytest.mark.parametrize("model", ("qwen35", pytest.param("demo", marks=pytest.mark.demo)))
def test_a_planted_cross_sequence_leak_reads_state(models, model, monkeypatch):
    LeakyProxy.made.clear()
    monkeypatch.setattr(neighbours, "endpoint", LeakyProxy)
    target, _, _ = models[model]
    with ServerRunner() as runner:
        row = ServerProbe(runner, target=target, settings=settings(find_binary()), prompt="the cat and the dog",
                          n=N, long_n=N, n_max=3).neighbour()
    assert sum(p.leaks for p in LeakyProxy.made) >= 2  # beside the neighbour, on both servers
    assert row.result == STATE and row.reached, row.evidence
    assert row.control["form"] == "ub1-server, -np 2" and row.control["identical"] is False


def test_a_two_slot_server_has_two_slots_each_its_context_and_its_own_kv_cache():
    argv = ["-m", "t.gguf", "-c", "512", "-ub", "512", "-np", "1", "--no-repack"]
    out = neighbours.two_slot_argv(argv, {"help_flags": ["--no-kv-unified", "-np"]}, 512)
    assert out[out.index("-np") + 1] == "2" and out[out.index("-c") + 1] == "1024" and "--no-kv-unified" in out
    assert argv[argv.index("-np") + 1] == "1"  # the run's own command line is left as it was
    old = neighbours.two_slot_argv(["-m", "t.gguf"], {"help_flags": []}, 256)
    assert old[old.index("-np") + 1] == "2" and old[old.index("-c") + 1] == "512" and "--no-kv-unified" not in old


def test_a_target_with_mtp_heads_rolls_back_by_snapshots_through_draft_mtp(tmp_path):
    from specview.backends.llama_cpp.quantize import quantize
    from tinyhybrid import write_tiny_qwen35

    target = write_tiny_qwen35(tmp_path / "tiny-qwen35-mtp.gguf", seed=0, n_embd=128, mtp=True)
    agree = quantize(target, tmp_path / "tiny-qwen35-mtp.Q4_0.gguf", "Q4_0", threads=1)
    s = settings(find_binary())
    with ServerRunner() as runner:
        rep = probe_server(runner, target=str(target), settings=s, n=N, long_n=N, accept_draft=str(agree),
                           triggers=["rollback-modes"], rollback=server_rollback(str(target), str(agree), s))
    rows = {r.label: r for r in rep.rows}
    assert set(rows) == {"checkpoint (draft-simple)", "snapshots (draft-mtp)"}, rep.notes
    for r in rows.values():
        assert r.reached and r.result != STATE, (r.label, r.evidence)
    assert rows["checkpoint (draft-simple)"].counts["replays"] > 0
    snap = rows["snapshots (draft-mtp)"].counts
    assert snap["drafted"] > snap["accepted"] and not snap["replays"]  # dropped by n_rs_seq, no replay
