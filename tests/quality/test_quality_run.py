"""A quality run on engines whose answers are known: the table adds up, a planted rollback fault changes answers
with a "state" fork, a planted near-tie with a "near-tie" one, and an interrupted run resumes where it stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import oracle
from specview.core.quality import (QUALITY_KEY, RESULT_FILE, QualityError, QualityResult, answer_changed, item_trace,
                                   load_suite, quality_block, run_quality)
from specview.core.quality import run as qrun
from specview.core.registry import get_backend
from specview.core.trace import Trace
from specview.core.verdicts import VERDICTS
from test_quality_stats import binomial_two_sided


def run(backend, suite, tmp_path=None, **kw):
    cfg = kw.pop("cfg", None) or oracle.config(backend, target=kw.pop("target", "oracle"))
    with get_backend(backend).runner() as runner:
        res = run_quality(runner, cfg, suite, out_dir=tmp_path, **kw)
        return res, runner


def adds_up(res: QualityResult) -> None:
    t = res.table
    assert t.n == len(res.items) - len(res.errors) == t.both_pass + t.both_fail + t.only_vanilla + t.only_speculative
    assert res.vanilla_rate.k == t.both_pass + t.only_vanilla and res.spec_rate.k == t.both_pass + t.only_speculative
    assert res.p_mcnemar == pytest.approx(float(binomial_two_sided(t.only_vanilla, t.only_speculative)))


def test_a_lossless_engine_changes_no_answer(tmp_path):
    suite = load_suite("mixed", 10)
    oracle.register(suite, name="oracle-clean")
    res, runner = run("oracle-clean", suite, tmp_path)
    adds_up(res)
    assert res.status == "complete" and res.table.both_pass == 10 and res.p_mcnemar == 1.0
    assert all(o.identical and o.fork_index is None and o.verdict is None for o in res.items)
    assert runner.speculative_runs == 10
    for o in res.items:  # every item's trace is saved, with the block the fork card and the report read
        t = Trace.load(item_trace(tmp_path / RESULT_FILE, o))
        block = quality_block(t)
        assert block["item"] == o.item_id and block["suite"] == "mixed" and block["vanilla_pass"] is True
        assert answer_changed(t) is False and answer_changed(t.to_json()) is False
    assert QualityResult.load(tmp_path / RESULT_FILE).to_dict()["table"] == res.table.to_dict()


def test_a_planted_rollback_fault_changes_answers_and_reads_state(tmp_path):
    suite = load_suite("mixed", 15)
    be = oracle.register(suite, name="oracle-keep", fault="keep-rejected")
    res, _ = run("oracle-keep", suite, tmp_path, diagnose="forks")
    adds_up(res)
    assert sum(e.faults for e in be.engines) > 0
    changed = res.discordant
    assert len(changed) >= 6 and res.table.only_speculative == 0 and res.p_mcnemar < 0.05
    forks = [o for o in res.items if o.fork_index is not None]
    assert forks and all(o.verdict == "state" and o.rule == "serial-verify-differs" for o in forks)
    for o in changed:
        assert o.vanilla.passed and not o.speculative.passed and o.fork_context and o.vanilla_piece is not None
        assert answer_changed(Trace.load(item_trace(tmp_path / RESULT_FILE, o))) is True
    # what the fault did is in the texts: vanilla's reply is the expected one, the speculative one strays from it
    for o in changed:
        t = Trace.load(item_trace(tmp_path / RESULT_FILE, o))
        assert t.vanilla.text.startswith(oracle.reply_for(suite.items[[i.id for i in suite.items].index(o.item_id)]))
        assert "#" in t.speculative.text


def test_a_planted_near_tie_changes_answers_and_reads_near_tie(tmp_path):
    suite = load_suite("reverse", 8)
    oracle.register(suite, name="oracle-tie")
    res, _ = run("oracle-tie", suite, tmp_path, target="oracle-tie:1")
    adds_up(res)
    assert len(res.discordant) == 8 and res.p_mcnemar == pytest.approx(2 / 2 ** 8)
    for o in res.discordant:
        assert (o.fork_index, o.verdict, o.rule) == (1, "near-tie", "serial-verify-reproduces-vanilla")
        assert o.gap == pytest.approx(oracle.TIE, abs=1e-4) and o.speculative_piece == "!"


def test_only_changed_answers_are_diagnosed_and_identical_arms_are_scored_once(tmp_path, monkeypatch):
    suite = load_suite("mixed", 10)
    oracle.register(suite, name="oracle-keep2", fault="keep-rejected")
    calls = []
    real = qrun.score
    monkeypatch.setattr(qrun, "score", lambda item, text, **kw: calls.append(item.id) or real(item, text, **kw))
    res, _ = run("oracle-keep2", suite)
    adds_up(res)
    forked = [o for o in res.items if not o.identical]
    assert len(calls) == len(res.items) + len(forked)  # one score per identical item, two per forked one
    assert all(o.verdict in VERDICTS for o in res.discordant)
    assert all(o.verdict is None for o in res.items if not o.discordant)


def test_an_interrupted_run_resumes_where_it_stopped(tmp_path):
    suite = load_suite("mixed", 9)
    oracle.register(suite, name="oracle-resume", fault="keep-rejected")
    stop = {"now": False}
    first, _ = run("oracle-resume", suite, tmp_path, cancel=lambda: stop["now"],
                   on_item=lambda o, p: stop.update(now=p.done >= 4))
    assert first.status == "interrupted" and len(first.items) == 4
    saved = QualityResult.load(tmp_path / RESULT_FILE)
    assert saved.status == "interrupted" and [o.item_id for o in saved.items] == [it.id for it in suite.items[:4]]
    lines = []
    done, runner = run("oracle-resume", suite, tmp_path, resume=True, progress=lines.append)
    assert runner.speculative_runs == 5 and done.status == "complete" and len(done.items) == 9
    assert lines[0] == "resuming: 4 of 9 items already done" and lines[-1].startswith("[9/9] mixed-009")
    assert "ETA" in lines[-1]
    adds_up(done)
    assert done.items[:4] == saved.items
    fresh, _ = run("oracle-resume", suite)
    assert fresh.table == done.table
    more, runner = run("oracle-resume", load_suite("mixed", 12), tmp_path, resume=True)  # a larger -n extends it
    assert runner.speculative_runs == 3 and len(more.items) == 12 and more.items[:9] == done.items
    fewer, runner = run("oracle-resume", load_suite("mixed", 5), tmp_path, resume=True)  # a smaller one keeps 5
    assert runner.speculative_runs == 0 and fewer.items == more.items[:5]


def test_resume_refuses_another_suite_other_settings_or_another_machine(tmp_path):
    suite = load_suite("mixed", 4)
    oracle.register(suite, name="oracle-r2")
    run("oracle-r2", suite, tmp_path, cancel=lambda: False, on_item=None)
    with pytest.raises(QualityError, match="another suite"):
        run("oracle-r2", load_suite("mixed", 4, seed=3), tmp_path, resume=True)
    with pytest.raises(QualityError, match=r"other settings \(n_max\)"):
        run("oracle-r2", suite, tmp_path, resume=True, cfg=oracle.config("oracle-r2", n_max=5))
    doc = json.loads((tmp_path / RESULT_FILE).read_text())
    doc["items"] = doc["items"][:2]
    doc["environment"]["cpu"] = "Some Other CPU"
    (tmp_path / RESULT_FILE).write_text(json.dumps(doc))
    with pytest.raises(QualityError, match="another machine.*Some Other CPU"):
        run("oracle-r2", suite, tmp_path, resume=True)
    assert len(json.loads((tmp_path / RESULT_FILE).read_text())["items"]) == 2  # nothing of this run was mixed in


def test_the_result_round_trips_and_malformed_files_are_refused(tmp_path):
    suite = load_suite("mixed", 6)
    oracle.register(suite, name="oracle-rt", fault="keep-rejected")
    res, _ = run("oracle-rt", suite, tmp_path)
    back = QualityResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back.items == res.items and back.table == res.table and back.suite == res.suite
    doc = res.to_dict()
    doc["table"] = {"both_pass": 99}  # derived figures are recomputed, never trusted
    assert QualityResult.from_dict(doc).table == res.table
    for field, value, msg in [("schema", "specview.matrix/1", "not a specview quality result"),
                              ("status", "done", "status must be one of"),
                              ("items", [{"item": "nope", "identical": True}], r"items\[0\]")]:
        bad = res.to_dict()
        bad[field] = value
        with pytest.raises(QualityError, match=msg):
            QualityResult.from_dict(bad, source="q.json")
    bad = res.to_dict()
    bad["items"][0]["verdict"] = "bogus"
    with pytest.raises(QualityError, match=r"q.json: .*items\[0\].verdict must be one of"):
        QualityResult.from_dict(bad, source="q.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(QualityError, match="broken.json"):
        QualityResult.load(tmp_path / "broken.json")


def test_a_code_suite_is_refused_without_execute(tmp_path):
    p = tmp_path / "code.jsonl"
    p.write_text(json.dumps({"prompt": "def f():\n", "test": "assert f() == 1", "entry_point": "f"}) + "\n")
    suite = load_suite(str(p))
    oracle.register(suite, name="oracle-code")
    with pytest.raises(QualityError, match="pass --execute"):
        run("oracle-code", suite, tmp_path)
    assert not (tmp_path / RESULT_FILE).exists()


def test_a_trace_from_no_suite_has_no_answer_changed():
    assert answer_changed({"config": {}}) is None and quality_block({"config": {"quality": "x"}}) is None
    assert answer_changed({"config": {QUALITY_KEY: {"vanilla_pass": True, "speculative_pass": None}}}) is None
    assert answer_changed({"config": {QUALITY_KEY: {"vanilla_pass": False, "speculative_pass": True}}}) is True


def test_an_item_that_cannot_run_is_outside_the_table(tmp_path):
    suite = load_suite("mixed", 5)
    oracle.register(suite, name="oracle-err")
    from dataclasses import replace

    items = list(suite.items)
    items[2] = replace(items[2], prompt="x" * 400)  # longer than the context it is given
    suite = replace(suite, items=items)
    cfg = oracle.config("oracle-err")
    cfg = replace(cfg, engine=replace(cfg.engine, n_ctx=256))
    res, _ = run("oracle-err", suite, tmp_path, cfg=cfg)
    assert [o.item_id for o in res.errors] == [items[2].id] and res.table.n == 4 and res.status == "complete"
    assert res.errors[0].outcome == "error" and not res.errors[0].vanilla.passed
