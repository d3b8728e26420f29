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
    assert w.export_report(blocker / "sub") is None
    assert "could not write the report" in w.verdict.text() and w.verdict_kind == "error"
