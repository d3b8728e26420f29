"""A quality result in words: the 2x2 table, the rates, the test's reading and the changed outcomes.

An item's *outcome* is whether each arm passed (both pass, both fail, only one); its *answers* are what each
arm replied.  Answers can differ while the outcome holds (two wrong numbers), so the words say which.

The CLI prints :func:`format_result`; the report and the app take the same
sentences (:func:`reading`, :func:`verdict_counts`), so they never disagree.
"""

from __future__ import annotations

from collections import Counter

from ..stats import pct
from ..verdicts import words
from .result import ItemOutcome, QualityResult, Rate

#: the p below which the paired test's result is called evidence
ALPHA = 0.05
OUTCOME_WORDS = {"both-pass": "both pass", "both-fail": "both fail", "only-vanilla": "only vanilla passes",
                 "only-speculative": "only speculative passes", "error": "error"}


def rate_text(r: Rate) -> str:
    """``17 of 20 (85.0%, 95% CI 64.0–94.8%)``."""
    return f"{r.k} of {r.n} ({pct(r.rate)}, 95% CI {pct(r.low)}–{pct(r.high)})"


def p_text(p: float) -> str:
    return "1" if p >= 0.9995 else f"{p:.3g}" if p >= 1e-4 else f"{p:.2e}"


def verdict_counts(items: list[ItemOutcome]) -> dict[str, int]:
    """How the forks of ``items`` were diagnosed: {verdict: count}, with ``not diagnosed`` for the others."""
    c = Counter((o.verdict or "not diagnosed") for o in items if o.fork_index is not None)
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


#: a result whose items both arms all fail: the suite could not show a changed outcome on this model
ALL_FAIL = ("Both arms fail every item, so this suite could not show a changed outcome on this model (a changed "
            "outcome is a pass in one arm): choose a suite the model can pass, such as arithmetic or sort, or a task "
            "suite of your own.")


def reading(res: QualityResult) -> list[str]:
    """What the result says, in sentences: whether outcomes changed (an item's outcome is whether each arm
    passed; its answers are what each arm replied), which way, whether the test calls it evidence, what the
    changed outcomes' forks were, and how to diagnose the forks that were not."""
    t, p = res.table, res.p_mcnemar
    b, c = t.only_vanilla, t.only_speculative
    out: list[str] = []
    if t.n == 0:
        return ["No item was scored."]
    if b + c == 0:
        forked = [o for o in res.items if o.fork_index is not None and o.error is None]
        differ = sum(1 for o in forked if o.vanilla.got != o.speculative.got)
        if not forked:
            tail = " (and every text was identical)."
        elif differ:
            tail = (f" (the texts forked on {len(forked)}, and on {differ} of them the two answers differ, without "
                    "changing whether they pass).")
        else:
            tail = f" (the texts forked on {len(forked)}, without changing the answer)."
        out.append(f"No outcome changed: on all {t.n} items both arms pass or both fail{tail}")
        if t.both_fail == t.n:
            out.append(ALL_FAIL)
        return out + _state_elsewhere(res) + _undiagnosed(res)
    way = f"{b} passed by vanilla only, {c} by the speculative arm only"
    if p < ALPHA:
        worse = "lower" if b > c else "higher"
        out.append(f"Speculative decoding changed outcomes: {way}; McNemar's exact test p = {p_text(p)} < {ALPHA}, "
                   f"so the speculative arm's pass rate is {worse} than vanilla's beyond chance.")
    else:
        out.append(f"Outcomes changed on {b + c} of {t.n} items ({way}); McNemar's exact test p = {p_text(p)}: "
                   f"on this many items that is not evidence that speculation moves the pass rate.")
    vc = verdict_counts(res.discordant)
    if vc:
        out.append("The forks of the changed outcomes: " + ", ".join(f"{n} {v}" for v, n in vc.items()) + ".")
    if vc.get("state"):
        out.append("A changed outcome whose fork is a state bug is not rounding: the speculative loop or its cache "
                   "is wrong there (see those items' traces).")
    elif vc and set(vc) == {"near-tie"}:
        out.append("Every changed outcome comes from a near-tie flipped by batched-versus-single numerics: the "
                   "invariant that holds on this hardware is 'divergences only at near-ties'.")
    return out + _state_elsewhere(res) + _undiagnosed(res)


def _state_elsewhere(res: QualityResult) -> list[str]:
    """A warning for state forks on items whose outcome did not change: a bug this suite's outcomes did not show."""
    n = sum(1 for o in res.items if o.verdict == "state" and not o.discordant)
    if not n:
        return []
    return [f"But {n} fork{'s' if n != 1 else ''} on items whose outcome did not change read state: the "
            "speculative loop or its cache is wrong, whether or not this suite's outcomes show it (see those "
            "items' traces)."]


def undiagnosed(items: list[ItemOutcome]) -> list[ItemOutcome]:
    """The items whose texts forked and whose fork was not diagnosed (not asked for; a failed diagnosis is not one)."""
    return [o for o in items if o.fork_index is not None and o.error is None and o.verdict is None
            and o.diagnosis_error is None]


