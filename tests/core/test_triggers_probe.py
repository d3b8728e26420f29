"""The probe's logic on the tests' fake engines: the scripted drafter, the judging of each row, the report.

* the scripted drafter proposes exactly what its script says, checked against the toy model's own greedy tokens;
* a correct engine reads identical on every trigger, each counted as it was forced;
* batched-only numerics (``shape_eps``: rows of passes wider than one token are off) read near-tie proven, by a
  control that ran and reproduced plain greedy;
* a planted KV fault (``FaultyBackend``, ``keep-rejected``) reads state where rollbacks happen, and identical
  where every draft is accepted (nothing is rolled back);
* the report survives JSON, a foreign file is refused in one line, ``specview probe --show`` prints it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fakes import EOS, N_VOCAB, FakeBackend, FaultyBackend, ToyModel  # noqa: E402

from specview.core.config import EngineSettings  # noqa: E402
from specview.core.probe import IDENTICAL, NAMES, NEAR_TIE, STATE, UNPROVEN, ProbeReport, TriggerResult  # noqa: E402
from specview.core.probe.result import ProbeError  # noqa: E402
from specview.core.probe.runner import probe_in_session  # noqa: E402
from specview.core.probe.scenarios import ScriptedDrafter, check_triggers  # noqa: E402
from specview.core.probe.text import markdown, table  # noqa: E402
from specview.core.registry import register_backend, unregister_backend  # noqa: E402
from specview.core.session import Session  # noqa: E402


@pytest.fixture
def engine():
    names = []

    def register(name: str, backend) -> str:
        register_backend(name, lambda: backend)
        names.append(name)
        return name

    yield register
    for n in names:
        unregister_backend(n)


def probe(backend: str, target: str = "0", **kw) -> ProbeReport:
    s = Session()
    try:
        return s.job(probe_in_session, target=target, settings=EngineSettings(), backend=backend,
                     **{"n": 24, "long_n": 96, **kw})
    finally:
        s.close()


def test_the_scripted_drafter_proposes_what_its_script_says():
    toy = ToyModel(0)
    prompt = [1, 5, 9]
    oracle = prompt + toy.greedy(prompt, 20)
    d = ScriptedDrafter(oracle, ("accept", "reject", "partial", "none", "deep"), n_max=3, n_vocab=N_VOCAB,
                        avoid=frozenset({EOS}), deep=5)
    hist = oracle[:3]  # history + [id_last] = prompt + the first generated token
    pos = len(hist) + 1
    assert d.draft(hist, oracle[3], 10) == oracle[pos:pos + 3]
    rej = d.draft(hist, oracle[3], 10)
    assert len(rej) == 3 and rej[0] != oracle[pos] and rej[0] != EOS
    part = d.draft(hist, oracle[3], 10)
    assert part[0] == oracle[pos] and all(t != oracle[pos + i] for i, t in enumerate(part) if i) and len(part) == 3
    assert d.draft(hist, oracle[3], 10) == []
    deep = d.draft(hist, oracle[3], 10)
    assert len(deep) == 5 and deep[0] == oracle[pos] and deep[1] != oracle[pos + 1]
    assert d.draft(hist, oracle[3], 2) == oracle[pos:pos + 2] and d.cut == 1  # the run's budget cuts the draft
    assert d.moves == ["accept", "reject", "partial", "none", "deep", "accept"]
    with pytest.raises(ValueError):
        ScriptedDrafter(oracle, ("accept", "bogus"), n_max=3, n_vocab=N_VOCAB)
    assert check_triggers(None) == NAMES and check_triggers(["long-run", "neighbour"]) == ("neighbour", "long-run")
    with pytest.raises(ValueError, match="unknown trigger"):
        check_triggers(["nope"])


def test_a_correct_engine_reads_identical_on_every_forced_trigger(engine):
    rep = probe(engine("probe-fake", FakeBackend()))
    assert {r.trigger for r in rep.rows} == set(NAMES)
    by = {(r.trigger, r.label): r for r in rep.rows}
    for r in rep.rows:
        if r.trigger != "ngram-loop" and not (r.trigger == "rollback-modes" and r.label != "seq-rm"):
            assert r.result == IDENTICAL and r.reached, (r.trigger, r.evidence)
    zero = by[("zero-after-accept", "accept, none")].counts
    assert zero["zero_after_accept"] > 0 and zero["accepted"] > 0
    whole = by[("whole-reject", "reject")].counts
    # every round that drafted was rejected whole (the last may have had no room left to draft)
    assert whole["rounds"] - 1 <= whole["whole_rejections"] <= whole["rounds"] and whole["accepted"] == 0
    long = by[("long-run", "96 tokens")]
    assert long.n_tokens == 96 and 1 + long.counts["rounds"] + long.counts["accepted"] == 96
    # the fake's contexts drop positions only (no rollback modes of their own): the other modes' rows say so
    assert by[("rollback-modes", "snapshots")].result == UNPROVEN
    assert "did not happen" in by[("rollback-modes", "snapshots")].evidence


def test_batched_only_numerics_read_near_tie_proven(engine):
    rep = probe(engine("probe-fake-eps", FakeBackend()), target="0:0:6.0", triggers=["whole-reject", "long-run"])
    forks = [r for r in rep.rows if r.first_mismatch is not None]
    assert forks, [r.evidence for r in rep.rows]  # the planted width error flips an argmax somewhere
    for r in forks:
        assert r.result == NEAR_TIE and r.control["identical"] and r.control["form"] == "single-token-passes"


def test_a_planted_kv_fault_reads_state_where_rollbacks_happen(engine):
    be = FaultyBackend(FakeBackend(), name="probe-faulty")
    be.faults["0"] = "keep-rejected"
    rep = probe(engine("probe-faulty", be), triggers=["zero-after-accept", "whole-reject"])
    by = {r.trigger: r for r in rep.rows}
    assert any(e.faults for e in be.engines)
    w = by["whole-reject"]
    assert w.result == STATE and w.control["identical"] is False and w.control["vanilla_repeats"] is True
    assert by["zero-after-accept"].result == IDENTICAL  # every draft accepted: the planted rollback never runs


def test_the_report_survives_json_and_a_foreign_file_is_refused(tmp_path, capsys):
    row = TriggerResult("whole-reject", "reject", "in-process", STATE, "fork at token 3", True, 24, 3,
                        control={"identical": False}, counts={"rounds": 5})
    rep = ProbeReport(target="t.gguf", rows=[row], notes=["a note"], seconds={"in-process": 1.5})
    path = rep.save(tmp_path / "p.json")
    back = ProbeReport.load(path)
    assert back.to_dict() == rep.to_dict() and back.worst == STATE
    text = table(back)
    assert "whole-reject" in text and "state" in text and "a note" in text
    md = markdown(back)
    assert "| whole-reject | reject | in-process | **state** |" in md and "llama.cpp #26695" in md
    with pytest.raises(ValueError):
        TriggerResult("x", "y", "in-process", "maybe", "", False)
    (tmp_path / "foreign.json").write_text(json.dumps({"schema": "other/1"}))
    with pytest.raises(ProbeError, match="not a specview probe report"):
        ProbeReport.load(tmp_path / "foreign.json")

    from specview.cli import main

    assert main(["probe", "--show", str(path)]) == 1  # a row reads state
    assert "whole-reject" in capsys.readouterr().out
    assert main(["probe", "--show", str(tmp_path / "foreign.json")]) == 2
    assert "not a specview probe report" in capsys.readouterr().err
    assert main(["probe", "--triggers", "nope", "--engine", "llama.cpp"]) == 2
    assert "unknown trigger" in capsys.readouterr().err


def test_specview_probe_prints_the_table_and_writes_both_reports(engine, tmp_path, capsys):
    from specview.cli import main

    name = engine("probe-cli-fake", FakeBackend())
    out, md = tmp_path / "p.json", tmp_path / "p.md"
    rc = main(["probe", "-m", "0", "--engine", name, "-n", "16", "--long", "32", "--json", str(out), "--md", str(md),
               "-q"])
    text = capsys.readouterr().out
    assert rc == 0 and all(n in text for n in NAMES) and "in-process" in text
    rep = ProbeReport.load(out)
    assert {r.trigger for r in rep.rows} == set(NAMES) and rep.worst != STATE
    assert md.read_text().count("| in-process |") == len(rep.rows)
    assert main(["probe", "-m", "0", "--engine", name, "--reject-draft", str(tmp_path / "none.gguf")]) == 2
    assert "--reject-draft" in capsys.readouterr().err and not (tmp_path / "none.gguf").exists()
