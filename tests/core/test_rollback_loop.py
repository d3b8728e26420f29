"""The speculative loop on memories that cannot drop positions (fakes.HybridFakeEngine): snapshots, and
llama-server's checkpoint and replay, for the target and the draft model alike."""

import json

import numpy as np
import pytest

from fakes import HybridFakeEngine, ToyModel
from specview.core.arms.drafters import ModelDrafter, NgramDrafter
from specview.core.arms.generate import GenOptions, run_to_end, speculative_greedy, vanilla_greedy
from specview.core.diagnose.replays import ArmCheck, spec_rows
from specview.core.trace import ArmResult, Malformed, Round, Trace

PROMPT = [1, 5, 9, 4, 22, 17, 3]
OPTS = GenOptions(max_tokens=60, ignore_eos=True)


def spec_arm(mode: str, *, noise: float = 3.0, shape_eps: float = 0.0, n_max: int = 3, serial: bool = False):
    eng = HybridFakeEngine(ToyModel(0, shape_eps=shape_eps), mode=mode)
    deng = HybridFakeEngine(ToyModel(0, noise=noise), mode=mode)
    arm = run_to_end(speculative_greedy(eng, ModelDrafter(deng, n_max=n_max), PROMPT, OPTS, n_max_hint=n_max,
                                        serial_verify=serial))
    return arm, eng, deng


@pytest.mark.parametrize("serial", [False, True])
def test_checkpoint_and_replay_is_lossless_and_emits_the_replays_rows(serial):
    arm, eng, deng = spec_arm("checkpoint", serial=serial)
    assert arm.tokens == ToyModel(0).greedy(PROMPT, 60)
    replayed = [r for r in arm.rounds[1:] if r.accepted < r.drafted]
    assert replayed, "the noisy drafter must be rejected somewhere"
    for r in arm.rounds[1:]:
        if r.accepted < r.drafted:  # restored, then [id_last] + accepted + [the target's token] verified again
            assert r.rollback == "checkpoint" and r.replay == r.accepted + 2
            steps = arm.steps[r.first_step:r.first_step + r.emitted]
            assert len(steps) == r.accepted + 2 and all(s.batch_size == r.replay for s in steps)
            assert [s.batch_index for s in steps] == list(range(r.replay))
        else:
            assert r.rollback == "" and r.replay == 0
    # a replay round emits one token more than accepted + 1: the counts add up with it
    assert 1 + sum(r.emitted for r in arm.rounds[1:]) == len(arm.tokens)
    assert sum(s.from_draft for s in arm.steps) == arm.n_accepted
    # the target restored its checkpoint once per replay; the draft model rolled back through its own
    assert eng.restores.count(("checkpoint", 0)) == len(replayed)
    assert deng.restores and all(mode == "checkpoint" for mode, _ in deng.restores)
    assert eng.kv == PROMPT + arm.tokens[:-1]


@pytest.mark.parametrize("serial", [False, True])
def test_snapshots_drop_the_rejected_tokens_and_recompute_nothing(serial):
    arm, eng, deng = spec_arm("snapshots", serial=serial)
    assert arm.tokens == ToyModel(0).greedy(PROMPT, 60)
    rejected = [r for r in arm.rounds[1:] if r.accepted < r.drafted]
    assert rejected and all(r.rollback == "snapshots" and r.replay == 0 for r in rejected)
    assert len(arm.tokens) == arm.n_accepted + len(arm.rounds)
    assert all(s.batch_size == arm.rounds[s.round].batch_size for s in arm.steps[1:])
    assert eng.restores and all(r == ("snapshots", 0) for r in eng.restores)
    # the arm's record of its rollbacks counts what the target's memory did, one n_rs_seq restore a rejection
    assert arm.rollbacks["target"] == {"n_rs_seq": len(eng.restores)} and len(eng.restores) == len(rejected)


def test_a_draft_longer_than_the_snapshots_takes_a_checkpoint_as_llama_server_does():
    eng = HybridFakeEngine(ToyModel(0), mode="snapshots", depth=2)
    deng = HybridFakeEngine(ToyModel(0, noise=3.0), mode="snapshots", depth=2)
    drafter = ModelDrafter(deng, n_max=6)
    drafter.engine.plan_rollbacks = lambda n: None  # the draft model keeps only 2 as well
    eng.plan_rollbacks = lambda n: None
    arm = run_to_end(speculative_greedy(eng, drafter, PROMPT, OPTS, n_max_hint=6))
    assert arm.tokens == ToyModel(0).greedy(PROMPT, 60)
    modes = {r.rollback for r in arm.rounds[1:] if r.accepted < r.drafted}
    assert modes == {"snapshots", "checkpoint"}  # short rollbacks by snapshot, the longer ones replayed
    for r in arm.rounds[1:]:
        if r.rollback == "snapshots":
            assert r.drafted - r.accepted <= 2
        if r.rollback == "checkpoint":
            assert r.drafted - r.accepted > 2 and r.replay == r.accepted + 2


