"""Reports treat token text as hostile: a planted trace whose tokens are ``<script>``, backtick fences,
``|`` and newlines must come out escaped in HTML and inert in Markdown; plots must be real PNGs."""

from __future__ import annotations

import base64
import json
import re
import shlex
import struct
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specview import cli
from specview.core.arms.compare import compare_arms
from specview.core.report import llama_commands, matrix_html, matrix_markdown, md_code, md_fence, trace_html, trace_markdown
from specview.core.trace import ArmResult, Round, Step, Trace

SCRIPT = "<script>alert(1)</script>"
FENCE = "```"
HOSTILE = [" The", " cat", SCRIPT, " sat", FENCE, "|", "\n", " on", "``", " <img src=x onerror=alert(2)>", " mat",
           " &amp;", " end", "\t", " ok", " done"]


# ---------------------------------------------------------------------------
# a planted trace
# ---------------------------------------------------------------------------
def _step(i: int, tok: int, piece: str, *, margin: float, rnd: int = 0, draft: bool = False, T: int = 1,
          row: int = 0) -> Step:
    return Step(index=i, token=tok, piece=piece, pos=20 + i, top_ids=[tok, tok + 1], top_logits=[5.0, 5.0 - margin],
                margin=margin, round=rnd, from_draft=draft, batch_size=T, batch_index=row)


def hostile_trace(fork: int = 4, n: int = 16, *, diagnosed: bool = True) -> Trace:
    """Vanilla emits HOSTILE in order; the speculative arm agrees until ``fork``, then emits the script tag."""
    vt = list(range(100, 100 + n))
    st = vt[:fork] + [102] + vt[fork + 1:]
    vsteps = [_step(i, t, HOSTILE[i % len(HOSTILE)], margin=0.05 + 0.3 * (i % 5)) for i, t in enumerate(vt)]
    ssteps, rounds = [], [Round(0, 0, 0, 0.0, 1.0, 20, 0)]
    ssteps.append(_step(0, st[0], vsteps[0].piece, margin=vsteps[0].margin, T=20, row=19))
    r = 1
    while len(ssteps) < n:
        first, acc = len(ssteps), min(2, n - len(ssteps) - 1)
        for j in range(acc + 1):
            i = len(ssteps)
            piece = HOSTILE[2] if st[i] == 102 else vsteps[i].piece
            ssteps.append(_step(i, st[i], piece, margin=vsteps[i].margin * 0.9, rnd=r, draft=j < acc, T=4, row=j))
        rounds.append(Round(r, 3, acc, 0.5, 1.5, 4, first, [st[first + j] for j in range(acc)] + [7] * (3 - acc)))
        r += 1
    v = ArmResult("vanilla", vt, "".join(s.piece for s in vsteps), vsteps, [], 10.0, 200.0, 150.0, "max_tokens")
    s = ArmResult("speculative", st, "".join(s.piece for s in ssteps), ssteps, rounds, 10.0, 150.0, 120.0,
                  "max_tokens", "draft-simple")
    diag = None
    if diagnosed:
        diag = {"verdict": "near-tie", "rule": "gap-within-envelope", "gap": 0.05,
                "envelope": {"max": 0.3, "p95": 0.25, "median": 0.1, "positions": fork,
                             "series": [0.1, 0.2, 0.3, 0.12, 0.2]},
                "at_risk": [0, 5], "thresholds": {"near_tie": 0.3, "far": 2.0, "at_risk": 0.3},
                "explanation": f"One token per pass picks {SCRIPT!r} by 0.05 logits over {FENCE!r}."}
    return Trace(
        config={"target": "demo:Q8_0", "draft": "demo:Q4_0", "spec_type": "draft-simple", "n_max": 3, "n_min": 0,
                "p_min": 0.0, "max_tokens": n, "prompt": "x", "chat": True, "ignore_eos": False, "top_k": 8,
                "backend": "llama.cpp", "ngram_size_n": 12, "ngram_size_m": 48, "n_ctx_used": 256,
                "engine": {"n_ctx": 0, "n_batch": 512, "n_ubatch": 512, "flash_attn": "off", "gpu_layers": -1,
                           "threads": 2, "kv_type": "f16"}},
        environment={"specview": "0.1.0", "backend": "llama.cpp", "cpu": "Evil <b>CPU</b> | x", "created": "now"},
        models={"target": {"path": "/models/it's a $(rm -rf ~) <b>.gguf", "file": "t<script>.gguf",
                           "quantization": "Q8_0", "n_params": 134515008, "file_size": 144811968},
                "draft": {"path": "/models/draft.gguf", "file": "draft.gguf", "quantization": "Q4_0"}},
        prompt={"text": f"Write {SCRIPT} and\n{FENCE}python\nprint('|')\n{FENCE}\nit's $(whoami)", "chat": True,
                "raw_tokens": False, "tokens": [1, 2, 3, 4]},
        vanilla=v, speculative=s, comparison=compare_arms(v, s), diagnosis=diag)


