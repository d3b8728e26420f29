"""Fixtures of the discovery tests: the fake stores in a temporary home, and that home made the process's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from stores import build_stores  # noqa: E402


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The stores of :func:`stores.build_stores`, built once per test module (the tests only read them)."""
    return build_stores(tmp_path_factory.mktemp("home"))


@pytest.fixture
def at_home(stores, monkeypatch):
    """The process's HOME, cache and settings folders moved into the fake home (the scan's defaults)."""
    for k, v in stores.env().items():
        monkeypatch.setenv(k, v)
    for k in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    from specview.core.models import names

    monkeypatch.setattr(names, "_last", [])  # no scan of another home is reused
    return stores
