"""The README's and docs' screenshots, taken from the app in a real window (run it under Xvfb on a server).

    xvfb-run -s '-screen 0 1600x1000x24' python scripts/screenshots.py main docs/screenshots/main.png
    xvfb-run -s '-screen 0 1600x1000x24' python scripts/screenshots.py main docs/screenshots/main-dark.png --theme dark
    xvfb-run -s '-screen 0 1600x1000x24' python scripts/screenshots.py matrix suite.json docs/screenshots/matrix-rates.png
    xvfb-run -s '-screen 0 1600x1000x24' python scripts/screenshots.py kernels kmap.json docs/screenshots/kernels.png
    xvfb-run -s '-screen 0 1600x1000x24' python scripts/screenshots.py locate loc.json docs/screenshots/locate.png
    xvfb-run -s '-screen 0 1600x1000x24' python scripts/screenshots.py quality q/quality.json docs/screenshots/quality.png

``main`` runs the demo (its default target, draft, prompt and length, one thread, diagnosed) and
grabs the window once the verdict is in, the fork in view; ``matrix`` and ``kernels`` open a file
made by ``specview matrix --suite`` or ``specview kernels`` and select its first forked setting or
its Q4_K_M row; ``locate`` opens a file made by ``specview locate --json`` and hovers its first
differing node; ``quality`` opens a ``quality.json`` made by ``specview quality -o DIR`` in the
Quality tab and selects its first changed answer.  Nothing is staged: what the window shows is what
the app computed or read.  The app's settings go to a temporary folder, removed when the shot is taken,
so the user's own are untouched.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["main", "matrix", "kernels", "locate", "quality"])
    ap.add_argument("args", nargs="+", help="[FILE] OUT.png")
    ap.add_argument("--theme", default="light", choices=["light", "dark"])
    ap.add_argument("--size", default="1600x1000")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    src, out = (None, a.args[0]) if a.what == "main" else (a.args[0], a.args[-1])
    width, height = (int(x) for x in a.size.split("x"))

    from PySide6.QtCore import QTimer

    from specview.gui.app import application

    app = application(argv=sys.argv[:1])
    from specview.gui.window import MainWindow

    settings = tempfile.TemporaryDirectory(prefix="specview-shot-")  # removed when the shot is taken
    w = MainWindow(settings_path=Path(settings.name) / "gui.json", preload=False)
    w.auto_run.setChecked(False)
    w.resize(width, height)
    w.apply_theme(a.theme)
    w.set_controls(threads=a.threads)
    w.show()
    status = {"code": 1}

    def grab() -> None:
        app.processEvents()
        if not w.grab().save(out):
            print(f"could not write {out}", file=sys.stderr)
        else:
            print(f"saved {out}")
            status["code"] = 0
        w.close()
        app.quit()

    def failed(message: str) -> None:
        print(f"specview: error: {message}", file=sys.stderr)
        w.close()
        app.quit()

    w.sigError.connect(failed)

    def start() -> None:
        if a.what == "main":
            w.sigTraceShown.connect(lambda _t: QTimer.singleShot(800, grab))
            w.run()
            return
        if a.what == "quality":
            if w.quality_tab.open(src):
                w.tabs.setCurrentWidget(w.quality_tab)
                changed = [i for i, o in enumerate(w.quality_tab.result.items) if o.discordant]
                w.quality_tab.items.selectRow(changed[0] if changed else 0)
                QTimer.singleShot(800, grab)
            return
        if w.open_trace(src) is not None or w.last_error:
            return
        if a.what == "kernels":
            kt = w.kernels_tab
            names = [t.target for t in kt.kmap.targets]
            row = names.index("demo:Q4_K_M") if "demo:Q4_K_M" in names else 0
            kt.view.selectTarget(row, 4 if len(kt.kmap.widths) >= 4 else 0)
        if a.what == "locate":
            plot = w.locate_tab.plot
            plot.hover(plot.series.first if plot.series is not None else None)
        QTimer.singleShot(800, grab)

    QTimer.singleShot(300, start)
    app.exec()
    settings.cleanup()
    return status["code"]


if __name__ == "__main__":
    sys.exit(main())
