"""The multi-token decode probe on the real llama.cpp build, and a real planted crash in its worker."""

from __future__ import annotations

import functools

import plants_probe
import pytest

from specview.backends.llama_cpp import probe
from specview.core.config import EngineSettings
from specview.core.doctor import has_amx, is_x86
from specview.core.errors import EngineCrashed, SpecviewError
from specview.core.worker import run_isolated


def amx_cpu() -> bool:
    """Whether this CPU can meet the crash at all (x86 with AMX, as the probe itself asks)."""
    return is_x86() and has_amx()


def real_probe_result() -> dict | None:
    """This build's own probe result on this CPU, whatever ``$SPECVIEW_REPACK_PROBE`` plants: None where the crash
    cannot happen; cached, else measured now in a throwaway worker (:func:`probe.run_probe`)."""
    if not amx_cpu():
        return None
    cached = probe.CACHE.get(probe.identity_key(probe.build_identity()))
    return cached if cached is not None else probe.run_probe()


def test_the_probe_decodes_four_tokens_of_a_quantized_model_in_a_worker():
    """The probe loads a quantized model with repacking on and decodes four tokens in one pass, in a throwaway worker
    as the product runs it (a crash there costs the worker only).  Where the crash is planted, that repacked load is
    refused in the worker before any decode; where this CPU's repacked kernels really crash, the worker dies."""
    decode = functools.partial(run_isolated, probe.probe_multi_token_decode, "demo:Q4_0", timeout=probe.PROBE_TIMEOUT)
    if probe.planted() == "crashed":
        with pytest.raises(SpecviewError, match=r"Q4_0\.gguf was loaded with repacked weights \(.*(CPU_REPACK|AMX).*\) "
                                                r"although \$SPECVIEW_REPACK_PROBE=crashed") as refused:
            decode()
        assert not isinstance(refused.value, EngineCrashed)  # refused at the load, not died at the decode
        assert probe.repack_decision(EngineSettings()).value is True  # and runs here decide no repack
        return
    real = real_probe_result()
    if real is not None and real["crashed"]:
        with pytest.raises(EngineCrashed):
            decode()
        if probe.planted() is None:
            assert probe.repack_decision(EngineSettings()).value is True
        return
    r = decode()
    assert r["ok"] and r["n_tokens"] == 4 and r["finite"]
    assert r["quantization"] == "Q4_0"
    assert r["buffers"] and sum(r["buffers"].values()) > 0  # the weights' buffers, from llama.cpp's load log
    assert r["repacked"] == sorted(b for b in r["buffers"] if b in probe.REPACKED_BUFFERS)


def test_the_probe_through_a_worker(monkeypatch, tmp_path):
    """The real probe (nothing planted: a planted crash would refuse its repacked load) runs in a worker, and what
    happened is cached for this build and CPU."""
    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECVIEW_REPACK_PROBE", raising=False)
    r = probe.run_probe()
    assert "skipped" not in r and r["n_tokens"] == 4
    assert probe.cached_result()["crashed"] is r["crashed"]
    if not amx_cpu():
        assert r["crashed"] is False  # no AMX kernels here: a four-token decode of repacked weights runs fine


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
