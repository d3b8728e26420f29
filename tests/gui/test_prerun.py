"""The checks before a run starts (specview/gui/prerun.py): each refuses with the reason, and the window's Run
goes through them before anything reaches the model worker."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from specview.core.config import DEMO_TARGET, RunConfig
from specview.core.errors import ConfigError, SpecviewError
from specview.gui.prerun import ENGINE_UNAVAILABLE, engine_notice, engine_refusal, focus_setting, form_config, trace_run


def _controls(cfg: RunConfig, refusal: str | None):
    """Controls that describe ``cfg`` and whose catalog answers ``refusal`` for a spec type without a draft."""
    asked = []

    def spec_refusal(target, spec_type):
        asked.append((target, spec_type))
        return refusal

    return SimpleNamespace(config=lambda: cfg, offers=SimpleNamespace(spec_refusal=spec_refusal)), asked


def test_form_config_refuses_a_spec_type_the_target_cannot_run_naming_spec_type():
    cfg = RunConfig(target="t.gguf", spec_type="draft-mtp", prompt="hi")
    controls, asked = _controls(cfg, "t.gguf has no MTP heads")
    with pytest.raises(ConfigError) as exc:
        form_config(controls)
    assert exc.value.setting == "spec_type" and "no MTP heads" in str(exc.value)
    assert asked == [("t.gguf", "draft-mtp")]
    fine, _ = _controls(cfg, None)
    assert form_config(fine) is cfg


def test_form_config_reads_the_demo_targets_header(make_window):
    w = make_window()
    cfg = replace(w.build_config(), target=DEMO_TARGET, spec_type="draft-mtp", draft=None)
    controls = SimpleNamespace(config=lambda: cfg, offers=w.controls.offers)  # the window's own catalog
    with pytest.raises(ConfigError) as exc:
        form_config(controls)
    assert exc.value.setting == "spec_type" and "has no MTP heads" in str(exc.value)
    plain = w.build_config()  # the demo target with its draft model: nothing to refuse
    assert form_config(SimpleNamespace(config=lambda: plain, offers=w.controls.offers)) is plain


def test_focus_goes_to_the_control_a_refusal_names(make_window, qtbot):
    w = make_window()
    w.show()
    w.activateWindow()
    qtbot.waitExposed(w)
    assert focus_setting(w.controls, ConfigError("p_min must be at most 1", setting="p_min"))
    qtbot.waitUntil(lambda: w.controls["p_min"].hasFocus(), timeout=2000)
    assert not focus_setting(w.controls, ConfigError("no target model", setting="target"))  # a picker, no setting
    assert not focus_setting(w.controls, SpecviewError("something else"))
    assert w.controls["p_min"].hasFocus()


def test_engine_refusal_names_the_engine_and_its_reason():
    why = engine_refusal(RunConfig(backend="no-such-engine", prompt="hi"))
    assert why is not None and why.startswith(f"the no-such-engine {ENGINE_UNAVAILABLE}: ")
    assert "unknown engine 'no-such-engine'" in why and "llama.cpp" in why  # the registry's words: what there is
    assert engine_refusal(RunConfig(backend="llama.cpp", prompt="hi")) is None


def test_engine_notice_warns_and_clears_only_its_own_warning():
    warn = engine_notice("mlx", "no <mlx> here", "info", "Ready.")
    assert warn.verdict is not None and warn.verdict[1] == "warn"
    assert "no &lt;mlx&gt; here" in warn.verdict[0] and ENGINE_UNAVAILABLE in warn.verdict[0]
    assert warn.status == "mlx unavailable: no <mlx> here"
    ready = engine_notice("llama.cpp", None, "warn", warn.verdict[0])
    assert ready.verdict == ("Engine llama.cpp ready. Press Run (Ctrl+R / F5).", "info")
    assert ready.status == "engine llama.cpp"
    # another warning (a refused draft, say) stays on screen
    assert engine_notice("llama.cpp", None, "warn", "the draft model is refused").verdict is None
    assert engine_notice("llama.cpp", None, "info", warn.verdict[0]).verdict is None


def test_trace_run_gives_the_run_or_why_not(synth):
    t = synth(20, fork=5)
    cfg, why = trace_run(t)
    assert why is None and cfg == RunConfig.from_dict({**t.config, "prompt": t.prompt["text"]})  # its prompt block
    bad = replace(t, config={**t.config, "p_min": "lots"})
    cfg, why = trace_run(bad)
    assert cfg is None and "cannot be run again here" in why and "p_min" in why


def test_an_engine_message_names_the_app_s_controls_not_its_flags():
    from specview.gui.prerun import in_app_words

    said = ("the prompt is 409 tokens and the run generates up to 48, which needs a context of 461, but the context "
            "is 256 (128 was asked for; the engine rounded it up). Raise --n-ctx to at least 461, or lower "
            "--max-tokens, or shorten the prompt.")
    assert in_app_words(said).endswith("Raise <b>Context</b> to at least 461, or lower <b>Tokens</b>, or shorten "
                                       "the prompt.")
    assert in_app_words("draft-eagle3 runs on llama-server: add --engine llama-server") == \
        "draft-eagle3 runs on llama-server: add <b>Engine</b>: llama-server"
    assert in_app_words("raise --n-batch (and --n-ctx)") == "raise <b>Batch (-b)</b> (and <b>Context</b>)"
    # a quoted command stays as written; a flag the form has no control for, and markup, are left as text
    assert in_app_words("run `specview run --n-ctx 4096` or --bogus <b>") == \
        "run `specview run --n-ctx 4096` or --bogus &lt;b&gt;"
