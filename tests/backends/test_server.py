"""The llama-server engine against a real llama-server on the demo model (short runs).

The binary comes from $SPECVIEW_LLAMA_SERVER or the cache path that
scripts/build-llama-server.sh fills.  Without it these tests skip, unless
$SPECVIEW_REQUIRE_SERVER=1, where its absence is a failure.
"""

from __future__ import annotations

import copy
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from specview.backends import server as srv
from specview.core import demo
from specview.core.compare import compare_arms
from specview.core.engine import EngineSettings
from specview.core.session import RunConfig, Session
from specview.core.trace import Trace

pytestmark = [pytest.mark.demo, pytest.mark.slow]

ENG = EngineSettings(threads=1, n_ctx=512)
BUILD_HINT = ("llama-server is not built: run scripts/build-llama-server.sh (it caches the binary in "
              f"{srv.cached_server_path()}), or set ${srv.ENV_BIN} to a llama-server binary")


@pytest.fixture(scope="module")
def server_bin() -> str:
    path = os.environ.get(srv.ENV_BIN) or str(srv.cached_server_path())
    if Path(path).is_file() and os.access(path, os.X_OK):
        return path
    if os.environ.get("SPECVIEW_REQUIRE_SERVER") == "1":
        pytest.fail(f"SPECVIEW_REQUIRE_SERVER=1 but {path} is missing. {BUILD_HINT}")
    pytest.skip(BUILD_HINT)


@pytest.fixture(scope="module")
def prompt_tokens() -> tuple[int, ...]:
    vm = srv._vocab_model(str(demo.resolve("demo:Q8_0")))
    try:
        return tuple(vm.tokenize(demo.DEMO_PROMPT, chat=True))
    finally:
        vm.close()


def cfg(prompt_tokens, **kw) -> RunConfig:
    base = dict(target="demo:Q8_0", draft=None, spec_type="ngram-simple", max_tokens=48,
                prompt_tokens=prompt_tokens, engine=ENG, backend="llama-server")
    base.update(kw)
    return RunConfig(**base)


@pytest.fixture(scope="module")
def ngram_trace(server_bin, prompt_tokens) -> Trace:
    return srv.run_server_trace(cfg(prompt_tokens), server_bin=server_bin, diagnose=False)


def test_the_spec_types_and_version_come_from_the_binary(server_bin):
    types = srv.server_spec_types(server_bin)
    for t in ("none", "draft-simple", "draft-mtp", "draft-eagle3", "ngram-simple", "ngram-mod"):
        assert t in types
    assert "version:" in srv.server_version(server_bin)


def test_vanilla_on_the_server_equals_the_in_process_engine(ngram_trace, prompt_tokens):
    t = ngram_trace
    c = RunConfig(target="demo:Q8_0", draft=None, spec_type="none", max_tokens=48, prompt_tokens=prompt_tokens,
                  engine=ENG)
    s = Session()
    try:
        local = s.run(c).vanilla
    finally:
        s.close()
    assert len(t.vanilla.tokens) == 48
    assert t.vanilla.tokens == local.tokens
    assert t.vanilla.text == local.text
    # log-probability differences are logit differences: the server's margins are the in-process ones
    for a, b in zip(t.vanilla.steps, local.steps):
        assert a.margin is not None and abs(a.margin - b.margin) < 1e-3, (a.index, a.margin, b.margin)
        assert a.top_ids[:2] == b.top_ids[:2] or abs(b.margin) < 1e-3
    assert t.environment["engine"] == "llama-server"
    assert "version:" in t.environment["llama_server"]["version"]
    assert t.vanilla.eval_ms is None and all(st.batch_size is None for st in t.speculative.steps)


def test_ngram_simple_reports_consistent_totals(ngram_trace):
    s = ngram_trace.speculative
    assert s.rounds == [] and s.reported_drafted is not None
    assert s.n_drafted >= s.n_accepted >= 0
    timings = ngram_trace.extra["server"]["speculative"]["timings"]
    assert s.n_drafted == timings.get("draft_n", 0)
    assert "--spec-type" in ngram_trace.extra["server"]["speculative"]["args"]
    assert "--spec-type" not in ngram_trace.extra["server"]["vanilla"]["args"]


def test_draft_simple_drafts_and_accepts(server_bin, prompt_tokens, tmp_path):
    t = srv.run_server_trace(cfg(prompt_tokens, spec_type="draft-simple", draft="demo:Q4_0", max_tokens=48),
                             server_bin=server_bin, diagnose=False)
    s = t.speculative
    assert len(s.tokens) == 48
    assert s.n_drafted > 0
    assert s.n_drafted >= s.n_accepted >= 0
    assert t.models["draft"]["quantization"] == "Q4_0" and t.config["draft"].endswith("Q4_0.gguf")
    back = Trace.load(t.save(tmp_path / "t.json"))
    assert (back.speculative.n_drafted, back.speculative.n_accepted) == (s.n_drafted, s.n_accepted)


