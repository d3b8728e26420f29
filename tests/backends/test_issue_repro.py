"""The no-specview reproduction of ``specview report --issue``, run as written against a real llama-server.

A fork found on llama-server (the fixed candidates of ``tests/forks.py``, one thread), diagnosed, saved and
reported with ``--issue``; then the report's own shell blocks are read back (CommonMark fences, shell words), the
``llama-server`` command lines started from ``$SPECVIEW_LLAMA_SERVER`` (only the port is changed, to a free one),
and its curl requests sent with urllib: the servers' answers must hold the tokens the report says each arm produced,
and fork where it says; the ``-ub 1`` pair must show what the report says it shows.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import urllib.request

import pytest
from forks import find_server_fork
from pasted import free_port, sh_blocks, start_server, stop_servers, wait_healthy
from markdown_it import MarkdownIt
from test_server import find_binary

from specview import cli
from specview.backends.llama_server import ServerRunner
from specview.core.report.issue import LIMIT, gh_length
from specview.core.report.summary import sealed_summary
from specview.core.trace import Trace

pytestmark = [pytest.mark.demo, pytest.mark.slow]


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """(trace, the issue's Markdown, the request file's text) for the first candidate that forks on llama-server."""
    binary = find_binary()
    runner = ServerRunner()
    try:
        fork = find_server_fork(runner, binary)
        t = fork.trace
        runner.diagnose(t, fork.cfg)
    finally:
        runner.close()
    d = tmp_path_factory.mktemp("issue")
    t.extra["summary"] = sealed_summary(t)
    t.save(d / "fork.json")
    assert cli.main(["report", str(d / "fork.json"), "--issue", "-o", str(d / "out")]) == 0
    return (Trace.load(d / "fork.json"), (d / "out" / "report-issue.md").read_text(encoding="utf-8"),
            (d / "out" / "request.json").read_text(encoding="utf-8"))


# -- the report, read back --------------------------------------------------------------------------------------
def commands(body: str) -> list[list[str]]:
    """Every command of the body's shell blocks as words (continuations joined, ``&`` dropped, heredocs skipped)."""
    out, heredoc = [], None
    for block in sh_blocks(body):
        for ln in block.replace("\\\n", " ").splitlines():
            if heredoc:
                heredoc = None if ln.strip() == heredoc else heredoc
                continue
            m = re.search(r"<<'(\w+)'", ln)
            heredoc = m.group(1) if m else None
            if ln.strip() and not ln.lstrip().startswith(("for ", "same() {", "}", "#")):
                out.append([w for w in shlex.split(ln.split("<<")[0]) if w != "&"])
    return out


def heredoc_request(body: str) -> str:
    for block in sh_blocks(body):
        m = re.search(r"cat > request\.json <<'EOF'\n(.*)\nEOF", block, re.DOTALL)
        if m:
            return m.group(1)
    raise AssertionError("the report pastes no request")


def expected(body: str) -> dict[str, list[int]]:
    for t in MarkdownIt("commonmark").parse(body):
        if t.type == "fence" and t.info == "text":
            got = dict(re.findall(r"^(vanilla|speculative) \(\d+ tokens\):\n([\d ]+)$", t.content, re.MULTILINE))
            if got:
                return {k: [int(x) for x in v.split()] for k, v in got.items()}
    raise AssertionError("the report lists no tokens")


class Servers:
    """The report's llama-server lines, started as written but for the port; stopped, all of them, at the end."""

    def __init__(self, lines: list[list[str]], binary: str):
        self.procs, self.port = [], {}
        for words in lines:
            env = dict(os.environ)
            while "=" in words[0] and not words[0].startswith("-"):
                k, _, v = words.pop(0).partition("=")
                env[k] = v
            assert words[0] == "llama-server"
            i = words.index("--port")
            port = free_port()
            self.port[int(words[i + 1])] = port
            argv = [binary, *words[1:i + 1], str(port), *words[i + 2:]]
            self.procs.append(start_server(argv, env))

    def wait(self, seconds: float = 180.0) -> None:
        wait_healthy(self.procs, self.port.values(), what="llama-server", seconds=seconds)

    def close(self) -> None:
        stop_servers(self.procs)


def send(words: list[str], ports: dict[int, int], files: dict[str, str]) -> tuple[str, dict]:
    """A report's curl line through urllib, to the server it names: (the file it saves to, the answer)."""
    url = next(w for w in words if w.startswith("http://"))
    data = words[words.index("-d") + 1]
    body = files[data[1:]] if data.startswith("@") else data
    m = re.match(r"http://127\.0\.0\.1:(\d+)(/.*)", url)
    req = urllib.request.Request(f"http://127.0.0.1:{ports[int(m.group(1))]}{m.group(2)}", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        answer = json.loads(r.read())
    return words[words.index(">") + 1], answer


def run_pair(body: str, request: str, ub1: bool) -> dict[str, dict]:
    cmds = commands(body)
    lines = [w for w in cmds if "llama-server" in w and (w[w.index("-ub") + 1] == "1") == ub1]
    curls = [w for w in cmds if w[0] == "curl"]
    servers = Servers(lines, find_binary())
    try:
        servers.wait()
        return dict(send(w, servers.port, {"request.json": request}) for w in curls
                    if int(re.search(r":(\d+)/", w[2]).group(1)) in servers.port)
    finally:
        servers.close()


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a + [None], b + [None])) if x != y), None)


# -- the tests ----------------------------------------------------------------------------------------------------
def test_the_issue_fits_and_pastes_the_request_it_wrote(reported):
    t, body, request = reported
    assert gh_length(body) <= LIMIT
    assert json.loads(heredoc_request(body)) == json.loads(request)
    assert json.loads(request)["prompt"] == t.prompt["tokens"]


def test_the_reports_commands_give_the_fork_on_llama_server(reported):
    t, body, request = reported
    got = run_pair(body, request, ub1=False)
    exp = expected(body)
    assert exp == {"vanilla": t.vanilla.tokens, "speculative": t.speculative.tokens}
    assert got["vanilla.json"]["tokens"] == exp["vanilla"]
    assert got["speculative.json"]["tokens"] == exp["speculative"]
    fork = first_difference(got["vanilla.json"]["tokens"], got["speculative.json"]["tokens"])
    assert fork == t.comparison.first_mismatch.index and f"fork at token {fork}" in body


def test_the_ub1_control_shows_what_the_report_says(reported):
    t, body, request = reported
    got = run_pair(body, request, ub1=True)
    v, s = got["vanilla-ub1.json"], got["speculative-ub1.json"]
    assert s["timings"]["draft_n"] > 0  # it speculated: its verify passes ran, one token at a time
    same = v["tokens"] == s["tokens"]
    claim = t.diagnosis["serial_verify"]["identical_to_vanilla"]
    assert claim is True and t.diagnosis["verdict"] == "near-tie"  # a natural fork: batched numerics
    assert same == claim and "the two -ub 1 answers are equal" in body
    if t.diagnosis["serial_verify"].get("vanilla_matches_run"):  # the report says so: check it too
        assert "and equal to vanilla.json" in body and v["tokens"] == t.vanilla.tokens
