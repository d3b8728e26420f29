"""Verdicts: their names, the rules that give them, their words, colours and cell text.

Every front end (CLI summary, app verdict bar, matrix grid, reports) takes what
it shows of a verdict from here, so the four never drift apart.

A verdict is one of :data:`VERDICTS`.  Two further *categories* exist only for
display: ``diverged`` (the arms forked but nobody diagnosed the fork) and
``error`` (a matrix cell that failed to run).
"""

from __future__ import annotations

from typing import Any, Mapping

#: the diagnosis' verdicts, in order of severity for a user; ``inconclusive`` is a fork that could
#: not be diagnosed where it ran (an engine whose server hides what the replay needs)
VERDICTS = ("identical", "near-tie", "state", "nondeterministic", "inconclusive")
#: what a grid cell or a summary can show: the verdicts plus two display-only categories
CATEGORIES = (*VERDICTS, "diverged", "error")

#: the rule names :func:`specview.core.diagnose.classify` returns, with what each means
RULES: dict[str, str] = {
    "identical": "the arms are token-for-token identical",
    "serial-verify-reproduces-vanilla": "the speculative loop with every verify row computed as its own "
    "single-token pass reproduces vanilla exactly, so the fork comes from batched-versus-single numerics (proven)",
    "serial-verify-differs": "the speculative loop with every verify row computed as its own single-token pass "
    "still differs from vanilla, so the loop or its cache is wrong (proven)",
    "vanilla-repeat-disagrees": "the vanilla arm run twice gives different tokens",
    "vanilla-replays-disagree": "two clean replays of the vanilla arm disagree with each other",
    "speculative-replays-disagree": "two clean replays of the speculative arm disagree with each other",
    "vanilla-unreproducible": "clean replays of the vanilla arm agree with each other but not with what it recorded",
    "speculative-unreproducible": "clean replays of the speculative arm agree with each other but not with what "
    "it recorded",
    "gap-far-beyond-envelope": "the fork's gap is far beyond anything batched-versus-single rounding moved",
    "gap-within-envelope": "the fork's gap is within the shift batched-versus-single rounding caused before it",
    "gap-below-far": "the fork's gap is above the largest shift seen before it but below the 'far' threshold",
    "snapshot-restore-unproven": "the speculative arm rolled back through llama.cpp's n_rs_seq snapshots, a path "
    "the serial-verify control never walks, and the snapshot check did not reproduce its tokens, so those "
    "rollbacks are unproven (the same run with --rollback checkpoint is covered)",
    "not-measured": "what the diagnosis needs could not be measured on this engine (its reason is recorded)",
}

#: one line per category, as the app's verdict bar and the reports say it
WORDS: dict[str, str] = {
    "identical": "identical",
    "near-tie": "near-tie flipped by batched-vs-single numerics",
    "state": "state bug (not a near-tie)",
    "nondeterministic": "nondeterministic (an arm does not reproduce itself)",
    "inconclusive": "inconclusive (could not be diagnosed here)",
    "diverged": "diverged (not diagnosed)",
    "error": "error",
}

#: light background colours (grid cells, report tables); None is a cell not run yet
COLOURS: dict[str | None, str] = {
    "identical": "#cfe8cf",
    "near-tie": "#f6e3a1",
    "state": "#f2a7a7",
    "nondeterministic": "#c9b6e8",
    "inconclusive": "#e4e4e4",
    "diverged": "#f3c89b",
    "error": "#d0d0d0",
    None: "#ffffff",
}

#: strong colours for text and bars (the app's verdict bar, the fork card)
STRONG: dict[str, str] = {
    "identical": "#2e7d32",
    "near-tie": "#b7791f",
    "state": "#c62828",
    "nondeterministic": "#6a4c9c",
    "inconclusive": "#616161",
    "diverged": "#d9822b",
    "error": "#757575",
}


def category(cell: Mapping[str, Any] | None) -> str | None:
    """A matrix cell's display category; None for a cell not run yet."""
    if cell is None:
        return None
    if cell.get("status") == "error":
        return "error"
    if cell.get("identical"):
        return "identical"
    v = cell.get("verdict")
    return v if v in VERDICTS else "diverged"


def words(verdict: str | None) -> str:
    """The one-line wording of a verdict or category ("" for none)."""
    if not verdict:
        return ""
    return WORDS.get(verdict, str(verdict))


def cell_label(cell: Mapping[str, Any] | None) -> str:
    """What a cell says in words: its verdict, "diverged (not diagnosed)", "error" or "not run"."""
    cat = category(cell)
    return "not run" if cat is None else ("diverged (not diagnosed)" if cat == "diverged" else cat)


def cell_text(cell: Mapping[str, Any] | None, *, sep: str = " · ") -> str:
    """The short text of a grid cell: ``identical``, ``fork @ 20 · near-tie``, ``error``, ``not run``."""
    cat = category(cell)
    if cat is None:
        return "not run"
    if cat in ("error", "identical"):
        return cat
    assert cell is not None
    return f"fork @ {cell.get('first_mismatch')}{sep}{cat}"
