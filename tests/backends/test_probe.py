"""The multi-token decode probe on the real llama.cpp build, and a real planted crash in its worker."""

from __future__ import annotations

import functools

import plants_probe

from specview.backends.llama_cpp import probe
from specview.core.config import EngineSettings
from specview.core.worker import run_isolated


def test_the_probe_decodes_four_tokens_of_a_quantized_model():
    r = probe.probe_multi_token_decode("demo:Q4_0")
    assert r["ok"] and r["n_tokens"] == 4 and r["finite"]
    assert r["quantization"] == "Q4_0"


def test_the_probe_through_a_worker(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path))
    r = probe.run_probe()
    assert r["crashed"] is False and r["n_tokens"] == 4
    assert probe.cached_result()["crashed"] is False


def test_a_crash_in_the_worker_is_cached_and_makes_no_repack_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECVIEW_REPACK_PROBE", raising=False)  # the probe cache planted here, not the variable
    monkeypatch.setattr(probe, "probe_needed", lambda flags=None: True)

    def isolate(fn, *args, timeout=None):  # the probe's worker, dying as it does on an AMX CPU
        return run_isolated(plants_probe.segv, timeout=timeout)

    monkeypatch.setattr(probe, "run_probe", functools.partial(probe.run_probe, isolate=isolate))
    d = probe.repack_decision(EngineSettings())
    assert d.setting == "no_repack" and d.value is True and "SIGSEGV" in d.why
    cached = probe.cached_result()
    assert cached["crashed"] is True and cached["signal"] == "SIGSEGV"
    facts = {f.name: f for f in probe.setup_facts("CPU : AVX2 = 1 | AMX_INT8 = 1 |", deep=False)}
    assert facts["amx"].value["build"] is True
    assert facts["repack_probe"].status == "warn" and "CRASHED" in facts["repack_probe"].text
