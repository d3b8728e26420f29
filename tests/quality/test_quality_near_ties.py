"""A quality run's near-tie density, counted again from its saved traces by a second reading of them.

The oracle engine's rows are known: every step's top-1/top-2 margin is 7.5
logits except, on ``oracle-tie:K``, reply position K, whose margin is
``oracle.TIE`` (and which a pass wider than one token flips).  So a near-tie
run has exactly one near-tie step an arm an item and every fork at one; a
planted rollback fault forks at wide margins.  The figures must equal a count
made here with numpy from the traces on disk, and add up.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import oracle
from specview.core import stats as core_stats
from specview.core.diagnose import ties as diagnose_ties
from specview.core.quality import RESULT_FILE, QualityError, QualityResult, item_trace, load_suite, run_quality
from specview.core.quality import stats as quality_stats
from specview.core.quality.near_ties import BANDS, ItemTies
from specview.core.registry import get_backend
from specview.core.report.outcomes import quality_html, quality_markdown
from specview.core.trace import Comparison, Trace

WIDE = 7.5  # the oracle's margin away from the tie: 5.0 against a row at most -2.5


def run(backend, suite, tmp_path, **kw):
    cfg = oracle.config(backend, target=kw.pop("target", "oracle"))
    with get_backend(backend).runner() as runner:
        return run_quality(runner, cfg, suite, out_dir=tmp_path, **kw)


def margins(step):
    """(nats, logits) of a step, read here: numpy's log-softmax over the finite recorded top-k."""
    v = np.array([x for x in step.top_logits if x is not None and np.isfinite(x)], dtype=np.float64)
    if v.size < 2:
        return step.margin, step.margin
    v = np.sort(v)[::-1]
    ls = v - (v.max() + np.log(np.exp(v - v.max()).sum()))
    return float(ls[0] - ls[1]), float(v[0] - v[1])


def near(m, band):
    x = m[0] if band.unit == "nats" else m[1]
    return x is not None and x <= band.width


def recount(res, out):
    """The figures of ``res``, counted from the traces saved under ``out`` without the module under test."""
    arms = {a: {"steps": 0, "measured": 0} for a in ("vanilla", "speculative")}
    per_band = {b.name: {"vanilla": 0, "speculative": 0, "fork": [0, 0, 0], "changed": [0, 0, 0]} for b in BANDS}
    for o in res.items:
        if o.error is not None:
            continue
        t = Trace.load(item_trace(out / RESULT_FILE, o))
        for a in arms:
            steps = getattr(t, a).steps
            ms = [margins(s) for s in steps]
            arms[a]["steps"] += len(steps)
            arms[a]["measured"] += sum(1 for m in ms if m[0] is not None)
            for b in BANDS:
                per_band[b.name][a] += sum(1 for m in ms if near(m, b))
        if t.vanilla.tokens != t.speculative.tokens:
            i = next((k for k, (x, y) in enumerate(zip(t.vanilla.tokens, t.speculative.tokens)) if x != y),
                     min(len(t.vanilla.tokens), len(t.speculative.tokens)))
            m = margins(t.vanilla.steps[i]) if i < len(t.vanilla.steps) else (None, None)
            for b in BANDS:
                slot = 2 if m[0] is None else 0 if near(m, b) else 1
                per_band[b.name]["fork"][slot] += 1
                if o.vanilla.passed != o.speculative.passed:
                    per_band[b.name]["changed"][slot] += 1
    return arms, per_band


def agrees_with_traces(res, out):
    arms, per_band = recount(res, out)
    nt = res.near_ties
    assert nt["arms"] == arms and nt["items"] == len(res.items) - len(res.errors) and nt["uncounted"] == 0
    for b in nt["bands"]:
        want = per_band[b["name"]]
        for a in ("vanilla", "speculative"):
            got = b[a]
            assert (got["near"], got["measured"]) == (want[a], arms[a]["measured"])
            lo, hi = core_stats.wilson(want[a], arms[a]["measured"])
            assert got["density"] == pytest.approx(want[a] / arms[a]["measured"])
            assert (got["low"], got["high"]) == (pytest.approx(lo), pytest.approx(hi))
        for key, slots in (("forked", want["fork"]), ("changed", want["changed"])):
            f = b[key]
            assert [f["at_near_tie"], f["wide"], f["no_margin"]] == slots
            assert f["at_near_tie"] + f["wide"] + f["no_margin"] == f["items"]
    assert nt["bands"][0]["forked"]["items"] == sum(1 for o in res.items if o.fork_index is not None)
    assert nt["bands"][0]["changed"]["items"] == len(res.discordant)


