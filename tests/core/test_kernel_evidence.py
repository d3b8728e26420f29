"""The kernel map as evidence: what it predicts for a run, under which matching rules, and what contradicts it.

Maps are computed on the toy engines of test_kernels (a planted kernel switch at a known width) or written as
JSON, so every prediction below follows from a planted fact.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specview.core.config import EngineSettings, RunConfig
from specview.core.kernels.evidence import (DIFFER, NOT_COVERED, NOT_DETERMINISTIC, PROVEN, KernelPrediction,
                                           citation, citation_text, contradiction_text, load_kernel_map, predict,
                                           predict_config, predict_trace)
from specview.core.kernels.map import KernelMap, KernelMapError, kernel_map
from specview.core.registry import Runner
from test_kernels import PROMPTS, toy  # noqa: F401  (the fixture)

FACTS = {"path": "/models/a.gguf", "file": "a.gguf", "file_size": 1000, "quantization": "Q4_K_M", "n_params": 7,
         "vocab_fingerprint": "abc"}


@pytest.fixture()
def switch_at_4(toy):  # noqa: F811
    """A toy target whose passes of 4 rows or more compute other bits: widths 1-3 bit-identical, 4-6 not."""
    return kernel_map(toy, ["dispatch:4:1.0"], PROMPTS, widths=range(1, 7), positions=10, backend="kernels-toy")


def test_n_max_below_the_planted_width_is_proven_and_above_it_differs(switch_at_4):
    km = switch_at_4
    for n in (0, 1, 2):
        p = predict(km, "dispatch:4:1.0", EngineSettings(), n)
        assert p.status == PROVEN, p.reason
        assert p.widths == list(range(1, n + 2)) and p.safe_n_max == 2 and p.row == "dispatch:4:1.0"
        assert p.evidence.startswith(f"{sum(km.targets[0].widths[w].rows for w in p.widths)} rows at widths")
        assert p.contradicts(False) and not p.contradicts(True)
    for n in (3, 5):
        p = predict(km, "dispatch:4:1.0", EngineSettings(), n)
        assert p.status == DIFFER and p.first_differing == 4
        st = km.targets[0].widths[4]
        assert p.identical_share == st.identical_share == 0.0 and p.max_delta == st.max_delta and st.max_delta > 0
        assert p.flips == st.flips and not p.contradicts(False)
        assert "width 4 differing" in p.reason and "what the kernels predict is possible" in p.reason
    # width 7 is not mapped, but width 4 already differs: that decides
    assert predict(km, "dispatch:4:1.0", EngineSettings(), 6).status == DIFFER


def test_widths_the_map_lacks_are_not_covered(toy):  # noqa: F811
    km = kernel_map(toy, ["dispatch:9:1.0"], PROMPTS, widths=range(1, 5), positions=8, backend="kernels-toy")
    assert predict(km, "dispatch:9:1.0", EngineSettings(), 3).status == PROVEN
    p = predict(km, "dispatch:9:1.0", EngineSettings(), 5)
    assert p.status == NOT_COVERED and p.missing == ["widths 5-6 were not mapped for dispatch:9:1.0 (the map has "
                                                     "widths 1-4)"]
    # a serial-verify run verifies one row at a time: width 1 alone, proven wherever the control held
    p = predict(km, "dispatch:9:1.0", EngineSettings(), 12, serial=True)
    assert p.status == PROVEN and p.widths == [1]


def test_a_failed_control_proves_nothing(toy):  # noqa: F811
    km = kernel_map(toy, ["noisy"], PROMPTS[:1], widths=[1, 2], positions=6, backend="kernels-toy")
    p = predict(km, "noisy", EngineSettings(), 1)
    assert p.status == NOT_DETERMINISTIC and "control failed" in p.reason and not p.contradicts(False)


def test_settings_that_change_kernels_must_match(toy):  # noqa: F811
    km = kernel_map(toy, ["dispatch:4:1.0"], PROMPTS, widths=range(1, 4), positions=6, backend="kernels-toy",
                    settings=[EngineSettings(flash_attn="on")])
    assert predict(km, "dispatch:4:1.0", EngineSettings(flash_attn="on"), 2).status == PROVEN
    for other, word in [(EngineSettings(flash_attn="off"), "flash_attn off here, on in the map"),
                        (EngineSettings(flash_attn="on", n_ubatch=1), "n_ubatch 1 here, 512 in the map"),
                        (EngineSettings(flash_attn="on", kv_type="q8_0"), "kv_type q8_0 here, f16 in the map"),
                        (EngineSettings(flash_attn="on", n_batch=64), "n_batch 64 here, 512 in the map")]:
        p = predict(km, "dispatch:4:1.0", other, 2)
        assert p.status == NOT_COVERED and word in p.missing[0], p.missing
    # the context size is not a kernel setting (the map keys its rows without it)
    assert predict(km, "dispatch:4:1.0", EngineSettings(flash_attn="on", n_ctx=4096), 2).status == PROVEN
    # another engine is not covered, whatever its settings
    p = predict(km, "dispatch:4:1.0", EngineSettings(flash_attn="on"), 2, backend="llama-server")
    assert p.status == NOT_COVERED and "kernels-toy engine" in p.missing[0]


def _with_threads(km: KernelMap, setting: int, used: int | None) -> KernelMap:
    d = km.to_json()
    for t in d["targets"]:
        t["settings"]["threads"] = setting
        t["threads_used"] = used
    return KernelMap.from_json(json.loads(json.dumps(d)))


def test_threads_must_be_equal(switch_at_4):
    km = _with_threads(switch_at_4, 1, 1)
    s1, s2 = EngineSettings(threads=1), EngineSettings(threads=2)
    assert predict(km, "dispatch:4:1.0", s1, 2).status == PROVEN
    p = predict(km, "dispatch:4:1.0", s2, 2)
    assert p.status == NOT_COVERED and "1 thread(s), this run with 2" in p.missing[0]
    # threads are compared as used: "all cores" (0) that came to 1 thread is covered by a -t 1 map, and not by -t 2
    assert predict(km, "dispatch:4:1.0", EngineSettings(), 2, threads_used=1).status == PROVEN
    assert predict(km, "dispatch:4:1.0", EngineSettings(), 2, threads_used=2).status == NOT_COVERED
    km0 = _with_threads(switch_at_4, 0, 2)  # a map made with every core of a 2-core machine
    assert predict(km0, "dispatch:4:1.0", s2, 2).status == PROVEN
    assert predict(km0, "dispatch:4:1.0", s1, 2).status == NOT_COVERED
    # unknown on one side: covered, with a caveat that says the threads were not compared
    p = predict(_with_threads(switch_at_4, 0, None), "dispatch:4:1.0", s2, 2)
    assert p.status == PROVEN and any("not compared" in c for c in p.caveats)


def _decided_here() -> EngineSettings:
    """1 thread, every other setting as a run on this machine decides it (no repack where the crash probe crashed,
    or where $SPECVIEW_REPACK_PROBE plants that)."""
    return Runner.resolve_settings(EngineSettings(threads=1), backend="llama.cpp")[0]


def _json_map(target: str, model: dict, *, env: dict | None = None, prompt_tokens: int = 5, positions: int = 16
              ) -> KernelMap:
    """A llama.cpp map of ``target`` made on this machine at 1 thread: its row records the settings as a map here
    decides them (:func:`_decided_here`)."""
    widths = [{"width": w, "rows": 16, "identical": 16, "flips": 0, "max_delta": 0.0, "p95_delta": 0.0}
              for w in (1, 2, 3)]
    decided = _decided_here()
    return KernelMap.from_json({
        "schema": "specview.kernels/1", "backend": "llama.cpp", "widths": [1, 2, 3], "positions": positions,
        "top_k": 8, "prompts": [{"name": "p", "tokens": [1, 2]}], "environment": env or {},
        "targets": [{"target": target, "settings": {"threads": 1, "no_repack": decided.no_repack}, "model": model,
                     "threads_used": 1, "prompts": [{"name": "p", "prompt_tokens": list(range(prompt_tokens)), "tokens": [3],
                                  "positions": positions}], "widths": widths}]})


def test_a_demo_name_and_its_file_are_the_same_target_by_file_facts():
    km = _json_map("demo:Q4_K_M", FACTS)
    s = EngineSettings(threads=1)
    # the same file under its path (the facts decide, whatever the name)
    p = predict(km, "/elsewhere/a.gguf", s, 2, model=dict(FACTS, path="/elsewhere/a.gguf"))
    assert p.status == PROVEN and not any("by name" in c for c in p.caveats)
    # the same name, but another file (re-quantized: another size): not this map's target
    p = predict(km, "demo:Q4_K_M", s, 2, model=dict(FACTS, file_size=999))
    assert p.status == NOT_COVERED and "no row for demo:Q4_K_M" in p.missing[0]
    # without facts the names decide: demo names case-insensitively, or the row's recorded path
    assert predict(km, "demo:q4_k_m", s, 2).status == PROVEN
    assert predict(km, "/models/a.gguf", s, 2).status == PROVEN
    p = predict(km, "/models/b.gguf", s, 2)
    nr = ", nr" if _decided_here().no_repack else ""  # the row's settings, as this machine decided them
    assert p.status == NOT_COVERED and f"the map has demo:Q4_K_M [t 1{nr}]" in p.missing[0]
    assert any("by name only" in c for c in predict(km, "demo:Q4_K_M", s, 2).caveats)


def test_another_build_or_a_longer_run_is_a_caveat_not_a_refusal():
    km = _json_map("demo:Q8_0", FACTS, env={"cpu": "AMD EPYC", "llama_cpp_python": "0.3.36", "os": "x"},
                   prompt_tokens=5, positions=16)
    s = EngineSettings(threads=1)
    p = predict(km, "demo:Q8_0", s, 2, environment={"cpu": "Apple M2", "llama_cpp_python": "0.3.36", "os": "y"},
                reach=100)
    assert p.status == PROVEN
    env = next(c for c in p.caveats if "another machine" in c)
    assert "cpu: AMD EPYC (map) vs Apple M2 (run)" in env and "llama_cpp_python" not in env and "os" not in env
    assert any("reaches KV position 100, the map measured up to 21" in c for c in p.caveats)
    assert p.map_reach == 21 and p.reach == 100
    # a fork beyond the map's positions: a shape the map did not measure is the likelier cause
    beyond = contradiction_text(p, where="cell", fork=80, pieces=(" a", " b"), fork_position=85)
    within = contradiction_text(predict(km, "demo:Q8_0", s, 2), where="cell", fork=3, fork_position=8)
    for t in (beyond, within):
        assert t.startswith("CONTRADICTION: cell forks at token")
        assert "a state bug or a shape the map did not measure" in t
        assert "run `specview run --serial-verify` with these settings" in t and "still different means a state" in t
    assert "beyond the 21 the map measured" in beyond and "A shape the map did not measure is the likelier" in beyond
    assert "a state bug in the loop or its cache" in within and "is the likelier cause" in within
    assert "(' a' vs ' b')" in beyond


def test_the_prediction_round_trips_and_the_map_may_be_given_as_json(switch_at_4, tmp_path):
    d = json.loads(json.dumps(switch_at_4.to_json()))
    p = predict(d, "dispatch:4:1.0", EngineSettings(), 3, map_file="k.json")
    assert p.status == DIFFER and p.map_file == "k.json"
    back = KernelPrediction.from_json(json.loads(json.dumps(p.to_json())))
    assert back.to_json() == p.to_json() and back.status == p.status and back.widths == p.widths
    assert KernelPrediction.from_json({"status": 5, "widths": "x"}).status == NOT_COVERED  # odd values read safely
    cite = citation(switch_at_4, "k.json")
    assert cite["targets"][0]["safe_n_max"] == 2 and cite["widths"] == [1, 2, 3, 4, 5, 6]
    assert "kernel map k.json: widths 1-6, 10 positions of tokens1, tokens2" in citation_text(cite)
    assert "dispatch:4:1.0: n_max ≤ 2 proven" in citation_text(cite)


@pytest.mark.parametrize("content,words", [
    (None, "no such file"),
    ("{", "not valid JSON"),
    ('{"schema": "specview.trace/1"}', "not a specview kernel map"),
    ('{"schema": "specview.kernels/1", "backend": 3}', "malformed kernel map"),
])
def test_a_bad_map_file_is_refused_naming_it(tmp_path, content, words):
    f = tmp_path / "k.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(KernelMapError) as e:
        load_kernel_map(f)
    assert str(f) in str(e.value) and words in str(e.value)


def test_a_run_config_and_a_trace_are_predicted_from_their_own_settings(switch_at_4):
    km = switch_at_4
    cfg = RunConfig(target="dispatch:4:1.0", draft="dispatch:99:0", prompt="x", n_max=2, backend="kernels-toy")
    assert predict_config(km, cfg).status == PROVEN
    assert predict_config(km, replace(cfg, n_max=3)).status == DIFFER
    assert predict_config(km, replace(cfg, n_max=3, serial_verify=True)).widths == [1]
    ngram = replace(cfg, spec_type="ngram-simple", draft=None, ngram_size_m=2)  # drafts up to 2 tokens
    assert predict_config(km, ngram).widths == [1, 2, 3]
    none = replace(cfg, spec_type="none", draft=None)
    assert predict_config(km, none).widths == [1]

    class T:  # a trace whose settings do not read back as a run
        config = {"target": "x", "n_max": -4}
        models = {}
        prompt = {"tokens": [1]}
        environment = {}

    p = predict_trace(km, T())
    assert p.status == NOT_COVERED and "not a valid run" in p.missing[0]