# ---------------------------------------------------------------------------
# independent checkers
# ---------------------------------------------------------------------------
def check_png(data: bytes) -> tuple[int, int]:
    """Parse a PNG by hand: signature, chunk CRCs, IHDR, and the IDAT stream inflating to the right size."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    assert ihdr is not None
    w, h, depth, colour = ihdr[:4]
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + (w * channels * depth + 7) // 8)
    return w, h


class Collect(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str | None]] = []
        self.text: list[str] = []
        self.imgs: list[dict] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for k, v in attrs:
            self.attrs.append((tag, k, v))
        if tag == "img":
            self.imgs.append(dict(attrs))

    def handle_data(self, data):
        self.text.append(data)


OUR_TAGS = {"html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "div", "b", "p", "table", "tr",
            "td", "th", "span", "pre", "figure", "img", "figcaption", "code", "ul", "li", "small", "br"}


def check_html(page: str, *, bold: int = 1) -> Collect:
    c = Collect()
    c.feed(page)
    c.close()
    assert "script" not in c.tags
    assert set(c.tags) <= OUR_TAGS, set(c.tags) - OUR_TAGS
    assert not [a for a in c.attrs if a[1].startswith("on")], "an event-handler attribute leaked in"
    for tag, k, v in c.attrs:  # nothing is fetched from anywhere: images are data: URIs, no links or scripts
        if k in ("src", "href"):
            assert tag == "img" and v.startswith("data:image/png;base64,")
    # the <b> tags are ours (the verdict banner of a trace report), never from token text
    assert c.tags.count("b") == bold
    return c


FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def md_blocks(md: str) -> tuple[list[str], list[str]]:
    """Split Markdown into fenced-block bodies and the lines outside them, CommonMark-style; fail on an open fence."""
    blocks, outside, cur, fence = [], [], None, None
    for line in md.split("\n"):
        if fence is None:
            m = FENCE_OPEN.match(line)
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                fence, cur = m.group(1), []
            else:
                outside.append(line)
        else:
            m = re.match(r"^ {0,3}(`{3,}|~{3,})\s*$", line)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                blocks.append("\n".join(cur))
                fence = None
            else:
                cur.append(line)
    assert fence is None, "a fenced block is never closed"
    return blocks, outside


def strip_code_spans(line: str) -> str:
    """Remove CommonMark code spans (a backtick run, then the same-length run)."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line) and line[i + 1] in "`\\":  # an escaped backtick opens nothing
            out.append(line[i:i + 2])
            i += 2
        elif line[i] == "`":
            j = i
            while j < len(line) and line[j] == "`":
                j += 1
            run = line[i:j]
            m = re.compile(r"(?<!`)" + re.escape(run) + r"(?!`)").search(line, j)
            if m:
                i = m.end()
                continue
            out.append(run)
            i = j
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


def check_markdown(md: str) -> tuple[list[str], list[str]]:
    blocks, outside = md_blocks(md)
    prose = [strip_code_spans(x) for x in outside]
    joined = "\n".join(prose)
    for tag in ("<script", "<img", "<b>"):  # only a backslash-escaped "\<" may appear outside code
        assert not re.search(r"(?<!\\)" + re.escape(tag), joined), tag
    assert not re.search(r"(?<!\\)```", joined)
    # every table keeps its column count: no cell text adds or removes a column
    table: list[int] = []
    for line in outside + [""]:
        if line.startswith("|"):
            table.append(unescaped_pipes(line))
        else:
            assert len(set(table)) <= 1, f"a table's rows have different column counts: {table}"
            table = []
    return blocks, outside


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------
def test_md_helpers_hold_any_backtick_run():
    for s in ["`", "``", "```", "a ` b", "````x", "`x`"]:
        span = md_code(s)
        assert strip_code_spans(span) == "" and "`" * 8 not in span
    blocks, _ = md_blocks(md_fence("a\n```\nb\n````` c"))
    assert blocks == ["a\n```\nb\n````` c"]
    from specview.core.report import md_text

    # what would start a list, a heading or a quote is escaped at the start only; inline markup everywhere
    assert [md_text(x) for x in ["- a", "1. a", "# a", "> a", "a - b. c", "*a* [b](c) <d>"]] == [
        "\\- a", "1\\. a", "\\# a", "\\> a", "a - b. c", "\\*a\\* \\[b\\](c) \\<d\\>"]


