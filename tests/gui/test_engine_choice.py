"""The Engine combo: llama.cpp GGUF files or MLX model folders, and a clear reason when MLX cannot run."""

from __future__ import annotations

import pytest
from require import require_module

from specview.core import registry
from specview.core.engine import BackendUnavailable

REASON = "MLX is not usable here (ImportError: no mlx in this test). Install it with `pip install 'specview[mlx]'`."


@pytest.fixture
def mlx_unavailable(monkeypatch):
    import specview.backends.mlx.lib as mlx_mod

    def no_mlx():
        raise BackendUnavailable(REASON)

    monkeypatch.setattr(mlx_mod, "_mx", no_mlx)
    monkeypatch.setattr(registry, "_INSTANCES", {})  # no MLX backend made by an earlier test
    return REASON


def test_unavailable_mlx_shows_the_reason_and_the_window_stays_usable(mlx_unavailable, synth, make_window, qtbot):
    w = make_window()
    errors = []
    w.sigError.connect(errors.append)
    assert w.engine.currentData() == "llama.cpp" and w.build_config().backend == "llama.cpp"
    w.engine.setCurrentIndex(w.engine.findData("mlx"))
    assert w.engine_problem == REASON
    assert REASON.split(" (")[0] in w.verdict.text() and "not available" in w.verdict.text()
    assert "Traceback" not in w.verdict.text()
    assert "mlx unavailable" in w.status_label.text()
    # the pickers now take MLX folders
    assert w.target.folder.isHidden() and w.draft.folder.isHidden() and "MLX model folder" in w.target.browse.toolTip()
    # running with it says why, in the window, and submits nothing to the worker
    assert w.run() is None
    assert errors and "mlx engine is not available" in errors[-1] and w.verdict_kind == "error"
    assert not w.busy and w.host.worker.runner is None
    # back to llama.cpp: the window works as before
    w.engine.setCurrentIndex(w.engine.findData("llama.cpp"))
    assert w.engine_problem is None and not w.target.folder.isHidden() and w.build_config().backend == "llama.cpp"
    with qtbot.waitSignal(w.sigTraceShown, timeout=5000):
        w.show_trace(synth(30, fork=12))
    assert "Forked at token 12" in w.verdict.text()


def test_engine_is_remembered_and_restored_from_a_trace(synth, make_window, tmp_path):
    settings = tmp_path / "gui.json"
    w = make_window(settings_path=settings)
    w.set_controls(backend="mlx")
    w.save_settings()
    w2 = make_window(settings_path=settings)
    assert w2.engine.currentData() == "mlx" and w2.build_config().backend == "mlx"
    trace = synth(20, fork=None)
    trace.config["backend"] = "llama.cpp"
    w2.show_trace(trace)
    w2.set_controls_from_trace(trace)
    assert w2.engine.currentData() == "llama.cpp"


def test_run_on_tiny_mlx_folders_fills_both_panes(make_window, qtbot, tmp_path):
    require_module("mlx.core")
    require_module("mlx_lm")
    from specview.backends.mlx import write_random_model

    target = write_random_model(tmp_path / "target", seed=1)
    draft = write_random_model(tmp_path / "draft", seed=2)  # same corpus: the same tokenizer
    w = make_window()
    w.set_controls(backend="mlx", target=str(target), draft=str(draft), spec_type="draft-simple", n_max=3,
                   max_tokens=16, ignore_eos=True, chat=False, prompt="the quick brown fox", diagnose=False,
                   threads=1)
    w.diagnose.setChecked(False)
    assert w.engine_problem is None
    cfg = w.build_config()
    assert cfg.backend == "mlx" and cfg.target == str(target)
    with qtbot.waitSignal(w.sigTraceShown, timeout=300_000) as blk:
        assert w.run() is not None
    trace = blk.args[0]
    assert trace.config["backend"] == "mlx" and w.last_error is None
    v, s = trace.vanilla, trace.speculative
    assert len(v.tokens) == len(s.tokens) == 16
    assert w.panes.vanilla.text() == v.text and w.panes.speculative.text() == s.text
    assert len(w.panes.vanilla.steps) == len(w.panes.speculative.steps) == 16
    assert s.n_drafted > 0 and s.n_accepted + len([r for r in s.rounds]) == len(s.tokens)
