"""The mlx-server engine on real mlx_lm.server processes (mlx[cpu] runs them on Linux).

Tiny random-weight models keep the servers quick; the CLI test runs the demo
MLX folders.  Every test checks that no server outlives it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from require import require_module

mx = require_module("mlx.core")
require_module("mlx_lm")

import mlx_plants  # noqa: E402

from specview.backends.local_server import process as lsp  # noqa: E402
from specview.backends.mlx import write_random_model  # noqa: E402
from specview.core.config import EngineSettings, RunConfig  # noqa: E402
from specview.core.errors import ConfigError  # noqa: E402
from specview.core.registry import get_backend  # noqa: E402
from specview.core.trace import Trace  # noqa: E402

PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlx-server")
    target = write_random_model(root / "target", seed=1)
    draft = write_random_model(root / "draft", seed=2)  # the same corpus: the same tokenizer, other weights
    return {"root": root, "target": str(target), "draft": str(draft)}


def cfg_for(models, **kw) -> RunConfig:
    engine = kw.pop("engine", EngineSettings())
    base = dict(backend="mlx-server", target=models["target"], draft=models["draft"], spec_type="draft-simple",
                n_max=3, max_tokens=20, prompt=PROMPT, chat=False, top_k=8, engine=engine)
    base.update(kw)
    return RunConfig(**base)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_no_servers(pids=()):
    assert lsp.live_servers() == []
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "an mlx_lm.server outlived its run"


def server_pids(trace: Trace) -> list[int]:
    return [trace.extra["server"][arm]["pid"] for arm in ("vanilla", "speculative")]


# -- a fork planted in the verify passes: diagnosed as a near-tie, proven by the serial control ------------
def test_planted_batched_near_tie_is_diagnosed_through_mlx_lm_in_process(models, tmp_path, monkeypatch):
    # the diagnosis replays in MLX in this process, where the plant below is (its worker process would not have it)
    monkeypatch.setenv("SPECVIEW_WORKER", "0")
    launcher = mlx_plants.launcher(tmp_path, "near-tie")
    cfg = cfg_for(models, engine=EngineSettings(server_bin=str(launcher)))
    events = []
    undo = mlx_plants.install("near-tie")  # the same plant in this process, for the diagnosis
    try:
        with get_backend("mlx-server").runner() as runner:
            trace = runner.run(cfg, on_event=lambda arm, st: events.append(arm))
            pids = server_pids(trace)
            diag = runner.diagnose(trace, cfg)
    finally:
        undo()
    assert_no_servers(pids)
    v, s = trace.vanilla, trace.speculative
    assert events.count("vanilla") == len(v.tokens) == 20 and events.count("speculative") == len(s.tokens)
    # what the server reports, and what it does not
    assert all(st.round is None and st.from_draft is None and st.batch_size is None for st in v.steps + s.steps)
    assert all(len(st.top_ids) == 8 and st.top_logits == sorted(st.top_logits, reverse=True) for st in v.steps)
    assert all(st.token == st.top_ids[0] for st in v.steps + s.steps)
    info = trace.extra["server"]
    assert info["top_logprobs_cap"] == 11 and "at most 11" in info["top_logprobs_cap_source"]
    assert info["speculative"]["request"]["num_draft_tokens"] == 3
    assert "--draft-model" in info["speculative"]["args"] and "--draft-model" not in info["vanilla"]["args"]
    # the planted verify passes flip the first near-tie of vanilla (or an earlier one, where this machine's
    # batched kernels already round differently)
    near = [j for j, st in enumerate(v.steps) if st.margin < mlx_plants.TAU]
    assert near, "no near-tie in 20 tokens: the planted fault cannot show"
    fork = trace.comparison.first_mismatch.index
    assert not trace.comparison.identical and fork <= near[0]
    assert s.tokens[fork] == v.steps[fork].top_ids[1]  # the runner-up won
    # the diagnosis: both loops reproduce their arms in process, the serial control reproduces vanilla
    assert (diag["verdict"], diag["rule"]) == ("near-tie", "serial-verify-reproduces-vanilla")
    rp = diag["replays"]
    assert rp["single"]["reproduced"] and rp["speculative"]["reproduced"]
    shape = rp["speculative"]  # a verify pass of 1 + min(n_max, tokens left) rows emitted the fork token
    assert 2 <= shape["batch_size"] <= 4 and 0 <= shape["batch_index"] < shape["batch_size"]
    assert shape["from_draft_flags"][fork] is shape["from_draft"]
    assert diag["serial_verify"]["identical_to_vanilla"] and diag["serial_verify"]["n_tokens"] == 20
    assert abs(diag["gap"] - v.steps[fork].margin) < 1e-4  # logp(a) - logp(b) is the recorded margin
    assert diag["not_measured"] and trace.diagnosis is diag
    # the trace survives a round trip
    path = trace.save(tmp_path / "t.json")
    again = Trace.load(path)
    assert again.vanilla.tokens == v.tokens and again.diagnosis["verdict"] == "near-tie"
    assert again.extra["server"]["top_logprobs_cap"] == 11


# -- a rollback bug planted in the server: the clean loop in process does not reproduce it -------------------
def test_planted_rollback_bug_in_the_server_is_a_state_bug(models, tmp_path):
    launcher = mlx_plants.launcher(tmp_path, "rollback")
    cfg = cfg_for(models, engine=EngineSettings(server_bin=str(launcher)))
    with get_backend("mlx-server").runner() as runner:
        trace = runner.run(cfg)
        pids = server_pids(trace)
        diag = runner.diagnose(trace, cfg)
    assert_no_servers(pids)
    assert not trace.comparison.identical
    assert diag["verdict"] == "state" and diag["rule"] == "speculative-unreproducible"
    sp = diag["replays"]["speculative"]
    assert diag["replays"]["single"]["reproduced"] and not sp["reproduced"] and sp["rerun_consistent"]
    # the kept draft moves the logits from the first rejection on; the tokens part at the fork or later
    assert sp["first_deviation"] <= trace.comparison.first_mismatch.index
    assert diag["serial_verify"]["identical_to_vanilla"]


# -- the CLI, offline, on the demo MLX folders -------------------------------------------------------------
@pytest.mark.demo
@pytest.mark.decides_nothing
def test_cli_run_on_the_demo_folders_and_its_report(tmp_path):
    out = tmp_path / "trace.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cp = subprocess.run([sys.executable, "-m", "specview", "run", "--engine", "mlx-server", "-n", "4",
                         "-p", "What is the capital of France?", "--json", str(out)],
                        capture_output=True, text=True, env=env, timeout=600)
    assert cp.returncode in (0, 1), cp.stderr
    trace = Trace.load(out)
    from specview.backends.mlx import DEMO_MLX
    from specview.core.config import DEMO_TARGET

    bits, group, _ = DEMO_MLX[DEMO_TARGET.split(":", 1)[1]]  # the MLX folder that stands for the demo target
    tgt = trace.models["target"]
    assert trace.config["backend"] == "mlx-server" and (tgt["quant_bits"], tgt["quant_group_size"]) == (bits, group)
    assert not trace.config.get("decided"), trace.config.get("decided")  # the same run on every CPU
    assert len(trace.vanilla.tokens) == len(trace.speculative.tokens) == 4 or "eos" in (
        trace.vanilla.stop_reason, trace.speculative.stop_reason)
    assert trace.prompt["chat"] and trace.extra["server"]["vanilla"]["usage"]["prompt_tokens"] == len(
        trace.prompt["tokens"])
    assert ("IDENTICAL" in cp.stdout) == trace.comparison.identical and "VERDICT" in cp.stdout
    # the vanilla arm is what mlx-lm's own greedy loop gives on the same folder, in this process
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load

    model, _ = load(trace.config["target_folder"])
    steps = generate_step(mx.array(trace.prompt["tokens"]), model, max_tokens=4, prefill_step_size=512)
    want = [int(tok) for (tok, _lp), _ in zip(steps, range(len(trace.vanilla.tokens)))]
    assert trace.vanilla.tokens == want
    for pid in server_pids(trace):
        assert not alive(pid)
    # its report builds
    from specview.core.report import write_report

    written = write_report(trace, tmp_path / "report")
    assert written["html"].read_text(encoding="utf-8") and written["markdown"].read_text(encoding="utf-8")


# -- no orphans --------------------------------------------------------------------------------------------
def test_a_killed_parent_takes_its_server_along(models, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        from specview.backends.mlx_server.process import MLXServer, find_server_program, server_args
        srv = MLXServer(find_server_program(), server_args({models['target']!r}, draft=None, n_batch=512, kv=[],
                                                          extra=[]), label="orphan")
        srv.start()
        srv.wait_loaded()
        print(srv.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """), encoding="utf-8")
    cp = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert cp.returncode == -signal.SIGKILL, cp.stderr
    pid = int(cp.stdout.split()[0])
    assert_no_servers([pid])


