"""specview on llama.cpp's real Vulkan backend (Mesa's lavapipe where there is no GPU).

Every check runs the ``specview`` CLI in a process of its own that loads the Vulkan build's libllama
(see conftest.py). One target, few tokens and few positions, so that lavapipe's pipeline compilations
stay few: the demo's Q8_0, whose batched and single-token passes take different kernels on Vulkan
(mul_mm and mul_mat_vec) and whose weights are of one type, so each pass shape compiles one matrix
pipeline where Q4_K_M's mix of Q4_K, Q5_0, Q6_K and Q8_0 tensors compiles four.

lavapipe compiles a pipeline the first time any process uses its shape, and the compiled pipeline is
kept in Mesa's shader cache for every later process, so what a cold cache costs is the set of pass
shapes the whole file takes. Every pass on Vulkan here is one of: the prompt (21 tokens), one token,
the backend check's 28 teacher-forced positions, and the kernel map's widths 8 and 9 (the widest
mul_mat_vec pass and the narrowest mul_mm one; the mul_mat_vec pipeline of a new width costs minutes
on a CPU). A check that would take a shape of its own is given settings that keep to these.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from vkcli import facts_of, specview, vk_env

pytestmark = [pytest.mark.vulkan, pytest.mark.demo, pytest.mark.slow]

TARGET = "demo:Q8_0"
PROMPT = "Write a short essay about the history of the printing press."


def doctor(env: dict[str, str], ngl: str) -> dict:
    res = specview(env, "doctor", "--engine", "llama.cpp", "-ngl", ngl, "--json", ok=(0, 1))
    return facts_of(json.loads(res.stdout))


def on_vulkan(placement: dict[str, int]) -> int:
    return sum(n for dev, n in placement.items() if dev.startswith("Vulkan"))


def test_doctor_names_the_vulkan_device_and_reads_back_where_the_layers_went(env, vk_lib):
    every = doctor(env, "-1")
    assert "Vulkan" in every[("llama.cpp", "backends")]["value"]
    assert str(vk_lib) in every[("llama.cpp", "backends")]["text"]  # it says which libllama it runs
    devices = every[("llama.cpp", "devices")]
    assert "Vulkan0" in devices["value"]
    assert "llvmpipe" in devices["text"] and "no int dot" in devices["text"]  # lavapipe has no integer dot product
    soft = every[("llama.cpp", "software_device")]
    assert soft["value"] == "Vulkan0" and "CPU rasteriser" in soft["text"] and "not a GPU's" in soft["text"]
    gpu = every[("llama.cpp", "gpu")]
    assert gpu["value"] == ["Vulkan0"] and gpu["status"] == "ok" and "no GPU backend" not in gpu["text"]
    placed = every[("llama.cpp", "offload")]["value"]
    assert sum(placed.values()) > 1 and placed.get("Vulkan0") == sum(placed.values()), placed
    assert every[("llama.cpp", "offload")]["status"] == "ok"

    none = doctor(env, "0")[("llama.cpp", "offload")]["value"]
    assert on_vulkan(none) == 0 and sum(none.values()) == sum(placed.values()), none
    three = doctor(env, "3")[("llama.cpp", "offload")]["value"]
    assert three.get("Vulkan0") == 3 and sum(three.values()) == sum(placed.values()), three


def test_doctor_says_when_the_build_has_vulkan_but_sees_no_device(vk_lib):
    hidden = doctor(vk_env(vk_lib, visible=False), "-1")  # lavapipe is skipped unless GGML_VK_VISIBLE_DEVICES names it
    assert "Vulkan" in hidden[("llama.cpp", "backends")]["value"]
    gpu = hidden[("llama.cpp", "gpu")]
    assert gpu["value"] is False and gpu["status"] in ("warn", "problem")
    assert "sees no Vulkan device" in gpu["text"] and "GGML_VK_VISIBLE_DEVICES" in gpu["advice"]
    assert on_vulkan(hidden[("llama.cpp", "offload")]["value"]) == 0


def bounded(check: dict) -> None:
    """Figures of a sane backend: lavapipe runs llama.cpp's own shaders with float activations, the CPU quantizes
    them (Q8_K): close, but not the CPU's arithmetic."""
    assert check["skipped"] is None and check["kind"] == "gpu-vs-cpu", check
    assert check["reference_label"] == "CPU (-ngl 0 --no-op-offload)"  # -ngl 0 alone still batches on the GPU
    tot = check["totals"]
    assert tot["non_finite"] == 0 and tot["positions"] > 20
    assert 0 < tot["kl_mean"] < 0.02 and tot["same_top1"] >= 0.9, tot
    assert 0 < tot["max_logit_delta"] < 10, "bit for bit the CPU's logits: did the test side run on the CPU?"
    assert abs(tot["ppl_test"] / tot["ppl_reference"] - 1) < 0.05, tot