def test_p_min_1_on_the_command_line_is_identical_to_vanilla(server_bin, prompt_tokens, tmp_path):
    out = tmp_path / "pmin1.json"
    cp = subprocess.run(
        [sys.executable, "-m", "specview", "run", "--engine", "llama-server", "--server-bin", server_bin,
         "--spec-type", "draft-simple", "--p-min", "1", "-n", "32", "-t", "1", "-c", "512",
         "--tokens", ",".join(map(str, prompt_tokens)), "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert cp.returncode == 0, cp.stderr
    assert "IDENTICAL" in cp.stdout and "the engine's own totals" in cp.stdout
    t = Trace.load(out)
    assert t.comparison.identical and len(t.vanilla.tokens) == 32
    assert t.speculative.n_drafted == 0 and t.speculative.n_accepted == 0


def _pid_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie holds no port and runs nothing


def _group_members(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                out.append(int(d.name))
    return out


def _health_refused(port: int, deadline: float) -> bool:
    """Bounded polling of /health until the port refuses connections."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline:
        try:
            opener.open(f"http://127.0.0.1:{port}/health", timeout=1).close()
        except urllib.error.HTTPError:
            pass
        except (urllib.error.URLError, ConnectionError, OSError):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_sigkilling_specview_mid_run_leaves_no_server(server_bin, prompt_tokens):
    p = subprocess.Popen(
        [sys.executable, "-m", "specview", "run", "--engine", "llama-server", "--server-bin", server_bin,
         "--spec-type", "ngram-simple", "-n", "2000", "--ignore-eos", "-t", "1", "-c", "4096",
         "--tokens", ",".join(map(str, prompt_tokens))],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    pids, ports, seen = [], [], []
    try:
        for line in p.stderr:  # the run reports each server as it starts and gets ready
            seen.append(line)
            if m := re.search(r"started llama-server \(\w+\) pid (\d+)", line):
                pids.append(int(m.group(1)))
            if m := re.search(r"ready on 127\.0\.0\.1:(\d+)", line):
                ports.append(int(m.group(1)))
            if "vanilla arm:" in line or "error" in line:
                break
        assert len(pids) == 2 and len(ports) == 2, "".join(seen)
        assert all(not _pid_gone(x) for x in pids)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    deadline = time.monotonic() + 20
    assert all(_health_refused(port, deadline) for port in ports)
    while time.monotonic() < deadline:  # bounded: the kernel finishes the kill a moment after the port closes
        if all(_pid_gone(x) for x in pids):
            break
        time.sleep(0.05)
    assert all(_pid_gone(x) for x in pids)
    assert all(_group_members(x) == [] for x in pids)


def test_a_server_that_dies_mid_run_is_named(server_bin, prompt_tokens):
    started: list[int] = []
    killed: list[int] = []

    def progress(msg: str) -> None:
        if m := re.search(r"started llama-server \(\w+\) pid (\d+)", msg):
            started.append(int(m.group(1)))
        if m := re.search(r"speculative arm: .* pid (\d+)", msg):
            killed.append(int(m.group(1)))
            os.kill(killed[0], signal.SIGKILL)

    with pytest.raises(srv.ServerError) as ei:
        srv.run_server_trace(cfg(prompt_tokens, max_tokens=16), server_bin=server_bin, progress=progress,
                             diagnose=False)
    msg = str(ei.value)
    assert killed and f"llama-server (speculative, pid {killed[0]}) exited" in msg
    assert "signal SIGKILL" in msg and "a request" in msg
    assert len(started) == 2 and all(_pid_gone(x) for x in started)  # the survivor was stopped too


def test_a_port_taken_between_check_and_bind_is_named_from_the_servers_output(server_bin, monkeypatch):
    monkeypatch.setattr(srv, "_port_in_use", lambda port: False)  # as if another program won the race
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        s = srv.LlamaServer(server_bin, ["-m", str(demo.resolve("demo:Q8_0")), "-t", "1"], label="vanilla",
                            port=port)
        s.start()
        try:
            with pytest.raises(srv.ServerError, match=f"port {port} on 127.0.0.1 is already in use"):
                s.wait_ready(timeout=60)
        finally:
            s.stop()


def _planted(trace: Trace, k: int, token: int) -> Trace:
    """The vanilla arm with a speculative arm that agrees up to k and then emits ``token``."""
    t = copy.deepcopy(trace)
    s = t.speculative
    s.tokens = t.vanilla.tokens[:k] + [token]
    s.steps = copy.deepcopy(t.vanilla.steps[:k + 1])
    s.steps[k].token, s.steps[k].top_ids, s.steps[k].top_logits, s.steps[k].margin = token, [], [], None
    t.comparison = compare_arms(t.vanilla, s)
    t.diagnosis = None
    return t


def test_diagnosis_from_the_outside_on_planted_forks(ngram_trace, server_bin):
    v = ngram_trace.vanilla
    early = v.steps[:24]
    tie = min(early, key=lambda st: st.margin)
    far = max(early, key=lambda st: st.margin)
    assert tie.margin < 1.0 and far.margin > 4.0  # facts about the demo's essay opening

    d = srv.diagnose_server(_planted(ngram_trace, tie.index, tie.top_ids[1]), server_bin=server_bin)
    assert d["verdict"] == "near-tie", d["explanation"]
    assert d["replays"]["single"]["reproduced"] and d["replays"]["single"]["requests"] == tie.index + 1
    assert d["replays"]["single"]["not_one_token"] == []  # every request after the prompt evaluated one token
    assert abs(d["gap"] - tie.margin) < 1e-3
    assert d["arms"]["speculative"] == {"reported": False}
    assert [b["T"] for b in d["replays"]["batched"]] == [2, 3, 4]
    assert all(b["evaluated"] == b["T"] for b in d["replays"]["batched"])  # really one T-token pass
    for ch in d["replays"]["chunked"]:  # the prefix really went in T-token passes
        assert sum(ch["evaluated"]) == tie.index and all(e <= ch["T"] for e in ch["evaluated"])
        assert ch["evaluated"][:-1] == [ch["T"]] * (len(ch["evaluated"]) - 1)

    d = srv.diagnose_server(_planted(ngram_trace, far.index, far.top_ids[-1]), server_bin=server_bin)
    assert d["verdict"] == "state", d["explanation"]
    assert d["gap"] > 4.0 and d["rule"] == "gap-far-beyond-envelope"

    t = _planted(ngram_trace, tie.index, tie.top_ids[1])
    j = max(0, tie.index - 1)
    t.vanilla.steps[j].top_logits = [x + 0.5 if i == 1 else x for i, x in enumerate(t.vanilla.steps[j].top_logits)]
    d = srv.diagnose_server(t, server_bin=server_bin)
    assert d["verdict"] == "nondeterministic", d["explanation"]
    assert d["replays"]["single"]["first_deviation"] == j
    assert "VERDICT  NONDETERMINISTIC" in srv.format_server_verdict(d)


def test_cancel_stops_both_servers_and_marks_the_arms(server_bin, prompt_tokens):
    started: list[int] = []
    flag = {"cancel": False}

    def progress(msg: str) -> None:
        if m := re.search(r"started llama-server \(\w+\) pid (\d+)", msg):
            started.append(int(m.group(1)))
        if "vanilla arm:" in msg:
            flag["cancel"] = True  # checked while the request is in flight

    t = srv.run_server_trace(cfg(prompt_tokens, max_tokens=1000, ignore_eos=True,
                                 engine=EngineSettings(threads=1, n_ctx=2048)),
                             server_bin=server_bin, progress=progress, cancel=lambda: flag["cancel"])
    assert t.vanilla.stop_reason == "cancelled" and t.speculative.stop_reason == "cancelled"
    assert t.vanilla.tokens == [] and t.comparison.n_vanilla == 0
    assert len(started) == 2 and all(_pid_gone(x) for x in started)


def test_both_engines_stop_at_the_end_of_generation_token_alike(server_bin):
    c = RunConfig(target="demo:Q8_0", draft=None, spec_type="ngram-simple", max_tokens=64,
                  prompt="Reply with one word: hello.", engine=EngineSettings(threads=1, n_ctx=256),
                  backend="llama-server")
    t = srv.run_server_trace(c, server_bin=server_bin, diagnose=False)
    s = Session()
    try:
        local = s.run(RunConfig(target="demo:Q8_0", draft=None, spec_type="none", max_tokens=64,
                                prompt_tokens=tuple(t.prompt["tokens"]), engine=c.engine)).vanilla
    finally:
        s.close()
    assert t.vanilla.stop_reason == local.stop_reason == "eos"
    assert t.vanilla.tokens == local.tokens and len(local.tokens) < 64  # the EOS token itself included
    assert t.speculative.tokens == t.vanilla.tokens


def test_a_real_fork_on_a_q4_k_m_target_is_diagnosed_from_the_outside(server_bin, prompt_tokens):
    t = srv.run_server_trace(cfg(prompt_tokens, target="demo:Q4_K_M", spec_type="draft-simple", draft="demo:Q4_0",
                                 max_tokens=40), server_bin=server_bin)
    if t.comparison.identical:  # the fork is numerics, so it depends on the CPU's kernels
        assert t.diagnosis is None
        pytest.skip("no fork within 40 tokens on this CPU")
    d = t.diagnosis
    fm = t.comparison.first_mismatch
    assert d["fork"] == fm.index and d["vanilla_token"] == fm.vanilla_token
    assert d["replays"]["single"]["reproduced"], "plain decoding on llama-server is deterministic on a CPU"
    assert d["replays"]["single"]["token"] == fm.vanilla_token
    assert d["verdict"] == "near-tie", d["explanation"]
    assert d["gap"] < 2.0 and abs(d["gap"] - t.vanilla.steps[fm.index].margin) < 1e-3


def test_ctrl_c_stops_the_servers_and_exits_130(server_bin, prompt_tokens):
    p = subprocess.Popen(
        [sys.executable, "-m", "specview", "run", "--engine", "llama-server", "--server-bin", server_bin,
         "--spec-type", "ngram-simple", "-n", "2000", "--ignore-eos", "-t", "1", "-c", "4096",
         "--tokens", ",".join(map(str, prompt_tokens))],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    pids = []
    try:
        for line in p.stderr:
            if m := re.search(r"started llama-server \(\w+\) pid (\d+)", line):
                pids.append(int(m.group(1)))
            if "vanilla arm:" in line or "error" in line:
                break
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 130
        assert "interrupted" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert len(pids) == 2 and all(_pid_gone(x) for x in pids)


def test_tokens_inside_a_multi_byte_character_get_no_top_k_but_keep_their_place(server_bin):
    # llama-server reports no top-k for a token whose text is an incomplete UTF-8 sequence; the others
    # must still line up with their own tokens (their margins equal the in-process engine's)
    c = RunConfig(target="demo:Q8_0", draft=None, spec_type="ngram-simple", max_tokens=24,
                  prompt="Translate 'good morning' into Chinese characters and Russian.",
                  engine=EngineSettings(threads=1, n_ctx=256), backend="llama-server")
    t = srv.run_server_trace(c, server_bin=server_bin, diagnose=False)
    s = Session()
    try:
        local = s.run(RunConfig(target="demo:Q8_0", draft=None, spec_type="none", max_tokens=24,
                                prompt_tokens=tuple(t.prompt["tokens"]), engine=c.engine)).vanilla
    finally:
        s.close()
    assert t.vanilla.tokens == local.tokens
    missing = [st.index for st in t.vanilla.steps if not st.top_ids]
    assert missing and len(missing) < len(t.vanilla.steps)
    for a, b in zip(t.vanilla.steps, local.steps):
        if a.top_ids:
            assert a.top_ids[0] == a.token and abs(a.margin - b.margin) < 1e-3
        else:
            assert a.margin is None


def test_the_matrix_runs_on_llama_server_and_agrees_with_single_runs(server_bin, tmp_path, capsys):
    """`specview matrix --engine llama-server`: every cell equals a single server run of the same settings."""
    import json

    from specview.cli import main

    out = tmp_path / "m.json"
    code = main(["matrix", "--engine", "llama-server", "--server-bin", server_bin, "-t", "1", "-c", "512",
                 "--targets", "demo:Q4_K_M", "--drafters", "demo:Q4_0,none", "--n-max", "2", "--p-min", "0",
                 "--tokens", "1,504,3458,282,1060", "-n", "24", "-o", str(out), "-q"])
    assert code in (0, 1), capsys.readouterr().err
    doc = json.loads(out.read_text())
    cells = {c["params"]["drafter"]: c for c in doc["cells"]}
    assert set(cells) == {"demo:Q4_0", "none"} and all(c["status"] == "ok" for c in cells.values())
    assert cells["none"]["identical"]  # nothing drafted: the same passes as vanilla
    assert doc["counters"]["loads"] == 4  # two servers per cell
    single = srv.run_server_trace(
        RunConfig(target="demo:Q4_K_M", draft="demo:Q4_0", spec_type="draft-simple", n_max=2, max_tokens=24,
                  prompt_tokens=(1, 504, 3458, 282, 1060), chat=False, engine=ENG, backend="llama-server"),
        server_bin=server_bin, diagnose=False)
    cell = cells["demo:Q4_0"]
    assert cell["identical"] == single.comparison.identical
    if not single.comparison.identical:
        assert cell["first_mismatch"] == single.comparison.first_mismatch.index
