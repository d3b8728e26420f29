"""The diagnosis on the real demo model: a planted rollback bug, a natural near-tie, a run identical by construction.

A natural fork is found, not assumed (``tests/forks.py``): whether a target
forks, and where, depends on this CPU's kernels and thread split, so the tests
assert what holds for any natural fork (its verdict, that both replays
reproduce, the gap against the envelope, the ranks) and never a token index.
Threads are left to ``$SPECVIEW_THREADS`` (or every core) except where a test
names them.

A fault-injecting engine (``fakes.FaultyEngine``, fault ``keep-rejected``) enters
through ``register_backend`` exactly like a real backend: real llama.cpp
underneath, but on its first rollback that drops a rejected draft it keeps that
draft's KV entry (the model then sees a stale token in its context, as with a
rollback bug).
"""

from __future__ import annotations

import json

import pytest
from fakes import FaultyBackend
from forks import CANDIDATES, find_fork

from specview.backends.llama_cpp import demo as llama_demo
from specview.core import diagnose as dmod
from specview.core.config import RunConfig
from specview.core.demo import DEMO_PROMPT, DEMO_TARGET
from specview.core.engine import EngineSettings
from specview.core.registry import register_backend, unregister_backend
from specview.core.session import Session
from specview.core.trace import Trace

pytestmark = pytest.mark.demo


@pytest.fixture
def faulty():
    """llama.cpp with fakes.FaultyEngine contexts (a planted KV fault) on the files in ``.faults``."""
    from specview.backends.llama_cpp import LlamaBackend

    fb = FaultyBackend(LlamaBackend(), name="faulty-llama.cpp")
    register_backend("faulty-llama.cpp", lambda: fb)
    yield fb
    unregister_backend("faulty-llama.cpp")


def test_planted_rollback_bug_is_a_state_verdict(faulty):
    """F16 target; keeping one rejected draft in the speculative arm's KV must read `state`."""
    f16 = str(llama_demo.resolve("demo:F16").resolve())
    cfg = RunConfig(target="demo:F16", draft="demo:Q4_0", prompt=DEMO_PROMPT, max_tokens=64,
                    backend="faulty-llama.cpp", engine=EngineSettings())
    session = Session()
    try:
        faulty.faults = {f16: "keep-rejected"}
        trace = session.run(cfg)
        # the arms ran on faulty contexts; the diagnosis opens clean ones
        faulty.faults = {}
        spec_engines = [e for e in faulty.engines if e.faults]
        assert len(spec_engines) == 1, "exactly one context (the speculative arm's) rolled back a rejected draft"
        assert not trace.comparison.identical, "the stale token must change the speculative text"

        diag = dmod.diagnose(session, session.resolve(cfg).config, trace, controls=True)
    finally:
        faulty.faults = {}
        session.close()

    assert diag["verdict"] == "state", diag["explanation"]
    assert diag["rule"] == "speculative-unreproducible"
    sp = diag["replays"]["speculative"]
    si = diag["replays"]["single"]
    assert si["reproduced"] and si["token"] == diag["vanilla_token"]
    assert not sp["reproduced"]
    assert sp["rerun_consistent"] is True
    # the deviation starts right after the first rollback that dropped a draft, before (or at) the fork
    first_rejecting = next(r for r in trace.speculative.rounds if r.index > 0 and r.accepted < r.drafted)
    assert sp["first_deviation"] == first_rejecting.first_step + first_rejecting.accepted + 1
    assert sp["first_deviation"] <= diag["fork"]
    assert sp["max_recorded_delta"] > 100 * dmod.LOGIT_TOL
    assert "bug report" in diag["explanation"]
    # controls localize it: plain greedy is deterministic and drafting nothing (no rollbacks) stays lossless
    ctrl = {c["name"]: c for c in diag["controls"]}
    assert ctrl["vanilla-twice"]["identical"] is True
    assert ctrl["zero-draft"]["identical"] is True
    assert trace.diagnosis is diag


# -- a natural fork, wherever this machine puts it -----------------------------------------
@pytest.fixture(scope="module")
def natural():
    """The first candidate of tests/forks.py that forks here, diagnosed once: (fork, diagnosis)."""
    session = Session()
    try:
        fork = find_fork(session)
        diag = dmod.diagnose(session, session.resolve(fork.cfg).config, fork.trace)
    finally:
        session.close()
    return fork, diag


