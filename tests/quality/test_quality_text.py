"""What a quality result says in words, on results built by hand."""

from __future__ import annotations

from specview.core.quality import ItemOutcome, QualityResult, Score, load_suite
from specview.core.quality.text import format_result, reading

P, F = Score(True, "1", "ok"), Score(False, "2", "no")


def result(*outcomes):
    suite = load_suite("count", len(outcomes))
    items = [ItemOutcome(it.id, v, s, identical=ident, fork_index=None if ident else 3, fork_context="x[['a' | 'b']]",
                         verdict=verdict, diagnosis_error=(rest or [None])[0])
             for it, (v, s, ident, verdict, *rest) in zip(suite.items, outcomes)]
    return QualityResult(suite=suite, config={"target": "t"}, items=items, status="complete").refresh()


def test_no_change_with_a_state_fork_still_warns():
    res = result((P, P, True, None), (F, F, False, "state"), (P, P, False, "near-tie"))
    said = " ".join(reading(res))
    assert said.startswith("No outcome changed: on all 3 items") and "forked on 2" in said
    assert "But 1 fork on items whose outcome did not change read state" in said


def test_changed_answers_beyond_chance_and_their_forks():
    res = result(*[(P, F, False, "state")] * 6, (F, P, False, "near-tie"), (P, P, True, None))
    assert res.table.only_vanilla == 6 and res.table.only_speculative == 1
    said = " ".join(reading(res))
    assert "6 passed by vanilla only, 1 by the speculative arm only" in said
    assert "p = 0.125" in said and "not evidence" in said  # 2 * (1 + 7) / 128
    assert "6 state, 1 near-tie" in said and "not rounding" in said
    res = result(*[(P, F, False, "state")] * 7)
    assert "lower than vanilla's beyond chance" in " ".join(reading(res)) and res.p_mcnemar == 2 / 128
    text = format_result(res)
    assert "vanilla pass          0         7         7" in text and text.count("verdict  state bug") == 7


def test_only_near_ties():
    res = result((P, F, False, "near-tie"), (F, F, True, None))
    assert "'divergences only at near-ties'" in " ".join(reading(res))


F3 = Score(False, "3", "no")  # a wrong answer other than F's


def test_answers_that_changed_without_changing_the_outcome_are_not_called_unchanged_answers():
    # item 2: both fail, with two different wrong answers; item 3: both pass, forked after the answer
    res = result((P, P, True, None), (F, F3, False, "near-tie"), (P, P, False, "near-tie"))
    said = " ".join(reading(res))
    assert said.startswith("No outcome changed: on all 3 items both arms pass or both fail")
    assert "forked on 2, and on 1 of them the two answers differ" in said
    assert "No answer changed" not in said and "No answer changed" not in format_result(res)
    res = result((P, P, False, "near-tie"))
    assert "forked on 1, without changing the answer" in " ".join(reading(res))


def test_changed_outcomes_are_called_outcomes():
    res = result((P, F, False, "near-tie"), (F, F, True, None))
    said = " ".join(reading(res))
    assert said.startswith("Outcomes changed on 1 of 2 items") and "The forks of the changed outcomes: 1 near-tie" in said
    assert "outcomes that changed:" in format_result(res) and "answers that changed" not in format_result(res)


def test_undiagnosed_forks_whose_outcome_held_point_to_diagnose_forks():
    res = result((P, F, False, "near-tie"), (P, P, False, None), (F, F3, False, None), (F, F, False, None, "boom"))
    said = " ".join(reading(res))
    # two held outcomes forked undiagnosed; the failed diagnosis is not "not asked for"
    assert "2 forks on items whose outcome held were not diagnosed" in said and "`--diagnose forks`" in said
    assert "--diagnose forks diagnoses them" in format_result(res)
    done = result((P, F, False, "near-tie"), (P, P, False, "near-tie"))
    assert "--diagnose" not in " ".join(reading(done)) and "--diagnose" not in format_result(done)
    none = result((P, F, False, None), (F, F, True, None))  # --diagnose none: a changed outcome's fork too
    said = " ".join(reading(none))
    assert "1 fork of changed outcomes was not diagnosed" in said and "--diagnose discordant" in format_result(none)


def test_a_suite_both_arms_fail_throughout_is_called_inconclusive():
    """Both arms fail every item: a changed outcome (a pass in one arm) could not show, so "no outcome changed" is
    said with that, in the CLI's reading and in the app's green-or-not headline."""
    from specview.core.quality.text import ALL_FAIL
    from specview.gui.quality.words import headline

    res = result((F, F, True, None), (F, F3, False, "near-tie"), (F, F, True, None))
    said = reading(res)
    assert said[0].startswith("No outcome changed: on all 3 items both arms pass or both fail") and ALL_FAIL in said
    text, kind = headline(res)
    assert kind == "unsure" and text.startswith("Inconclusive: no outcome changed on the 3 items, but both arms fail")
    one_passes = result((P, P, True, None), (F, F, True, None))
    assert ALL_FAIL not in reading(one_passes) and headline(one_passes)[1] == "ok"
