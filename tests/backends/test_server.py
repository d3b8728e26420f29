"""The llama-server engine against a real llama-server on the demo model (short runs).

The binary comes from $SPECVIEW_LLAMA_SERVER or the cache path that
scripts/build-llama-server.sh fills.  Without it these tests skip, unless
$SPECVIEW_REQUIRE_SERVER=1, where its absence is a failure.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import door
import pytest
from require import missing

from specview.backends.llama_server import ServerError, ServerRunner, binary as sb
from specview.backends.llama_server import runner as sbe
from specview.core.config import EngineSettings, RunConfig
from specview.core.registry import get_backend
from specview.core.session import Session
from specview.core.trace import Trace

pytestmark = [pytest.mark.demo, pytest.mark.slow]

ENG = EngineSettings(threads=1, n_ctx=512)
BUILD_HINT = ("llama-server is not built: run scripts/build-llama-server.sh (it caches the binary in "
              f"{sb.cached_server_path()}), or set ${sb.ENV_BIN} to a llama-server binary")


def find_binary() -> str:
    path = os.environ.get(sb.ENV_BIN) or str(sb.cached_server_path())
    if Path(path).is_file() and os.access(path, os.X_OK):
        return path
    missing(f"{path} is missing. {BUILD_HINT}", switch="SPECVIEW_REQUIRE_SERVER")


@pytest.fixture(scope="module")
def server_bin() -> str:
    return find_binary()


@pytest.fixture(scope="module")
def prompt_tokens(server_bin) -> tuple[int, ...]:
    from specview.core.demo import DEMO_PROMPT

    vm = door.model(get_backend("llama.cpp").resolve("demo:Q8_0"), vocab_only=True)
    try:
        return tuple(vm.tokenize(DEMO_PROMPT, chat=True))
    finally:
        vm.close()


def cfg(server_bin, prompt_tokens, **kw) -> RunConfig:
    eng = kw.pop("engine", ENG)
    base = dict(target="demo:Q8_0", draft=None, spec_type="ngram-simple", max_tokens=48, prompt_tokens=prompt_tokens,
                engine=replace(eng, server_bin=server_bin), backend="llama-server")
    base.update(kw)
    return RunConfig(**base)


@pytest.fixture(scope="module")
def runner():
    r = ServerRunner()
    yield r
    r.close()


@pytest.fixture(scope="module")
def in_process():
    """The in-process engine the server's arms are compared with: one worker and one load of demo:Q8_0 for them all."""
    s = Session()
    yield s
    s.close()


@pytest.fixture(scope="module")
def draft_trace(runner, server_bin, prompt_tokens) -> Trace:
    return runner.run(cfg(server_bin, prompt_tokens, spec_type="draft-simple", draft="demo:Q4_0"))


def test_the_spec_types_and_version_come_from_the_binary(server_bin):
    types = sb.server_spec_types(server_bin)
    for t in ("none", "draft-simple", "draft-mtp", "draft-eagle3", "ngram-simple", "ngram-mod"):
        assert t in types
    assert get_backend("llama-server").spec_types(EngineSettings(server_bin=server_bin)) == types
    assert "version:" in sb.server_version(server_bin)


def test_vanilla_on_the_server_equals_the_in_process_engine(draft_trace, prompt_tokens, in_process):
    t = draft_trace
    local = in_process.run(RunConfig(target="demo:Q8_0", draft=None, spec_type="none", max_tokens=48,
                                prompt_tokens=prompt_tokens, engine=ENG)).vanilla
    assert len(t.vanilla.tokens) == 48 and t.vanilla.tokens == local.tokens and t.vanilla.text == local.text
    # log-probability differences are logit differences: the server's margins are the in-process ones
    for a, b in zip(t.vanilla.steps, local.steps):
        assert a.margin is not None and abs(a.margin - b.margin) < 1e-3, (a.index, a.margin, b.margin)
    assert t.environment["engine"] == "llama-server" and "version:" in t.environment["llama_server"]["version"]
    assert t.vanilla.eval_ms is None


