"""The serial-verify control on real llama.cpp: tiny GGUF models, then the demo model.

Planted faults live in every context opened on the target (the diagnosis'
own included), or in the loop's acceptance rule, so the teacher-forced
replays rebuild the same faulty state and reproduce it: only the serial-verify
control can tell.  No assertion here rests on a threshold.

Whether and where a quantized demo target forks depends on the CPU's kernels
and the thread split, so the natural fork is searched for over a small fixed
set of runs, and the test asserts the properties of whichever it finds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakes import FaultyBackend, accepting_unpicked
from specview.core import diagnose as dmod
from specview.core.arms import generate
from specview.core.config import EngineSettings, RunConfig
from specview.core.prompts import builtin_prompts
from specview.core.registry import register_backend, unregister_backend
from specview.core.session import Session
from specview.core.trace import Trace

FAULTS = ("keep-rejected", "drop-accepted", "accept-unpicked")
PROMPTS = {p.name: p.text for p in builtin_prompts()}


@pytest.fixture
def planted():
    """A llama.cpp backend whose contexts on the files in ``.faults`` carry a planted KV fault."""
    from specview.backends.llama_cpp import LlamaBackend

    fb = FaultyBackend(LlamaBackend(), name="planted")
    register_backend("planted", lambda: fb)
    yield fb
    unregister_backend("planted")


def plant(fb: FaultyBackend, fault: str, target: str | Path, monkeypatch) -> None:
    if fault == "accept-unpicked":
        monkeypatch.setattr(generate, "accepted_prefix", accepting_unpicked(generate.accepted_prefix))
    else:
        fb.faults = {str(Path(target).resolve()): fault}


def assert_state_through_the_control(trace: Trace, d: dict, fb: FaultyBackend, fault: str) -> None:
    assert d["verdict"] == "state" and d["rule"] == "serial-verify-differs", d["explanation"]
    sv = d["serial_verify"]
    assert sv["form"] == "single-token-passes" and sv["identical_to_vanilla"] is False
    assert sv["vanilla_repeat"]["identical"] is True  # vanilla repeats itself: not nondeterminism
    assert sv["n_tokens"] == sv["first_mismatch"] + 1  # the control stops at its first difference
    if fault != "accept-unpicked":
        assert any(e.faults for e in fb.engines), "the planted fault never fired"
    assert dmod.format_verdict(d).splitlines()[1].strip().startswith("serial verify  DIFFERS")


def faulty_fork(fb: FaultyBackend, fault: str, monkeypatch, configs: list[RunConfig]):
    """The first config whose faulty run forks from vanilla, diagnosed; fails naming what was tried."""
    tried = []
    plant(fb, fault, fb.resolve(configs[0].target), monkeypatch)
    for cfg in configs:
        session = Session()
        try:
            trace = session.run(cfg)
            if not trace.comparison.identical:
                return trace, dmod.diagnose(session, session.resolve(cfg).config, trace)
        finally:
            session.close()
        tried.append(f"{Path(cfg.target).name} {cfg.prompt!r:.30}")
    pytest.fail(f"the planted {fault} fault never changed the speculative text; tried: {'; '.join(tried)}")


# -- tiny models --------------------------------------------------------------------------------
def tiny_config(tiny_dir: Path, prompt: str, **kw) -> RunConfig:
    base = dict(backend="planted", target=str(tiny_dir / "target.gguf"), draft=str(tiny_dir / "other.gguf"),
                prompt=prompt, chat=False, max_tokens=40, ignore_eos=True, engine=EngineSettings(threads=1))
    base.update(kw)
    return RunConfig(**base)


def test_serial_verify_on_a_tiny_model_reproduces_vanilla_through_rejections(tiny_dir, planted):
    session = Session()
    try:
        trace = session.run(tiny_config(tiny_dir, "the cat sat on the dog", serial_verify=True))
    finally:
        session.close()
    s = trace.speculative
    assert trace.comparison.identical
    assert s.n_drafted > s.n_accepted  # an unrelated draft: most drafts are rejected and rolled back
    assert all(r.serial and r.batch_size == 1 + r.drafted for r in s.rounds[1:])
    assert len(s.tokens) == s.n_accepted + len(s.rounds)
    loaded = Trace.from_json(json.loads(json.dumps(trace.to_json())))
    assert all(r.serial for r in loaded.speculative.rounds[1:]) and loaded.config["serial_verify"] is True


@pytest.mark.parametrize("fault", FAULTS)
def test_planted_faults_on_a_tiny_model_read_state(fault, tiny_dir, planted, monkeypatch):
    configs = [tiny_config(tiny_dir, p) for p in ("the cat sat on the dog", "a model of the target",
                                                  "history of the essay")]
    trace, d = faulty_fork(planted, fault, monkeypatch, configs)
    assert_state_through_the_control(trace, d, planted, fault)


# -- the demo model -----------------------------------------------------------------------------
DEMO_TOKENS = 48
#: where a natural fork is looked for, cheapest first; the first that forks is used
NATURAL = [(target, threads, prompt) for threads in (1, 2) for target in ("demo:Q4_K_M", "demo:BF16")
           for prompt in ("essay", "technical", "list")]


@pytest.mark.demo
def test_a_natural_demo_fork_is_proven_a_near_tie():
    tried = []
    session = Session()
    try:
        for target, threads, prompt in NATURAL:
            cfg = RunConfig(target=target, draft="demo:Q4_0", prompt=PROMPTS[prompt], max_tokens=DEMO_TOKENS,
                            engine=EngineSettings(threads=threads))
            trace = session.run(cfg)
            if not trace.comparison.identical:
                d = dmod.diagnose(session, session.resolve(cfg).config, trace)
                break
            tried.append(f"{target} -t {threads} {prompt}")
        else:
            pytest.fail(f"no natural fork in {DEMO_TOKENS} tokens; tried: {'; '.join(tried)}")
    finally:
        session.close()
    i = trace.comparison.first_mismatch.index
    assert d["verdict"] == "near-tie" and d["rule"] == "serial-verify-reproduces-vanilla", d["explanation"]
    sv = d["serial_verify"]
    assert sv["identical_to_vanilla"] is True and sv["first_mismatch"] is None
    assert sv["n_tokens"] == len(trace.vanilla.tokens) and sv["vanilla_repeat"] is None
    # the fork came out of a batched verify row, and both replays reproduce their arms
    st = trace.speculative.steps[i]
    assert st.batch_size > 1 and not st.serial
    assert d["replays"]["single"]["reproduced"] and d["replays"]["speculative"]["reproduced"]
    assert d["replays"]["single"]["token"] == d["vanilla_token"]
    assert d["replays"]["speculative"]["token"] == d["speculative_token"]


@pytest.mark.demo
@pytest.mark.parametrize("fault", FAULTS)
def test_planted_faults_on_the_demo_read_state(fault, planted, monkeypatch):
    configs = [RunConfig(backend="planted", target="demo:F16", draft="demo:Q4_0", prompt=PROMPTS[p],
                         max_tokens=DEMO_TOKENS, engine=EngineSettings(threads=1))
               for p in ("essay", "technical", "list")]
    trace, d = faulty_fork(planted, fault, monkeypatch, configs)
    assert_state_through_the_control(trace, d, planted, fault)


@pytest.mark.demo
def test_specview_run_serial_verify_reproduces_vanilla(tmp_path, capsys):
    """On any machine: the demo's quantized target with every verify row as its own pass equals vanilla."""
    from specview.cli import main

    out = tmp_path / "serial.json"
    rc = main(["run", "-m", "demo:Q4_K_M", "-n", "40", "-t", "1", "--serial-verify", "-q", "--json", str(out)])
    assert "IDENTICAL" in capsys.readouterr().out
    assert rc == 0
    trace = Trace.load(out)
    assert trace.config["serial_verify"] is True
    rounds = trace.speculative.rounds[1:]
    assert rounds and all(r.serial for r in rounds) and trace.speculative.n_drafted > 0
    raw = json.loads(out.read_text())
    assert raw["speculative"]["rounds"][1]["serial"] is True
    assert "serial" not in raw["vanilla"]["steps"][0]
