"""``specview report --issue``: one Markdown paste for an upstream issue, under GitHub's limit, that renders as it is
and whose reproduction is the run's own: its servers' flags, its request and its tokens, read back from the
Markdown by a parser of the test's own (CommonMark fences, shell words, JSON)."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from markdown_it import MarkdownIt

from specview import cli
from specview.core.arms.compare import compare_arms
from specview.core.report.issue import LIMIT, gh_length, issue_markdown
from specview.core.trace import ArmResult, Round, Step, Trace

# token texts a report must show literally and keep inert: markup, fences, table bars, an emoji GitHub counts twice
PIECES = [" The", " cat", "<script>alert(1)</script>", " |", "```", "\n", " 🐈", " sat", "<details>", " on"]


def _step(i, tok, piece, margin, *, rnd=0, draft=False, T=1, row=0, prompt=4):
    return Step(index=i, token=tok, piece=piece, pos=prompt + i, top_ids=[tok, tok + 1],
                top_logits=[5.0, 5.0 - margin], margin=margin, round=rnd, from_draft=draft, batch_size=T,
                batch_index=row)


def make_trace(n: int = 40, fork: int = 12, *, prompt_len: int = 4, n_max: int = 3, serial: bool | None = True,
               no_repack: bool = True) -> Trace:
    """Vanilla emits 100, 101, ...; the speculative arm agrees until ``fork`` and then emits 7 there, in rounds of
    ``n_max`` drafts of which two are accepted (width n_max + 1)."""
    vt = [100 + i for i in range(n)]
    st = vt[:fork] + [7] + vt[fork + 1:]
    vsteps = [_step(i, t, PIECES[i % len(PIECES)], 0.01 + 0.1 * (i % 7), prompt=prompt_len) for i, t in enumerate(vt)]
    ssteps = [_step(0, st[0], vsteps[0].piece, vsteps[0].margin, T=prompt_len, row=prompt_len - 1, prompt=prompt_len)]
    rounds = [Round(0, 0, 0, 0.0, 1.0, prompt_len, 0)]
    r = 1
    while len(ssteps) < n:
        first, acc = len(ssteps), min(2, n - len(ssteps) - 1)
        for j in range(acc + 1):
            i = len(ssteps)
            piece = "X" if st[i] == 7 else vsteps[i].piece
            ssteps.append(_step(i, st[i], piece, vsteps[i].margin, rnd=r, draft=j < acc, T=n_max + 1, row=j,
                                prompt=prompt_len))
        rounds.append(Round(r, n_max, acc, 0.5, 1.5, n_max + 1, first, st[first:first + acc] + [9] * (n_max - acc)))
        r += 1
    v = ArmResult("vanilla", vt, "".join(s.piece for s in vsteps), vsteps, [], 10.0, 400.0, 300.0, "max_tokens")
    s = ArmResult("speculative", st, "".join(s.piece for s in ssteps), ssteps, rounds, 10.0, 200.0, 150.0,
                  "max_tokens", "draft-simple")
    diag = {"verdict": "near-tie", "rule": "serial-verify-reproduces-vanilla", "gap": 0.03,
            "envelope": {"max": 0.05, "p95": 0.04, "median": 0.01, "positions": fork},
            "thresholds": {"near_tie": 0.05, "far": 2.0, "at_risk": 0.05},
            "departure": {"where": "first differs at blk.3 ffn_out-3: MUL_MAT on q4_K weights in CPU",
                          "node": "ffn_out-3", "op": "MUL_MAT", "width": n_max + 1, "row": 1, "position": fork,
                          "max_abs": 0.02},
            "serial_verify": None if serial is None else {"form": "single-token-passes", "identical_to_vanilla": serial,
                                                          "first_mismatch": None if serial else fork + 3,
                                                          "n_tokens": n}}
    sha = "ab" * 32
    return Trace(
        config={"target": "demo:Q4_K_M", "draft": "demo:Q4_0", "spec_type": "draft-simple", "n_max": n_max,
                "n_min": 0, "p_min": 0.0, "max_tokens": n, "prompt": None, "prompt_tokens": [1000 + i for i in range(prompt_len)], "chat": False,
                "ignore_eos": True, "top_k": 8, "backend": "llama.cpp", "ngram_size_n": 12, "ngram_size_m": 48,
                "n_ctx_used": 4096, "threads_used": 2,
                "engine": {"n_ctx": 0, "n_batch": 512, "n_ubatch": 512, "flash_attn": "auto", "gpu_layers": 0,
                           "threads": 0, "kv_type": "f16", "no_repack": no_repack},
                "models": {"target": {"name": "demo:Q4_K_M", "path": "/m/t.gguf", "size": 1000, "sha256": sha},
                           "draft": {"name": "demo:Q4_0", "path": "/m/d.gguf", "size": 900, "sha256": "cd" * 32}}},
        environment={"specview": "0.1.0", "llama_cpp_python": "0.3.36", "llama_cpp_vendored_commit": "0c1e57098",
                     "ggml_version": "0.25.3", "ggml_commit": "unknown", "compiler": "GCC: (Debian 12.2.0-14) 12.2.0",
                     "cpu": "Intel Xeon", "llama_cpp_system_info": "CPU : AVX2 = 1 | AMX_INT8 = 1 | " * 200,
                     "ggml_devices": [{"name": "CPU", "description": "Intel Xeon", "type": "cpu"}]},
        models={"target": {"path": "/m/t.gguf", "file": "t.gguf", "quantization": "Q4_K_M", "file_size": 1000},
                "draft": {"path": "/m/d.gguf", "file": "d.gguf", "quantization": "Q4_0", "file_size": 900}},
        prompt={"text": None, "chat": False, "raw_tokens": True, "tokens": [1000 + i for i in range(prompt_len)]},
        vanilla=v, speculative=s, comparison=compare_arms(v, s), diagnosis=diag)


# -- an independent reading of the Markdown -------------------------------------------------------------------
def md():
    return MarkdownIt("commonmark").enable("table")


def fences(body: str, lang: str | None = None) -> list[str]:
    return [t.content for t in md().parse(body) if t.type == "fence" and (lang is None or t.info == lang)]


def shell_commands(block: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, ``&`` dropped, the heredoc bodies skipped."""
    out, lines, heredoc = [], block.replace("\\\n", " ").splitlines(), None
    for ln in lines:
        if heredoc:
            heredoc = None if ln.strip() == heredoc else heredoc
            continue
        m = re.search(r"<<'(\w+)'", ln)
        if m:
            heredoc = m.group(1)
        if ln.strip() and not ln.lstrip().startswith(("#", "for ", "same() {", "}")):
            words = shlex.split(ln.split("<<")[0])
            out.append([w for w in words if w != "&"])
    return out


