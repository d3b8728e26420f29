"""SPECVIEW_REPACK_PROBE=crashed makes any CPU decide what one whose repacked kernels crash decides, and finds a
load that did not take that decision: in specview's own loads, in llama-server, and in a test written past the
door (tests/door.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import door
from specview.backends.llama_cpp import plant, probe
from specview.core.config import EngineSettings, RunConfig
from specview.core.errors import SpecviewError
from specview.core.registry import Runner

pytestmark = [pytest.mark.demo]
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def crashed(monkeypatch):
    monkeypatch.setenv(plant.PLANT_VARIABLE, "crashed")


def test_a_planted_crash_decides_no_repack_with_its_reason(crashed):
    r = Runner.resolve(RunConfig(prompt="x"))
    assert r.config.engine.no_repack is True
    assert "SPECVIEW_REPACK_PROBE=crashed" in r.why("no_repack") and "#20824" in r.why("no_repack")
    assert door.no_repack() is True


def test_a_planted_ok_and_an_explicit_repack_decide_nothing(monkeypatch):
    monkeypatch.setenv(plant.PLANT_VARIABLE, "ok")
    assert probe.probe_result() == plant.planted_result() and probe.probe_result()["crashed"] is False
    assert Runner.resolve(RunConfig(prompt="x")).decisions == ()
    monkeypatch.setenv(plant.PLANT_VARIABLE, "crashed")
    r = Runner.resolve(RunConfig(prompt="x", engine=EngineSettings(no_repack=False)))
    assert r.config.engine.no_repack is False and r.decisions == ()  # an explicit value wins


def test_a_misspelt_plant_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(plant.PLANT_VARIABLE, "crash")
    with pytest.raises(SpecviewError, match=r"\$SPECVIEW_REPACK_PROBE='crash': must be one of crashed, ok"):
        Runner.resolve(RunConfig(prompt="x"))


def test_a_repacked_load_is_refused_under_a_planted_crash(crashed, demo_paths):
    """Q4_0's weights are repacked on x86 (the buffer llama.cpp calls CPU_REPACK, or AMX on an AMX build): with the
    crash planted that
    load fails as the first multi-token pass on it would on an AMX CPU, and the plain load works."""
    from specview.backends.llama_cpp import lib
    from specview.backends.llama_cpp.model import LlamaModel

    plain = LlamaModel(demo_paths["Q4_0"], gpu_layers=0, no_repack=True)  # noqa: door - the refusal's own test
    try:
        repacks = [ln for ln in lib.log_lines() if plant.repacked_buffer_line(ln)]
        assert plain.weight_buffers and set(plain.weight_buffers) <= {"CPU", "CPU_Mapped"}, plain.weight_buffers
    finally:
        plain.close()
    assert not repacks  # no repacked buffer without repacking
    try:
        LlamaModel(demo_paths["Q4_0"], gpu_layers=0, no_repack=False)  # noqa: door - the refusal's own test
    except SpecviewError as exc:
        assert any(f"{b} model buffer size" in str(exc) for b in plant.REPACKED_BUFFERS), str(exc)
        assert "SPECVIEW_REPACK_PROBE=crashed" in str(exc)
    else:  # a build or CPU that repacks nothing (an ARM core, a GPU build) has no repacked buffer to refuse
        assert not _this_build_repacks_q4_0(demo_paths["Q4_0"])


def _this_build_repacks_q4_0(path: Path) -> bool:
    """Whether a plain (unplanted) load of ``path`` with repacking on logs a repacked buffer (CPU_REPACK, AMX), in a
    child (a load alone: the AMX crash comes with a multi-token decode)."""
    code = ("import sys; from specview.backends.llama_cpp.model import LlamaModel; "
            "from specview.backends.llama_cpp import lib, plant; m = LlamaModel(sys.argv[1], gpu_layers=0); "
            "print(any(plant.repacked_buffer_line(l) for l in lib.log_lines()))")
    env = {k: v for k, v in os.environ.items() if k != plant.PLANT_VARIABLE}
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
                         timeout=300)
    return out.stdout.strip().endswith("True")


def test_a_test_that_loads_past_the_door_fails_under_a_planted_crash(tmp_path, demo_paths):
    """A test that builds its own C-API model with llama.cpp's default parameters (repacking on) passes on a CPU
    that repacks safely and crashes its lane on one that does not; with the crash planted it fails on every CPU,
    named, while the same test through the door passes."""
    if not _this_build_repacks_q4_0(demo_paths["Q4_0"]):
        pytest.skip("this llama.cpp build repacks no Q4_0 weights here (no CPU_REPACK or AMX buffer to find)")
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "test_past_the_door.py").write_text(textwrap.dedent(f"""
        import llama_cpp as ll
        import door

        PATH = {str(demo_paths["Q4_0"])!r}

        def test_bare_load():
            m = ll.llama_model_load_from_file(PATH.encode(), ll.llama_model_default_params())
            assert m
            ll.llama_model_free(m)

        def test_through_the_door():
            m = door.c_load(ll, PATH)
            assert m
            ll.llama_model_free(m)
        """), encoding="utf-8")
    env = {**os.environ, plant.PLANT_VARIABLE: "crashed", "PYTHONPATH": str(TESTS)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                          "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "test_past_the_door.py::test_bare_load loaded repacked weights past the resolution" in text, text
    # the bare load's test body passed (repacking is safe on this CPU) and its teardown failed it; the door's passed
    assert "2 passed" in text and "1 error" in text and "test_through_the_door" not in text.split("short test")[-1], text


def test_llama_server_on_quantized_weights_without_no_repack_is_refused_under_a_planted_crash(crashed, demo_paths,
                                                                                             tiny_target):
    """llama-server names no weight buffer at its default verbosity, so the file's type says it would repack: a
    quantized target without --no-repack is refused before the server starts; with it, or on F32 weights (which
    no CPU backend repacks), the server starts."""
    from test_server import find_binary

    from specview.backends.llama_server.process import LlamaServer
    from specview.backends.local_server.process import ServerError

    binary = find_binary()

    def server(target, no_repack):
        cfg = RunConfig(prompt="x", engine=EngineSettings(threads=1, n_ctx=256, no_repack=no_repack)).to_dict()
        return LlamaServer.for_run(binary, cfg, target=str(target), draft=None, speculative=False, label="t")

    srv = server(demo_paths["Q4_0"], False)
    with pytest.raises(ServerError, match=r"would repack the quantized weights of .*Q4_0.*SPECVIEW_REPACK_PROBE"):
        srv.start()
    assert srv.proc is None  # refused before anything started
    for target, no_repack in ((demo_paths["Q4_0"], True), (tiny_target, False)):
        with server(target, no_repack) as ok:  # started, and ready
            assert ok.alive()
