"""The two arms on a fake engine whose every logit is known in advance."""

import numpy as np
import pytest

from fakes import EOS, FakeEngine, ToyModel
from specview.core.arms.compare import compare_arms
from specview.core.arms.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specview.core.engine import ContextOverflow
from specview.core.arms.generate import GenOptions, run_to_end, speculative_greedy, vanilla_greedy
from specview.core.trace import Round, Step

PROMPT = [1, 5, 9, 4, 22, 17, 3]


def run_spec(target, draft_model, opts, **kw):
    eng = FakeEngine(target)
    deng = FakeEngine(draft_model) if draft_model is not None else None
    drafter = ModelDrafter(deng, **kw) if deng is not None else NoDrafter()
    events = []
    arm = run_to_end(speculative_greedy(eng, drafter, PROMPT, opts), events.append)
    return arm, eng, deng, events


def test_vanilla_equals_an_independent_greedy_loop():
    m = ToyModel(0)
    eng = FakeEngine(m, n_batch=3)
    arm = run_to_end(vanilla_greedy(eng, PROMPT, GenOptions(max_tokens=50, ignore_eos=True, n_batch=3)))
    assert arm.tokens == m.greedy(PROMPT, 50)
    # prefill in chunks of 3 (7 prompt tokens -> 3, 3, 1), then exactly one token per pass
    assert eng.batch_sizes == [3, 3, 1] + [1] * 49
    assert arm.steps[0].batch_size == 1 and arm.steps[0].batch_index == 0  # the last chunk held one token
    assert all(s.batch_size == 1 for s in arm.steps)
    assert [s.pos for s in arm.steps] == list(range(len(PROMPT), len(PROMPT) + 50))
    for s in arm.steps:
        assert s.top_ids[0] == s.token
        assert s.margin == pytest.approx(s.top_logits[0] - s.top_logits[1])
    assert arm.text == "".join(f"<{t}>" for t in arm.tokens)


@pytest.mark.parametrize("n_max", [1, 3, 8])
@pytest.mark.parametrize("noise", [0.0, 2.0, 6.0])
def test_speculative_is_lossless_on_a_shape_independent_model(n_max, noise):
    target = ToyModel(0)
    draft = ToyModel(0, noise=noise)
    opts = GenOptions(max_tokens=60, ignore_eos=True)
    arm, eng, _, events = run_spec(target, draft, opts, n_max=n_max)
    assert arm.tokens == target.greedy(PROMPT, 60)
    # every emitted token comes from an accepted draft or is the round's own target token
    assert len(arm.tokens) == arm.n_accepted + len(arm.rounds)
    assert sum(s.from_draft for s in arm.steps) == arm.n_accepted
    for r in arm.rounds[1:]:
        assert r.batch_size == 1 + r.drafted
        assert 0 <= r.accepted <= r.drafted <= n_max
    # the KV cache after every round holds exactly the prompt and the tokens emitted before the last one
    assert eng.kv == PROMPT + arm.tokens[:-1]
    # events: one Step per token, one Round per round, in order
    assert [e.index for e in events if isinstance(e, Step)] == list(range(60))
    assert [e.index for e in events if isinstance(e, Round)] == list(range(len(arm.rounds)))
    if noise == 0.0:
        assert arm.n_accepted == arm.n_drafted  # a perfect drafter is always accepted


def test_perfect_drafter_verifies_full_batches():
    m = ToyModel(3)
    arm, eng, _, _ = run_spec(m, m, GenOptions(max_tokens=41, ignore_eos=True), n_max=4)
    # 1 token from prefill, then 8 rounds of 4 drafts + 1 target token = 41
    assert [r.drafted for r in arm.rounds] == [0] + [4] * 8
    assert [r.accepted for r in arm.rounds] == [0] + [4] * 8
    assert eng.batch_sizes[1:] == [5] * 8


