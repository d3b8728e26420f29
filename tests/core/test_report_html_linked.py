"""The linked HTML file, read as text: hostile token text is escaped, the only scripts are its own, nothing
is fetched, its data block gives back every token, and its plots and tracks say what the trace says."""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser

import pytest

from specview.core.arms.compare import compare_arms
from specview.core.diagnose import tracks
from specview.core.report.linked import linked_html
from specview.core.report.write import write_report
from specview.core.trace import ArmResult, Round, Step, Trace

SCRIPT = "</script><script>alert(1)</script>"
PIECES = [" The", " cat", SCRIPT, " sat", "<!--", " on", "\n", " <img src=x onerror=alert(2)>", " mat", " &amp;"]


class Collect(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str | None]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v) for k, v in attrs]
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def _step(i, tok, *, top, margin, rnd=0, draft=False, T=1, row=0):
    return Step(index=i, token=tok, piece=PIECES[tok % len(PIECES)], pos=10 + i, top_ids=[t for t, _ in top],
                top_logits=[x for _, x in top], margin=margin, round=rnd, from_draft=draft, batch_size=T,
                batch_index=row)


def planted(fork: int = 5, n: int = 10) -> Trace:
    """Vanilla picks token i at step i with a margin of 0.1 * (i + 1); the speculative rows move the runner-up
    by +0.02 and, at ``fork``, past the top-1."""
    vsteps, ssteps = [], []
    for i in range(n):
        m = 0.1 * (i + 1)
        vsteps.append(_step(i, i, top=[(i, 5.0), (i + 1, 5.0 - m), (i + 2, 3.0)], margin=m))
        if i == fork:
            ssteps.append(_step(i, i + 1, top=[(i + 1, 5.0 - m + m + 0.03), (i, 5.0), (i + 2, 3.0)], margin=0.03,
                                rnd=1 + i // 3, draft=True, T=4, row=i % 3))
        else:
            t = i if i < fork else i + 1
            ssteps.append(_step(i, t, top=[(t, 5.0), (t + 1, 5.0 - m + 0.02), (t + 2, 3.0)], margin=m - 0.02,
                                rnd=1 + i // 3, draft=i % 3 != 2, T=4, row=i % 3))
    rounds = [Round(0, 0, 0, 0.0, 1.0, 10, 0), Round(1, 3, 2, 0.1, 1.0, 4, 0, [0, 1, 9]),
              Round(2, 3, 3, 0.1, 1.0, 4, 3, [3, 4, 6]), Round(3, 3, 0, 0.1, 1.0, 4, 6, [1, 1, 1])]
    v = ArmResult("vanilla", [s.token for s in vsteps], "".join(s.piece for s in vsteps), vsteps, [], 1.0, 10.0,
                  9.0, "max_tokens")
    s = ArmResult("speculative", [s.token for s in ssteps], "".join(s.piece for s in ssteps), ssteps, rounds, 1.0,
                  8.0, 7.0, "max_tokens", "draft-simple")
    return Trace(config={"target": "t.gguf", "draft": "d.gguf", "spec_type": "draft-simple", "n_max": 3},
                 environment={}, models={"target": {"file": "t.gguf"}, "draft": {"file": "d.gguf"}},
                 prompt={"text": "p", "tokens": [1, 2, 3]}, vanilla=v, speculative=s,
                 comparison=compare_arms(v, s),
                 diagnosis={"verdict": "near-tie", "rule": "gap-within-envelope", "gap": 0.6,
                            "envelope": {"max": 0.05, "positions": fork, "series": [0.02] * fork + [0.05]}})


def test_hostile_tokens_are_escaped_and_the_only_scripts_are_its_own():
    t = planted()
    page = linked_html(t)
    c = Collect()
    c.feed(page)
    c.close()
    assert c.tags.count("script") == 2 and c.tags.count("img") == 0
    assert not [a for a in c.attrs if a[1].startswith("on")], "an event-handler attribute leaked in"
    assert not [a for a in c.attrs if a[1] in ("src", "href")], "nothing may be fetched"
    csp = next(v for tag, k, v in c.attrs if k == "content" and "default-src" in (v or ""))
    assert "default-src 'none'" in csp and "connect-src" not in csp
    data_block, code = c.scripts
    data = json.loads(data_block)
    assert [s["piece"] for s in data["vanilla"]] == [s.piece for s in t.vanilla.steps]
    assert "<" not in data_block  # no token can close the block or open a comment in it
    assert "alert" not in code
    assert page.count("&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;") >= 2  # both arms show it as text


def test_the_plots_have_a_target_per_token_and_the_tracks_say_what_the_rows_say():
    t = planted(fork=5)
    page = linked_html(t)
    n = len(t.vanilla.steps)
    for plot in ("plot-margins", "plot-track"):
        svg = re.search(f"<svg class=plot id='{plot}'.*?</svg>", page, re.S).group(0)
        assert len(re.findall(r"class=hit data-i='(\d+)'", svg)) == n
        assert svg.count("class=cursor") == 1
    tr = tracks.pair_tracks(t)
    assert len(tr["delta_margin"]) == 6  # the shared prefix and the fork
    for i in range(5):  # the runner-up moved up by 0.02: the margin shrank by 0.02
        assert tr["delta_margin"][i] == pytest.approx(-0.02)
    m = t.vanilla.steps[5].margin
    assert tr["delta_margin"][5] == pytest.approx(-(m + 0.03))  # below minus the margin: the flip
    # KL over the three shared candidates, renormalised, computed here by hand
    lv = [5.0, 4.9, 3.0]
    ls = [5.0, 4.92, 3.0]
    zv, zs = math.log(sum(map(math.exp, lv))), math.log(sum(map(math.exp, ls)))
    want = sum(math.exp(a - zv) * ((a - zv) - (b - zs)) for a, b in zip(lv, ls))
    assert tr["kl"][0] == pytest.approx(want, rel=1e-9)


def test_acceptance_histogram_counts_rounds_by_length_and_position():
    h = tracks.acceptance_histogram(planted().speculative)
    assert h["rounds"] == 3 and h["by_length"] == [1, 0, 1, 1]
    assert [(p["drafted"], p["accepted"]) for p in h["positions"]] == [(3, 2), (3, 2), (3, 1)]
    page = linked_html(planted())
    assert page.count("class='bar drafted'") == 3 and page.count("class='bar accepted'") == 3


def test_the_report_folder_gets_the_linked_file(tmp_path):
    written = write_report(planted(), tmp_path)
    assert written["linked"] == tmp_path / "report-linked.html"
    page = written["linked"].read_text(encoding="utf-8")
    assert "id=fork-card" in page and "Fork card: token 5" in page and "Near-tie density" in page
