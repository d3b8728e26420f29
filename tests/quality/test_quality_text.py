"""What a quality result says in words, on results built by hand."""

from __future__ import annotations

from specview.core.quality import ItemOutcome, QualityResult, Score, load_suite
from specview.core.quality.text import format_result, reading

P, F = Score(True, "1", "ok"), Score(False, "2", "no")


def result(*outcomes):
    suite = load_suite("count", len(outcomes))
    items = [ItemOutcome(it.id, v, s, identical=ident, fork_index=None if ident else 3, fork_context="x[['a' | 'b']]",
                         verdict=verdict)
             for it, (v, s, ident, verdict) in zip(suite.items, outcomes)]
    return QualityResult(suite=suite, config={"target": "t"}, items=items, status="complete").refresh()


def test_no_change_with_a_state_fork_still_warns():
    res = result((P, P, True, None), (F, F, False, "state"), (P, P, False, "near-tie"))
    said = " ".join(reading(res))
    assert said.startswith("No answer changed: on all 3 items") and "forked on 2" in said
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