def servers(body: str) -> dict[int, list[str]]:
    """Every ``llama-server`` command in the body's shell blocks, by port."""
    out = {}
    for block in fences(body, "sh"):
        for words in shell_commands(block):
            if "llama-server" in words:
                out[int(words[words.index("--port") + 1])] = words
    return out


def inline_request(body: str) -> dict | None:
    for block in fences(body, "sh"):
        m = re.search(r"cat > request\.json <<'EOF'\n(.*)\nEOF", block, re.DOTALL)
        if m:
            return json.loads(m.group(1))
    return None


def expected_tokens(body: str) -> dict[str, tuple[int, list[int]]]:
    """(first index, ids) the report says each answer holds ("vanilla (N tokens):", or "speculative, tokens I-J of
    N:" for a cut list)."""
    for block in fences(body, "text"):
        got = re.findall(r"^(vanilla|speculative)(?:, tokens (\d+)-\d+ of \d+| \(\d+ tokens\)):\n([\d ]+)$", block,
                         re.MULTILINE)
        if got:
            return {k: (int(lo or 0), [int(x) for x in v.split()]) for k, lo, v in got}
    raise AssertionError("no expected tokens in the report")


# -- the tests --------------------------------------------------------------------------------------------------
def test_a_short_run_is_whole_and_its_reproduction_is_the_run():
    t = make_trace()
    body, cut = issue_markdown(t)
    assert cut == [] and "cut to stay under" not in body
    srv = servers(body)
    assert sorted(srv) == [8080, 8081, 8082, 8083]
    for port, words in srv.items():
        spec = port in (8081, 8083)
        ub = "1" if port >= 8082 else "512"
        assert words[words.index("-ub") + 1] == ub
        assert words[words.index("-m") + 1] == "/m/t.gguf" and words[words.index("-t") + 1] == "2"
        assert ("--no-repack" in words) and ("-md" in words) == spec and ("--spec-type" in words) == spec
        if spec:
            assert words[words.index("--spec-draft-n-max") + 1] == "3" and words[words.index("-md") + 1] == "/m/d.gguf"
    req = inline_request(body)
    assert req["prompt"] == t.prompt["tokens"] and req["n_predict"] == 40 and req["temperature"] == 0
    assert req["top_k"] == 1 and req["ignore_eos"] is True and req["speculative.n_max"] == 3
    exp = expected_tokens(body)
    assert exp == {"vanilla": (0, t.vanilla.tokens), "speculative": (0, t.speculative.tokens)}
    assert "fork at token 12" in body
    # the fork's table: both arms' ids side by side, the fork row marked
    row = next(ln for ln in body.splitlines() if ln.startswith("| → 12 |"))
    assert "| 112 |" in row and "| 7 |" in row
    # the build, the models' hashes, the op and the width table
    for s in ("0c1e57098", "0.25.3", "GCC: (Debian 12.2.0-14) 12.2.0", "ab" * 32, "cd" * 32, "ffn_out-3"):
        assert s in body
    width_row = next(ln for ln in body.splitlines() if ln.startswith("| 4 |"))
    rounds = [r for r in t.speculative.rounds if r.index > 0]
    assert width_row.split("|")[2].strip() == str(len(rounds)) and "the fork" in width_row
    assert "the two -ub 1 answers are equal" in body