def test_html_report_escapes_every_token(tmp_path: Path):
    t = hostile_trace()
    fake_png = _tiny_png()
    page = trace_html(t, {"margins": fake_png, "acceptance": fake_png})
    c = check_html(page)
    text = "".join(c.text)
    assert SCRIPT in text  # shown to the reader, as text
    assert "onerror=alert(2)" in text
    assert "&amp;" in text  # the token " &amp;" is shown literally, not as "&"
    assert page.count("<script") == 0 and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert len(c.imgs) == 2
    for img in c.imgs:
        check_png(base64.b64decode(img["src"].split(",", 1)[1], validate=True))
        assert img.get("alt")


def test_markdown_report_keeps_fences_and_tables_intact():
    t = hostile_trace()
    md = trace_markdown(t, {"margins": "report-margins.png", "acceptance": "report-acceptance.png"})
    blocks, outside = check_markdown(md)
    fork_block = next(b for b in blocks if b.startswith("vanilla"))
    assert SCRIPT in fork_block and FENCE in fork_block  # the fork shows both, inside one block
    assert "⏎" in "\n".join(blocks)  # the newline token is drawn, not emitted
    prompt_block = next(b for b in blocks if "print('|')" in b)
    assert prompt_block == t.prompt["text"]  # the prompt, fences and all, survives verbatim
    assert "![Top-1/top-2 margin per token](report-margins.png)" in md


def test_llama_commands_use_llama_cpp_flags_and_quote_paths():
    t = hostile_trace()
    cmds = llama_commands(t.config, t.models, t.prompt)
    argv = shlex.split(cmds["cli_speculative"].replace("\\\n", " "))
    assert argv[0] == "llama-cli"
    assert argv[argv.index("-m") + 1] == "/models/it's a $(rm -rf ~) <b>.gguf"
    assert argv[argv.index("-p") + 1] == t.prompt["text"]
    for flag, value in [("-md", "/models/draft.gguf"), ("--spec-type", "draft-simple"), ("--spec-draft-n-max", "3"),
                        ("--spec-draft-n-min", "0"), ("--spec-draft-p-min", "0"), ("--temp", "0"), ("--top-k", "1"),
                        ("-n", "16"), ("-c", "256"), ("-b", "512"), ("-ub", "512"), ("-fa", "off"), ("-ngl", "all"),
                        ("-t", "2")]:
        assert argv[argv.index(flag) + 1] == value, flag
    vanilla = shlex.split(cmds["cli_vanilla"].replace("\\\n", " "))
    assert "-md" not in vanilla and "--spec-type" not in vanilla
    server = shlex.split(cmds["server_speculative"].replace("\\\n", " "))
    assert server[0] == "llama-server" and "--spec-draft-n-max" in server
    # the request sends the exact prompt token ids
    payload = json.loads(shlex.split(cmds["request"].splitlines()[0])[-3])
    assert payload["prompt"] == [1, 2, 3, 4] and payload["temperature"] == 0 and payload["top_k"] == 1
    assert payload["n_predict"] == 16


KNOWN_FLAGS = {  # llama.cpp common/arg.cpp (vendored in llama-cpp-python 0.3.36)
    "-m", "-md", "-ngld", "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min",
    "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m", "--temp", "--top-k", "-n", "-c", "-b", "-ub",
    "-fa", "-ngl", "-ctk", "-ctv", "-t", "-p", "-st", "-np", "--port", "--ignore-eos",
}


@pytest.mark.parametrize("spec_type", ["draft-simple", "ngram-simple", "none"])
def test_every_flag_is_a_llama_cpp_flag(spec_type):
    t = hostile_trace()
    cfg = dict(t.config, spec_type=spec_type, ignore_eos=True)
    for key, text in llama_commands(cfg, t.models, t.prompt).items():
        if key == "request":
            continue
        flags = {w for w in shlex.split(text.replace("\\\n", " ")) if w.startswith("-") and not w[1:].isdigit()}
        assert flags <= KNOWN_FLAGS, flags - KNOWN_FLAGS


