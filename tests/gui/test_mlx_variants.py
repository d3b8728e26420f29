"""MLX quantization flipping in the app: the variants a user has, and deriving a missing one."""

from __future__ import annotations

from require import require_module


def test_mlx_picker_lists_variants_and_derives_a_missing_precision(make_window, qtbot, tmp_path, monkeypatch):
    require_module("mlx.core")
    require_module("mlx_lm")
    from specview.backends import mlx

    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path / "cache"))  # derived copies land here, not in ~/.cache
    src = mlx.write_random_model(tmp_path / "Tiny-fp32", seed=3)
    w = make_window()
    w.set_controls(backend="mlx", target=str(src), spec_type="none", max_tokens=8, chat=False, diagnose=False)
    picker = w.target
    labels = [picker.quants.itemText(i) for i in range(picker.quants.count())]
    assert not picker.quants.isHidden()
    assert any(c.exists for c in picker.choices)
    missing = [c for c in picker.choices if not c.exists]
    assert [c.quant for c in missing] == ["8bit", "4bit"], labels
    four = next(i for i, c in enumerate(picker.choices) if c.quant == "4bit")
    with qtbot.waitSignal(w.host.worker.sigDerived, timeout=300_000) as blk:
        picker.quants.activated.emit(four)
    derived = blk.args[0].path
    qtbot.waitUntil(lambda: w.target.value() == derived, timeout=10_000)
    q = mlx.folder_quantization(derived)
    assert q["bits"] == 4
    assert any(c.exists and c.path == derived for c in w.target.choices)
    # back on the source folder: the derived copy is offered as a variant, only 8 bits are left to derive
    w.set_controls(target=str(src))
    assert any(c.exists and c.quant.startswith("4bit") and c.path == derived for c in w.target.choices)
    assert [c.quant for c in w.target.choices if not c.exists] == ["8bit"]
