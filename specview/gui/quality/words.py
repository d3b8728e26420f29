"""What the Quality tab says of a quality run, in words a user reads (Qt-free, so the tests read the same words).

A quality run pairs each item's two answers; the question is whether a fork
ever changes an answer.  The headline answers it from McNemar's exact p on the
discordant items ("no evidence speculation changes answers (p = 1.00)" /
"speculation changes answers: p = 0.002"), each arm's pass rate comes with its
95% Wilson interval, and a changed answer whose fork was diagnosed a state bug
is named: that is a bug, not a near-tie.  Beside them, how many steps were
near-ties in each tie band and where the forks fell (:func:`ties_note` says what
was counted, or why nothing was).
"""

from __future__ import annotations

from typing import Any

from ...core.quality.text import ALL_FAIL, ALPHA, p_text, rate_text
from ...core.report.escape import visible


def p_words(p: float) -> str:
    """``p = 1``, ``p = 0.002`` (the CLI's and the report's figures)."""
    return f"p = {p_text(p)}"


def changed_at_state(res: Any) -> list[Any]:
    """The items whose answer changed and whose fork was diagnosed a state bug."""
    return [o for o in res.items if o.discordant and o.verdict == "state"]


def headline(res: Any) -> tuple[str, str]:
    """(sentence, kind) of a result: whether speculation changes answers; kind ok, warn or bad (the verdict bar's)."""
    t = res.table
    b, c = t.only_vanilla, t.only_speculative
    if t.n == 0:
        return "No item has finished yet.", "info"
    p = p_words(res.p_mcnemar)
    if b + c == 0 and t.both_fail == t.n:
        # a changed answer shows as a pass in one arm: with none in either, this suite cannot show one here
        text, kind = f"Inconclusive: no outcome changed on the {t.n} items, but {ALL_FAIL[0].lower()}{ALL_FAIL[1:]}", \
            "unsure"
    elif b + c == 0:
        text, kind = (f"No evidence speculation changes answers ({p}): on all {t.n} items both arms pass or both "
                      "fail."), "ok"
    elif res.p_mcnemar >= ALPHA:
        text, kind = (f"No evidence speculation changes answers ({p}): {b + c} of {t.n} answers changed ({b} passed "
                      f"only with vanilla, {c} only with speculation), no more than chance gives."), "warn"
    else:
        text, kind = (f"Speculation changes answers: {p}. {b} of {t.n} items pass only with vanilla, {c} only with "
                      "speculation."), "bad"
    state = changed_at_state(res)
    if state:
        text += (f" {len(state)} changed answer{'s' if len(state) != 1 else ''} came with a STATE fork: a bug in the "
                 "speculative loop or its cache, not a near-tie.")
        kind = "bad"
    return text, kind


def rate_words(arm: str, rate: Any) -> str:
    """``vanilla passes 18 of 20 (90.0%, 95% CI 69.9–97.2%)``."""
    return f"{arm} passes {rate_text(rate)}" if rate.n else f"{arm}: no item yet"


def ties_note(res: Any, *, running: bool = False) -> str:
    """What the near-tie table counted (:func:`~specview.core.quality.near_ties.intro`), or why it is empty: no
    item finished yet, or a result recorded before the counts were kept (run the suite again to count them)."""
    from ...core.quality.near_ties import intro

    nt = res.near_ties
    if nt.get("items"):
        return intro(nt)
    if nt.get("uncounted"):
        return (f"Near-tie density: not counted. The {nt['uncounted']} item(s) of this result were recorded "
                "without each step's margin (a result written by an older specview); run the suite again to "
                "count how many steps were near-ties and where the forks fell.")
    return "Near-tie density: " + ("counted as items finish." if running else "no item ran, so nothing to count.")


def passed(score: Any) -> str:
    return "pass" if score.passed else "fail"


def fork_token(o: Any) -> str:
    """``' 945' → ' 954'`` at the fork ("" for identical arms)."""
    if o.identical or o.fork_index is None:
        return ""
    v = "(end)" if o.vanilla_piece is None else repr(visible(o.vanilla_piece))
    s = "(end)" if o.speculative_piece is None else repr(visible(o.speculative_piece))
    return f"@{o.fork_index}: {v} → {s}"


def verdict_text(o: Any) -> str:
    """The fork's diagnosis: ``identical``, its verdict, ``not diagnosed``; a state fork on a changed answer is
    written in capitals with a warning sign."""
    if o.error:
        return "error"
    if o.identical:
        return "identical"
    if not o.verdict:
        return "not diagnosed"
    return "⚠ STATE (answer changed)" if o.verdict == "state" and o.discordant else str(o.verdict)


def item_tooltip(o: Any) -> str:
    """An item's details: each arm's answer and why it passed or failed, the text around the fork, the gap."""
    lines = [f"{o.item_id}: vanilla {passed(o.vanilla)} ({o.vanilla.why}), speculative {passed(o.speculative)} "
             f"({o.speculative.why})"]
    if o.vanilla.got is not None or o.speculative.got is not None:
        lines.append(f"answers read: vanilla {o.vanilla.got!r}, speculative {o.speculative.got!r}")
    if o.fork_context:
        lines.append(f"around the fork: {visible(o.fork_context)}")
    if o.gap is not None:
        lines.append(f"gap at the fork: {o.gap:.4f} logits" + (f" ({o.rule})" if o.rule else ""))
    if o.error:
        lines.append(f"error: {o.error}")
    lines.append("double-click: open its trace side by side" if o.trace_path else "no saved trace")
    return "\n".join(lines)


__all__ = ["ALPHA", "changed_at_state", "fork_token", "headline", "item_tooltip", "p_words", "passed", "rate_words",
           "ties_note", "verdict_text"]
