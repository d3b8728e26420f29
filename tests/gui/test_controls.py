"""The run controls are generated from the settings' declarations, and a run goes through them unchanged."""

from __future__ import annotations

import json
import re
from pathlib import Path

from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox

from specview.core.config import EngineSettings, RunConfig, declared, typed_default
from specview.core.registry import backend_names


def gui_settings():
    return [(cls, f) for cls in (RunConfig, EngineSettings) for f in declared(cls) if f.metadata.get("gui", True)]


def other_value(f):
    """A value the declaration accepts that is not the default (so a round trip that drops it fails)."""
    d, meta = typed_default(f), f.metadata  # a setting the machine may decide: typed by its plain value
    if f.name == "no_repack":  # the app shows the machine's choice as the control's own: the other one is not it
        from specview.core.config import EngineSettings as _E
        from specview.core.registry import Runner

        return not Runner.resolve_settings(_E(), backend="llama.cpp", measure=False)[0].no_repack
    if isinstance(d, bool):
        return not d
    if meta.get("choices"):
        return [c for c in meta["choices"] if c != d][-1]
    if isinstance(d, int):
        hi = meta.get("max")
        return d + 3 if hi is None or d + 3 <= hi else d - 1
    if isinstance(d, float):
        return 0.375
    return f"/opt/{f.name}/value"


def test_every_declared_setting_has_its_control(make_window):
    w = make_window()
    names = {f.name for _c, f in gui_settings()}
    assert set(w.controls.settings) == names
    assert {"n_batch", "n_ubatch", "kv_type", "serial_verify", "threads", "flash_attn"} <= names
    for _cls, f in gui_settings():
        widget = w.controls[f.name]
        d, meta = typed_default(f), f.metadata
        assert widget.objectName() == f.name
        assert meta["help"] in widget.toolTip()
        if isinstance(d, bool):
            assert isinstance(widget, QCheckBox) and widget.text() == meta["label"]
        elif meta.get("choices"):
            assert isinstance(widget, QComboBox)
            assert [widget.itemData(i) for i in range(widget.count())] == list(meta["choices"])
        elif isinstance(d, int):
            assert isinstance(widget, QSpinBox)
            if meta.get("min") is not None:
                assert widget.minimum() == meta["min"]
            if meta.get("max") is not None:
                assert widget.maximum() == meta["max"]
        elif isinstance(d, float):
            assert isinstance(widget, QDoubleSpinBox)
            assert (widget.minimum(), widget.maximum()) == (meta["min"], meta["max"])
        else:
            assert isinstance(widget, QLineEdit)


def test_settings_for_one_engine_show_only_for_it(make_window):
    w = make_window()
    only = {f.name: f.metadata["only_for"] for _c, f in gui_settings() if f.metadata.get("only_for")}
    assert only, "some setting is declared for one engine only"
    from specview.backends.llama_cpp.lib import builds_backend

    vulkan = builds_backend("vulkan")  # Vulkan's knobs: only where the in-process build has Vulkan
    knobs = {f.name for _c, f in gui_settings() if str(f.metadata.get("env") or "").startswith("GGML_VK_")}
    assert knobs and knobs <= set(only)
    for name in backend_names():
        w.engine.setCurrentIndex(w.engine.findData(name))
        for setting, engines in only.items():
            shown = name in engines and (setting not in knobs or name != "llama.cpp" or vulkan)
            assert w.controls[setting].isHidden() == (not shown), (name, setting)
    assert [w.engine.itemData(i) for i in range(w.engine.count())] == backend_names()


def test_drafting_settings_are_live_only_for_the_spec_types_that_read_them(make_window):
    """n_max, n_min and p_min drive the draft-model family; the n-gram sizes drive ngram-simple; none reads none:
    a control the chosen type ignores is greyed, its tooltip saying which types read it."""
    w = make_window()
    c = w.controls
    draft_knobs, ngram_knobs = ("n_max", "n_min", "p_min"), ("ngram_size_n", "ngram_size_m")
    for st in [c.spec_type.itemData(i) for i in range(c.spec_type.count())]:
        c.spec_type.setCurrentIndex(c.spec_type.findData(st))
        for name in draft_knobs + ngram_knobs:
            live = st == "ngram-simple" if name in ngram_knobs else st not in ("ngram-simple", "none")
            widget = c.settings[name].widget
            assert widget.isEnabled() == live, (st, name)
            assert (f"(the {st} spec type does not read it" in widget.toolTip()) == (not live), (st, name)
    assert {c.spec_type.itemData(i) for i in range(c.spec_type.count())} >= {"draft-simple", "ngram-simple", "none"}


