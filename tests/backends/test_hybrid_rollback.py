"""Speculative decoding on the tiny hybrid targets (tests/tinyhybrid.py) in every rollback mode llama.cpp
allows on them, with real llama.cpp underneath.

* ``specview run`` prints a comparison and a verdict in each mode, and the trace says which mode ran and
  which rounds replayed; seq-rm is refused, naming the architecture and the modes it allows.
* The serial-verify control (every verify row and every replayed token its own single-token pass)
  reproduces vanilla token for token in every mode, through rejections, rollbacks and replays.
* The teacher-forced replay of the diagnosis rebuilds a hybrid arm's state exactly (checkpoint restores and
  replay passes included): every recorded row, bit for bit.
* Each planted rollback fault (``plants_rollback``: a checkpoint restored one token late, a snapshot index
  off by one, a replay skipped, a replay that keeps a rejected token) reads "state" through the control.

Nothing here pins this machine: exact tokens are compared with vanilla greedy on the same machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from plants_rollback import NEEDS, ROLLBACK_FAULTS  # noqa: E402
from tinyhybrid import hybrid_pair  # noqa: E402

from fakes import FaultyBackend  # noqa: E402
from test_serial_verify import assert_state_through_the_control, faulty_fork  # noqa: E402

from specview.core import diagnose as dmod  # noqa: E402
from specview.core.config import EngineSettings, RunConfig  # noqa: E402
from specview.core.arms.generate import banned  # noqa: E402
from specview.core.diagnose.replays import ArmCheck, spec_rows, without_banned  # noqa: E402
from specview.core.registry import register_backend, unregister_backend  # noqa: E402
from specview.core.session import Session  # noqa: E402
from specview.core.trace import Trace  # noqa: E402

ARCHS = ("qwen35", "lfm2")
MODES = (None, "auto", "checkpoint", "snapshots")  # None: no --rollback given
PROMPTS = ("the cat and the dog", "a model of the target", "history of the essay")
N = 48


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid")
    return {arch: hybrid_pair(arch, d) for arch in ARCHS}


def config(pairs, arch: str, mode: str | None, prompt: str = PROMPTS[0], **kw) -> RunConfig:
    target, draft = pairs[arch]
    base = dict(target=str(target), draft=str(draft), prompt=prompt, chat=False, max_tokens=N, ignore_eos=True,
                engine=EngineSettings(threads=1, rollback=mode))
    base.update(kw)
    return RunConfig(**base)


def ran(mode: str | None) -> str:
    return "checkpoint" if mode in (None, "auto") else mode  # what llama-server does for draft-simple on a hybrid


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", MODES)
def test_specview_run_prints_a_comparison_and_a_verdict_in_every_mode(pairs, arch, mode, tmp_path, capsys):
    from specview.cli import main

    target, draft = pairs[arch]
    out = tmp_path / "t.json"
    rc = main(["run", "-m", str(target), "-md", str(draft), "-p", PROMPTS[0], "--no-chat", "-n", str(N),
               "--ignore-eos", "-t", "1", *(["--rollback", mode] if mode else []), "-q", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc in (0, 1), text
    assert ("IDENTICAL" in text) == (rc == 0) and "VERDICT" in text
    trace = Trace.load(out)
    s = trace.speculative
    raw = json.loads(out.read_text())
    assert trace.config["context_used"]["rollback"] == ran(mode)
    # an explicit mode stays as given; left unset or auto, the target's header decides, with its reason
    decided = mode in (None, "auto")
    assert trace.config["engine"]["rollback"] == ("checkpoint" if decided else mode)
    assert ("rollback" in trace.config.get("decided", {})) == decided
    rejected = [r for r in s.rounds[1:] if r.accepted < r.drafted]
    assert rejected and s.n_accepted > 0, "the Q4_0 drafter must be accepted in part"
    assert all(r.rollback == ran(mode) for r in rejected)
    used = s.rollbacks["target"]
    if ran(mode) == "checkpoint":
        assert all(r.replay == r.accepted + 2 for r in rejected)
        assert "restored and replayed" in text
        # every rejection restored the checkpoint and replayed (again, where a replay rejected a carried token)
        assert used["checkpoint"] == used["replay"] >= len(rejected) and used["n_rs_seq"] == used["state-copy"] == 0
    else:
        assert all(r.replay == 0 for r in rejected) and "kept recurrent state" in text
        # a batched verify pass keeps a snapshot of every position it may drop: each rejection selected one
        assert used["n_rs_seq"] == len(rejected) and used["checkpoint"] == used["state-copy"] == used["replay"] == 0
    assert raw["speculative"]["rollbacks"]["target"] == used
    assert 1 + sum(r.emitted for r in s.rounds[1:]) == len(s.tokens) == N
    assert raw["speculative"]["rounds"][rejected[0].index]["rollback"] == ran(mode)


@pytest.mark.parametrize("arch", ARCHS)
def test_auto_is_decided_from_the_targets_header_and_says_why(pairs, arch):
    from specview.core.registry import Runner

    r = Runner.resolve(config(pairs, arch, None))
    assert r.config.engine.rollback == "checkpoint"
    assert arch in r.why("rollback") and "llama-server" in r.why("rollback")


@pytest.mark.parametrize("arch", ARCHS)
def test_seq_rm_on_a_hybrid_is_refused_naming_the_architecture_and_its_modes(pairs, arch, capsys):
    from specview.cli import main

    target, draft = pairs[arch]
    rc = main(["run", "-m", str(target), "-md", str(draft), "-p", "x", "-n", "4", "-t", "1", "--rollback", "seq-rm",
               "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "--rollback" in err and arch in err and "snapshots, checkpoint" in err, err


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["checkpoint", "snapshots"])
def test_the_serial_verify_control_reproduces_vanilla_in_every_mode(pairs, arch, mode):
    session = Session()
    try:
        trace = session.run(config(pairs, arch, mode, serial_verify=True))
    finally:
        session.close()
    s = trace.speculative
    assert trace.comparison.identical, trace.comparison.first_mismatch
    rejected = [r for r in s.rounds[1:] if r.accepted < r.drafted]
    # one-token passes keep no n_rs_seq snapshot: in snapshot mode each rejection loads a state copied after a
    # single-token pass, and the rounds and the arm's record say so
    assert rejected and all(r.serial and r.rollback == {"snapshots": "state-copy"}.get(mode, mode) for r in rejected)
    used = s.rollbacks["target"]
    assert used["n_rs_seq"] == 0
    if mode == "checkpoint":  # every replayed token was its own single-token pass too
        assert all(st.serial and st.batch_size == rnd.replay
                   for rnd in rejected for st in s.steps[rnd.first_step:rnd.first_step + rnd.emitted])
        assert used["checkpoint"] == used["replay"] >= len(rejected)
    else:
        assert used["state-copy"] == len(rejected) and used["checkpoint"] == 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["checkpoint", "snapshots"])
def test_the_teacher_forced_replay_rebuilds_a_hybrid_arm_bit_for_bit(pairs, arch, mode):
    cfg = config(pairs, arch, mode)
    session = Session()
    try:
        trace = session.run(cfg)
        s = trace.speculative
        target = session.model(cfg.backend, cfg.target, session.resolve(cfg).settings)
        eng = session.engine("replay-check", target, session.resolve(cfg).settings, 512)
        check = ArmCheck(s)
        upto = len(s.tokens) - 1
        rows = spec_rows(eng, list(trace.prompt["tokens"]), cfg.engine.n_batch, s, upto, lambda: False)
        for j, row, meta in without_banned(rows, banned(eng, cfg.ignore_eos)):  # read as the arm read them
            check.see(j, row, 8, 0.0)
            assert (meta["batch_size"], meta["batch_index"]) == (s.steps[j].batch_size, s.steps[j].batch_index)
            if j >= upto:
                break
    finally:
        session.close()
    assert check.reproduced and check.max_delta == 0.0, (check.first_deviation, check.max_delta)


@pytest.fixture
def planted():
    from specview.backends.llama_cpp import LlamaBackend

    fb = FaultyBackend(LlamaBackend(), name="planted-hybrid")
    register_backend("planted-hybrid", lambda: fb)
    yield fb
    unregister_backend("planted-hybrid")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fault", ROLLBACK_FAULTS)
def test_each_planted_rollback_fault_reads_state_through_the_control(pairs, arch, fault, planted, monkeypatch):
    configs = [config(pairs, arch, NEEDS[fault], p, backend="planted-hybrid") for p in PROMPTS]
    trace, d = faulty_fork(planted, fault, monkeypatch, configs)
    assert_state_through_the_control(trace, d, planted, fault)
    # the replays ran on hybrid state, in the run's rollback mode, and the vanilla one reproduced its arm
    assert d["replays"]["single"]["reproduced"] and d["replays"]["speculative"]["reproduced"]
    assert {r.rollback for r in trace.speculative.rounds[1:]} >= {NEEDS[fault]}
    assert dmod.format_verdict(d)