def test_raw_token_and_template_free_prompts_get_no_cli_command():
    t = hostile_trace()
    for prompt in (dict(t.prompt, text=None, raw_tokens=True), dict(t.prompt, chat=False)):
        cmds = llama_commands(t.config, t.models, prompt)
        assert "cli_vanilla" not in cmds and '"prompt":[1,2,3,4]' in cmds["request"]


def test_written_report_has_real_plots(tmp_path: Path):
    from specview.commands.report import plot_renderer
    from specview.core.report.write import write_report

    t = hostile_trace(n=40, fork=9)
    src = tmp_path / "t.json"
    t.save(src)
    out = tmp_path / "rep"
    assert cli.main(["report", str(src), "-o", str(out)]) == 0
    page = (out / "report.html").read_text(encoding="utf-8")
    c = check_html(page)
    sizes = [check_png(base64.b64decode(i["src"].split(",", 1)[1])) for i in c.imgs]
    assert len(sizes) == 2 and all(w >= 600 and h >= 200 for w, h in sizes)
    md = (out / "report.md").read_text(encoding="utf-8")
    check_markdown(md)
    for name in re.findall(r"\]\(([^)]+\.png)\)", md):
        assert check_png((out / name).read_bytes())[0] >= 600
    written = write_report(src, tmp_path / "again", name="bug", plots=plot_renderer())
    assert {p.name for p in written.values()} == {"bug.html", "bug.md", "bug-margins.png", "bug-acceptance.png",
                                                 "bug-linked.html"}


def test_report_refuses_foreign_json(tmp_path: Path, capsys):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"schema": "something/1"}))
    assert cli.main(["report", str(f), "-o", str(tmp_path / "o")]) == 2
    assert "neither a specview trace" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "missing.json")]) == 2
    for content, said in (("[]", "its top level is an array, not an object"), ('{"x": 1}', 'it has no "schema" field'),
                          ('{"schema": null}', "its schema is null, not a string")):
        f.write_text(content)
        capsys.readouterr()
        assert cli.main(["report", str(f), "-o", str(tmp_path / "o")]) == 2
        assert capsys.readouterr().err.strip().endswith(f"a quality run (specview.quality/1): {said}")


def test_matrix_report_escapes_cell_text(tmp_path: Path):
    from test_matrix import FakeSession, spec  # the fake session of the matrix tests

    from specview.core.matrix import load_matrix, run_matrix

    run_matrix(spec(), FakeSession(), out=tmp_path / "m.json")
    doc = load_matrix(tmp_path / "m.json")
    fork = next(c for c in doc["cells"] if not c["identical"])
    fork["fork"]["vanilla_piece"] = SCRIPT
    fork["fork"]["speculative_piece"] = "|" + FENCE + "\n"
    doc["cells"][0]["params"]["prompt"] = "<b>bold|prompt</b>"
    page = matrix_html(doc)
    c = check_html(page, bold=0)
    assert SCRIPT in "".join(c.text) and "grid" in page
    md = matrix_markdown(doc)
    check_markdown(md)
    assert md.count("\n| ") >= 6  # the grid and the forks table are there
    (tmp_path / "m.json").write_text(json.dumps(doc))
    assert cli.main(["report", str(tmp_path / "m.json"), "-o", str(tmp_path / "mr")]) == 0
    check_html((tmp_path / "mr" / "report.html").read_text(encoding="utf-8"), bold=0)
    assert "Reproduce the earliest fork" not in page  # no trace saved for it

    # with the earliest fork's trace saved beside the matrix, its llama.cpp commands are included
    first = min((c for c in doc["cells"] if not c["identical"]), key=lambda c: c["first_mismatch"])
    hostile_trace().save(tmp_path / "fork.json")
    first["trace"] = "fork.json"
    (tmp_path / "m.json").write_text(json.dumps(doc))
    assert cli.main(["report", str(tmp_path / "m.json"), "-o", str(tmp_path / "mr2")]) == 0
    page = (tmp_path / "mr2" / "report.html").read_text(encoding="utf-8")
    check_html(page, bold=0)
    assert "Reproduce the earliest fork" in page and "--spec-draft-n-max" in page
    md = (tmp_path / "mr2" / "report.md").read_text(encoding="utf-8")
    check_markdown(md)
    assert "### Reproduce the earliest fork" in md