def test_an_ngram_drafter_on_a_hybrid_target_replays_too():
    eng = HybridFakeEngine(ToyModel(0), mode="checkpoint")
    prompt = PROMPT * 4
    arm = run_to_end(speculative_greedy(eng, NgramDrafter(size_n=2, size_m=5), prompt, OPTS, n_max_hint=5))
    assert arm.tokens == ToyModel(0).greedy(prompt, 60)
    assert any(r.replay for r in arm.rounds[1:]) or all(r.accepted == r.drafted for r in arm.rounds[1:])


def test_a_replay_that_rejects_again_restores_again_and_still_adds_up():
    """Width-dependent rows (shape_eps): the replay pass, of another width, can disagree with the verify pass;
    llama-server restores the checkpoint again and replays the shorter carry."""
    found = False
    for seed in range(6):
        eng = HybridFakeEngine(ToyModel(seed, shape_eps=1.5), mode="checkpoint")
        deng = HybridFakeEngine(ToyModel(seed, noise=1.0), mode="checkpoint")
        arm = run_to_end(speculative_greedy(eng, ModelDrafter(deng, n_max=4), PROMPT, OPTS, n_max_hint=4))
        replays = sum(1 for r in arm.rounds[1:] if r.replay)
        restores = eng.restores.count(("checkpoint", 0))
        assert 1 + sum(r.emitted for r in arm.rounds[1:]) == len(arm.tokens) == 60
        assert restores >= replays
        if restores > replays:
            found = True
            break
    assert found, "no replay rejected a carried token on any seed tried"


@pytest.mark.parametrize("mode", ["checkpoint", "snapshots"])
def test_the_teacher_forced_replay_rebuilds_a_hybrid_arm_exactly(mode):
    arm, _, _ = spec_arm(mode, shape_eps=0.5)
    check = ArmCheck(arm)
    fresh = HybridFakeEngine(ToyModel(0, shape_eps=0.5), mode=mode)
    upto = len(arm.tokens) - 1
    for j, row, meta in spec_rows(fresh, PROMPT, 512, arm, upto, lambda: False):
        check.see(j, row, 8, 0.0)
        assert meta["batch_size"] == arm.steps[j].batch_size and meta["batch_index"] == arm.steps[j].batch_index
        if j >= upto:
            break
    assert check.reproduced and check.max_delta == 0.0


def test_vanilla_never_prepares_a_rollback():
    eng = HybridFakeEngine(ToyModel(0), mode="checkpoint")
    arm = run_to_end(vanilla_greedy(eng, PROMPT, OPTS))
    assert arm.tokens == ToyModel(0).greedy(PROMPT, 60) and eng.ckpt is None and not eng.restores


def test_rounds_write_rollback_and_replay_only_when_set_and_read_old_traces():
    r = Round(index=1, drafted=3, accepted=1, draft_ms=0.1, verify_ms=0.2, batch_size=4, first_step=1,
              draft_tokens=[5, 6, 7], rollback="checkpoint", replay=3)
    d = r.to_json()
    assert d["rollback"] == "checkpoint" and d["replay"] == 3 and r.emitted == 3
    plain = Round(index=2, drafted=3, accepted=3, draft_ms=0.1, verify_ms=0.2, batch_size=4, first_step=4,
                  draft_tokens=[5, 6, 7])
    assert "rollback" not in plain.to_json() and "replay" not in plain.to_json() and plain.emitted == 4
    arm, _, _ = spec_arm("checkpoint")
    raw = json.loads(json.dumps(arm.to_json()))
    back = ArmResult.from_json("speculative", raw)
    assert [(x.rollback, x.replay) for x in back.rounds] == [(x.rollback, x.replay) for x in arm.rounds]
    for x in raw["rounds"]:  # a trace written before rollbacks were recorded
        x.pop("rollback", None)
        x.pop("replay", None)
    old = ArmResult.from_json("speculative", raw)
    assert all(x.rollback == "" and x.replay == 0 for x in old.rounds)
    raw["rounds"][1]["rollback"] = "rewind"
    with pytest.raises(Malformed, match="rollback"):
        ArmResult.from_json("speculative", raw)
    assert Trace  # the arm is read through the same converters a whole trace uses


def test_mean_accepted_counts_the_replays_extra_token():
    arm, _, _ = spec_arm("checkpoint")
    rs = arm.rounds[1:]
    assert arm.mean_accepted == pytest.approx((len(arm.tokens) - 1) / len(rs))
    assert np.isclose(arm.mean_accepted, sum(r.emitted for r in rs) / len(rs))
