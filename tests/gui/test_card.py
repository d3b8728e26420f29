"""The fork card: drawn offscreen for a forked and an identical trace, written by `specview report --card`,
shown first in the Markdown report, and exported (file and clipboard) from the app."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtGui import QGuiApplication, QImage

from specview import cli
from specview.gui.card import CARD_WIDTH, MAX_HEIGHT, ForkCard, export_card, fork_card_png, fork_highlight

DIAGNOSIS = {"verdict": "near-tie", "rule": "serial-verify-reproduces-vanilla", "gap": 0.0421,
             "serial_verify": {"identical_to_vanilla": True, "n_tokens": 40},
             "envelope": {"max": 0.31, "p95": 0.2, "median": 0.1, "positions": 25},
             "thresholds": {"near_tie": 0.31, "far": 2.0}}


def decode(png: bytes) -> QImage:
    img = QImage.fromData(png, "PNG")
    assert not img.isNull(), "the card is not a readable PNG"
    return img.convertToFormat(QImage.Format.Format_RGB32)


def pixels(img: QImage) -> np.ndarray:
    """The image's pixels as 0xffRRGGBB words, one row per image row."""
    raw = np.frombuffer(bytes(img.constBits()), dtype=np.uint32)
    return raw.reshape(img.height(), img.bytesPerLine() // 4)[:, :img.width()]


def highlighted(img: QImage) -> int:
    return int((pixels(img) == np.uint32(fork_highlight().rgb())).sum())


def check_card(png: bytes) -> QImage:
    img = decode(png)
    assert img.width() == CARD_WIDTH and 300 <= img.height() <= MAX_HEIGHT
    assert len(np.unique(pixels(img))) > 50, "the card looks blank"
    return img


def test_forked_card_marks_the_fork(qapp, synth):
    t = synth(40, 25, diagnosis=DIAGNOSIS)
    img = check_card(fork_card_png(t))
    # the mismatched token's background: a solid run of pixels in the app's fork colour, in both panes
    assert highlighted(img) > 200
    card = ForkCard(t)
    fm = t.comparison.first_mismatch
    for pane, piece in zip(card.panes, (fm.vanilla_piece, fm.speculative_piece)):
        assert pane.steps[pane.mismatch_index].piece == piece
        assert pane.steps[pane.mismatch_index].index == fm.index
    header = card.header.text()
    assert "NEAR-TIE at token 25" in header
    numbers = card.numbers.text()
    assert "IDENTICAL to vanilla over all 40 tokens" in numbers and "0.0421" in numbers
    card.deleteLater()


def test_identical_card_says_so(qapp, synth):
    t = synth(40, None)
    assert t.comparison.identical
    img = check_card(fork_card_png(t))
    assert highlighted(img) == 0
    card = ForkCard(t)
    assert "IDENTICAL over 40 tokens" in card.header.text() and not card.panes
    card.deleteLater()


def test_card_states_the_settings_that_reproduce_the_run(qapp, synth):
    from specview.gui.card import settings_rows

    t = synth(30, 12)
    t.config["threads_used"] = 3
    t.models["target"]["quantization"] = "Q4_K_M"
    t.environment["ggml_devices"] = [{"name": "Vulkan0", "description": "Radeon 8060S"}]
    rows = dict(settings_rows(t))
    assert rows["target"] == "target.gguf (Q4_K_M)" and rows["draft"] == "draft.gguf"
    assert rows["spec type"] == "draft-simple" and rows["n_max / n_min / p_min"] == "3 / 0 / 0.0"
    assert rows["threads used"] == "3" and "Vulkan0 (Radeon 8060S)" in rows["devices"]


@pytest.mark.parametrize("where", ["beside", "elsewhere"])
def test_report_card_is_written_and_shown_first(qapp, synth, tmp_path: Path, where):
    t = synth(40, 25, diagnosis=DIAGNOSIS)
    src = tmp_path / "t.json"
    t.save(src)
    out = tmp_path / "rep"
    argv = ["report", str(src), "-o", str(out), "--card"]
    card = out / "fork-card.png"
    if where == "elsewhere":
        card = tmp_path / "cards" / "bug.png"
        card.parent.mkdir()
        argv.append(str(card))
    assert cli.main(argv) == 0
    check_card(card.read_bytes())
    md = (out / "report.md").read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert images[0] == ("fork-card.png" if where == "beside" else "../cards/bug.png")
    assert (out / images[0]).resolve() == card.resolve()
    assert md.index("![fork card]") < md.index("**Speculative decoding diverges")


def test_report_card_refuses_a_non_png_name(tmp_path: Path, synth, capsys):
    src = tmp_path / "t.json"
    synth(20, 5).save(src)
    assert cli.main(["report", str(src), "-o", str(tmp_path / "o"), "--card", str(tmp_path / "card.txt")]) == 2
    assert "--card" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_without_a_card_renderer_the_report_has_none(tmp_path: Path, synth):
    from specview.core.report.write import write_report

    written = write_report(synth(20, 5), tmp_path / "o")
    assert "card" not in written and "fork card" not in (tmp_path / "o" / "report.md").read_text(encoding="utf-8")


def test_app_exports_the_card_and_copies_it(make_window, synth, tmp_path: Path):
    w = make_window()
    assert not w.act_card.isEnabled()
    w.show_trace(synth(40, 25, diagnosis=DIAGNOSIS))
    assert w.act_card.isEnabled()
    p = export_card(w, tmp_path / "card.png")
    assert p is not None
    img = check_card(p.read_bytes())
    clip = QGuiApplication.clipboard().image()
    assert clip.size() == img.size() and highlighted(clip.convertToFormat(QImage.Format.Format_RGB32)) > 200
