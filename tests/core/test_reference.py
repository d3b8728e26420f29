"""The backend check on synthetic rows and on fake engines: a sane pair passes, a planted broken backend is flagged."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fakes import BrokenBackend, FakeBackend, ToyModel
from specview.core import diagnose as dmod
from specview.core.diagnose import reference as ref
from specview.core.config import EngineSettings, RunConfig
from specview.core.errors import SpecviewError
from specview.core.registry import register_backend, unregister_backend
from specview.core.session import Session

PROMPTS = [("a", [1, 5, 9, 11, 4]), ("b", [1, 7, 3, 30, 2, 8, 12])]


@pytest.fixture(autouse=True)
def backends():
    register_backend("fake", FakeBackend)
    register_backend("broken", BrokenBackend)
    register_backend("broken-cpu", lambda: BrokenBackend(gpu=False, name="broken-cpu"))
    yield
    for n in ("broken", "broken-cpu"):
        unregister_backend(n)


# -- figures on known numbers ------------------------------------------------------------------
def test_kl_top1_and_delta_against_a_hand_computation():
    a = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]], dtype=np.float64)).astype(np.float32)
    b = np.log(np.array([[0.25, 0.5, 0.25], [0.1, 0.2, 0.7]], dtype=np.float64)).astype(np.float32) + 3.0
    c = ref.compare_rows(a, b)
    kl0 = 0.5 * np.log(0.5 / 0.25) + 0.25 * np.log(0.25 / 0.5) + 0.25 * np.log(1.0)
    assert c["kl"][0] == pytest.approx(kl0, abs=1e-6)
    assert c["kl"][1] == pytest.approx(0.0, abs=1e-6)  # a constant shift changes no probability
    assert c["same_top1"].tolist() == [False, True]
    assert c["max_delta"][1] == pytest.approx(3.0, abs=1e-5)
    s = ref.summarize(c["kl"], c["same_top1"], c["max_delta"], c["finite"], [0.1, 0.3], [0.2, 0.2])
    assert s["positions"] == 2 and s["non_finite"] == 0
    assert s["kl_mean"] == pytest.approx(kl0 / 2, abs=1e-6) and s["kl_max"] == pytest.approx(kl0, abs=1e-6)
    assert s["same_top1"] == 0.5
    assert s["ppl_reference"] == pytest.approx(np.exp(0.2)) and s["ppl_test"] == pytest.approx(np.exp(0.2))
    assert ref.problems_of(s) == [f"mean KL divergence {s['kl_mean']:.4g} nats is above the limit "
                                  f"{ref.KL_MEAN_LIMIT:g}", "the top-1 token agrees at only 50.0% of positions "
                                  f"(limit {ref.TOP1_LIMIT:.0%})"]


def test_non_finite_logits_are_counted_and_flagged():
    a = np.zeros((3, 4), dtype=np.float32)
    b = a.copy()
    b[1, 2] = np.nan
    c = ref.compare_rows(a, b)
    assert c["finite"].tolist() == [True, False, True]
    s = ref.summarize(c["kl"], c["same_top1"], c["max_delta"], c["finite"])
    assert s["non_finite"] == 1 and s["kl_mean"] == 0.0 and s["same_top1"] == pytest.approx(2 / 3)
    assert any("not finite" in p for p in ref.problems_of(s))


def test_the_pair_follows_the_build():
    gpu = ref.choose_pair("broken", EngineSettings(gpu_layers=20))
    assert gpu.kind == "gpu-vs-cpu" and gpu.reference.gpu_layers == 0 and gpu.test.gpu_layers == 20
    # the reference is the CPU for every op: without --no-op-offload a GPU build batches >= 32 tokens on the GPU
    assert gpu.reference.no_op_offload is True and gpu.test.no_op_offload is False
    assert gpu.test_label == "GPU (-ngl 20)" and gpu.reference_label == "CPU (-ngl 0 --no-op-offload)"
    cpu = ref.choose_pair("broken", EngineSettings(gpu_layers=0), cpu_count=8)  # the GPU not asked for
    assert cpu.kind == "threads" and (cpu.reference.threads, cpu.test.threads) == (1, 8)
    assert ref.choose_pair("fake", EngineSettings(threads=4), cpu_count=2).test.threads == 4  # the user's -t
    assert ref.choose_pair("fake", EngineSettings(), cpu_count=1).startswith("this is a CPU-only build on one core")
    assert ref.wanted_for(RunConfig(backend="broken", target="0", draft="0", prompt="x"))
    assert not ref.wanted_for(RunConfig(backend="fake", target="0", draft="0", prompt="x"))


# -- whole checks on fake engines ----------------------------------------------------------------
def check(backend: str, settings: EngineSettings = EngineSettings(), **kw):
    session = Session()
    return session, ref.run_check(session, backend=backend, target="3", settings=settings, prompts=PROMPTS,
                                  **kw)


@pytest.fixture
def four_threads(monkeypatch):
    """A run here takes 4 threads (a test lane's share of the cores would otherwise decide, and a lane of one
    core has no thread split to check)."""
    monkeypatch.setenv("SPECVIEW_THREADS", "4")


def test_a_sane_pair_passes_with_every_position_compared(four_threads):
    session, r = check("fake", continuation=10)
    assert r["kind"] == "threads" and r["ok"] is True and r["problems"] == []
    toy = ToyModel(3)
    for (name, toks), p in zip(PROMPTS, r["prompts"]):
        cont = toy.greedy(toks, 10)  # the reference's greedy continuation, computed without an engine
        if 2 in cont:  # stopped at EOS
            cont = cont[: cont.index(2) + 1]
        assert p["name"] == name and p["positions"] == len(toks) + len(cont) - 1
        assert p["kl_mean"] == 0.0 and p["kl_max"] == 0.0 and p["same_top1"] == 1.0 and p["max_logit_delta"] == 0.0
        assert p["ppl_reference"] == p["ppl_test"] is not None
    t = r["totals"]
    assert t["positions"] == sum(p["positions"] for p in r["prompts"])
    assert session.loads == 1  # one thread and all threads share the loaded weights
    json.dumps(r)
    text = ref.format_check(r)
    assert "RESULT  ok" in text and "1 thread" in text


@pytest.mark.parametrize("backend, kind", [("broken", "gpu-vs-cpu"), ("broken-cpu", "threads")])
def test_a_broken_backend_is_flagged(backend, kind):
    _, r = check(backend, settings=EngineSettings(threads=2), continuation=6)
    assert r["kind"] == kind and r["ok"] is False
    t = r["totals"]
    assert t["kl_mean"] > ref.KL_MEAN_LIMIT and t["same_top1"] < ref.TOP1_LIMIT
    assert len(r["problems"]) == 2
    assert t["ppl_test"] > t["ppl_reference"]
    assert "RESULT  BROKEN" in ref.format_check(r)


def test_no_pair_on_one_core_is_said_not_raised():
    session = Session()
    r = ref.run_check(session, backend="fake", target="3", settings=EngineSettings(), prompts=PROMPTS,
                      pair=ref.choose_pair("fake", EngineSettings(), cpu_count=1))
    assert r["ok"] is None and r["skipped"] and r["prompts"] == []
    assert ref.format_check(r).startswith("backend check not run")


def test_bad_input_is_refused_clearly():
    with pytest.raises(SpecviewError, match="at least one prompt"):
        ref.run_check(Session(), backend="fake", target="3", settings=EngineSettings(), prompts=[])
    with pytest.raises(SpecviewError, match="continuation"):
        check("fake", continuation=-1)


# -- inside a diagnosis --------------------------------------------------------------------------
def test_a_diagnosis_on_a_gpu_run_checks_the_backend_first(four_threads):
    cfg = RunConfig(backend="broken", target="3", draft="3:2.0:0.5", prompt="hello there", max_tokens=30,
                    ignore_eos=True)
    session = Session()
    trace = session.run(cfg)
    d = dmod.diagnose(session, session.resolve(cfg).config, trace)  # the run used a GPU: the check runs unasked
    r = d["reference"]
    assert r["kind"] == "gpu-vs-cpu" and r["ok"] is False
    assert r["totals"]["positions"] == len(trace.prompt["tokens"]) + len(trace.vanilla.tokens) - 1
    lines = dmod.format_verdict(d).splitlines()
    assert lines[0].startswith("BACKEND CHECK FAILED") and lines[1].startswith("VERDICT")
    assert d["explanation"].startswith("Before anything else: the backend check failed")


def test_a_cpu_run_checks_the_backend_only_when_asked(four_threads):
    cfg = RunConfig(backend="fake", target="3", draft="3:2.0", prompt="hello", max_tokens=20, ignore_eos=True,
                    engine=EngineSettings(threads=2))
    session = Session()
    trace = session.run(cfg)
    assert dmod.diagnose(session, session.resolve(cfg).config, trace)["reference"] is None
    d = dmod.diagnose(session, session.resolve(cfg).config, trace, reference=True)
    assert d["reference"]["ok"] is True and d["reference"]["test_label"] == "2 threads"
    assert "backend check  ok" in dmod.format_verdict(d)


# -- the command ---------------------------------------------------------------------------------
def test_specview_check_prints_a_table_and_exits_by_the_result(capsys):
    from specview.cli import main

    rc = main(["check", "--engine", "broken", "-m", "3", "-p", "one prompt", "-p", "another", "-n", "5", "-q"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "GPU (-ngl all) against CPU (-ngl 0 --no-op-offload)" in out and "RESULT  BROKEN" in out
    assert "prompt 1" in out and "prompt 2" in out
    rc = main(["check", "--engine", "broken", "-m", "3", "-p", "one prompt", "-n", "5", "-ngl", "0", "-t", "2",
               "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["ok"] is True and r["kind"] == "threads" and r["test_label"] == "2 threads"


def test_specview_check_refuses_bad_input_without_a_traceback(capsys, tmp_path):
    from specview.cli import main

    assert main(["check", "--engine", "fake", "-m", "3", "-f", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt: no such file" in capsys.readouterr().err
    assert main(["check", "--engine", "fake", "-m", "3", "--prompts", "nope"]) == 2
    assert "unknown built-in prompt 'nope'" in capsys.readouterr().err
    assert main(["check", "--engine", "fake", "-m", "3", "-n", "-1"]) == 2
    assert "--continuation must be >= 0" in capsys.readouterr().err
