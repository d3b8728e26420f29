"""The README's screenshot of the draft picker open on the demo target (run it under Xvfb on a server).

    xvfb-run -s '-screen 0 1600x1000x24' python scripts/screenshot_model_picker.py docs/screenshots/model-picker.png

The app runs with a temporary HOME whose one added models folder holds two
tiny models written like the tests' (``tests/tinymodel.py``): one with the
demo's vocabulary (its tokenizer copied from the shipped demo file) and one
with another; the demo's own copies come from specview's cache as usual.
The window scans, the draft picker is opened on ``demo:Q8_0`` with
draft-simple, and the screen is grabbed around the Run panel and the open
list (the list is a window of its own, so ``QWidget.grab`` would miss it).  Give ``--folder`` to show a folder of your
own models instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fake_folder(home: Path) -> Path:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "gui")]
    from tinymodel import write_tiny_llama
    from vocab_copy import write_with_vocab_of

    from specview.core.demo import shipped_path

    folder = home / "models"
    folder.mkdir(parents=True, exist_ok=True)
    write_with_vocab_of(shipped_path(), folder / "tiny-with-smollm2-vocab.gguf")
    write_tiny_llama(folder / "tiny-llama-other-vocab.gguf")
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="OUT.png")
    ap.add_argument("--folder", help="a folder of models to add (default: two tiny ones written for the shot)")
    ap.add_argument("--theme", default="light", choices=["light", "dark"])
    ap.add_argument("--size", default="1280x820")
    a = ap.parse_args()
    width, height = (int(x) for x in a.size.split("x"))
    scratch = tempfile.TemporaryDirectory(prefix="specview-shot-")  # settings, HOME, the tiny models: removed at the end
    tmp = Path(scratch.name)
    os.environ["SPECVIEW_CONFIG_DIR"] = str(tmp / "config")
    if a.folder is None:
        from specview.core.paths import cache_dir

        os.environ["SPECVIEW_CACHE"] = str(cache_dir())  # the demo's copies stay where they are
        os.environ["HOME"] = str(tmp)
        for var in ("XDG_CACHE_HOME", "OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE"):
            os.environ.pop(var, None)
    folder = Path(a.folder) if a.folder else fake_folder(tmp)

    from PySide6.QtCore import QRect, QTimer
    from PySide6.QtWidgets import QGroupBox

    from specview.core.models import add_folder
    from specview.gui.app import application

    add_folder(str(folder))
    app = application(argv=sys.argv[:1])
    from specview.gui.window import MainWindow

    w = MainWindow(settings_path=tmp / "gui.json", preload=False)
    w.auto_run.setChecked(False)
    w.resize(width, height)
    w.move(0, 0)
    w.apply_theme(a.theme)
    w.set_controls(target="demo:Q8_0", draft="demo:Q4_0", spec_type="draft-simple", threads=1)
    w.show()
    status = {"code": 1}

    def grab() -> None:
        app.processEvents()
        popup = w.draft.view.window()
        dock = w.controls_dock
        box = w.controls.findChild(QGroupBox, "group_models")
        area = QRect(dock.mapToGlobal(dock.rect().topLeft()), box.mapToGlobal(box.rect().bottomRight()))
        area = area.united(popup.frameGeometry()).adjusted(-4, -4, 8, 8).intersected(w.frameGeometry())
        shot = app.primaryScreen().grabWindow(0, area.x(), area.y(), area.width(), area.height())
        if shot.save(a.out):
            print(f"saved {a.out} ({shot.width()}x{shot.height()})")
            status["code"] = 0
        else:
            print(f"could not write {a.out}", file=sys.stderr)
        w.draft.combo.hidePopup()
        w.close()
        app.quit()

    def open_popup(_scan: object) -> None:
        w.draft.combo.setFocus()
        w.draft.combo.showPopup()
        QTimer.singleShot(600, grab)

    w.model_scan.sigScanned.connect(open_popup)
    QTimer.singleShot(120_000, app.quit)
    app.exec()
    scratch.cleanup()
    return status["code"]


if __name__ == "__main__":
    raise SystemExit(main())
