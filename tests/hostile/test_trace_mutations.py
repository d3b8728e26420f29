"""Single-field mutations of a real trace through ``specview report`` and ``specview compare``.

``data/real-trace.json`` is what ``specview run -m demo:Q4_K_M --diagnose`` wrote on the demo (64 tokens of
the built-in essay prompt: real config, environment, models, steps and rounds).  That run came out
identical, so a fork was planted where a natural one would be: the speculative arm's token 3 is vanilla's
top-2 there (' crucial' for ' vital', a margin of 0.057 logits), and the diagnosis is the near-tie a
diagnosis of such a fork writes, every block filled (replays, envelope, thresholds, serial-verify control,
and the departure with its graph record); its sealed ``summary`` was made again for the planted fork.

Every mutation changes one field: a value of another type (a string where a number goes, a number where
text goes, null, a list, an object), a number past any range, a deleted key, or HTML, Markdown or a
backtick fence where text goes.  Each must end in one clean error line naming the file (exit status 2) or
a report that shows the value inert, never a traceback or an internal error (exit status 70), and never a
half-written report.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from specview import cli

REAL = Path(__file__).parent / "data" / "real-trace.json"
SCRIPT = "<script>alert(1)</script>"
MARKDOWN = "</details>`|**x**|`\n# h\n<img src=x onerror=alert(2)>"
FENCE = "x\n```\n\n<script>alert(1)</script>\n\n```\n"  # closes a fixed ``` fence (a model name in a command)
#: what a mutation writes in a field's place (a deleted key is "missing")
VALUES: dict[str, Any] = {
    "string": "x", "null": None, "negative": -1, "huge": 10**400, "big": 2**64, "float": 1e308, "bool": True,
    "list": [], "object": {}, "missing": ..., "script": SCRIPT, "markdown": MARKDOWN, "fence": FENCE,
}
KINDS = list(VALUES)


_DOC: dict[str, Any] = {}


def real() -> dict[str, Any]:
    if not _DOC:
        _DOC.update(json.loads(REAL.read_text(encoding="utf-8")))
    return copy.deepcopy(_DOC)


#: how deep a block's fields are mutated (a path's length, by the longest prefix given): the free-form blocks
#: only at their first levels, where readers pick values out, and a block that repeats another's keys (the
#: draft's model, the vanilla replay) as a whole; the arms and the rest of the diagnosis all the way down
DEPTH = {("environment",): 2, ("summary",): 2, ("models",): 3, ("models", "draft"): 2, ("config",): 3,
         ("diagnosis", "replays", "single"): 3}


def _depth(path: tuple) -> int:
    return next((d for n in range(len(path), 0, -1) if (d := DEPTH.get(path[:n])) is not None), 99)


def _fields(doc: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every field worth mutating, by path: each key of each object, and of each list its first element (of an
    arm's steps the fork's only: a list of 64 steps holds the same keys 64 times)."""
    if path and len(path) >= _depth(path):
        return
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*path, k)
            yield from _fields(v, (*path, k))
    elif isinstance(doc, list) and doc:
        i = _fork() if path[-1:] == ("steps",) and _fork() < len(doc) else 0
        yield (*path, i)
        yield from _fields(doc[i], (*path, i))


def _fork() -> int:
    fm = real()["comparison"]["first_mismatch"]
    return fm["index"] if fm else 0


def get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def mutated(doc: dict[str, Any], path: tuple, kind: str) -> dict[str, Any]:
    parent = get(doc, path[:-1])
    if VALUES[kind] is ...:
        del parent[path[-1]]
    else:
        parent[path[-1]] = copy.deepcopy(VALUES[kind])
    return doc


#: the mutations of each kind of field, taken in turn: a number meets a string first (the issue's
#: max_abs), a text meets markup first (the issue's verdict)
FOR_NUMBER = ["string", "null", "huge", "negative", "big", "bool", "float", "list", "object", "missing"]
FOR_TEXT = ["script", "markdown", "fence", "null", "negative", "list", "object", "bool", "missing"]
FOR_OTHER = ["string", "script", "null", "huge", "list", "object", "bool", "missing", "float"]