def test_check_vulkan_against_the_cpu(env):
    # --widths 1: the per-width check in passes of one token, a shape the file takes anyway (2 to 4 would each
    # compile mul_mat_vec pipelines of their own)
    res = specview(env, "check", "-m", TARGET, "-p", PROMPT, "-n", "8", "-ngl", "-1", "--widths", "1", "--json")
    check = json.loads(res.stdout)
    bounded(check)
    assert [w["width"] for w in check["widths"]] == [1] and check["widths"][0]["pair"]["positions"] == 7


def test_run_on_vulkan_with_diagnosis_carries_the_gpu_facts(env, tmp_path: Path):
    trace_path = tmp_path / "vk.json"
    # --p-min 1 drafts nothing: identical by construction, so the diagnosis is the backend check a GPU run gets first
    # (a fork's replays would compile shapes of their own); 8 tokens make that check the same 28 positions as
    # test_check_vulkan_against_the_cpu's, and the target as its own drafter takes no pipelines of another quant type
    res = specview(env, "run", "-m", TARGET, "-md", TARGET, "--p-min", "1", "-p", PROMPT, "-n", "8", "-ngl", "-1",
                   "--diagnose", "--json", str(trace_path), ok=(0, 1))
    trace = json.loads(trace_path.read_text())
    envd = trace["environment"]
    vk = [d for d in envd["ggml_devices"] if d["name"] == "Vulkan0"]
    assert vk and vk[0].get("software") is True and "llvmpipe" in vk[0]["description"]
    assert envd["ggml_env"].get("GGML_VK_VISIBLE_DEVICES") == "0"
    layers = trace["models"]["target"]["layers_on"]
    assert layers.get("Vulkan0") == sum(layers.values()) > 1, layers
    ref = trace["diagnosis"]["reference"]  # a GPU run's diagnosis checks the backend against the CPU first
    assert ref is not None
    bounded(ref)
    assert "backend check" in res.stdout + res.stderr

    out = tmp_path / "report"
    specview(env, "report", str(trace_path), "-o", str(out), "--card", str(tmp_path / "card.png"))
    html = (out / "report.html").read_text()
    md = (out / "report.md").read_text()
    for text in (html, md):
        assert "Vulkan0" in text and "llvmpipe" in text
    assert (tmp_path / "card.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


#: the widths mapped: the control and the two either side of ggml-vulkan's boundary, the widest mat-vec width and
#: the narrowest mul_mm one; every other width would compile mul_mat_vec pipelines of its own on lavapipe (minutes
#: for the first pass of a new width, on a cold shader cache)
MAP_WIDTHS = (1, 8, 9)
MAT_VEC = [w for w in MAP_WIDTHS if 1 < w <= 8]


def test_kernel_map_on_vulkan_finds_the_mat_vec_to_mat_mat_boundary(env, tmp_path: Path):
    out = tmp_path / "map.json"
    res = specview(env, "kernels", "-m", TARGET, "-p", PROMPT, "--widths", ",".join(map(str, MAP_WIDTHS)),
                   "--positions", "2", "-ngl", "-1", "-o", str(out))
    print(res.stderr)  # the per-width progress: on a cold shader cache, how long each width's first pass compiled
    kmap = json.loads(out.read_text())
    assert any(d["name"] == "Vulkan0" for d in kmap["environment"]["ggml_devices"])
    (t,) = kmap["targets"]
    widths = {int(s["width"]): s for s in t["widths"]}
    assert tuple(sorted(widths)) == MAP_WIDTHS
    # width 1 is the control: the same single-token pass after a rollback, deterministic on Vulkan too
    assert widths[1]["identical"] == widths[1]["rows"] > 0
    # ggml-vulkan computes up to 8 columns with mul_mat_vec and more with mul_mm: what the map finds has to
    # show it. The mul_mm width differs from the single-token rows, and a mat-vec width is closer to them.
    assert widths[9]["identical"] < widths[9]["rows"] and widths[9]["max_delta"] > 0, widths[9]
    assert MAT_VEC and min(widths[w]["max_delta"] for w in MAT_VEC) < widths[9]["max_delta"], widths
    # progress names the width at hand and counts every pass the map needs (passes_needed), to the last
    done = re.findall(r"kernel map: \S+, \S+: (\d+)/(\d+) passes \(width (\d+)\), .*done in", res.stderr)
    assert len(done) == 1 and done[0][0] == done[0][1] and int(done[0][2]) in MAP_WIDTHS, res.stderr
    from specview.core.kernels.map import passes_needed

    assert int(done[0][1]) == passes_needed(MAP_WIDTHS, 2, 1), res.stderr


def test_llama_server_on_vulkan_with_draft_simple(env, vk_lib, tmp_path: Path):
    trace_path = tmp_path / "server.json"
    # the target's passes on Vulkan keep to the shapes the tests above compiled: the prompt, one token, and verify
    # passes of 9 rows (llama.cpp drafts exactly 8 tokens or none with n_min = n_max = 8); the drafter computes on
    # the CPU (-ngld 0) and no server runs llama.cpp's 2-token warm-up pass
    specview(env, "run", "--engine", "llama-server", "--server-bin", str(vk_lib / "llama-server"), "-m", TARGET,
             "-p", PROMPT, "-n", "12", "-ngl", "-1", "--spec-type", "draft-simple", "--n-max", "8", "--n-min", "8",
             "--server-args", "-ngld 0 --no-warmup", "--no-diagnose", "--json", str(trace_path), ok=(0, 1))
    trace = json.loads(trace_path.read_text())
    server = trace["environment"]["llama_server"]
    assert any("Vulkan0" in d for d in server["devices"]), server
    assert trace["config"]["engine"]["gpu_layers"] == -1
    spec, cmp = trace["speculative"], trace["comparison"]
    assert len(trace["vanilla"]["tokens"]) == 12 and len(spec["tokens"]) == 12
    assert cmp["identical"] == (cmp["first_mismatch"] is None)
    assert spec["n_drafted"] > 0, "the speculative server drafted nothing"


def test_vulkan_knobs_reach_ggml_in_the_engine_process_and_the_report(vk_lib, tmp_path: Path):
    """ggml-vulkan reads GGML_VK_* once, when it starts: the settings must be in the worker's environment before
    llama.cpp loads. Here nothing in the environment shows lavapipe: only the setting can."""
    env = vk_env(vk_lib, visible=False)
    args = ["run", "-m", TARGET, "-p", "Hi", "-n", "2", "-ngl", "0", "--spec-type", "none", "--no-diagnose", "-q"]
    specview(env, *args, "--json", str(tmp_path / "plain.json"), ok=(0, 1))
    plain = json.loads((tmp_path / "plain.json").read_text())
    assert [d["name"] for d in plain["environment"]["ggml_devices"]] == ["CPU"]

    specview(env, *args, "--vk-visible-devices", "0", "--vk-disable-f16", "--json", str(tmp_path / "knobs.json"),
             ok=(0, 1))
    trace = json.loads((tmp_path / "knobs.json").read_text())
    (vk,) = [d for d in trace["environment"]["ggml_devices"] if d["name"] == "Vulkan0"]
    assert vk["vk_fp16"] == 0  # lavapipe has fp16; GGML_VK_DISABLE_F16 took it away, as ggml-vulkan says
    assert trace["environment"]["ggml_env"]["GGML_VK_VISIBLE_DEVICES"] == "0"
    eng = trace["config"]["engine"]
    assert eng["vk_disable_f16"] is True and eng["vk_visible_devices"] == "0"
    assert trace["models"]["target"]["layers_on"] == {"CPU": sum(trace["models"]["target"]["layers_on"].values())}

    specview(env, "report", str(tmp_path / "knobs.json"), "-o", str(tmp_path / "report"))
    md = (tmp_path / "report" / "report.md").read_text()
    assert "GGML_VK_DISABLE_F16=1 GGML_VK_VISIBLE_DEVICES=0 llama-server" in md

    doc = facts_of(json.loads(specview(env, "doctor", "--engine", "llama.cpp", "--quick", "--json",
                                       "--vk-visible-devices", "0", "--vk-disable-f16", ok=(0, 1)).stdout))
    assert "Vulkan0" in doc[("llama.cpp", "devices")]["value"] and "no fp16" in doc[("llama.cpp", "devices")]["text"]


def _probe_buffers(env: dict[str, str], no_host: bool) -> dict[str, float]:
    """The weight buffers of the repack probe's load of the demo's Q4_0 (nothing decoded), in a process of its own
    with ``env`` (the probe's real load: nothing planted)."""
    import subprocess
    import sys

    code = ("import json, sys; from specview.backends.llama_cpp import probe; "
            "print(json.dumps(probe.probe_buffers('demo:Q4_0', no_host=sys.argv[1] == '1')))")
    env = {k: v for k, v in env.items() if k != "SPECVIEW_REPACK_PROBE"}
    res = subprocess.run([sys.executable, "-c", code, "1" if no_host else "0"], env=env, capture_output=True,
                         text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_repack_probe_loads_as_a_cpu_only_run_does_while_a_gpu_is_visible(env, vk_lib):
    """With a Vulkan device visible llama.cpp keeps a CPU layer's weights in the device's host buffer (mapped from
    the file: CPU_Mapped alone) and repacks none of them, so a probe that loaded that way would pass on an AMX CPU, and its result, cached for the
    build, would clear a CPU-only run of the same build (GGML_VK_VISIBLE_DEVICES unset), whose weights go to the
    repacked buffers that crash. The probe loads past the host buffer: the buffers it exercises are a CPU-only
    run's."""
    from specview.backends.llama_cpp.plant import REPACKED_BUFFERS

    hosted = _probe_buffers(env, no_host=False)
    probed = _probe_buffers(env, no_host=True)
    cpu_only = _probe_buffers(vk_env(vk_lib, visible=False), no_host=False)
    assert hosted and not set(hosted) & set(REPACKED_BUFFERS), hosted  # nothing repacked: no AMX kernel runs
    assert set(cpu_only) & set(REPACKED_BUFFERS), cpu_only  # Q4_0 is repacked on x86 (AVX2: CPU_REPACK; AMX)
    assert set(probed) == set(cpu_only), (probed, cpu_only)  # the probe meets what a CPU-only run meets
