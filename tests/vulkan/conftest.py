"""Fixtures of the Vulkan tests: the build's folder, and an environment that sees a Vulkan device (see vkcli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from require import missing
from vkcli import facts_of, specview, vk_env, vulkan_lib


@pytest.fixture(scope="session")
def vk_lib() -> Path:
    return vulkan_lib()


@pytest.fixture(scope="session")
def env(vk_lib) -> dict[str, str]:
    """The environment of a process that runs llama.cpp on Vulkan0, with a lavapipe device present."""
    e = vk_env(vk_lib)
    res = specview(e, "doctor", "--engine", "llama.cpp", "--quick", "--json", ok=(0, 1))
    devices = facts_of(json.loads(res.stdout))[("llama.cpp", "devices")]["value"]
    if "Vulkan0" not in devices:
        missing(f"the Vulkan build sees no Vulkan device ({devices}): install a Vulkan driver; without a GPU, "
                "Mesa >= 24's lavapipe (`bash scripts/install-vulkan-deps.sh` on Debian 12)",
                switch="SPECVIEW_REQUIRE_VULKAN")
    return e