def test_a_failed_start_leaves_no_server_and_says_why(models):
    runner = get_backend("mlx-server").runner()
    cfg = cfg_for(models, engine=EngineSettings(server_args="--no-such-flag"))
    with pytest.raises(lsp.ServerError, match="rejected its command line") as err:
        runner.run(cfg)
    assert "--no-such-flag" in str(err.value)
    assert_no_servers()
    # a model the server cannot load: its process stays up, so its log must stop it (not the start timeout)
    cfg = cfg_for(models, engine=EngineSettings(server_args="--adapter-path /nonexistent/adapter"))
    t0 = time.monotonic()
    with pytest.raises(lsp.ServerError, match="generation thread died"):
        runner.run(cfg)
    assert time.monotonic() - t0 < 120
    assert_no_servers()
    runner.close()


def test_a_port_in_use(models, monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        # a port given explicitly and taken: refused before anything starts
        from specview.backends.mlx_server.process import MLXServer, find_server_program

        srv = MLXServer(find_server_program(), ["--model", models["target"]], label="busy", port=port)
        with pytest.raises(lsp.ServerError, match="already in use"):
            srv.start()
        assert srv.proc is None
        # a port that was free a moment ago and is taken when the server binds: started again elsewhere
        handed = []
        real = lsp.free_port

        def racy(host=lsp.HOST):
            handed.append(port if not handed else real(host))
            return handed[-1]

        monkeypatch.setattr(lsp, "free_port", racy)
        with get_backend("mlx-server").runner() as runner:
            trace = runner.run(cfg_for(models, spec_type="none", draft=None, max_tokens=4))
            assert runner.loads == 2 and handed[0] == port and handed[1] != port
            pids = server_pids(trace)
        assert len(trace.vanilla.tokens) == 4 and trace.comparison.identical
    assert_no_servers(pids)


def test_a_server_dying_mid_run_is_an_error_and_nothing_is_left(models):
    killed = []

    def progress(msg):
        if msg.startswith("speculative arm:"):  # kill the speculative server just before its request
            pid = int(msg.rsplit(" ", 1)[1])
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    runner = get_backend("mlx-server").runner(progress=progress)
    with pytest.raises(lsp.ServerError, match=r"exited .*signal SIGKILL"):
        runner.run(cfg_for(models, max_tokens=4))
    assert killed
    # the vanilla server of the run was stopped too
    assert_no_servers(killed)
    runner.close()


def test_what_the_server_cannot_do_is_refused_before_starting(models):
    be = get_backend("mlx-server")
    for kw, setting in ((dict(p_min=0.5), "p_min"), (dict(n_min=1), "n_min"),
                        (dict(serial_verify=True), "serial_verify"), (dict(spec_type="ngram-simple", draft=None),
                                                                      "spec_type"),
                        (dict(engine=EngineSettings(kv_type="iq4_nl")), "kv_type"),
                        (dict(engine=EngineSettings(server_args="--port 9")), "server_args")):
        with pytest.raises(ConfigError) as err:
            be.check(cfg_for(models, **kw))
        assert err.value.setting == setting
    assert lsp.live_servers() == []
    json.dumps(be.environment())  # facts a trace can hold