def test_a_natural_fork_is_a_near_tie(natural):
    """Whatever fork this machine gives: a near-tie whose replays reproduce both arms and whose numbers add up."""
    fork, diag = natural
    trace = fork.trace
    i = fork.index
    where = fork.describe()
    assert diag["verdict"] == "near-tie", f"{where}: {diag['explanation']}"
    assert diag["fork"] == i and i > 0, where  # both arms take their first token from the same prefill
    # the serial-verify control (every verify row its own single-token pass) gives vanilla back exactly
    sv = diag["serial_verify"]
    assert sv is not None and sv["identical_to_vanilla"] is True, (where, sv)
    assert diag["rule"] == "serial-verify-reproduces-vanilla", (where, diag["explanation"])
    # both teacher-forced replays give back what their arm recorded, fork token included
    si, sp = diag["replays"]["single"], diag["replays"]["speculative"]
    assert si["reproduced"] and sp["reproduced"], where
    assert si["token"] == diag["vanilla_token"] and sp["token"] == diag["speculative_token"], where
    assert diag["vanilla_token"] != diag["speculative_token"]
    # ranks: each shape puts its own arm's token first and the other arm's token below it
    assert si["rank_a"] == 1 and si["rank_b"] >= 2, where
    assert sp["rank_b"] == 1 and sp["rank_a"] >= 2, where
    # the gap: positive, not far beyond what the shapes move logits by, and vanilla's own margin when b was
    # vanilla's runner-up
    env, gap, th = diag["envelope"], diag["gap"], diag["thresholds"]
    margin = trace.vanilla.steps[i].margin
    assert 0 < gap <= th["far"], where
    assert gap == pytest.approx(si["gap"], abs=1e-4)
    assert gap >= margin - 1e-4, where
    if si["rank_b"] == 2:
        assert gap == pytest.approx(margin, abs=1e-4), where
    # the flip needs the a-b difference to move by both gaps; two logits each moving by at most the
    # fork's shift move their difference by at most twice that
    assert si["gap"] + sp["gap"] <= 2 * env["at_fork"] + 1e-4, where
    # the envelope covers exactly the shared prefix, and its at-risk positions are those with a margin below it
    assert len(env["series"]) == i + 1 and env["positions"] == i
    assert env["max"] == pytest.approx(max(env["series"][:i]))
    assert th["far"] == pytest.approx(max(dmod.FAR_FACTOR * env["max"], dmod.FAR_FLOOR), abs=1e-4)
    margins = [s.margin for s in trace.vanilla.steps]
    assert diag["at_risk"] == [j for j, m in enumerate(margins) if m is not None and m < env["max"]]
    # the replay rebuilt the verify pass the speculative arm really ran at the fork
    step = trace.speculative.steps[i]
    assert (sp["batch_size"], sp["batch_index"]) == (step.batch_size, step.batch_index), where
    assert 0 <= sp["batch_index"] < sp["batch_size"] <= fork.cfg.n_max + 1
    json.dumps(diag)


