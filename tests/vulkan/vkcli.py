"""Helpers for the tests on llama.cpp's Vulkan backend (the fixtures are in conftest.py).

They need the shared libraries and llama-server of ``scripts/build-llama-cpp.sh`` (found through
``$SPECVIEW_VULKAN_LIB``, else that script's cache folder) and a Vulkan driver; on a machine without a
GPU, Mesa's lavapipe (``scripts/install-vulkan-deps.sh`` installs it on Debian 12). llama-cpp-python
reads ``LLAMA_CPP_LIB_PATH`` once, when it is imported, so every check runs the ``specview`` CLI in a
process of its own with that variable set (and ``GGML_VK_VISIBLE_DEVICES=0``: ggml-vulkan skips a
CPU-type device unless it is named). Without the build they skip and say how to get it, unless
``SPECVIEW_REQUIRE_VULKAN=1``, where that is a failure.

lavapipe compiles each new shader pipeline the first time a process uses it (minutes for the first
pass of a new width) and keeps it in ``~/.cache/mesa_shader_cache``: the tests share one target, few
tokens and few positions, so a cold cache costs CI minutes, not hours.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from require import missing

from specview.core.paths import cache_dir

VERSION = "0.3.36"
HINT = ("build llama.cpp with Vulkan: `bash scripts/build-llama-cpp.sh` (as root on Debian 12 it installs Mesa's "
        "lavapipe, glslc and the Vulkan headers it needs), or point $SPECVIEW_VULKAN_LIB at a Vulkan build's "
        "folder holding libllama.so and libggml-vulkan.so")


def vulkan_lib() -> Path:
    env = os.environ.get("SPECVIEW_VULKAN_LIB")
    folder = Path(env) if env else cache_dir() / "llama-cpp" / f"{VERSION}-vulkan" / "build" / "bin"
    for name in ("libllama.so", "libggml-vulkan.so", "llama-server"):
        if not (folder / name).exists():
            missing(f"no {name} in {folder}: {HINT}", switch="SPECVIEW_REQUIRE_VULKAN")
    return folder


def vk_env(lib: Path, *, visible: bool = True, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LLAMA_CPP_LIB_PATH"] = str(lib)
    env.pop("GGML_VK_VISIBLE_DEVICES", None)
    if visible:
        env["GGML_VK_VISIBLE_DEVICES"] = "0"
    env.setdefault("SPECVIEW_THREADS", "2")
    env.update(extra)
    return env


def specview(env: dict[str, str], *args: str, timeout: float = 900, ok=(0,)) -> subprocess.CompletedProcess:
    """``python -m specview ARGS`` in its own process; fails the test with its output when the exit is not in ``ok``."""
    res = subprocess.run([sys.executable, "-m", "specview", *args], env=env, capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL)
    if res.returncode not in ok:
        pytest.fail(f"specview {' '.join(args)} exited with {res.returncode}\n--- stdout\n{res.stdout[-4000:]}"
                    f"\n--- stderr\n{res.stderr[-4000:]}", pytrace=False)
    return res


def facts_of(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(f["topic"], f["name"]): f for f in doc["facts"]}