def test_one_server_runs_both_arms_and_its_vanilla_equals_a_server_without_the_drafter(draft_trace, server_bin,
                                                                                       prompt_tokens):
    """The single-server protocol's premise, against the real server, token for token and log-prob for log-prob."""
    t = draft_trace
    rec = t.extra["server"]
    assert rec["protocol"] == "single-server" and rec["vanilla"]["form"] == "token-by-token"
    assert rec["vanilla"]["server"]["pid"] == rec["speculative"]["server"]["pid"]  # one server, both arms
    assert "-md" in rec["vanilla"]["server"]["args"]  # with its drafter loaded
    assert rec["vanilla"]["off_shape"] == [] and rec["vanilla"]["drafted"] == 0
    assert rec["vanilla"]["evaluated_first"] == len(prompt_tokens)  # then one token per request
    assert rec["vanilla"]["check"]["identical"]  # the runner checked it once against a drafter-free server
    with ServerRunner(single_server=False) as two:
        ref = two.run(cfg(server_bin, prompt_tokens, spec_type="draft-simple", draft="demo:Q4_0"))
    assert ref.extra["server"]["protocol"] == "two-servers"
    assert "-md" not in ref.extra["server"]["vanilla"]["server"]["args"]
    assert ref.vanilla.tokens == t.vanilla.tokens
    for a, b in zip(ref.vanilla.steps, t.vanilla.steps):
        assert a.top_ids == b.top_ids and a.top_logits == b.top_logits
    assert ref.speculative.tokens == t.speculative.tokens  # and the speculative arm is the same request


def test_per_round_data_is_rebuilt_and_adds_up(draft_trace):
    s = draft_trace.speculative
    assert draft_trace.extra["server"]["speculative"]["rounds"]["available"], \
        draft_trace.extra["server"]["speculative"]["rounds"]
    rounds = s.rounds
    assert rounds[0].index == 0 and rounds[0].first_step == 0
    assert sum(r.drafted for r in rounds) == s.reported_drafted > 0
    assert sum(r.accepted for r in rounds) <= s.reported_accepted
    for r in rounds[1:]:
        assert 0 <= r.accepted <= r.drafted and r.batch_size == r.drafted + 1
        steps = [st for st in s.steps if st.round == r.index]
        assert steps[0].index == r.first_step and len(steps) <= r.accepted + 1
        assert [st.from_draft for st in steps] == [j < r.accepted for j in range(len(steps))]
        assert [st.batch_index for st in steps] == list(range(len(steps)))
        # llama-server reports top-k only for tokens of one-token passes
        assert all(bool(st.top_ids) == (r.drafted == 0) for st in steps if st.piece.isascii())
    assert [st.round for st in s.steps] == sorted(st.round for st in s.steps)
    assert all(r.draft_ms is None and r.verify_ms is None for r in rounds)


def test_a_second_run_reuses_the_server_and_the_vanilla_arm(runner, draft_trace, server_bin, prompt_tokens):
    loads, vruns = runner.loads, runner.vanilla_runs
    t = runner.run(cfg(server_bin, prompt_tokens, spec_type="draft-simple", draft="demo:Q4_0", max_tokens=48))
    assert runner.loads == loads and runner.vanilla_runs == vruns  # no start, no vanilla arm
    assert t.vanilla.tokens == draft_trace.vanilla.tokens and t.extra["server"]["vanilla"]["reused"]
    t2 = runner.run(cfg(server_bin, prompt_tokens[:-1], spec_type="draft-simple", draft="demo:Q4_0", max_tokens=8))
    assert runner.loads == loads and runner.vanilla_runs == vruns + 1  # a new prompt: same server, new vanilla arm
    assert len(t2.vanilla.tokens) == 8


def test_a_broken_single_server_vanilla_falls_back_to_its_own_server_and_says_so(server_bin, prompt_tokens,
                                                                                  monkeypatch):
    monkeypatch.setattr(sbe, "_chain_problem", lambda tbt, n: "request 3 evaluated 2 tokens where plain decoding "
                                                              "evaluates 1")
    with ServerRunner() as r:
        t = r.run(cfg(server_bin, prompt_tokens, spec_type="draft-simple", draft="demo:Q4_0", max_tokens=16))
        rec = t.extra["server"]
        assert rec["protocol"] == "two-servers" and "request 3 evaluated 2 tokens" in rec["protocol_reason"]
        assert rec["vanilla"]["form"] == "one-request" and "-md" not in rec["vanilla"]["server"]["args"]
        assert r.loads == 2 and len(t.vanilla.tokens) == 16