def cases() -> list[tuple[str, tuple, str]]:
    """One mutation per field, each kind of field going through its mutations in turn, so that every kind
    meets every part of the trace."""
    doc = real()
    seen = {"number": 0, "text": 0, "other": 0}
    out = []
    for path in _fields(doc):
        v = get(doc, path)
        group = ("number" if isinstance(v, (int, float)) and not isinstance(v, bool) else
                 "text" if isinstance(v, str) else "other")
        kinds = {"number": FOR_NUMBER, "text": FOR_TEXT, "other": FOR_OTHER}[group]
        kind = kinds[seen[group] % len(kinds)]
        seen[group] += 1
        out.append((".".join(map(str, path)) + f"={kind}", path, kind))
    return out


CASES = cases() if REAL.exists() else []


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("good") / "good.json"
    p.write_text(REAL.read_text(encoding="utf-8"), encoding="utf-8")
    return p


@pytest.fixture(scope="module", autouse=True)
def quick():
    """The plots are drawn by the app's widgets from checked values (``test_plots_of_mutated_traces`` draws
    some); the mutations run without them, and without fsync (what is written is checked, not how durably)."""
    import os

    from specview.commands import report

    mp = pytest.MonkeyPatch()
    mp.setattr(report, "plot_renderer", lambda: (lambda trace: {}))
    mp.setattr(os, "fsync", lambda fd: None)
    yield
    mp.undo()


def _clean(rc: int, err: str, path: Path, ok: tuple[int, ...]) -> None:
    assert "Traceback" not in err and "internal error" not in err, err
    assert rc in ok, (rc, err)
    if rc == 2:
        lines = [ln for ln in err.strip().splitlines() if ln.startswith("specview: error: ")]
        assert len(lines) == 1 and str(path) in lines[0], err


def _inert(md: str, html: str) -> None:
    """Neither report lets the markup through: HTML has no element from the trace, and the Markdown rendered
    (as GitHub does, raw HTML allowed) has none either, nor a heading or a fold the trace opened or closed."""
    import markdown_it

    rendered = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    for page in (html, rendered):
        assert "<script" not in page and "<img src=x" not in page
    assert "<h1>h</h1>" not in rendered and rendered.count("<details>") == rendered.count("</details>")


@pytest.mark.parametrize("label,path,kind", CASES, ids=[c[0] for c in CASES])
def test_a_mutated_trace_is_refused_or_reported_inert(label, path, kind, good, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutated(real(), path, kind), ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "report"
    rc = cli.main(["report", str(bad), "-o", str(out)])
    err = capsys.readouterr().err
    _clean(rc, err, bad, (0, 2))
    if rc == 0:
        md, html = (out / "report.md").read_text(encoding="utf-8"), (out / "report.html").read_text(encoding="utf-8")
        if kind in ("script", "markdown", "fence"):
            _inert(md, html)
            for extra in out.glob("*.html"):  # a report beside them (the linked one) carries its own script
                assert "alert(1)</script" not in extra.read_text(encoding="utf-8"), extra
            issue = tmp_path / "issue"
            rc = cli.main(["report", str(bad), "-o", str(issue), "--issue"])
            _clean(rc, capsys.readouterr().err, bad, (0, 2))
            for page in issue.glob("*.md"):
                _inert(page.read_text(encoding="utf-8"), "")
    else:
        assert not out.exists() or not any(out.iterdir()), f"a refused trace left files behind: {err}"
    for argv in (["compare", str(good), str(bad)], ["compare", str(bad), str(good)]):
        rc = cli.main(argv)
        captured = capsys.readouterr()
        _clean(rc, captured.err, bad, (0, 1, 2))  # plain text for a terminal: markup there is inert


def test_the_mutations_cover_the_trace():
    assert REAL.is_file(), "the real trace the mutations start from is missing"
    kinds = {k for _, _, k in CASES}
    assert kinds == set(KINDS) and len(CASES) >= 240, len(CASES)
    tops = {p[0] for _, p, _ in CASES}
    assert {"config", "models", "prompt", "vanilla", "speculative", "comparison", "diagnosis", "environment"} <= tops
    assert any(p[:3] == ("diagnosis", "departure", "graph") for _, p, _ in CASES)


def test_the_two_found_by_hand(good, tmp_path, capsys):
    """A departure graph's max_abs holding a string (a ValueError in the plot's float()), and a verdict
    holding a script tag (reaching report.md as it was)."""
    doc = real()
    doc["diagnosis"]["departure"]["graph"]["max_abs"][0] = "x"
    bad = tmp_path / "max_abs.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    assert cli.main(["report", str(bad), "-o", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"specview: error: {bad}: malformed specview trace: 'diagnosis.departure.graph.max_abs[0]' "
                           "must be a number or null, not a string")
    doc = real()
    doc["diagnosis"]["verdict"] = SCRIPT
    bad = tmp_path / "verdict.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    assert cli.main(["report", str(bad), "-o", str(tmp_path / "r2")]) == 0
    md = (tmp_path / "r2" / "report.md").read_text(encoding="utf-8")
    _inert(md, (tmp_path / "r2" / "report.html").read_text(encoding="utf-8"))
    assert "alert(1)" in md  # shown, as text