def test_a_planted_near_tie_is_one_near_tie_step_an_arm_an_item_and_every_fork_is_at_one(tmp_path):
    suite = load_suite("reverse", 6)
    oracle.register(suite, name="oracle-nt-tie")
    res = run("oracle-nt-tie", suite, tmp_path, target="oracle-tie:1", diagnose="none")
    agrees_with_traces(res, tmp_path)
    nt = res.near_ties
    assert nt["items"] == 6 and len(res.discordant) == 6
    for b in nt["bands"]:  # the tie (0.01) is inside every band, the other steps (7.5) outside all
        assert b["vanilla"]["near"] == 6 and b["speculative"]["near"] == 6
        assert b["forked"] == {"items": 6, "at_near_tie": 6, "wide": 0, "no_margin": 0, "rate": 1.0,
                               "low": pytest.approx(core_stats.wilson(6, 6)[0]), "high": 1.0}
        assert b["changed"]["at_near_tie"] == 6
    assert nt["arms"]["vanilla"]["steps"] == sum(len(Trace.load(item_trace(tmp_path / RESULT_FILE, o)).vanilla.steps)
                                                 for o in res.items)
    o = res.items[0]
    assert o.ties.fork_nats == pytest.approx(oracle.TIE, abs=1e-4) and all(o.ties.fork_near.values())


def test_a_planted_rollback_fault_forks_at_wide_margins(tmp_path):
    suite = load_suite("mixed", 8)
    wrong = {it.id for it in suite.items[::2]}  # these replies fail in both arms: a fork there changes no answer
    oracle.register(suite, name="oracle-nt-keep", fault="keep-rejected",
                    reply=lambda it: "no idea" if it.id in wrong else oracle.reply_for(it))
    res = run("oracle-nt-keep", suite, tmp_path, diagnose="none")
    agrees_with_traces(res, tmp_path)
    forked = [o for o in res.items if o.fork_index is not None]
    assert len(forked) >= 4 and 0 < len(res.discordant) < len(forked)
    assert all(b["changed"]["items"] == b["changed"]["wide"] == len(res.discordant) for b in res.near_ties["bands"])
    for b in res.near_ties["bands"]:  # no step of the oracle is near a tie: every fork is at a wide margin
        assert b["vanilla"]["near"] == 0 and b["vanilla"]["density"] == 0.0
        assert b["forked"]["items"] == len(forked) and b["forked"]["wide"] == len(forked)
        assert b["forked"]["at_near_tie"] == 0 and b["forked"]["rate"] == 0.0
    assert all(o.ties.fork_logits == pytest.approx(WIDE, abs=1e-3) for o in forked)


def test_a_fork_where_vanilla_stopped_has_no_margin(tmp_path):
    suite = load_suite("reverse", 1)
    oracle.register(suite, name="oracle-nt-short")
    res = run("oracle-nt-short", suite, tmp_path)
    t = Trace.load(item_trace(tmp_path / RESULT_FILE, res.items[0]))
    short = copy.deepcopy(t)
    short.vanilla.tokens, short.vanilla.steps = short.vanilla.tokens[:3], short.vanilla.steps[:3]
    short.comparison = Comparison.of(short.vanilla, short.speculative)
    assert short.comparison.first_mismatch.index == 3 and short.comparison.first_mismatch.vanilla_token is None
    it = ItemTies.of(short)
    assert it.forked and it.fork_near == {} and it.fork_nats is None and it.vanilla.steps == 3
    assert ItemTies.from_dict(json.loads(json.dumps(it.to_dict()))) == it


def test_the_counts_round_trip_and_malformed_counts_are_refused(tmp_path):
    suite = load_suite("reverse", 3)
    oracle.register(suite, name="oracle-nt-rt")
    res = run("oracle-nt-rt", suite, tmp_path, target="oracle-tie:2", diagnose="none")
    back = QualityResult.load(tmp_path / RESULT_FILE)
    assert back.items == res.items and back.near_ties == res.near_ties
    doc = json.loads((tmp_path / RESULT_FILE).read_text())
    assert doc["near_ties"] == json.loads(json.dumps(res.near_ties))

    def refused(edit, match):
        bad = copy.deepcopy(doc)
        edit(bad["items"][0]["ties"])
        with pytest.raises(QualityError, match=match):
            QualityResult.from_dict(bad, source="q.json")

    refused(lambda t: t["vanilla"].update(measured=t["vanilla"]["steps"] + 1), r"items\[0\]\.ties\.vanilla\.measured")
    refused(lambda t: t["speculative"]["near"].update({"0.5 nats": 10 ** 6}), r"at most measured")
    refused(lambda t: t["vanilla"].update(steps=-1), r"must be a count")
    refused(lambda t: t.update(fork=None), r"ties\.fork must be set exactly when the item has a fork")
    refused(lambda t: t["fork"]["near"].update({"0.5 nats": "yes"}), r"true or false")
    refused(lambda t: t["fork"].update(nats=float("nan")), r"finite number")


