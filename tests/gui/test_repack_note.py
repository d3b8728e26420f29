"""The app's settings panel says in one line why weights are not repacked when the machine chose it."""

from __future__ import annotations

from types import SimpleNamespace

from specview.backends.llama_cpp import probe
from specview.core.config import EngineSettings, RunConfig
from specview.core.registry import Runner
from specview.gui import settings as gui_settings


def _machine_that_crashed(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECVIEW_REPACK_PROBE", raising=False)  # the probe cache planted here, not the variable
    monkeypatch.setattr(probe, "probe_needed", lambda flags=None: True)
    probe.CACHE.put(probe.identity_key(probe.build_identity()),
                       {"crashed": True, "signal": "SIGSEGV", "exitcode": -11, "n_tokens": 4})


def test_the_app_opens_with_no_repack_and_says_why_where_the_probe_crashed(make_window, monkeypatch, tmp_path):
    _machine_that_crashed(monkeypatch, tmp_path)
    run = gui_settings.default_run()
    assert run["engine"]["no_repack"] is True and "SIGSEGV" in run["decided"]["no_repack"]["why"]
    w = make_window()
    c = w.controls
    c.set_state(run)
    assert c["no_repack"].isChecked()
    assert not c.repack_note.isHidden() and "SIGSEGV" in c.repack_note.text()
    # left alone, the setting stays the machine's: the run resolves it again, and its trace keeps the reason
    assert c.config().engine.no_repack is None
    assert "SIGSEGV" in Runner.resolve(c.config()).why("no_repack")
    c["no_repack"].setChecked(False)  # the user's own choice wins, and no machine reason is left behind
    assert c.repack_note.isHidden()
    assert c.config().engine.no_repack is False
    c["no_repack"].setChecked(True)
    assert c.repack_note.isHidden() and c.config().engine.no_repack is True
    assert Runner.resolve(c.config()).decisions == ()


def test_elsewhere_the_app_opens_with_llama_cpps_default(make_window, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probe, "probe_needed", lambda flags=None: False)
    assert gui_settings.default_run()["engine"]["no_repack"] is False
    w = make_window()
    w.controls.set_state(gui_settings.default_run())
    assert w.controls.repack_note.isHidden()


def test_the_fork_card_names_repack_and_the_cpu_features():
    from specview.gui.card import settings_rows

    cfg = dict(RunConfig(prompt="x", engine=EngineSettings(no_repack=True)).to_dict(),
               decided={"no_repack": {"value": True, "why": "it crashed"}})
    trace = SimpleNamespace(config=cfg, models={}, environment={"cpu": "Xeon",
                                                                 "setup": {"machine.cpu_features": ["AVX-512", "AMX"]}})
    rows = dict(settings_rows(trace))
    assert rows["weight repack"] == "off (--no-repack): it crashed"
    assert rows["CPU"] == "Xeon (AVX-512, AMX)"