def test_p_min_one_drafts_nothing_and_matches_vanilla_shapes():
    m = ToyModel(1)
    arm, eng, _, _ = run_spec(m, ToyModel(1, noise=1.0), GenOptions(max_tokens=30, ignore_eos=True), p_min=1.0)
    assert arm.n_drafted == 0
    assert all(r.batch_size == 1 for r in arm.rounds[1:])
    veng = FakeEngine(m)
    van = run_to_end(vanilla_greedy(veng, PROMPT, GenOptions(max_tokens=30, ignore_eos=True)))
    assert veng.batch_sizes == eng.batch_sizes  # identical shapes, pass for pass
    assert van.tokens == arm.tokens


def test_n_min_drops_short_drafts():
    m = ToyModel(2)
    arm, _, _, _ = run_spec(m, m, GenOptions(max_tokens=20, ignore_eos=True), n_max=3, n_min=4)
    assert arm.n_drafted == 0


def test_max_tokens_is_exact_even_with_long_drafts():
    m = ToyModel(4)
    for max_tokens in (1, 2, 5, 17):
        arm, eng, _, _ = run_spec(m, m, GenOptions(max_tokens=max_tokens, ignore_eos=True), n_max=8)
        assert len(arm.tokens) == max_tokens
        assert arm.stop_reason == "max_tokens"
        assert max(eng.batch_sizes[1:], default=1) <= max_tokens  # never drafts past the budget


def test_eos_stops_both_arms_at_the_same_token():
    m = ToyModel(5, eos_bias=2.5)
    ref = m.greedy(PROMPT, 200)
    assert EOS in ref, "this toy model must emit EOS for the test to mean anything"
    cut = ref.index(EOS) + 1
    van = run_to_end(vanilla_greedy(FakeEngine(m), PROMPT, GenOptions(max_tokens=200)))
    spec, _, _, _ = run_spec(m, m, GenOptions(max_tokens=200), n_max=5)
    assert van.tokens == ref[:cut] and van.stop_reason == "eos"
    assert spec.tokens == ref[:cut] and spec.stop_reason == "eos"
    # --ignore-eos as llama.cpp means it: EOS banned (a -inf logit bias), never emitted
    seq, banned_ref = list(PROMPT), []
    for _ in range(200):
        row = m.logits(seq, 1)
        row[EOS] = -np.inf
        banned_ref.append(int(np.argmax(row)))
        seq.append(banned_ref[-1])
    assert banned_ref[:cut - 1] == ref[:cut - 1] and EOS not in banned_ref
    ign = run_to_end(vanilla_greedy(FakeEngine(m), PROMPT, GenOptions(max_tokens=200, ignore_eos=True)))
    assert ign.tokens == banned_ref
    spec_ign, _, _, _ = run_spec(m, m, GenOptions(max_tokens=200, ignore_eos=True), n_max=5)
    assert spec_ign.tokens == banned_ref
    assert all(EOS not in s.top_ids for s in ign.steps + spec_ign.steps)


def test_cancel_stops_between_forward_passes():
    m = ToyModel(6)
    eng = FakeEngine(m)
    seen = []
    gen = vanilla_greedy(eng, PROMPT, GenOptions(max_tokens=100, ignore_eos=True), cancel=lambda: len(seen) >= 10)
    arm = run_to_end(gen, seen.append)
    assert arm.stop_reason == "cancelled"
    assert len(arm.tokens) == 10
    spec_seen = []
    eng2 = FakeEngine(m)
    gen = speculative_greedy(eng2, ModelDrafter(FakeEngine(m), n_max=3), PROMPT,
                             GenOptions(max_tokens=100, ignore_eos=True), cancel=lambda: len(spec_seen) >= 10)
    arm2 = run_to_end(gen, spec_seen.append)
    assert arm2.stop_reason == "cancelled" and len(arm2.tokens) < 100
    assert arm2.tokens == m.greedy(PROMPT, len(arm2.tokens))