def test_a_vanilla_arm_that_differs_from_a_drafter_free_server_is_replaced_and_the_pair_keeps_two_servers(
        server_bin, prompt_tokens, monkeypatch):
    monkeypatch.setattr(sbe, "arm_difference", lambda a, b: "token 3: 10 against 11")
    with ServerRunner() as r:
        c = cfg(server_bin, prompt_tokens, spec_type="draft-simple", draft="demo:Q4_0", max_tokens=12)
        t = r.run(c)
        rec = t.extra["server"]
        assert rec["protocol"] == "two-servers" and "token 3: 10 against 11" in rec["protocol_reason"]
        assert rec["vanilla"]["form"] == "one-request" and rec["vanilla"]["check"]["identical"] is False
        loads = r.loads
        t2 = r.run(replace(c, n_max=2, prompt_tokens=prompt_tokens[:-1]))  # same pair: two servers, no new check
        rec2 = t2.extra["server"]
        assert rec2["protocol"] == "two-servers" and "token 3: 10 against 11" in rec2["protocol_reason"]
        assert rec2["vanilla"]["form"] == "one-request" and "check" not in rec2["vanilla"]
        assert r.loads == loads + 1  # only the speculative server for the new n_max


def test_p_min_1_on_the_command_line_is_identical_to_vanilla(server_bin, prompt_tokens, tmp_path):
    out = tmp_path / "pmin1.json"
    cp = subprocess.run(
        [sys.executable, "-m", "specview", "run", "--engine", "llama-server", "--server-bin", server_bin,
         "--spec-type", "draft-simple", "--p-min", "1", "-n", "24", "-t", "1", "-c", "512",
         "--tokens", ",".join(map(str, prompt_tokens)), "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert cp.returncode == 0, cp.stderr
    assert "IDENTICAL" in cp.stdout
    t = Trace.load(out)
    assert t.comparison.identical and len(t.vanilla.tokens) == 24
    assert t.speculative.n_drafted == 0 and t.speculative.n_accepted == 0


def test_both_engines_stop_at_the_end_of_generation_token_alike(runner, server_bin, in_process):
    c = RunConfig(target="demo:Q8_0", draft=None, spec_type="ngram-simple", max_tokens=64,
                  prompt="Reply with one word: hello.", engine=replace(ENG, server_bin=server_bin),
                  backend="llama-server")
    t = runner.run(c)
    local = in_process.run(RunConfig(target="demo:Q8_0", draft=None, spec_type="none", max_tokens=64,
                                prompt_tokens=tuple(t.prompt["tokens"]), engine=ENG)).vanilla
    assert t.vanilla.stop_reason == local.stop_reason == "eos"
    assert t.vanilla.tokens == local.tokens and len(local.tokens) < 64  # the EOS token itself included
    assert t.speculative.tokens == t.vanilla.tokens


def test_tokens_inside_a_multi_byte_character_get_no_top_k_but_keep_their_place(runner, server_bin, in_process):
    c = RunConfig(target="demo:Q8_0", draft=None, spec_type="ngram-simple", max_tokens=24,
                  prompt="Translate 'good morning' into Chinese characters and Russian.",
                  engine=replace(ENG, server_bin=server_bin), backend="llama-server")
    t = runner.run(c)
    local = in_process.run(RunConfig(target="demo:Q8_0", draft=None, spec_type="none", max_tokens=24,
                                prompt_tokens=tuple(t.prompt["tokens"]), engine=ENG)).vanilla
    assert t.vanilla.tokens == local.tokens and t.speculative.tokens == t.vanilla.tokens
    missing = [st.index for st in t.vanilla.steps if not st.top_ids]
    assert missing and len(missing) < len(t.vanilla.steps)
    for a, b in zip(t.vanilla.steps, local.steps):
        if a.top_ids:
            assert a.top_ids[0] == a.token and abs(a.margin - b.margin) < 1e-3
        else:
            assert a.margin is None


# -- no server outlives specview --------------------------------------------------------------------
def _pid_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def _all_gone(pids: list[int], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded: the kernel finishes a kill a moment after the port closes
        if all(_pid_gone(x) for x in pids):
            return True
        time.sleep(0.05)
    return all(_pid_gone(x) for x in pids)


def _cli(server_bin, prompt_tokens, **popen):
    return subprocess.Popen(
        [sys.executable, "-m", "specview", "run", "--engine", "llama-server", "--server-bin", server_bin,
         "--spec-type", "ngram-simple", "-n", "2000", "--ignore-eos", "-t", "1", "-c", "4096",
         "--tokens", ",".join(map(str, prompt_tokens))],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_sigkilling_specview_mid_run_leaves_no_server(server_bin, prompt_tokens):
    p = _cli(server_bin, prompt_tokens)
    pids, seen = [], []
    try:
        for line in p.stderr:
            seen.append(line)
            if m := re.search(r"started llama-server \([\w -]+\) pid (\d+)", line):
                pids.append(int(m.group(1)))
            if "vanilla arm:" in line or "error" in line:
                break
        assert len(pids) == 1, "".join(seen)  # one server for both arms
        assert not _pid_gone(pids[0])
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert _all_gone(pids)


def test_ctrl_c_stops_the_server_and_exits_130(server_bin, prompt_tokens):
    p = _cli(server_bin, prompt_tokens, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pids = []
    try:
        for line in p.stderr:
            if m := re.search(r"started llama-server \([\w -]+\) pid (\d+)", line):
                pids.append(int(m.group(1)))
            if "vanilla arm:" in line or "error" in line:
                break
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 130
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert len(pids) == 1 and _all_gone(pids)


def test_a_server_that_dies_mid_run_is_named_and_nothing_is_left(server_bin, prompt_tokens):
    started: list[int] = []
    killed: list[int] = []

    def progress(msg: str) -> None:
        if m := re.search(r"started llama-server \([\w -]+\) pid (\d+)", msg):
            started.append(int(m.group(1)))
        if m := re.search(r"speculative arm: .* pid (\d+)", msg):
            killed.append(int(m.group(1)))
            os.kill(killed[0], signal.SIGKILL)

    with ServerRunner(progress=progress) as r:
        with pytest.raises(ServerError) as ei:
            r.run(cfg(server_bin, prompt_tokens, max_tokens=16))
        assert r.pool.live() == []
    msg = str(ei.value)
    assert killed and f"llama-server (speculative, pid {killed[0]}) exited" in msg
    assert "signal SIGKILL" in msg and "a request" in msg
    assert len(started) == 2 and _all_gone(started)  # the drafter's server and the drafter-free one it was checked on


def test_a_port_taken_between_check_and_bind_is_named_from_the_servers_output(server_bin, monkeypatch):
    from specview.backends.llama_server.process import LlamaServer
    from specview.backends.local_server import process as lp

    monkeypatch.setattr(lp, "port_in_use", lambda port, host="127.0.0.1": False)  # another program won the race
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        s = LlamaServer(server_bin, ["-m", get_backend("llama.cpp").resolve("demo:Q8_0"), "-t", "1",
                                     *door.server_flags()], label="vanilla", port=port)
        s.start()
        try:
            with pytest.raises(ServerError, match=f"port {port} on 127.0.0.1 is already in use"):
                s.wait_ready(timeout=60)
        finally:
            s.stop()
        assert _all_gone([s.pid])


def test_cancel_keeps_what_was_computed_and_the_runner_stops_its_server_on_close(server_bin, prompt_tokens):
    started: list[int] = []
    flag = {"n": 0}

    def progress(msg: str) -> None:
        if m := re.search(r"started llama-server \([\w -]+\) pid (\d+)", msg):
            started.append(int(m.group(1)))

    def on_event(arm, ev):
        if arm == "speculative" and getattr(ev, "index", -1) >= 10:
            flag["n"] += 1

    with ServerRunner(progress=progress) as r:
        t = r.run(cfg(server_bin, prompt_tokens, max_tokens=160, ignore_eos=True,
                      engine=EngineSettings(threads=1, n_ctx=1024)), on_event=on_event, cancel=lambda: flag["n"] > 0)
        assert t.vanilla.stop_reason == "max_tokens" and len(t.vanilla.tokens) == 160
        assert t.speculative.stop_reason == "cancelled" and 10 < len(t.speculative.tokens) < 160
        assert t.speculative.tokens == t.vanilla.tokens[:len(t.speculative.tokens)]
        spid = t.extra["server"]["speculative"]["server"]["pid"]
        assert spid in [p.pid for p in r.pool.live()]  # the server survived the dropped request ...
        again = r.run(cfg(server_bin, prompt_tokens, max_tokens=8))  # ... and answers the next one
        assert again.speculative.tokens == t.vanilla.tokens[:8]
        assert again.extra["server"]["speculative"]["server"]["pid"] == spid
    assert spid in started and _all_gone(started)


def test_a_llama_server_matrix_with_no_diagnose_diagnoses_nothing_and_shares_its_servers(server_bin, tmp_path, capsys):
    import json

    from specview.cli import main

    out = tmp_path / "m.json"
    code = main(["matrix", "--engine", "llama-server", "--server-bin", server_bin, "-t", "1", "-c", "512",
                 "--targets", "demo:Q4_K_M", "--drafters", "demo:Q4_0,ngram-simple", "--n-max", "2,3",
                 "--tokens", "1,504,3458,282,1060", "--tokens", "1,9690,46,1391,1060", "-n", "16", "--no-diagnose",
                 "-o", str(out), "-q"])
    assert code in (0, 1), capsys.readouterr().err
    doc = json.loads(out.read_text())
    cells = doc["cells"]
    assert cells and all(c["status"] == "ok" for c in cells)
    assert all(not c["diagnosed"] and c["verdict"] == ("identical" if c["identical"] else "diverged") for c in cells)
    # one server per (drafter, n_max, p_min) plus the drafter-free one the pairs were checked against,
    # instead of two per cell; the vanilla arm once per prompt plus the check's
    n_servers = len({(c["params"]["drafter"], c["params"]["n_max"], c["params"]["p_min"]) for c in cells})
    assert doc["counters"]["loads"] <= n_servers + 1 < 2 * len(cells)
    n_prompts = len({c["params"]["prompt"] for c in cells})
    assert doc["counters"]["vanilla_runs"] <= n_prompts + 2 and doc["counters"]["speculative_runs"] == len(cells)


def test_the_shared_openai_protocol_reads_llama_servers_v1_completions_as_its_native_endpoint(server_bin):
    """specview.backends.local_server.openai (shared with the other server engines) on the real llama-server."""
    from specview.backends.llama_server.process import LlamaServer
    from specview.backends.llama_server.protocol import completion_body
    from specview.backends.local_server import openai

    model = get_backend("llama.cpp").resolve("demo:Q8_0")
    toks = [1, 504, 3458, 282, 1060]
    with LlamaServer(server_bin, ["-m", model, "-t", "1", "-c", "256", "-np", "1", *door.server_flags()],
                     label="openai") as s:
        s.wait_ready(timeout=120)
        native = s.post("/completion", completion_body(toks, 12, n_probs=4))
        choice, resp = openai.complete(s, "/v1/completions", openai.completion_body(toks, 12, top_logprobs=4))
        assert openai.model_ids(s) == [model]
    entries = openai.parse_logprobs(choice)
    assert [e.id for e in entries] == native["tokens"] and openai.stop_reason(choice) == "max_tokens"
    assert resp["usage"]["completion_tokens"] == 12 and resp["usage"]["prompt_tokens"] == len(toks)
    for e, n in zip(entries, native["completion_probabilities"]):
        assert e.top_ids == [t["id"] for t in n["top_logprobs"]]
        assert e.top_logprobs == sorted(e.top_logprobs, reverse=True)
        assert abs(e.margin - (n["top_logprobs"][0]["logprob"] - n["top_logprobs"][1]["logprob"])) < 1e-6
