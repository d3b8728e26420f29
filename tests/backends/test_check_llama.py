"""``specview check`` and the backend check before a diagnosis, on real llama.cpp.

A tiny GGUF checked at one thread against two through the command (a sane
pair: every position compared, the same top-1 everywhere), the same command on
a planted broken build (real llama.cpp contexts whose multi-threaded logits
are shifted by one token), and the ``gpu_offload`` fact of the real build
deciding whether a diagnosis checks the backend first.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from specview import cli
from specview.backends.llama_cpp import lib as llama_lib
from specview.backends.llama_cpp.backend import LlamaBackend, LlamaLoaded
from specview.backends.llama_cpp.engine import LlamaEngine
from specview.core import diagnose as dmod
from specview.core.diagnose import reference
from specview.core.config import EngineSettings, RunConfig
from specview.core.registry import get_backend, register_backend, unregister_backend
from specview.core.session import Session
import door

PROMPT = "the cat sat on the"


class ShiftedEngine(LlamaEngine):
    """A real llama.cpp context whose logits come back shifted by one token id: a build that is plainly wrong."""

    def eval(self, tokens, rows):  # type: ignore[no-untyped-def]
        return np.roll(super().eval(tokens, rows), 1, axis=1)


class _ShiftedWhenThreaded(LlamaLoaded):
    def new_engine(self, settings: EngineSettings, n_ctx: int) -> LlamaEngine:
        cls = ShiftedEngine if settings.threads > 1 else LlamaEngine
        return cls(self.model, settings, n_ctx=n_ctx)


class BrokenThreadsLlama(LlamaBackend):
    """The real llama.cpp backend, except that contexts with more than one thread are broken."""

    name = "llama.cpp-broken-threads"

    def load(self, name: str, settings: EngineSettings) -> LlamaLoaded:
        return _ShiftedWhenThreaded(super().load(name, settings).model)


@pytest.fixture()
def broken_backend():
    register_backend(BrokenThreadsLlama.name, BrokenThreadsLlama)
    yield BrokenThreadsLlama.name
    unregister_backend(BrokenThreadsLlama.name)


def check(target, *extra: str, capsys) -> tuple[int, dict[str, Any]]:
    rc = cli.main(["check", "-m", str(target), "-p", PROMPT, "--no-chat", "-n", "8", "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_check_on_a_tiny_gguf_at_one_thread_against_two(tiny_target, capsys):
    rc, r = check(tiny_target, "-t", "2", capsys=capsys)
    assert (rc, r["ok"], r["kind"]) == (0, True, "threads"), r
    assert (r["reference_label"], r["test_label"]) == ("1 thread", "2 threads")
    # every position of the prompt and of the 8 greedy tokens but the last is compared, each with finite logits
    with Session() as s:
        n_prompt = len(s.model("llama.cpp", str(tiny_target), door.settings()).tokenize(PROMPT))
    assert r["totals"]["positions"] == n_prompt + 8 - 1 and r["totals"]["non_finite"] == 0
    # F32 weights: two thread splits round differently only in the last bits
    assert r["totals"]["same_top1"] == 1.0 and r["totals"]["kl_mean"] < 1e-6, r["totals"]
    assert r["problems"] == []


def test_check_flags_a_planted_broken_build_through_the_real_path(tiny_target, broken_backend, capsys):
    rc, r = check(tiny_target, "--engine", broken_backend, "-t", "2", capsys=capsys)
    assert rc == 1 and r["ok"] is False and r["kind"] == "threads", r
    assert r["totals"]["same_top1"] < reference.TOP1_LIMIT and r["totals"]["kl_mean"] > reference.KL_MEAN_LIMIT
    assert any("top-1 token agrees" in p for p in r["problems"]) and any("mean KL" in p for p in r["problems"])
    # the reference side (one thread) is the real, unbroken llama.cpp: the perplexity it reports is the plain one's
    rc, plain = check(tiny_target, "-t", "2", capsys=capsys)
    assert r["totals"]["ppl_reference"] == pytest.approx(plain["totals"]["ppl_reference"], rel=1e-5)


def test_the_real_builds_gpu_offload_fact_is_llama_cpps_own():
    import llama_cpp

    env = get_backend("llama.cpp").environment()
    assert env["gpu_offload"] is bool(llama_cpp.llama_supports_gpu_offload())


def _diagnosed(tiny_target, tiny_draft, gpu_layers: int) -> dict[str, Any]:
    cfg = RunConfig(target=str(tiny_target), draft=str(tiny_draft), prompt=PROMPT, chat=False, max_tokens=16,
                    ignore_eos=True, engine=EngineSettings(threads=1, gpu_layers=gpu_layers))
    with Session() as s:
        trace = s.run(cfg)
        return dmod.diagnose(s, s.resolve(cfg).config, trace)


def test_a_gpu_build_checks_the_backend_before_every_gpu_diagnosis(tiny_target, tiny_draft, monkeypatch):
    """The fact True (as a GPU build of llama-cpp-python reports it): a run with -ngl != 0 is checked first."""
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    monkeypatch.setattr(llama_lib, "_ENV", None)  # the build's facts are read once per process: read them again
    assert get_backend("llama.cpp").environment()["gpu_offload"] is True
    d = _diagnosed(tiny_target, tiny_draft, gpu_layers=-1)
    r = d["reference"]
    assert r is not None and r["kind"] == "gpu-vs-cpu", r
    assert (r["reference_label"], r["test_label"]) == ("CPU (-ngl 0 --no-op-offload)", "GPU (-ngl all)")
    assert r["ok"] is True and r["totals"]["positions"] > 0  # on this CPU build both sides are the CPU
    # -ngl 0 keeps the target on the CPU: nothing to check first
    assert _diagnosed(tiny_target, tiny_draft, gpu_layers=0)["reference"] is None


def test_a_cpu_build_does_not_check_first(tiny_target, tiny_draft, monkeypatch):
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: False)
    monkeypatch.setattr(llama_lib, "_ENV", None)
    assert _diagnosed(tiny_target, tiny_draft, gpu_layers=-1)["reference"] is None
