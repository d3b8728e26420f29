"""The app on the user's own llama-server: the engine choice, its spec types, a real run, a bad binary."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from require import missing

pytestmark = [pytest.mark.demo]

RUN_TIMEOUT = 300_000


@pytest.fixture(scope="module")
def server_bin() -> str:
    from specview.core.paths import cache_dir

    env = os.environ.get("SPECVIEW_LLAMA_SERVER")
    path = Path(env) if env else cache_dir() / "llama-server" / "0.3.36" / "llama-server"
    if not path.is_file():
        missing(f"no llama-server at {path}: build one with scripts/build-llama-server.sh",
                switch="SPECVIEW_REQUIRE_SERVER")
    return str(path)


def test_a_run_on_the_users_llama_server_fills_both_panes(server_bin, make_window, qtbot):
    w = make_window(settings_path=None)
    w.set_controls(backend="llama-server", server_bin=server_bin, target="demo:Q8_0", draft="demo:Q4_0",
                   spec_type="draft-simple", p_min=1.0, max_tokens=24, diagnose=True,
                   prompt="Write an essay on the importance of sleep for students.", chat=True, threads=1)
    assert w.engine_problem is None
    assert not w.controls["server_bin"].isHidden()
    offered = [w.spec_type.itemData(i) for i in range(w.spec_type.count())]
    assert "draft-mtp" in offered and "ngram-mod" in offered  # the binary's own spec types
    with qtbot.waitSignal(w.sigTraceShown, timeout=RUN_TIMEOUT) as blk:
        w.run()
    trace = blk.args[0]
    assert trace.environment["engine"] == "llama-server"
    assert len(trace.vanilla.tokens) == 24 and trace.comparison.identical  # p_min = 1 drafts nothing
    assert w.panes.vanilla.text() == trace.vanilla.text and w.panes.speculative.text() == trace.speculative.text
    assert "Traceback" not in w.verdict.text()


def test_a_bad_server_binary_is_named_in_the_window(tmp_path, make_window):
    w = make_window(settings_path=None)
    missing = tmp_path / "no-such-llama-server"
    w.set_controls(backend="llama-server", server_bin=str(missing))
    assert w.engine_problem is not None and str(missing) in w.engine_problem
    assert "not available" in w.verdict.text() and str(missing) in w.verdict.text()
    assert w.run() is None and not w.busy
    w.set_controls(backend="llama.cpp")
    assert w.engine_problem is None and w.controls["server_bin"].isHidden()
    offered = [w.spec_type.itemData(i) for i in range(w.spec_type.count())]
    assert offered == ["draft-simple", "ngram-simple", "none"]


def test_run_matrix_runs_every_cell_on_the_users_llama_server(server_bin, make_window, qtbot, tmp_path):
    """Run > Run matrix with the llama-server engine: every cell runs on the server runner (it used to fail
    every cell with "unknown engine", the matrix being handed an in-process session)."""
    from specview.gui.matrix import matrix_spec

    w = make_window(settings_path=None)
    w.set_controls(backend="llama-server", server_bin=server_bin, target="demo:Q8_0", draft="demo:Q4_0",
                   spec_type="draft-simple", max_tokens=16, diagnose=False, chat=True, threads=1,
                   prompt="Write an essay on the importance of sleep for students.")
    assert w.engine_problem is None
    spec = matrix_spec(w.build_config(), ["demo:Q8_0"], ["demo:Q4_0", "none"], [3], diagnose=False)
    with qtbot.waitSignal(w.sigMatrixFinished, timeout=RUN_TIMEOUT) as blk:
        assert w.run_matrix(spec, out_dir=tmp_path / "m") is not None
    doc = blk.args[0].doc
    assert doc["status"] == "complete" and len(doc["cells"]) == doc["n_cells"] == 2
    assert all(c["status"] == "ok" for c in doc["cells"]), [c.get("error") for c in doc["cells"]]
    assert {c["config"]["backend"] for c in doc["cells"]} == {"llama-server"}
    assert all(c["n_vanilla"] == 16 for c in doc["cells"])
    assert type(w.host.worker.runner).__module__.startswith("specview.backends.llama_server")


def test_the_draft_picker_follows_the_spec_type_on_the_demo(server_bin, make_window, tmp_path):
    """draft-eagle3 / dflash / dspark load a draft file too: the picker stays live and takes the demo's own drafter
    of that type; back on draft-simple it is the Q4_0 copy again; a file of the user's own is never replaced."""
    w = make_window(settings_path=None)
    w.set_controls(backend="llama-server", server_bin=server_bin, target="demo:Q4_K_M", draft="demo:Q4_0",
                   spec_type="draft-simple", threads=1)
    c = w.controls

    def choose(spec_type: str) -> str:
        c.spec_type.setCurrentIndex(c.spec_type.findData(spec_type))
        return c.draft.value() if c.draft.isEnabled() else "(disabled)"

    assert choose("draft-dspark") == "demo:dspark"
    assert choose("draft-eagle3") == "demo:eagle3"
    assert choose("ngram-mod") == "(disabled)" and choose("draft-mtp") == "(disabled)"
    assert choose("draft-dflash") == "demo:dflash"
    assert choose("draft-simple") == "demo:Q4_0"
    assert c.state()["draft"] == "demo:Q4_0" and c.state()["spec_type"] == "draft-simple"
    own = str(tmp_path / "my-eagle3.gguf")
    c.draft.set_value(own, emit=True)
    assert choose("draft-eagle3") == own


def test_run_a_preset_streams_its_parts_and_findings_into_the_matrix_tab(server_bin, make_window, qtbot, tmp_path,
                                                                         monkeypatch):
    """Run > Run a report's preset matrix: the preset's cells on llama-server (the preset's engine, whatever the
    panel's), with the panel's threads and binary, and the findings at the head of the Matrix tab's summary."""
    import specview.core.matrix.preset as preset
    from specview.gui import menus

    real = preset.load_preset

    def short(name, models=None):  # the preset as shipped, at 16 tokens a cell
        s = real(name, models)
        s.max_tokens = 16
        return s

    monkeypatch.setattr(preset, "load_preset", short)
    w = make_window(settings_path=None)
    w.set_controls(backend="llama.cpp", server_bin=server_bin, threads=1, diagnose=False)
    assert set(w.act_presets) == {"llama-cpp-dspark", "lfm2-draft"}
    assert "LFM2 record" in w.act_presets["lfm2-draft"].toolTip()
    with qtbot.waitSignal(w.sigMatrixFinished, timeout=RUN_TIMEOUT) as blk:
        assert menus.run_preset(w, "lfm2-draft", out_dir=tmp_path / "m") is not None
    doc = blk.args[0].doc
    assert doc["status"] == "complete" and [c["params"]["part"] for c in doc["cells"]] == [
        "draft", "p-min-1", "n-max-1", "f16", "f16"]
    assert {c["config"]["backend"] for c in doc["cells"]} == {"llama-server"}
    assert {c["config"]["engine"]["threads"] for c in doc["cells"]} == {1}
    shown = w.matrix_tab.summary.text()
    assert shown.startswith("Preset lfm2-draft: the LFM2 record")
    assert "The same with --spec-draft-p-min 1: nothing drafted and identical over 16 tokens" in shown
    assert "\n\n" in shown and shown.split("\n\n")[1].startswith("5 cells: ")  # the findings, then the summary
    assert w.matrix_tab.table.rowCount() == 5 and w.matrix_tab.table.columnCount() == 1