def test_a_run_goes_through_the_controls_unchanged(make_window):
    """Every generated setting set to a non-default value survives set_config -> config."""
    w = make_window()
    kw, eng = {}, {}
    for cls, f in gui_settings():
        if f.metadata.get("only_for"):
            continue  # shown for another engine; checked below on the state
        (kw if cls is RunConfig else eng)[f.name] = other_value(f)
    cfg = RunConfig(target="/models/a/Model.Q4_K_M.gguf", draft="/models/a/Model.Q4_0.gguf", prompt="hello",
                    top_k=13, engine=EngineSettings(**eng), **kw)
    w.controls.set_config(cfg)
    assert w.build_config() == cfg
    # a setting without a control (top_k) and an engine-only one keep their values too
    server = RunConfig(prompt="hi", backend="llama-server", spec_type="none", draft=None,
                       engine=EngineSettings(server_bin="/opt/bin/llama-server", server_args="-ngl 99"))
    w.controls.set_state(server.to_dict())
    st = w.controls.state()
    assert st["engine"]["server_bin"] == "/opt/bin/llama-server" and st["engine"]["server_args"] == "-ngl 99"
    assert st["backend"] == "llama-server"


def test_token_ids_are_a_prompt_of_their_own(make_window, qtbot):
    w = make_window()
    cfg = RunConfig(prompt=None, prompt_tokens=(1, 270, 280, 290), chat=False)
    w.controls.set_config(cfg)
    assert w.prompt_choice.currentText() == "(token ids)" and w.prompt.toPlainText() == "1, 270, 280, 290"
    assert w.build_config() == cfg
    w.prompt.setPlainText("1, 2, x")
    with qtbot.waitSignal(w.sigError, timeout=2000) as blk:
        assert w.run() is None
    assert "'x' is not a token id" in blk.args[0]
    # choosing a built-in prompt leaves token mode
    w.prompt_choice.setCurrentIndex(w.prompt_choice.findText("essay"))
    w.prompt_choice.activated.emit(w.prompt_choice.currentIndex())
    c2 = w.build_config()
    assert c2.prompt_tokens is None and c2.prompt == w.prompts["essay"]


def test_a_bad_value_names_the_setting(make_window, qtbot):
    w = make_window()
    w.controls.set_state({**w.controls.state(), "spec_type": "draft-simple", "draft": None})
    w.draft.set_value("")
    with qtbot.waitSignal(w.sigError, timeout=2000) as blk:
        assert w.run() is None
    assert "draft" in blk.args[0]


def test_settings_written_before_runs_were_stored_whole_still_open(make_window, tmp_path):
    path = tmp_path / "gui.json"
    path.write_text(json.dumps({"engine": "llama.cpp", "target": "/m/x.Q4_K_M.gguf", "n_max": 6, "p_min": 0.5,
                                "flash_attn": "off", "threads": 2, "prompt": "old prompt", "diagnose": False}))
    w = make_window(settings_path=path)
    cfg = w.build_config()
    assert (cfg.target, cfg.n_max, cfg.p_min, cfg.engine.flash_attn, cfg.engine.threads, cfg.prompt) == (
        "/m/x.Q4_K_M.gguf", 6, 0.5, "off", 2, "old prompt")
    assert not w.diagnose.isChecked()
    w.close()
    saved = json.loads(path.read_text())
    assert RunConfig.from_dict(saved["run"]) == cfg


def test_no_gui_code_compares_an_engine_name_with_a_string():
    names = "|".join(re.escape(n) for n in ("llama.cpp", "mlx", "llama-server"))
    pattern = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({names})["']|["']({names})["']\s*(==|!=)""")
    root = Path(__file__).resolve().parents[2] / "specview" / "gui"
    hits = [f"{p.name}:{i}" for p in root.rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line)]
    assert hits == []


def test_a_matrix_around_the_controls_keeps_every_other_setting(make_window):
    """The cell of a Run matrix that has the run's own target, draft and n_max is exactly the run on screen."""
    from specview.core.matrix import cell_config, expand
    from specview.gui.matrix import matrix_spec

    w = make_window()
    cfg = RunConfig(target="demo:Q8_0", draft="demo:Q4_0", n_max=4, n_min=1, p_min=0.25, serial_verify=True,
                    max_tokens=48, ignore_eos=True, top_k=12, prompt="hello there",
                    engine=EngineSettings(n_batch=128, n_ubatch=1, kv_type="q8_0", threads=2, flash_attn="off"))
    w.controls.set_config(cfg)
    spec = matrix_spec(w.build_config(), ["demo:Q8_0", "demo:Q4_K_M"], ["demo:Q4_0", "none"], [1, 4], diagnose=False)
    same = [cell_config(spec, p) for p in expand(spec)
            if p.target == cfg.target and p.drafter == cfg.draft and p.n_max == cfg.n_max]
    assert len(same) == 1
    assert same[0] == cfg