def _undiagnosed(res: QualityResult) -> list[str]:
    """Where forks went undiagnosed, what diagnoses them: ``--diagnose forks``."""
    held = [o for o in undiagnosed(res.items) if not o.discordant]
    changed = [o for o in undiagnosed(res.items) if o.discordant]
    out = []
    if held:
        out.append(f"{len(held)} fork{'s' if len(held) != 1 else ''} on items whose outcome held "
                   f"{'were' if len(held) != 1 else 'was'} not diagnosed (by default only the forks of changed "
                   "outcomes are); `--diagnose forks` diagnoses every fork, so a state bug that did not change an "
                   "outcome is found too.")
    if changed:
        out.append(f"{len(changed)} fork{'s' if len(changed) != 1 else ''} of changed outcomes "
                   f"{'were' if len(changed) != 1 else 'was'} not diagnosed (`--diagnose none`); `--diagnose "
                   "discordant` (the default) or `--diagnose forks` says whether each is a near-tie or a state bug.")
    return out


def table_lines(res: QualityResult) -> list[str]:
    """The 2x2 table as text, with its margins."""
    t = res.table
    w = max(6, len(str(t.n)))
    rows = [("", "spec pass", "spec fail", "total"),
            ("vanilla pass", t.both_pass, t.only_vanilla, t.both_pass + t.only_vanilla),
            ("vanilla fail", t.only_speculative, t.both_fail, t.only_speculative + t.both_fail),
            ("total", t.both_pass + t.only_speculative, t.only_vanilla + t.both_fail, t.n)]
    return [f"  {str(r[0]):<13}" + "".join(f"{str(x):>{max(w, 10)}}" for x in r[1:]) for r in rows]


def item_line(o: ItemOutcome) -> str:
    """One changed outcome: the item, which arm passed, the two answers, the fork and its verdict."""
    head = f"{o.item_id}: {OUTCOME_WORDS[o.outcome]}"
    got = f"vanilla {o.vanilla.got!r}, speculative {o.speculative.got!r}"
    if o.fork_index is None:
        return f"{head} ({got}; the texts are identical)"
    verdict = (words(o.verdict) if o.verdict else
               f"not diagnosed ({o.diagnosis_error})" if o.diagnosis_error else
               "not diagnosed (--diagnose discordant, the default, diagnoses it)")
    return f"{head} ({got})\n      fork at token {o.fork_index}: {o.fork_context}\n      verdict  {verdict}"


def near_tie_lines(res: QualityResult) -> list[str]:
    """Per tie band, vanilla's near-tie density and how many of the forks fell at a near-tie (``near_ties``)."""
    from .near_ties import density_text, forks_text

    nt = res.near_ties
    if not nt.get("items"):
        return []
    out = []
    for i, b in enumerate(nt["bands"]):
        head = "near-ties    " if i == 0 else " " * 13
        out.append(f"{head}{b['name']:<11} vanilla {density_text(b['vanilla'])}; forks {forks_text(b['forked'])}")
    return out


def format_result(res: QualityResult) -> str:
    """What ``specview quality`` prints at the end."""
    suite = res.suite
    seed = f", seed {suite.seed}" if suite.seed is not None else ""
    lines = [f"suite    {suite.name}: {len(res.items)} of {len(suite.items)} items{seed} ({suite.source})"]
    cfg = res.config
    lines.append(f"target   {cfg.get('target')}; {cfg.get('spec_type')}"
                 + (f" with {cfg.get('draft')}" if cfg.get("draft") else "")
                 + f"; n_max={cfg.get('n_max')} p_min={cfg.get('p_min')}; {cfg.get('max_tokens')} tokens per answer")
    if res.status != "complete":
        lines.append(f"status   {res.status}: {len(suite.items) - len(res.items)} items not run (--resume runs them)")
    lines.append("")
    lines += table_lines(res)
    lines.append("")
    lines.append(f"vanilla      passes {rate_text(res.vanilla_rate)}")
    lines.append(f"speculative  passes {rate_text(res.spec_rate)}")
    lines.append(f"McNemar      exact p = {p_text(res.p_mcnemar)} on {res.table.only_vanilla} + "
                 f"{res.table.only_speculative} discordant items")
    identical = sum(1 for o in res.items if o.identical and o.error is None)
    hint = " (--diagnose forks diagnoses them)" if undiagnosed(res.items) else ""
    lines.append(f"texts        {identical} of {res.table.n} identical; forks: "
                 + (", ".join(f"{n} {v}" for v, n in verdict_counts(res.items).items()) or "none") + hint)
    lines += near_tie_lines(res)
    if res.errors:
        lines.append(f"errors       {len(res.errors)} items could not be run (outside the table): "
                     + "; ".join(f"{o.item_id}: {(o.error or '').splitlines()[0]}" for o in res.errors[:3]))
    lines.append("")
    lines += reading(res)
    if res.discordant:
        lines.append("")
        lines.append("outcomes that changed:")
        lines += [f"  {item_line(o)}" for o in res.discordant]
    return "\n".join(lines)


__all__ = ["ALPHA", "OUTCOME_WORDS", "format_result", "item_line", "near_tie_lines", "p_text", "pct", "rate_text",
           "reading", "table_lines", "undiagnosed", "verdict_counts"]
