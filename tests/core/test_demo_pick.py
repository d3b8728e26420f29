"""The demo's pick of a quantization that can fork here, on planted probe results."""

from __future__ import annotations


from specview.backends.llama_cpp import demo_pick
from specview.backends.llama_cpp.demo_pick import DemoPick, choose, pick_demo_target
from specview.core.config import DEMO_TARGET, EngineSettings
from specview.core.errors import EngineCrashed


def same(rows=16):
    return {"rows": rows, "identical": rows, "max_delta": 0.0, "deterministic": True}


def diff(rows=4, identical=0, delta=0.09):
    return {"rows": rows, "identical": identical, "max_delta": delta, "deterministic": True}


def test_the_default_is_kept_where_its_verify_rows_differ():
    pick = choose({"Q4_K_M": diff(), "BF16": diff()})
    assert pick.target == DEMO_TARGET and not pick.changed and pick.reason == "" and pick.can_fork


def test_the_first_quantization_that_differs_replaces_a_default_that_cannot_fork():
    pick = choose({"Q4_K_M": same(), "BF16": same(), "F16": diff(delta=0.017), "Q8_0": diff()}, no_repack=True)
    assert pick.target == "demo:F16" and pick.changed and pick.can_fork
    assert pick.reason.startswith("demo:F16 instead of demo:Q4_K_M")
    assert "16 of 16 rows" in pick.reason and "--no-repack" in pick.reason and "0.017" in pick.reason


def test_a_nondeterministic_quantization_is_not_picked():
    shaky = dict(diff(), deterministic=False)  # its width-1 control failed: a difference proves nothing
    pick = choose({"Q4_K_M": same(), "BF16": shaky, "F16": diff()})
    assert pick.target == "demo:F16"


def test_where_none_differs_it_says_so_plainly():
    pick = choose({q: same() for q in demo_pick.CANDIDATES})
    assert pick.target == DEMO_TARGET and not pick.can_fork
    assert pick.reason.startswith("no demo quantization can fork on this build")


def test_the_order_tries_the_default_first():
    assert demo_pick.order("demo:BF16")[0] == "BF16"
    assert demo_pick.order()[0] == "Q4_K_M" and "F32" not in demo_pick.order()


def test_the_pick_is_measured_once_per_build_and_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path))
    calls = []

    def isolate(fn, quants, settings, timeout=None):
        calls.append((quants, settings["no_repack"]))
        return {"Q4_K_M": same(), "BF16": diff()}

    a = pick_demo_target(EngineSettings(no_repack=True, threads=1), isolate=isolate)
    b = pick_demo_target(EngineSettings(no_repack=True, threads=1), isolate=isolate)
    assert a.target == b.target == "demo:BF16" and len(calls) == 1 and calls[0][1] is True
    pick_demo_target(EngineSettings(no_repack=False, threads=1), isolate=isolate)
    assert len(calls) == 2  # other kernels, other answer


def test_a_probe_that_crashes_keeps_the_default_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path))

    def isolate(*a, **kw):
        raise EngineCrashed("the engine's worker process was terminated by SIGSEGV", crash={"signal": "SIGSEGV"})

    pick = pick_demo_target(EngineSettings(), isolate=isolate)
    assert pick.target == DEMO_TARGET and "SIGSEGV" in pick.reason
    assert demo_pick.cached_pick(EngineSettings()) is None  # a crash is not an answer to cache


def test_a_pick_reads_back():
    p = DemoPick(target="demo:BF16", reason="why", probes={"BF16": diff()})
    assert DemoPick.from_json(p.to_json()) == p