def _tiny_png() -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * 4 for _ in range(3))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 3, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_markdown_renders_without_injected_html():
    """Render the Markdown with a CommonMark parser (HTML allowed, as GitHub allows some) and parse the result."""
    import markdown_it  # the dev extra declares markdown-it-py
    md = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table")
    t = hostile_trace()
    page = md.render(trace_markdown(t, {"margins": "report-margins.png", "acceptance": "report-acceptance.png"}))
    c = Collect()
    c.feed(page)
    assert "script" not in c.tags and "b" not in c.tags  # token text never becomes markup
    assert not [a for a in c.attrs if a[1].startswith("on")]
    assert [i["src"] for i in c.imgs] == ["report-margins.png", "report-acceptance.png"]
    text = "".join(c.text)
    assert SCRIPT in text and "onerror=alert(2)" in text  # shown as text
    # the fork block is one <pre>, holding both arms' lines with the planted fence inside
    pres = re.findall(r"<pre><code[^>]*>(.*?)</code></pre>", page, re.S)
    fork = [p for p in pres if p.startswith("vanilla")]
    assert len(fork) == 1 and "```" in fork[0] and fork[0].count("\n") == 2
    # every table row has as many cells as its header
    for table in re.findall(r"<table>(.*?)</table>", page, re.S):
        counts = {len(re.findall(r"<t[hd][ >]", row)) for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)}
        assert len(counts) == 1, counts
    # the piece "|" shows as a plain |, not as "\|", in the table of facts
    assert "\\|" not in text


def test_the_writer_takes_its_plots_from_the_renderer_given(tmp_path: Path):
    from specview.core.report.write import write_report

    t = hostile_trace(n=40, fork=9)
    calls = []

    def renderer(trace):
        calls.append(trace)
        return {"margins": _tiny_png(), "not-a-plot": b"ignored"}

    written = write_report(t, tmp_path / "a", plots=renderer)
    assert calls == [t] and {p.name for p in written.values()} == {"report.html", "report.md", "report-margins.png",
                                                                   "report-linked.html"}
    assert len(check_html((tmp_path / "a" / "report.html").read_text(encoding="utf-8")).imgs) == 1
    written = write_report(t, tmp_path / "b")  # no renderer: no plots
    assert {p.name for p in written.values()} == {"report.html", "report.md", "report-linked.html"}
    assert not check_html((tmp_path / "b" / "report.html").read_text(encoding="utf-8")).imgs


def test_report_without_qt_writes_no_plots_and_says_so(tmp_path: Path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "specview.gui.export", None)  # importing it now raises ImportError
    src = tmp_path / "t.json"
    hostile_trace().save(src)
    assert cli.main(["report", str(src), "-o", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "no plots" in err and len(err.strip().splitlines()) == 1
    assert not list((tmp_path / "r").glob("*.png"))
    check_html((tmp_path / "r" / "report.html").read_text(encoding="utf-8"))


def test_a_broken_backend_is_said_before_the_fork_in_both_reports():
    from specview.core.diagnose.reference import problems_of

    t = hostile_trace()
    totals = {"kl_mean": 3.1, "same_top1": 0.4, "non_finite": 0}
    problems = problems_of(totals)
    t.diagnosis["reference"] = {"kind": "gpu", "test_label": "GPU (-ngl 99) <b>", "reference_label": "CPU (-ngl 0)",
                                "totals": totals, "ok": False, "problems": problems}
    md = trace_markdown(t, {})
    check_markdown(md)
    warn = next(line for line in md.splitlines() if "BACKEND CHECK FAILED" in line)
    assert warn.startswith("> **⚠ BACKEND CHECK FAILED") and "3.1 nats is above the limit 0.01" in warn
    assert md.index("BACKEND CHECK FAILED") < md.index("### The fork")
    assert md.index("BACKEND CHECK FAILED") < md.index("One token per pass picks")
    page = trace_html(t, {})
    check_html(page, bold=2)
    assert page.index("BACKEND CHECK FAILED") < page.index("The fork, token")
    assert "&lt;b&gt;" in page and "GPU (-ngl 99) <b>" not in page
    # and a sane backend is one row of the facts, with no warning
    t.diagnosis["reference"] = dict(t.diagnosis["reference"], ok=True, problems=[],
                                    totals={"kl_mean": 0.0, "same_top1": 1.0, "non_finite": 0})
    md = trace_markdown(t, {})
    assert "BACKEND CHECK FAILED" not in md and "| backend check |" in md