def test_items_recorded_without_counts_are_left_out_and_said_so(tmp_path):
    suite = load_suite("reverse", 4)
    oracle.register(suite, name="oracle-nt-old")
    res = run("oracle-nt-old", suite, tmp_path, target="oracle-tie:1", diagnose="none")
    doc = json.loads((tmp_path / RESULT_FILE).read_text())
    for d in doc["items"][:2]:
        del d["ties"]  # a result written before the counts were kept
    old = QualityResult.from_dict(doc)
    nt = old.near_ties
    assert nt["items"] == 2 and nt["uncounted"] == 2
    assert nt["arms"]["vanilla"]["steps"] == sum(o.ties.vanilla.steps for o in res.items[2:])
    assert all(b["forked"]["items"] == 2 and b["vanilla"]["near"] == 2 for b in nt["bands"])
    assert "2 item(s) recorded without counts are left out" in quality_markdown(old)
    for d in doc["items"]:
        d.pop("ties", None)
    none = QualityResult.from_dict(doc)
    assert none.near_ties["items"] == 0 and "Near-tie density" not in quality_markdown(none)


def test_the_report_shows_each_arms_density_and_the_forks_at_near_ties(tmp_path):
    suite = load_suite("reverse", 5)
    oracle.register(suite, name="oracle-nt-rep")
    res = run("oracle-nt-rep", suite, tmp_path, target="oracle-tie:1", diagnose="none")
    a = res.near_ties["arms"]
    lo, hi = core_stats.wilson(5, a["vanilla"]["measured"])
    want_v = (f"5 of {a['vanilla']['measured']} steps ({100 * 5 / a['vanilla']['measured']:.1f}%, 95% CI "
              f"{100 * lo:.1f}%–{100 * hi:.1f}%)")
    md, html = quality_markdown(res), quality_html(res)
    for doc in (md, html):
        assert "Near-tie density" in doc and want_v in doc
        assert "5 of 5 at a near-tie (100.0%" in doc
        assert f"vanilla {a['vanilla']['steps']} steps, speculative {a['speculative']['steps']} steps" in doc
    row = next(line for line in md.splitlines() if line.startswith("| 0\\.5 nats"))
    assert row.count("5 of 5 at a near-tie") == 2  # texts differed, and answer changed


def test_one_wilson_interval_serves_the_suite_the_matrix_and_the_near_ties():
    assert diagnose_ties.wilson is core_stats.wilson and quality_stats.wilson is core_stats.wilson
    assert quality_stats.Z95 == core_stats.Z95
    rf = diagnose_ties.rate_fields(10, 3)
    assert (rf["low"], rf["high"]) == core_stats.wilson(3, 10)


def _leaves(d, path=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, (*path, k))
    yield path


def test_every_field_of_the_counts_is_read_or_refused_by_name(tmp_path):
    suite = load_suite("reverse", 2)
    oracle.register(suite, name="oracle-nt-hostile")
    run("oracle-nt-hostile", suite, tmp_path, target="oracle-tie:1", diagnose="none")
    doc = json.loads((tmp_path / RESULT_FILE).read_text())
    read = refused = 0
    for path in list(_leaves(doc["items"][0]["ties"])):
        for value in (None, -1, "x", 1.5, [], {}, True, 10 ** 9, float("inf")):
            bad = copy.deepcopy(doc)
            if not path:
                bad["items"][0]["ties"] = value
            else:
                node = bad["items"][0]["ties"]
                for k in path[:-1]:
                    node = node[k]
                node[path[-1]] = value
            try:
                res = QualityResult.from_dict(bad, source="q.json")
            except QualityError as exc:
                assert str(exc).startswith("q.json: malformed quality result: items[0]")
                refused += 1
                continue
            read += 1
            nt = res.near_ties
            assert nt["items"] + nt["uncounted"] == 2
            for b in nt["bands"]:
                for key in ("forked", "changed"):
                    f = b[key]
                    assert f["at_near_tie"] + f["wide"] + f["no_margin"] == f["items"]
                for a in ("vanilla", "speculative"):
                    assert 0 <= b[a]["near"] <= b[a]["measured"] <= nt["arms"][a]["steps"]
            quality_markdown(res)
    assert read and refused


def test_specview_quality_prints_each_bands_density_and_the_forks_at_near_ties(tmp_path):
    """What the console says is what the result holds: per band, vanilla's near-tie steps of its measured steps,
    and the forks at a near-tie of the forks."""
    from specview.core.quality.text import format_result, near_tie_lines

    suite = load_suite("reverse", 4)
    oracle.register(suite, name="oracle-nt-print")
    res = run("oracle-nt-print", suite, tmp_path, target="oracle-tie:1", diagnose="none")
    lines = near_tie_lines(res)
    assert len(lines) == len(res.near_ties["bands"]) and lines[0].startswith("near-ties    0.125 nats")
    measured = res.near_ties["arms"]["vanilla"]["measured"]
    for line, b in zip(lines, res.near_ties["bands"]):
        assert f"vanilla 4 of {measured} steps" in line and "forks 4 of 4 at a near-tie" in line, line
        assert b["name"] in line
    assert "\n".join(lines) in format_result(res)
