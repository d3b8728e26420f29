"""``specview doctor`` and the setup facts every trace carries."""

from __future__ import annotations

import json
import subprocess
import sys

import door
import llama_cpp
import pytest

from specview.backends.llama_cpp.backend import cpu_features, setup_facts
from specview.backends.llama_cpp.lib import ggml_devices
from specview.backends.llama_cpp.model import layer_placement
from specview.core.config import EngineSettings, RunConfig, default_threads
from specview.core.session import Session

CPU_ONLY = [{"name": "CPU", "description": "a CPU", "type": "CPU"}]
WITH_GPU = CPU_ONLY + [{"name": "Vulkan0", "description": "Radeon 8060S", "type": "GPU"}]


def _by(facts, name):
    found = [f for f in facts if f.name == name]
    assert found, f"no fact {name!r} in {[f.name for f in facts]}"
    return found[0]


def test_a_gpu_asked_for_on_a_build_without_one_is_a_problem_with_the_rebuild_line() -> None:
    facts = setup_facts(EngineSettings(gpu_layers=8), deep=False, devices=CPU_ONLY)
    gpu = _by(facts, "gpu")
    assert gpu.status == "problem"
    assert "-ngl 8" in gpu.text and "without a GPU backend" in gpu.text
    assert 'CMAKE_ARGS="-DGGML_VULKAN=on"' in gpu.advice and "--no-cache-dir" in gpu.advice
    # the same build asked for no GPU has nothing wrong
    assert _by(setup_facts(EngineSettings(gpu_layers=0), deep=False, devices=CPU_ONLY), "gpu").status == "info"


def test_a_gpu_the_build_sees_but_no_layer_reaches_is_a_problem() -> None:
    stuck = setup_facts(EngineSettings(gpu_layers=-1), deep=True, devices=WITH_GPU, placement={"CPU": 31})
    assert _by(stuck, "gpu").status == "ok" and _by(stuck, "gpu").value == ["Vulkan0"]
    off = _by(stuck, "offload")
    assert off.status == "problem" and "31 on CPU of 31 layers" in off.text
    moved = setup_facts(EngineSettings(gpu_layers=-1), deep=True, devices=WITH_GPU,
                        placement={"Vulkan0": 30, "CPU": 1})
    assert _by(moved, "offload").status == "ok"
    assert "30 on Vulkan0, 1 on CPU of 31 layers" in _by(moved, "offload").text


def test_layer_placement_is_read_from_llamas_own_load_log(tiny_target) -> None:
    assert layer_placement(["load_tensors: layer   0 assigned to device CPU, is_swa = 0",
                            "load_tensors: layer   1 assigned to device ROCm0, is_swa = 0", "other"]) == \
        {"CPU": 1, "ROCm0": 1}
    m = door.model(tiny_target, gpu_layers=-1)
    try:
        n_layer = int(m.meta("llama.block_count"))
        placed = m.facts()["layers_on"]
    finally:
        m.close()
    # llama.cpp assigns every block and the output layer; with no GPU device every one stays on the CPU
    assert sum(placed.values()) == n_layer + 1
    if not [d for d in ggml_devices() if d["type"] != "CPU"]:
        assert set(placed) == {"CPU"}


def test_cpu_features_come_from_the_builds_system_info() -> None:
    assert cpu_features("CPU : SSE3 = 1 | AVX = 1 | AVX512 = 0 | LLAMAFILE = 1 | ") == ["SSE3", "AVX", "LLAMAFILE"]


def test_doctor_json_on_this_machine() -> None:
    res = subprocess.run([sys.executable, "-m", "specview", "doctor", "--json", "--engine", "llama.cpp"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode in (0, 1), res.stderr
    doc = json.loads(res.stdout)
    facts = {(f["topic"], f["name"]): f for f in doc["facts"]}
    assert facts[("llama.cpp", "version")]["value"] == llama_cpp.__version__
    assert facts[("machine", "threads")]["value"] == default_threads()
    devices = facts[("llama.cpp", "devices")]["value"]
    assert devices == [d["name"] for d in ggml_devices()]
    placed = facts[("llama.cpp", "offload")]["value"]
    assert sum(placed.values()) > 0
    # exit 1 exactly when something was flagged
    assert (res.returncode == 1) == any(f["status"] in ("warn", "problem") for f in doc["facts"])


@pytest.mark.parametrize("threads", [1])
def test_every_trace_carries_the_setup_it_ran_on(tiny_target, tiny_draft, threads) -> None:
    cfg = RunConfig(target=str(tiny_target), draft=str(tiny_draft), prompt="the cat", chat=False, max_tokens=6,
                    engine=EngineSettings(threads=threads))
    with Session() as s:
        trace = s.run(cfg)
    setup = trace.environment["setup"]
    assert setup["llama.cpp.version"] == llama_cpp.__version__
    assert setup["machine.threads"] == default_threads()
    assert "llama.cpp.offload" not in setup  # the slow check is the doctor's, not every run's
    assert sum(trace.models["target"]["layers_on"].values()) > 0