def test_cli_prints_the_verdict_with_its_numbers(natural, capsys, tmp_path):
    """`specview run` on the fork found above: exit 1, DIVERGED, and the diagnosis' numbers as printed."""
    from specview.cli import main

    fork, _ = natural
    c = fork.candidate
    out_json = tmp_path / "t.json"
    rc = main(["run", "-m", c.target, "-md", c.draft, "-p", fork.cfg.prompt, "-n", str(c.max_tokens),
               "--n-max", str(c.n_max), "-fa", c.flash_attn, "-q", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert f"DIVERGED at token {fork.index}" in out  # the same settings on the same machine: the same fork
    assert "VERDICT  NEAR-TIE" in out
    trace = Trace.load(out_json)
    d = trace.diagnosis
    assert d is not None and d["verdict"] == "near-tie"
    assert f"logit(a) - logit(b) = {d['gap']:.4f}" in out
    assert f"max {d['envelope']['max']:.4f}" in out
    assert f"= {d['thresholds']['far']:.4f}" in out


def test_the_candidates_are_a_small_fixed_list():
    """A fork search costs a few short runs at most, and names every run it tried when none forks."""
    assert 1 <= len(CANDIDATES) <= 10
    assert len(set(CANDIDATES)) == len(CANDIDATES)
    assert all(c.max_tokens <= 256 for c in CANDIDATES)


def test_a_search_that_finds_nothing_names_what_it_tried():
    from forks import NoFork, search

    class Identical:
        def __init__(self):
            self.configs = []

        def __call__(self, cfg):
            self.configs.append(cfg)
            return _identical_trace(cfg)

    run = Identical()
    with pytest.raises(NoFork) as exc:
        search(run, CANDIDATES[:2], threads=1)
    msg = str(exc.value)
    assert [c.target for c in run.configs] == [c.target for c in CANDIDATES[:2]]
    assert all(c.engine.threads == 1 for c in run.configs)
    for c in CANDIDATES[:2]:
        assert c.describe() in msg
    assert "identical over 3 tokens" in msg


def _identical_trace(cfg: RunConfig):
    from types import SimpleNamespace

    return SimpleNamespace(comparison=SimpleNamespace(first_mismatch=None, identical=True),
                           vanilla=SimpleNamespace(tokens=[1, 2, 3]))


# -- the default demo: what the README promises ---------------------------------------------
@pytest.mark.parametrize("no_repack", [None, True], ids=["decided", "no-repack"])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_default_demo_forks(threads, no_repack):
    """`specview run` with every default forks at one and at two threads, with the repack this machine decides
    (repacked weights, or none where the crash probe crashed) and with none: the demo target is the one `specview
    run` picks for these kernels.  Repacking is never forced on: where the probe crashed that would crash.
    Where the machine decides no repack itself, the two cases are one run (tests/core/test_repack.py checks that
    an explicit choice records no reason), so only the decided one runs."""
    from specview.backends.llama_cpp.demo_pick import pick_demo_target
    from specview.core.registry import Runner

    machine = Runner.resolve_settings(EngineSettings(), backend="llama.cpp")[0].no_repack
    if no_repack is True and machine is True:
        pytest.skip("this machine decides no repack itself: [decided] is this same run")
    settings = EngineSettings(threads=threads, no_repack=no_repack)
    resolved = Runner.resolve(RunConfig(prompt=DEMO_PROMPT, engine=settings), default_target=True)
    assert resolved.settings.no_repack is (machine if no_repack is None else no_repack)
    pick = pick_demo_target(resolved.settings)  # the pick the resolution took (cached under these settings)
    assert pick.can_fork, pick.reason
    assert resolved.config.target == pick.target
    session = Session()
    try:
        trace = session.run(resolved)
    finally:
        session.close()
    decided = trace.config.get("decided") or {}
    assert trace.config["target"] == pick.target and trace.config["engine"]["no_repack"] is resolved.settings.no_repack
    # the trace says why: the pick, and the no-repack decision where the machine (not the test) made it
    # (the default kept, because it forks here, is no decision: nothing to say, so nothing recorded)
    assert decided.get("target") == ({"value": pick.target, "why": pick.reason} if pick.reason else None)
    assert pick.reason or pick.target == DEMO_TARGET
    assert ("no_repack" in decided) is (no_repack is None and machine is True)
    cfg = resolved.config
    assert not trace.comparison.identical, (
        f"the default demo ({cfg.target} <- {cfg.draft}, {cfg.max_tokens} tokens, n_max {cfg.n_max}, "
        f"{threads} thread(s), {'no repack' if cfg.engine.no_repack else 'repack'}; {pick.reason or 'the default'}) "
        "gave the same text in both arms on this machine; the README promises a fork")


def test_an_identical_run_is_cheap():
    """p_min = 1 drafts nothing, so both arms run the same passes: identical on any machine, and no extra runs."""
    cfg = RunConfig(target="demo:Q4_K_M", draft="demo:Q4_0", prompt=DEMO_PROMPT, max_tokens=48, p_min=1.0)
    session = Session()
    try:
        trace = session.run(cfg)
        runs = session.vanilla_runs + session.speculative_runs
        diag = dmod.diagnose(session, session.resolve(cfg).config, trace)
        assert session.vanilla_runs + session.speculative_runs == runs
    finally:
        session.close()
    assert trace.comparison.identical
    assert diag["verdict"] == "identical"
    assert diag["replays"] is None and diag["envelope"] is None and diag["serial_verify"] is None
    assert "IDENTICAL" in dmod.format_verdict(diag)
    json.dumps(diag)