def test_shape_dependent_numerics_fork_where_the_target_nearly_ties():
    """A target whose T>1 passes are off by a small epsilon forks, and only at a small margin."""
    target = ToyModel(0, shape_eps=0.5)
    found = False
    for seed in range(8):
        prompt = [1, 3 + seed, 9, 4]
        van = run_to_end(vanilla_greedy(FakeEngine(target), prompt, GenOptions(max_tokens=120, ignore_eos=True)))
        spec = run_to_end(speculative_greedy(FakeEngine(target), ModelDrafter(FakeEngine(ToyModel(0)), n_max=4),
                                             prompt, GenOptions(max_tokens=120, ignore_eos=True)))
        c = compare_arms(van, spec)
        if not c.identical:
            found = True
            i = c.first_mismatch.index
            st = spec.steps[i]
            assert st.batch_size > 1  # the fork came from a batched pass
            assert van.steps[i].margin < 2 * 0.5  # within the planted numeric error of a tie
    assert found


def test_context_overflow_is_refused_up_front():
    eng = FakeEngine(ToyModel(0), n_ctx=50)
    with pytest.raises(ContextOverflow, match="needs a context of"):
        run_to_end(vanilla_greedy(eng, PROMPT, GenOptions(max_tokens=60)))
    with pytest.raises(ContextOverflow, match="empty"):
        run_to_end(vanilla_greedy(eng, [], GenOptions(max_tokens=5)))


def test_a_context_the_engine_sized_otherwise_says_what_was_asked_for():
    """llama.cpp pads a context to a multiple of 256: "-c 128" makes 256, and the refusal says both."""
    eng = FakeEngine(ToyModel(0), n_ctx=256)
    eng.n_ctx_requested = 128
    with pytest.raises(ContextOverflow) as ei:
        run_to_end(vanilla_greedy(eng, PROMPT, GenOptions(max_tokens=300)))
    assert "but the context is 256 (128 was asked for; the engine rounded it up). Raise --n-ctx" in str(ei.value)
    eng.n_ctx_requested = 256
    with pytest.raises(ContextOverflow) as ei:
        run_to_end(vanilla_greedy(eng, PROMPT, GenOptions(max_tokens=300)))
    assert "but the context is 256. Raise --n-ctx" in str(ei.value)


def test_ngram_drafter_in_the_loop_is_lossless():
    m = ToyModel(8)
    prompt = [1, 5, 6, 7, 8] * 6
    eng = FakeEngine(m)
    arm = run_to_end(speculative_greedy(eng, NgramDrafter(size_n=2, size_m=4), prompt,
                                        GenOptions(max_tokens=40, ignore_eos=True)))
    assert arm.tokens == m.greedy(prompt, 40)
    assert len(arm.tokens) == arm.n_accepted + len(arm.rounds)


def test_options_are_validated():
    with pytest.raises(ValueError):
        GenOptions(max_tokens=0)
    with pytest.raises(ValueError):
        GenOptions(top_k=1)
    with pytest.raises(ValueError):
        ModelDrafter(FakeEngine(ToyModel(0)), n_max=-1)


# -- serial verify ------------------------------------------------------------------------------
def run_serial(target, draft_model, prompt, opts, *, serial=True, wrap=None, **kw):
    eng = FakeEngine(target)
    outer = wrap(eng) if wrap else eng
    drafter = ModelDrafter(FakeEngine(draft_model), **kw)
    arm = run_to_end(speculative_greedy(outer, drafter, prompt, opts, serial_verify=serial))
    return arm, eng