#: values of the plots' inputs that the checks let through (null, non-finite, lists of other lengths), each must
#: still draw or leave its plot out
PLOT_MUTATIONS = [
    (("diagnosis", "departure", "graph", "max_abs", 0), None),
    (("diagnosis", "departure", "graph", "max_abs", 0), 1e999),  # infinity, as a file can spell it
    (("diagnosis", "departure", "graph", "index"), []),  # lists of unequal length: no graph to draw
    (("diagnosis", "departure", "graph", "status"), "dx?"),
    (("diagnosis", "envelope", "series"), [None, 1e999, -1.0]),
    (("vanilla", "steps", 0, "margin"), None),
    (("vanilla", "steps", 0, "top_logits"), [1e999, None]),
]


@pytest.mark.parametrize("path,value", PLOT_MUTATIONS, ids=[".".join(map(str, p)) for p, _ in PLOT_MUTATIONS])
def test_plots_of_mutated_traces(path, value, tmp_path, capsys, monkeypatch):
    pytest.importorskip("PySide6")
    from specview.commands import report

    monkeypatch.setattr(report, "plot_renderer", _PLOTS)
    doc = real()
    parent = get(doc, path[:-1])
    parent[path[-1]] = value
    bad = tmp_path / "plots.json"
    bad.write_text(json.dumps(doc).replace("Infinity", "1e999"), encoding="utf-8")
    rc = cli.main(["report", str(bad), "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err
    _clean(rc, err, bad, (0,))
    assert (tmp_path / "r" / "report.md").is_file() and "Traceback" not in err
    assert list((tmp_path / "r").glob("*.png")), "no plot was drawn"


from specview.commands.report import plot_renderer as _PLOTS  # noqa: E402  (the real one, before `quick` swaps it)


def test_compare_shows_a_terminal_escape_instead_of_sending_it(good, tmp_path, capsys):
    doc = real()
    esc = "\x1b]0;pwned\x07\x1b[2J"  # set the window title, clear the screen
    doc["environment"]["cpu"] = esc
    doc["config"]["engine"]["kv_type"] = esc
    for arm in ("vanilla", "speculative"):  # the text around a difference, in both arms alike
        doc[arm]["steps"][5]["piece"] = esc
        doc[arm]["text"] = "".join(s["piece"] for s in doc[arm]["steps"])
    doc["speculative"]["tokens"][9] = doc["speculative"]["steps"][9]["token"] = 7
    doc["speculative"]["text"] = "".join(s["piece"] for s in doc["speculative"]["steps"])
    bad = tmp_path / "escape.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    cli.main(["compare", str(good), str(bad)])
    captured = capsys.readouterr()
    assert "specview: error" not in captured.err, captured.err
    out = captured.out
    assert "DIFFERENT from token 9" in out and "\x1b" not in out and "\x07" not in out
    assert out.count("\\x1b]0;pwned\\x07\\x1b[2J") >= 3  # shown: the context, the setting, the CPU