def test_the_control_says_what_the_runs_own_control_measured():
    assert "the two -ub 1 answers still differ (the run's control: from token 15)" in issue_markdown(
        make_trace(serial=False))[0]
    assert "if the two -ub 1 answers are equal" in issue_markdown(make_trace(serial=None))[0]
    body = issue_markdown(make_trace(no_repack=False))[0]
    assert all("--no-repack" not in w for w in servers(body).values())


def test_a_long_run_fits_under_githubs_limit_and_says_what_it_cut():
    t = make_trace(n=12000, fork=9000, prompt_len=6000)
    full = sum(len(" ".join(map(str, a.tokens))) for a in (t.vanilla, t.speculative))
    assert full > LIMIT  # the token lists alone would not fit
    body, cut = issue_markdown(t)
    assert gh_length(body) <= LIMIT
    assert "cut to stay under GitHub's 65,536-character limit" in body and "repro" in cut
    exp = expected_tokens(body)
    lo, hi = 9000 - 64, 9000 + 9  # from 64 tokens before the fork to 8 after it
    assert exp == {"vanilla": (lo, t.vanilla.tokens[lo:hi]), "speculative": (lo, t.speculative.tokens[lo:hi])}
    assert len(servers(body)) == 4  # the commands always survive
    req = inline_request(body)
    if req is None:  # too long to paste: the report says to attach the request file
        assert "request" in cut and "attach" in body
    else:
        assert req["prompt"] == t.prompt["tokens"]


def test_a_prompt_too_long_to_paste_leaves_the_request_to_its_file(tmp_path, capsys):
    t = make_trace(n=60, fork=30, prompt_len=14000)
    src = tmp_path / "long.json"
    t.save(src)
    assert cli.main(["report", str(src), "--issue", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    body = (tmp_path / "out" / "report-issue.md").read_text(encoding="utf-8")
    assert gh_length(body) <= LIMIT and inline_request(body) is None and "attach" in body
    req = json.loads((tmp_path / "out" / "request.json").read_text())
    assert req["prompt"] == t.prompt["tokens"] and req["n_predict"] == 60
    assert f"{gh_length(body)} characters" in out and "request.json" in out


def test_the_body_is_commonmark_that_pastes_as_it_is():
    body, _ = issue_markdown(make_trace(n=80, fork=30))
    tokens = md().parse(body)
    # no token text became markup: the only HTML is the report's own folding and footer
    html = [t.content.strip() for t in tokens if t.type in ("html_block", "html_inline")]
    assert all(re.fullmatch(r"</?(details|summary|sub)>.*", h, re.DOTALL) for h in html), html
    rendered = md().render(body)
    assert "<script>" not in rendered and "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered
    assert rendered.count("<table>") == body.count("\n|---|") and rendered.count("<table>") >= 6
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    for h in ("Verdict and proof", "The op", "Verify widths", "The fork, token 30", "Build and machine", "Models",
              "Reproduce without specview"):
        assert h in headings, headings
    # every fence closes: the text after the last one is the footer
    assert body.rstrip().endswith("(`specview report --issue`).</sub>")


def test_an_issue_is_written_from_a_trace_only(tmp_path, capsys):
    m = tmp_path / "m.json"
    m.write_text(json.dumps({"schema": "specview.kernels/1"}))
    assert cli.main(["report", str(m), "--issue", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(m) in err and "Traceback" not in err
    assert not (tmp_path / "report-issue.md").exists()


@pytest.mark.parametrize("backend", ["mlx", "mlx-server"])
def test_an_mlx_run_gets_mlx_lm_server_or_says_why_not(backend):
    # an MLX run is reproduced on mlx_lm.server (tests/backends/test_issue_repro_mlx.py); these token ids name no
    # tokenizer that could give mlx_lm.server their text, so the report says so instead of llama-server lines
    t = make_trace()
    t.config["backend"] = backend
    body, _ = issue_markdown(t)
    assert "no llama-server reproduction" not in body and not servers(body)
    assert "no mlx\\_lm.server reproduction: the prompt is token ids" in body and "/m/t.gguf" in body
