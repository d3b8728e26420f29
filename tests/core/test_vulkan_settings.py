"""Vulkan's numerics knobs as settings, declared once (no Vulkan build needed)."""

from __future__ import annotations


from specview.core.config import EngineSettings, RunConfig, axes, environment_settings, settings_environment
from specview.core.llama_flags import llama_commands, server_argv

KNOBS = {"vk_disable_mmvq": "GGML_VK_DISABLE_MMVQ", "vk_force_mmvq": "GGML_VK_FORCE_MMVQ",
         "vk_disable_f16": "GGML_VK_DISABLE_F16", "vk_disable_coopmat": "GGML_VK_DISABLE_COOPMAT",
         "vk_visible_devices": "GGML_VK_VISIBLE_DEVICES"}


def test_each_knob_is_declared_once_with_the_variable_ggml_reads():
    assert environment_settings() == KNOBS
    assert EngineSettings().environment() == {}  # nothing set: nothing put in the environment
    on = EngineSettings(vk_disable_mmvq=True, vk_disable_coopmat=True, vk_visible_devices=" 0,1 ")
    assert on.environment() == {"GGML_VK_DISABLE_MMVQ": "1", "GGML_VK_DISABLE_COOPMAT": "1",
                                "GGML_VK_VISIBLE_DEVICES": "0,1"}
    # the trace's config block carries them and gives the same environment back
    again = RunConfig.from_dict(RunConfig(prompt="x", engine=on).to_dict()).engine
    assert again == on and settings_environment(again.to_dict()) == on.environment()
    assert {"vk_disable_mmvq", "vk_force_mmvq", "vk_disable_f16", "vk_disable_coopmat"} <= set(axes())


def test_report_commands_carry_the_knobs_as_an_environment_prefix_and_flags_do_not():
    cfg = RunConfig(prompt="hello", engine=EngineSettings(vk_disable_mmvq=True, vk_visible_devices="0")).to_dict()
    cmds = llama_commands(cfg, {}, {"tokens": [1, 2], "text": "hello", "chat": True})
    for key in ("server_vanilla", "server_speculative", "cli_vanilla", "cli_speculative"):
        assert cmds[key].startswith("GGML_VK_DISABLE_MMVQ=1 GGML_VK_VISIBLE_DEVICES=0 llama-"), cmds[key]
    assert not any("GGML_VK" in a or "vk" in a for a in server_argv(cfg, target="t.gguf", speculative=True))
    plain = llama_commands(RunConfig(prompt="hello").to_dict(), {}, {"tokens": [1], "text": "hello"})
    assert plain["server_vanilla"].startswith("llama-server ")


def test_the_cli_sets_the_knobs():
    import argparse

    from specview.commands.common import add_setting_flags

    p = argparse.ArgumentParser()
    add_setting_flags(p)
    ns = p.parse_args(["--vk-disable-mmvq", "--vk-visible-devices", "0"])
    assert ns.vk_disable_mmvq is True and ns.vk_visible_devices == "0" and ns.vk_force_mmvq is False


def test_the_llama_cpp_engine_asks_its_process_for_them():
    from specview.backends.llama_cpp.backend import LlamaBackend

    st = EngineSettings(vk_force_mmvq=True)
    assert LlamaBackend().worker_env(st) == {"GGML_VK_FORCE_MMVQ": "1"}
    assert LlamaBackend().worker_env(EngineSettings()) == {}


def test_a_kernel_map_row_names_its_knobs():
    from specview.core.kernels.text import settings_label

    labels = {settings_label(EngineSettings(**{k: True})) for k in KNOBS if k != "vk_visible_devices"}
    assert len(labels) == 4 and "" not in labels  # rows of a map over the knobs stay apart
    assert settings_label(EngineSettings(vk_visible_devices="0")) == "vk-devices 0"


def test_the_app_can_tell_a_vulkan_build_from_its_files(tmp_path):
    """The app shows Vulkan's knobs for a Vulkan build only; it tells by the library folder llama-cpp-python would
    load ($LLAMA_CPP_LIB_PATH, else its own), without loading llama.cpp."""
    import os
    import subprocess
    import sys

    probe = ("import sys; from specview.backends.llama_cpp.lib import builds_backend; "
             "print(builds_backend('vulkan'), builds_backend('cuda'), 'llama_cpp' in sys.modules)")
    vk = tmp_path / "vk"
    vk.mkdir()
    (vk / "libggml-vulkan.so").write_bytes(b"")
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (cpu / "libggml-cpu.so").write_bytes(b"")
    for folder, want in ((vk, "True False False"), (cpu, "False False False")):
        env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(folder))
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split() == want.split(), out
