"""File > Export Report…: the HTML and Markdown report of the trace on screen, plots drawn on the GUI thread."""

from __future__ import annotations

from html import unescape
from html.parser import HTMLParser

from specview.core.report.facts import headline
from specview.core.verdicts import WORDS as VERDICT_WORDS


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.text: list[str] = []
        self.imgs: list[str] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.imgs.append(dict(attrs).get("src", ""))

    def handle_data(self, data):
        self.text.append(data)


def test_export_report_of_an_opened_trace(synth, make_window, qtbot, tmp_path):
    diag = {"verdict": "near-tie", "gap": 0.012, "explanation": "a near-tie flipped by batched rounding"}
    path = synth(120, fork=70, diagnosis=diag).save(tmp_path / "t.json")
    w = make_window()
    assert not w.act_export.isEnabled()  # nothing to report before a trace is shown
    with qtbot.waitSignal(w.sigTraceShown, timeout=5000):
        w.open_trace(path)
    assert w.act_export.isEnabled()
    out = tmp_path / "report"
    with qtbot.waitSignal(w.sigReportWritten, timeout=30000) as blk:
        written = w.export_report(out)
    assert blk.args[0] == written
    html_file, md_file = out / "report.html", out / "report.md"
    assert written["html"] == html_file and written["markdown"] == md_file
    assert html_file.is_file() and md_file.is_file()
    page = Page()
    page.feed(html_file.read_text(encoding="utf-8"))
    page.close()
    text = " ".join(" ".join(page.text).split())
    assert VERDICT_WORDS["near-tie"] in text  # the verdict, in words
    assert " ".join(unescape(headline(w.trace)).split()) in text
    assert "a near-tie flipped by batched rounding" in text
    # the plots are embedded in the HTML and written beside the Markdown
    assert page.imgs and all(src.startswith("data:image/png;base64,") for src in page.imgs)
    md = md_file.read_text(encoding="utf-8")
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs and all(name in md for name in pngs)
    assert "report written" in w.status_label.text()


def test_export_without_a_trace_or_to_a_bad_folder_is_an_error(synth, make_window, tmp_path):
    w = make_window()
    assert w.export_report(tmp_path / "r") is None
    assert "no trace to report" in w.verdict.text()
    w.show_trace(synth(30, fork=10))
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    verdict = w.verdict.text()
    errors = []
    w.sigError.connect(errors.append)
    assert w.export_report(blocker / "sub") is None
    # said over the window; the verdict bar keeps the run's verdict, which a failed export does not change
    assert w.verdict.text() == verdict and w.verdict_kind != "error"
    box = w.file_error_box
    assert box.isVisible() and box.text() == f"Could not write the report into {blocker / 'sub'}"
    assert box.informativeText().startswith(f"{blocker / 'sub'}: ") and not box.informativeText().startswith("-o")
    assert errors and errors[0].startswith("Could not write the report")
    box.close()
    assert w.save_trace(blocker / "t.json") is None
    assert w.file_error_box.text() == "Could not save the trace" and w.verdict.text() == verdict
    assert w.file_error_box.informativeText() == f"{blocker / 't.json'}: {blocker} is a file, not a folder"
    w.file_error_box.close()