def test_serial_verify_reproduces_vanilla_where_batched_verify_forks():
    """Rows of T > 1 passes are off by a planted epsilon: batched verify forks, serial verify never does."""
    target = ToyModel(0, shape_eps=0.5)
    opts = GenOptions(max_tokens=120, ignore_eos=True)
    forked = 0
    for seed in range(8):
        prompt = [1, 3 + seed, 9, 4]
        ref = target.greedy(prompt, 120)
        batched, _ = run_serial(target, ToyModel(0, noise=1.0), prompt, opts, serial=False, n_max=4)
        serial, eng = run_serial(target, ToyModel(0, noise=1.0), prompt, opts, n_max=4)
        forked += batched.tokens != ref
        assert serial.tokens == ref
        # every verify row was its own single-token pass: after the prefill the engine saw only T = 1
        assert eng.batch_sizes[1:] == [1] * (len(eng.batch_sizes) - 1)
        rounds = serial.rounds[1:]
        assert all(r.serial and r.batch_size == 1 + r.drafted for r in rounds)
        assert len(eng.batch_sizes) - 1 == sum(r.batch_size for r in rounds)
        assert [s.serial for s in serial.steps] == [False] + [True] * (len(serial.steps) - 1)
        assert len(serial.tokens) == serial.n_accepted + len(serial.rounds)
        assert eng.kv == prompt + serial.tokens[:-1]  # rollbacks exactly as in the batched loop
        assert serial.n_drafted > serial.n_accepted  # drafts were rejected and rolled back
    assert forked, "the planted batched error must fork at least one prompt for this test to mean anything"


def test_serial_and_batched_verify_make_the_same_rounds_on_a_shape_independent_model():
    target = ToyModel(2)
    opts = GenOptions(max_tokens=60, ignore_eos=True)
    batched, beng = run_serial(target, ToyModel(2, noise=2.0), PROMPT, opts, serial=False, n_max=3)
    serial, seng = run_serial(target, ToyModel(2, noise=2.0), PROMPT, opts, n_max=3)
    assert serial.tokens == batched.tokens == target.greedy(PROMPT, 60)
    key = [(r.drafted, r.accepted, r.batch_size, r.draft_tokens, r.first_step) for r in batched.rounds]
    assert [(r.drafted, r.accepted, r.batch_size, r.draft_tokens, r.first_step) for r in serial.rounds] == key
    assert [(s.batch_size, s.batch_index, s.from_draft) for s in serial.steps] == \
        [(s.batch_size, s.batch_index, s.from_draft) for s in batched.steps]
    assert not any(r.serial for r in batched.rounds) and not any(s.serial for s in batched.steps)
    assert seng.truncations == beng.truncations


def test_a_serial_round_round_trips_through_json_and_a_batched_one_stays_as_before():
    target = ToyModel(4)
    serial, _ = run_serial(target, ToyModel(4, noise=1.0), PROMPT, GenOptions(max_tokens=20, ignore_eos=True), n_max=3)
    r = serial.rounds[1]
    assert r.to_json()["serial"] is True and Round(**r.to_json()).to_json() == r.to_json()
    st = serial.steps[1]
    assert st.to_json()["serial"] is True and Step(**st.to_json()).serial
    assert "serial" not in serial.rounds[0].to_json() and "serial" not in serial.steps[0].to_json()


@pytest.mark.parametrize("fault", ["keep-rejected", "drop-accepted", "accept-unpicked"])
def test_planted_faults_make_the_serial_loop_differ_from_plain_greedy(fault, monkeypatch):
    from fakes import FaultyEngine, accepting_unpicked
    from specview.core.arms import generate

    target = ToyModel(2)
    opts = GenOptions(max_tokens=60, ignore_eos=True)
    wrap = None
    if fault == "accept-unpicked":
        monkeypatch.setattr(generate, "accepted_prefix", accepting_unpicked(generate.accepted_prefix))
    else:
        wrap = lambda e: FaultyEngine(e, fault)  # noqa: E731
    differs = 0
    for seed in range(6):
        prompt = [1, 3 + seed, 9 + seed, 4 + 2 * seed]
        serial, _ = run_serial(target, ToyModel(2, noise=2.0), prompt, opts, wrap=wrap, n_max=4)
        assert serial.n_drafted > serial.n_accepted
        differs += serial.tokens != target.greedy(prompt, 60)
    # the toy model looks at two tokens of context, so a fault can go unseen on a prompt, not on all of them
    assert differs > 0
