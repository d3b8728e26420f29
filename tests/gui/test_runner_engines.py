"""Runs, matrices and re-runs go through the chosen engine's runner, with every setting the run had.

A fake engine registered through the same door as the real ones
(``register_backend``) records each configuration its runner is given.
"""

from __future__ import annotations

import pytest
from synthetic import synthetic_trace
from PySide6.QtWidgets import QDialog

from specview.core.config import EngineSettings, RunConfig
from specview.core.registry import Backend, Runner, register_backend, unregister_backend
from specview.core.trace import Trace

FAKE = "fake-engine"


class FakeRunner(Runner):
    def __init__(self, engine: "FakeBackend"):
        self.engine = engine
        self.runs: list[RunConfig] = []
        self.diagnosed: list[RunConfig] = []
        self.closed = False

    def run(self, cfg, *, on_event=None, cancel=None, reuse_vanilla=True) -> Trace:
        self.runs.append(cfg)
        n = min(cfg.max_tokens, 40)
        trace = synthetic_trace(n, fork=n // 2 if cfg.n_max > 1 else None, n_max=max(1, cfg.n_max))
        trace.config = cfg.to_dict()
        if on_event is not None:
            for st in trace.vanilla.steps:
                on_event("vanilla", st)
            rounds = {r.first_step: r for r in trace.speculative.rounds}
            for st in trace.speculative.steps:
                if st.index in rounds:
                    on_event("speculative", rounds[st.index])
                on_event("speculative", st)
        self.vanilla_runs += 1
        self.speculative_runs += 1
        return trace

    def diagnose(self, trace, cfg, *, controls=False, progress=None, cancel=None) -> dict:
        self.diagnosed.append(cfg)
        return {"verdict": "near-tie", "gap": 0.01, "explanation": f"diagnosed by {FAKE}"}

    def close(self) -> None:
        self.closed = True


class FakeBackend(Backend):
    name = FAKE
    label = "Fake engine"
    model_kind = "gguf"
    in_process = False

    def __init__(self):
        self.runners: list[FakeRunner] = []

    def spec_types(self, settings=None):
        return ["draft-simple", "ngram-simple", "none", "fake-type"]

    def runner(self, *, progress=None) -> FakeRunner:
        r = FakeRunner(self)
        self.runners.append(r)
        return r


@pytest.fixture
def fake_engine():
    backend = FakeBackend()
    register_backend(FAKE, lambda: backend)
    yield backend
    unregister_backend(FAKE)


def test_the_engine_list_and_its_spec_types_come_from_the_registry(fake_engine, make_window):
    w = make_window()
    i = w.engine.findData(FAKE)
    assert i >= 0 and w.engine.itemText(i) == "Fake engine"
    w.engine.setCurrentIndex(i)
    assert w.engine_problem is None
    assert [w.spec_type.itemData(k) for k in range(w.spec_type.count())] == fake_engine.spec_types()


def test_a_run_goes_through_the_chosen_engines_runner(fake_engine, make_window, qtbot):
    w = make_window()
    w.set_controls(backend=FAKE, max_tokens=30, n_max=3, diagnose=True)
    with qtbot.waitSignal(w.sigTraceShown, timeout=10_000) as blk:
        w.run_button.click()
    trace = blk.args[0]
    (runner,) = fake_engine.runners
    assert w.host.worker.runner is runner
    assert runner.runs == [w.build_config()] and runner.diagnosed == runner.runs
    assert trace.diagnosis["explanation"] == f"diagnosed by {FAKE}" and "near-tie" in w.verdict.text()
    assert w.panes.vanilla.text() == trace.vanilla.text and w.panes.speculative.text() == trace.speculative.text


def test_run_matrix_goes_through_the_chosen_engines_runner(fake_engine, make_window, qtbot, monkeypatch, tmp_path):
    """Run > Run matrix with an engine other than llama.cpp: every cell runs on that engine's runner
    (the matrix used to be handed an in-process session whatever the engine, and failed with "unknown engine")."""
    from specview.gui.matrix import MatrixDialog

    def accept(dlg):
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(MatrixDialog, "exec", accept)
    w = make_window()
    w.set_controls(backend=FAKE, target="demo:Q8_0", draft="demo:Q4_0", n_max=3, max_tokens=24, diagnose=True)
    with qtbot.waitSignal(w.sigMatrixFinished, timeout=30_000) as blk:
        w.act_matrix.trigger()
    doc = blk.args[0].doc
    (runner,) = fake_engine.runners
    assert w.host.worker.runner is runner and not runner.closed  # the worker keeps its runner for the next run
    assert doc["status"] == "complete" and len(doc["cells"]) == doc["n_cells"] == len(runner.runs) > 1
    assert all(c["status"] == "ok" for c in doc["cells"]), [c.get("error") for c in doc["cells"]]
    assert {cfg.backend for cfg in runner.runs} == {FAKE}
    assert {c["config"]["backend"] for c in doc["cells"]} == {FAKE}
    forked = [c for c in doc["cells"] if not c["identical"]]
    assert forked and all(c["verdict"] == "near-tie" for c in forked)  # diagnosed by the same runner
    assert len(runner.diagnosed) == len(forked)


@pytest.mark.parametrize("engine", [{"n_batch": 128}, {"n_ubatch": 1}, {"kv_type": "q8_0"},
                                    {"n_batch": 128, "n_ubatch": 1, "kv_type": "q8_0", "threads": 2}])
def test_a_reopened_trace_runs_again_with_its_own_settings(fake_engine, make_window, qtbot, tmp_path, engine):
    cfg = RunConfig(backend=FAKE, target="demo:Q4_K_M", prompt="Tell me about the cat.", max_tokens=20, n_max=5,
                    p_min=0.125, engine=EngineSettings(**engine))
    trace = synthetic_trace(20, fork=None)
    trace.config = cfg.to_dict()
    path = trace.save(tmp_path / "t.json")
    w = make_window()
    w.set_controls(backend="llama.cpp", n_max=2)  # the controls show something else first
    with qtbot.waitSignal(w.sigTraceShown, timeout=5000):
        w.open_trace(path)
    assert w.build_config() == cfg
    with qtbot.waitSignal(w.sigTraceShown, timeout=10_000):
        w.run_button.click()
    (runner,) = fake_engine.runners
    assert runner.runs == [RunConfig.from_dict(trace.config)]
    for key, value in engine.items():
        assert getattr(runner.runs[0].engine, key) == value


def test_a_reopened_token_id_trace_runs_on_those_ids(fake_engine, make_window, qtbot, tmp_path):
    cfg = RunConfig(backend=FAKE, prompt=None, prompt_tokens=(1, 270, 280, 290), chat=False, max_tokens=16)
    trace = synthetic_trace(16, fork=None)
    trace.config = cfg.to_dict()
    trace.prompt = {"text": None, "chat": False, "raw_tokens": True, "tokens": [1, 270, 280, 290]}
    path = trace.save(tmp_path / "ids.json")
    w = make_window()
    with qtbot.waitSignal(w.sigTraceShown, timeout=5000):
        w.open_trace(path)
    with qtbot.waitSignal(w.sigTraceShown, timeout=10_000):
        w.run_button.click()
    (runner,) = fake_engine.runners
    assert runner.runs[0].prompt_tokens == (1, 270, 280, 290) and runner.runs[0].prompt is None
    assert runner.runs[0] == cfg


def test_a_reopened_trace_reruns_identically_on_llama_cpp(tiny_dir, make_window, qtbot, tmp_path):
    """The real engine: a trace made with -b 128 -ub 1 --kv-type bf16 -fa off on raw token ids, opened and run again,
    is the same run (same settings, same prompt ids, same tokens)."""
    from specview.core.registry import Runner
    from specview.core.session import Session

    cfg = RunConfig(target=str(tiny_dir / "target.gguf"), draft=str(tiny_dir / "draft.gguf"), n_max=3,
                    prompt=None, prompt_tokens=(1, 270, 280, 290), chat=False, max_tokens=24, ignore_eos=True,
                    engine=EngineSettings(n_batch=128, n_ubatch=1, kv_type="bf16", flash_attn="off", threads=1))
    with Session() as s:
        first = s.run(cfg)
    path = first.save(tmp_path / "tiny.json")
    w = make_window()
    w.diagnose.setChecked(False)
    with qtbot.waitSignal(w.sigTraceShown, timeout=5000):
        w.open_trace(path)
    with qtbot.waitSignal(w.sigTraceShown, timeout=300_000) as blk:
        w.run_button.click()
    again = blk.args[0]
    assert w.last_error is None
    # the traces record the settings as they ran: what cfg left unset, decided for this machine
    assert RunConfig.from_dict(again.config) == Runner.resolve(cfg).config == RunConfig.from_dict(first.config)
    assert again.prompt["tokens"] == [1, 270, 280, 290]
    assert again.vanilla.tokens == first.vanilla.tokens and again.speculative.tokens == first.speculative.tokens
