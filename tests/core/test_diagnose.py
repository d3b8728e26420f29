"""The diagnosis logic without a real model: synthetic numbers, and scripted engines with known faults.

The scripted "model" predicts ``(c[-1] + c[-2] + 1) % V`` from its context
``c`` with a margin of 1 logit over the runner-up, and every row of a forward
pass with more than one token moves the runner-up by ``SHAPE`` logits: a
batched-versus-single rounding effect of known size.  Variants plant a
near-tie, a rollback that keeps a rejected draft, a huge shape effect at one
position, per-call jitter, or a context that flips the tie (a backend whose
vanilla does not repeat itself).  Faults from ``fakes`` (a KV entry kept or
dropped, a draft accepted that the target did not pick) are planted in every
context of the target, the diagnosis' own included: only the serial-verify
control can see them.  They register through ``register_backend``, the door
real backends use.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np
import pytest

from fakes import FaultyEngine, accepting_unpicked
from specview.core import diagnose as dmod
from specview.core.arms import generate
from specview.core.engine import Engine, EngineSettings, SpecviewError, VocabInfo
from specview.core.registry import LoadedModel, register_backend
from specview.core.inprocess import InProcessBackend
from specview.core.session import RunConfig, Session
from specview.core.trace import Trace
from specview.core.verdicts import RULES

V = 32
PROMPT = (1, 2)
SHAPE = 0.03  # how far a batched row moves the runner-up
TIE_TOKEN = 10  # token index where the "tie" model's margin is 0.01
TIE_MARGIN = 0.01
BIG_TOKEN = 9  # where the "big" model's batched rows move by BIG_SHAPE against a margin of BIG_MARGIN
BIG_SHAPE, BIG_MARGIN = 5.0, 3.0
ARMED: set[str] = set()  # model kinds whose new engines get the rollback fault
PLANTED: dict[str, str] = {}  # model kind -> a fakes.FaultyEngine fault for every new engine of it
FLAKY_OPENED = [0]  # contexts opened on the "flaky" model so far


def expected_next(c: Sequence[int]) -> int:
    return (c[-1] + (c[-2] if len(c) > 1 else 0) + 1) % V


class ScriptedModel(LoadedModel):
    def __init__(self, name: str):
        self.path = name
        self.kind = name.split(":", 1)[1]
        self._vocab = VocabInfo(n_vocab=V, vocab_type="spm", bos=None, eos=None, add_bos=False, add_eos=False,
                                texts=tuple(f"t{i}" for i in range(V)))

    def facts(self) -> dict[str, Any]:
        return {"path": self.path, "file": self.path, "quantization": self.kind, "architecture": "scripted"}

    @property
    def vocab(self) -> VocabInfo:
        return self._vocab

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return list(PROMPT)

    def new_engine(self, settings: EngineSettings, n_ctx: int) -> Engine:
        flip = False
        if self.kind == "flaky":
            flip = FLAKY_OPENED[0] > 0  # only the first context ever opened computes the tie "right"
            FLAKY_OPENED[0] += 1
        eng = ScriptedEngine(self, n_ctx + 1, settings.n_batch, faulty=self.kind in ARMED, flip=flip)
        if self.kind in PLANTED:
            return FaultyEngine(eng, PLANTED[self.kind])
        return eng

    def row(self, c: Sequence[int], T: int, flip: bool = False) -> np.ndarray:
        out = np.zeros(V, dtype=np.float64)
        nxt = expected_next(c)
        if self.kind == "draft" and len(c) % 4 == 0:
            nxt = (nxt + 5) % V  # a draft model that is wrong now and then, so drafts get rejected
        alt = (nxt + 1) % V
        token_index = len(c) - len(PROMPT)
        margin, shape = 1.0, SHAPE
        if self.kind in ("tie", "jitter", "flaky") and token_index == TIE_TOKEN:
            margin = TIE_MARGIN
            if flip:
                margin = -TIE_MARGIN
        if self.kind == "big" and token_index == BIG_TOKEN:
            margin, shape = BIG_MARGIN, BIG_SHAPE
        out[nxt] = 5.0
        out[alt] = 5.0 - margin + (shape if T > 1 else 0.0)
        if self.kind == "jitter":
            out += np.random.default_rng().uniform(0, 1e-3, V)
        return out.astype(np.float32)


class ScriptedEngine(Engine):
    backend = "scripted"

    def __init__(self, model: ScriptedModel, n_ctx: int, n_batch: int, *, faulty: bool = False, flip: bool = False):
        super().__init__()
        self.m = model
        self.flip = flip
        self.kv: list[int] = []
        self._n_ctx, self._n_batch = n_ctx, n_batch
        self.faulty = faulty
        self.stale = 0  # 1 once a rejected draft was kept
        self.faults = 0

    @property
    def vocab(self) -> VocabInfo:
        return self.m.vocab

    def model_facts(self) -> dict[str, Any]:
        return self.m.facts()

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return list(PROMPT)

    def piece(self, token: int) -> str:
        return f" t{token}"

    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        T = len(tokens)
        self.kv.extend(int(t) for t in tokens)
        base = len(self.kv) - T
        rows = [r + T if r < 0 else r for r in rows]
        out = np.stack([self.m.row(self.kv[: base + r + 1], T, self.flip) for r in rows])
        self.n_past += T
        self.n_evals += 1
        return out

    def truncate(self, n: int) -> None:
        if n == 0:
            self.stale = 0
        elif self.faulty and not self.stale and n < self.n_past:
            self.stale = 1  # the rollback keeps the first rejected draft token
            self.faults += 1
        self.kv = self.kv[: n + self.stale]
        self.n_past = n


class ScriptedBackend(InProcessBackend):
    name = "scripted"

    def load(self, name: str, settings: EngineSettings) -> LoadedModel:
        return ScriptedModel(name)


register_backend("scripted", ScriptedBackend)


def config(kind: str, **kw) -> RunConfig:
    base = dict(target=f"scripted:{kind}", draft="scripted:draft", prompt_tokens=PROMPT, max_tokens=24,
                backend="scripted", n_max=3, engine=EngineSettings(n_batch=8))
    base.update(kw)
    return RunConfig(**base)


def run(kind: str, *, controls: bool = False, faulty: bool = False, serial_verify: bool = True,
        **kw) -> tuple[Session, Trace, dict]:
    cfg = config(kind, **kw)
    session = Session()
    if faulty:
        ARMED.add(kind)
    try:
        trace = session.run(cfg)
    finally:
        ARMED.discard(kind)
    diag = dmod.diagnose(session, session.resolve(cfg).config, trace, controls=controls, serial_verify=serial_verify)
    return session, trace, diag


def independent_greedy(n: int) -> list[int]:
    """Plain greedy on the scripted "plain" model, computed without any engine."""
    c = list(PROMPT)
    for _ in range(n):
        c.append(expected_next(c))
    return c[len(PROMPT):]


# -- synthetic numbers ----------------------------------------------------------------------
def test_envelope_stats_and_thresholds():
    s = dmod.envelope_stats([0.0] * 18 + [0.5, 2.0])
    assert s["max"] == 2.0 and s["median"] == 0.0
    assert 0.5 < s["p95"] < 2.0  # linear interpolation between the two top values
    assert dmod.envelope_stats([]) == {"max": None, "p95": None, "median": None}
    assert dmod.far_threshold(0.1) == dmod.FAR_FLOOR  # the floor wins for small envelopes
    assert dmod.far_threshold(1.5) == pytest.approx(4 * 1.5)
    assert dmod.far_threshold(None) == dmod.FAR_FLOOR
    assert dmod.at_risk_positions([0.5, 0.01, None, 0.2, 0.3], 0.3) == [1, 3]
    assert dmod.at_risk_positions([0.5], None) is None


def test_rank_breaks_ties_towards_lower_ids():
    row = np.array([1.0, 3.0, 3.0, 2.0], dtype=np.float32)
    assert [dmod.rank_of(row, t) for t in range(4)] == [4, 1, 2, 3]


@pytest.mark.parametrize("kw, verdict, rule", [
    (dict(identical=True), "identical", "identical"),
    (dict(identical=False, gap=0.01, env_max=0.3), "near-tie", "gap-within-envelope"),
    (dict(identical=False, gap=0.5, env_max=0.3), "near-tie", "gap-below-far"),  # above max, under far=2.0
    (dict(identical=False, gap=2.5, env_max=0.3), "state", "gap-far-beyond-envelope"),
    (dict(identical=False, gap=2.5, env_max=0.7), "near-tie", "gap-below-far"),  # far = 4 x 0.7 = 2.8
    (dict(identical=False, gap=0.0, env_max=None), "near-tie", "gap-below-far"),
    (dict(identical=False, spec_reproduced=False, spec_rerun_consistent=True, gap=0.01, env_max=0.3),
     "state", "speculative-unreproducible"),
    (dict(identical=False, spec_reproduced=False, spec_rerun_consistent=False, gap=0.01, env_max=0.3),
     "nondeterministic", "speculative-replays-disagree"),
    (dict(identical=False, single_reproduced=False, single_rerun_consistent=False, spec_reproduced=False,
          spec_rerun_consistent=True, gap=0.01, env_max=0.3), "nondeterministic", "vanilla-replays-disagree"),
    (dict(identical=False, single_reproduced=False, single_rerun_consistent=True, gap=0.01, env_max=0.3),
     "state", "vanilla-unreproducible"),
    # the serial-verify control decides where it ran, whatever the gap says
    (dict(identical=False, serial_verify_identical=True, gap=0.5, env_max=0.3),
     "near-tie", "serial-verify-reproduces-vanilla"),
    (dict(identical=False, serial_verify_identical=True), "near-tie", "serial-verify-reproduces-vanilla"),
    (dict(identical=False, serial_verify_identical=False, gap=0.001, env_max=0.3), "state", "serial-verify-differs"),
    (dict(identical=False, serial_verify_identical=False, vanilla_repeat_identical=True), "state",
     "serial-verify-differs"),
    (dict(identical=False, serial_verify_identical=False, vanilla_repeat_identical=False), "nondeterministic",
     "vanilla-repeat-disagrees"),
    (dict(identical=False, serial_verify_identical=True, vanilla_repeat_identical=False, gap=0.01),
     "nondeterministic", "vanilla-repeat-disagrees"),
    (dict(identical=True, serial_verify_identical=False), "identical", "identical"),
    # replays that disagree with themselves come first: nothing else can be trusted without determinism
    (dict(identical=False, serial_verify_identical=False, single_reproduced=False, single_rerun_consistent=False),
     "nondeterministic", "vanilla-replays-disagree"),
    # a dirty arm context is a state bug even where the serial loop, on a clean context, reproduces vanilla
    (dict(identical=False, serial_verify_identical=True, spec_reproduced=False, spec_rerun_consistent=True,
          gap=0.01, env_max=0.3), "state", "speculative-unreproducible"),
    # the serial loop never runs a T > 1 pass, so a batched pass far off is still not a near-tie
    (dict(identical=False, serial_verify_identical=True, gap=2.5, env_max=0.3), "state", "gap-far-beyond-envelope"),
])
def test_classify(kw, verdict, rule):
    assert dmod.classify(**kw) == (verdict, rule)
    assert rule in RULES


def test_classify_needs_a_gap_or_the_control_for_a_reproduced_fork():
    with pytest.raises(ValueError):
        dmod.classify(identical=False)
    with pytest.raises(ValueError):
        dmod.classify(identical=False, serial_verify_identical=None)


# -- scripted engines -------------------------------------------------------------------------
def test_near_tie_flip_reads_near_tie_with_numbers_that_say_so():
    session, trace, d = run("tie", controls=True)
    assert trace.comparison.first_mismatch.index == TIE_TOKEN
    assert d["verdict"] == "near-tie" and d["rule"] == "serial-verify-reproduces-vanilla"
    sv = d["serial_verify"]
    assert sv["form"] == "single-token-passes" and sv["identical_to_vanilla"] is True
    assert sv["first_mismatch"] is None and sv["n_tokens"] == len(trace.vanilla.tokens)
    assert sv["vanilla_repeat"] is None and not sv["reused_run"]
    # one single-token pass per verify row: prefill plus, per round, 1 + drafted passes
    assert sv["passes"] >= 1 + (len(trace.vanilla.tokens) - 1)
    assert d["fork"] == TIE_TOKEN
    assert d["gap"] == pytest.approx(TIE_MARGIN, abs=1e-5)
    env = d["envelope"]
    assert env["max"] == pytest.approx(SHAPE, abs=1e-5)  # exactly the planted shape effect
    assert env["at_fork"] == pytest.approx(SHAPE, abs=1e-5)
    assert len(env["series"]) == TIE_TOKEN + 1 and env["positions"] == TIE_TOKEN
    assert env["series"][0] == 0.0  # the prefill is the same pass in both shapes
    # every position the speculative arm took from a batched row moved by SHAPE, the others not at all
    for j, x in enumerate(env["series"]):
        assert x == pytest.approx(SHAPE if trace.speculative.steps[j].batch_size > 1 and j > 0 else 0.0, abs=1e-5)
    assert d["thresholds"]["far"] == dmod.FAR_FLOOR
    assert d["at_risk"] == [TIE_TOKEN]
    si, sp = d["replays"]["single"], d["replays"]["speculative"]
    assert si["reproduced"] and sp["reproduced"]
    assert sp["gap"] == pytest.approx(SHAPE - TIE_MARGIN, abs=1e-5)
    assert (si["rank_a"], si["rank_b"], sp["rank_b"], sp["rank_a"]) == (1, 2, 1, 2)
    assert sp["batch_size"] == trace.speculative.steps[TIE_TOKEN].batch_size > 1
    # cost: the single replay is one pass per position; the speculative one, one per round up to the fork
    rounds = [r for r in trace.speculative.rounds if 0 < r.index and r.first_step <= TIE_TOKEN]
    assert d["replays"]["passes"] == (1 + TIE_TOKEN) + (1 + len(rounds))
    ctrl = {c["name"]: c for c in d["controls"]}
    assert set(ctrl) == {"vanilla-twice", "zero-draft", "ngram", "prefill-chunk"}
    assert all(c["identical"] for c in ctrl.values()), ctrl
    assert ctrl["prefill-chunk"]["n_batch"] == dmod.CONTROL_CHUNK
    assert session.loads == 2  # target and draft, never reloaded for replays or controls
    text = dmod.format_verdict(d)
    assert "VERDICT  NEAR-TIE" in text and f"{d['gap']:.4f}" in text and f"max {env['max']:.4f}" in text
    assert "zero-draft" in text
    # the control's result comes first, right under the verdict
    assert text.splitlines()[1].strip().startswith("serial verify  IDENTICAL to vanilla")
    assert "That proves the fork" in d["explanation"]


def test_without_the_control_the_thresholds_decide():
    session, trace, d = run("tie", serial_verify=False)
    assert d["serial_verify"] is None
    assert d["verdict"] == "near-tie" and d["rule"] == "gap-within-envelope"
    assert "serial verify" not in dmod.format_verdict(d)


def test_rollback_keeping_a_rejected_draft_reads_state():
    session, trace, d = run("plain", faulty=True, controls=True)
    assert not trace.comparison.identical
    assert d["verdict"] == "state" and d["rule"] == "speculative-unreproducible"
    sp = d["replays"]["speculative"]
    assert not sp["reproduced"] and sp["rerun_consistent"] is True
    assert d["replays"]["single"]["reproduced"]
    first_rejecting = next(r for r in trace.speculative.rounds if r.index > 0 and r.accepted < r.drafted)
    assert sp["first_deviation"] == first_rejecting.first_step + first_rejecting.accepted + 1
    # from a clean state the verify pass picks what plain greedy picks
    assert sp["token"] == d["vanilla_token"] == expected_next(list(PROMPT) + trace.vanilla.tokens[: d["fork"]])
    assert "bug report" in d["explanation"]
    ctrl = {c["name"]: c for c in d["controls"]}
    assert ctrl["vanilla-twice"]["identical"] and ctrl["zero-draft"]["identical"]
    # the fault lived only in the arm's own context: the serial loop on a clean one reproduces vanilla
    assert d["serial_verify"]["identical_to_vanilla"] is True


@pytest.mark.parametrize("kind", ["plain", "tie"])
@pytest.mark.parametrize("fault", ["keep-rejected", "drop-accepted", "accept-unpicked"])
def test_planted_faults_read_state_through_the_serial_verify_control(kind, fault, monkeypatch):
    """Faults in every context of the target (the diagnosis' too) or in the loop itself: only the control sees them."""
    if fault == "accept-unpicked":
        monkeypatch.setattr(generate, "accepted_prefix", accepting_unpicked(generate.accepted_prefix))
    else:
        monkeypatch.setitem(PLANTED, kind, fault)
    session, trace, d = run(kind, max_tokens=32)
    assert not trace.comparison.identical
    assert d["verdict"] == "state" and d["rule"] == "serial-verify-differs", d["explanation"]
    sv = d["serial_verify"]
    assert sv["identical_to_vanilla"] is False
    # vanilla itself is right: it equals plain greedy computed without an engine, and repeats itself
    assert trace.vanilla.tokens == independent_greedy(len(trace.vanilla.tokens)) or kind == "tie"
    assert sv["vanilla_repeat"]["identical"] is True
    assert sv["vanilla_repeat"]["n_tokens"] == sv["first_mismatch"] + 1
    # the serial arm stops at its first token that differs from vanilla
    assert sv["n_tokens"] == sv["first_mismatch"] + 1
    assert 0 < sv["first_mismatch"] <= len(trace.vanilla.tokens)
    lines = dmod.format_verdict(d).splitlines()
    assert lines[0].startswith("VERDICT  STATE") and lines[1].strip().startswith("serial verify  DIFFERS")
    assert "bug report" in d["explanation"]


def test_a_run_that_was_itself_serial_is_its_own_control(monkeypatch):
    monkeypatch.setitem(PLANTED, "plain", "keep-rejected")
    cfg = config("plain", serial_verify=True)
    session = Session()
    trace = session.run(cfg)
    assert all(r.serial for r in trace.speculative.rounds[1:]) and trace.speculative.rounds[1:]
    assert not trace.comparison.identical
    runs = session.speculative_runs
    d = dmod.diagnose(session, session.resolve(cfg).config, trace)
    assert session.speculative_runs == runs
    assert d["serial_verify"]["reused_run"] is True and d["serial_verify"]["passes"] is None
    assert d["verdict"] == "state" and d["rule"] == "serial-verify-differs"
    # the speculative replay rebuilt the serial arm's state with single-token passes too
    assert "single-token passes" in d["replays"]["speculative"]["shape"]


def test_serial_verify_run_reproduces_a_near_tie_vanilla():
    cfg = config("tie", serial_verify=True)
    trace = Session().run(cfg)
    assert trace.comparison.identical  # the tie that flips in T > 1 passes never sees one
    assert trace.config["serial_verify"] is True
    rounds = trace.speculative.rounds[1:]
    assert rounds and all(r.serial and r.batch_size == 1 + r.drafted for r in rounds)
    assert any(r.drafted > 0 for r in rounds)


def test_a_vanilla_that_does_not_repeat_itself_reads_nondeterministic():
    FLAKY_OPENED[0] = 0
    session, trace, d = run("flaky")
    assert trace.comparison.first_mismatch.index == TIE_TOKEN
    assert d["serial_verify"]["identical_to_vanilla"] is False
    assert d["serial_verify"]["vanilla_repeat"] == {**d["serial_verify"]["vanilla_repeat"], "identical": False,
                                                    "first_mismatch": TIE_TOKEN}
    assert d["verdict"] == "nondeterministic" and d["rule"] == "vanilla-repeat-disagrees"
    assert f"first at token {TIE_TOKEN}" in d["explanation"]


def test_a_gap_far_beyond_the_envelope_reads_state():
    session, trace, d = run("big")
    assert trace.comparison.first_mismatch.index == BIG_TOKEN
    assert d["replays"]["single"]["reproduced"] and d["replays"]["speculative"]["reproduced"]
    assert d["gap"] == pytest.approx(BIG_MARGIN, abs=1e-5)
    assert d["envelope"]["max"] == pytest.approx(SHAPE, abs=1e-5)
    assert d["gap"] > d["thresholds"]["far"] == dmod.FAR_FLOOR
    assert d["verdict"] == "state" and d["rule"] == "gap-far-beyond-envelope"
    # the loop is right (the serial control reproduces vanilla); the batched pass itself is far off
    assert d["serial_verify"]["identical_to_vanilla"] is True
    assert "batched verify pass itself" in d["explanation"]


def test_jitter_reads_nondeterministic():
    session, trace, d = run("jitter")
    assert d["verdict"] == "nondeterministic"
    assert d["replays"]["single"]["rerun_consistent"] is False


def test_identical_run_is_cheap_unless_the_envelope_is_asked_for():
    cfg = config("plain")
    session = Session()
    trace = session.run(cfg)
    assert trace.comparison.identical
    d = dmod.diagnose(session, session.resolve(cfg).config, trace)
    assert d["verdict"] == "identical" and d["replays"] is None and d["envelope"] is None
    d2 = dmod.diagnose(session, session.resolve(cfg).config, trace, envelope_if_identical=True)
    assert d2["verdict"] == "identical"
    assert len(d2["envelope"]["series"]) == cfg.max_tokens
    assert d2["envelope"]["max"] == pytest.approx(SHAPE, abs=1e-5)


def test_diagnosis_round_trips_through_a_saved_trace(tmp_path):
    session, trace, d = run("tie", controls=True)
    assert trace.diagnosis is d
    path = trace.save(tmp_path / "t.json")
    loaded = Trace.load(path)
    assert loaded.diagnosis == json.loads(json.dumps(d))
    assert json.loads(path.read_text())["diagnosis"]["verdict"] == "near-tie"
    # a loaded trace can be diagnosed again from its own record, with the same result
    cfg = RunConfig.from_dict({k: v for k, v in loaded.config.items() if k != "n_ctx_used"})
    again = dmod.diagnose(session, session.resolve(cfg).config, loaded)
    assert again["verdict"] == "near-tie" and again["gap"] == d["gap"]
    assert again["replays"]["speculative"]["reproduced"]


def test_cancel_leaves_no_diagnosis():
    cfg = config("tie")
    session = Session()
    trace = session.run(cfg)
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(dmod.DiagnosisCancelled):
        dmod.diagnose(session, session.resolve(cfg).config, trace, cancel=cancel)
    assert trace.diagnosis is None


def test_a_trace_without_rounds_is_refused_clearly():
    cfg = config("tie")
    session = Session()
    trace = session.run(cfg)
    trace.speculative.rounds = trace.speculative.rounds[:1]
    with pytest.raises(SpecviewError, match="per-round data"):
        dmod.diagnose(session, session.resolve(cfg).config, trace)


@pytest.mark.parametrize("arm", ["vanilla", "speculative"])
def test_a_cancelled_arm_is_refused_by_name(arm):
    session, trace, _ = run("tie")
    getattr(trace, arm).stop_reason = "cancelled"
    with pytest.raises(SpecviewError, match=f"the {arm} arm was cancelled: there is no complete run"):
        dmod.require_complete(trace)
    with pytest.raises(SpecviewError, match=f"the {arm} arm was cancelled"):
        session.diagnose(trace, RunConfig.from_dict(trace.config))
