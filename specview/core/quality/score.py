"""Scoring one arm's answer to one item: text items by their extractor, code items by running their test.

A code item's program is its prompt, the completion, its test and
``check(entry_point)``, composed by :func:`program`; it runs only with
``execute=True`` (the sandbox in :mod:`specview.core.quality.execute`).

A regex item's pattern is the suite's own, matched against model output: it
is compiled when the suite loads (:mod:`.suites`) and matched with the
``regex`` module under :data:`PATTERN_TIMEOUT`, so a pattern that backtracks
catastrophically (``(a+)+$`` on a long reply) scores the item an error naming
the item and the pattern (:attr:`Score.error`) instead of hanging the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import regex

from .extract import candidates, fenced_blocks, last_number, normalise, numbers_equal
from .suites import Item, QualityError, shown_pattern

#: seconds one code sample may run (HumanEval's own harness gives 3)
CODE_TIMEOUT = 10.0
#: seconds a suite's pattern may search one reply (a sane one takes microseconds; one that backtracks, forever)
PATTERN_TIMEOUT = 1.0


@dataclass(frozen=True)
class Score:
    """Whether an answer passed, what was read from it (the extracted answer, or the test's outcome), and why;
    ``error`` where the answer could not be judged at all (its pattern ran out of time): ``passed`` is then
    False, and ``error`` says why no verdict was reached."""

    passed: bool
    got: str | None
    why: str
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"passed": self.passed, "got": self.got, "why": self.why}
        if self.error is not None:
            d["error"] = self.error
        return d

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "score") -> "Score":
        if not isinstance(d, dict) or not isinstance(d.get("passed"), bool):
            raise QualityError(f"{where} must be an object with passed: true or false")
        got, why = d.get("got"), d.get("why", "")
        if got is not None and not isinstance(got, str):
            raise QualityError(f"{where}.got must be text or null")
        if not isinstance(why, str):
            raise QualityError(f"{where}.why must be text")
        error = d.get("error")
        if error is not None and not isinstance(error, str):
            raise QualityError(f"{where}.error must be text or absent")
        return cls(passed=d["passed"], got=got, why=why, error=error)


#: where HumanEval's own harness cuts a continuation: the function has ended where a new top-level block starts
STOP_SEQUENCES = ("\nclass ", "\ndef ", "\n#", "\nif ", "\nprint(")
#: what a chat model is asked, around a code item's prompt
CODE_REQUEST = ("Complete the following Python function. Reply with the whole function in one ```python code "
                "block.\n\n```python\n{prompt}```")


def prompt_for(item: Item, chat: bool) -> str:
    """The text a run sends for ``item``: a text item's prompt as it is; a code item's wrapped in a request
    (:data:`CODE_REQUEST`) for a chat, or as it is (the model continues the function) without one."""
    if item.kind == "code" and chat:
        return CODE_REQUEST.format(prompt=item.prompt)
    return item.prompt


#: where a fenced function ends: the example usage a chat model writes after it (top-level code or a comment)
AFTER_FUNCTION = ("\n#", "\nif ", "\nprint(", "\nassert ")


def _defines(item: Item) -> re.Pattern[str] | None:
    if not item.entry_point:
        return None
    return re.compile(rf"^\s*def\s+{re.escape(item.entry_point)}\s*\(", re.M)


def _cut(code: str, stops: tuple[str, ...], start: int = 0) -> str:
    at = [i for i in (code.find(s, start) for s in stops) if i >= 0]
    return code[:min(at)] if at else code


def completion_code(item: Item, text: str) -> str:
    """The code of a completion.

    A chat model fences its code and often adds a second block of example usage: the last fenced block that
    defines the entry point is taken (else the first block), up to the top-level code or comment that follows
    the function (:data:`AFTER_FUNCTION`; helper functions after it stay).  Unfenced text is a continuation of
    the prompt, cut where a new top-level block starts (:data:`STOP_SEQUENCES`, as HumanEval's harness cuts it).
    """
    blocks = fenced_blocks(text)
    if not blocks:
        return _cut(text, STOP_SEQUENCES)
    pat = _defines(item)
    defining = [b for b in blocks if pat is not None and pat.search(b)]
    if not defining:
        return blocks[0]
    code = defining[-1]
    m = pat.search(code) if pat is not None else None
    return _cut(code, AFTER_FUNCTION, m.end()) if m else code


def program(item: Item, text: str) -> str:
    """The program a code item runs: prompt + completion + test + ``check(entry_point)``.

    A completion that restates the whole function (``def entry_point`` in it,
    as a chat model's fenced reply does) comes after the prompt on a line of its
    own, so it replaces the prompt's body-less function while the prompt's
    imports and helpers stay defined; a continuation is appended to the prompt
    as it is.
    """
    code = completion_code(item, text)
    pat = _defines(item)
    whole = pat is not None and pat.search(code) is not None
    head = item.prompt.rstrip("\n") + "\n    pass\n\n\n" + code if whole else item.prompt + code
    parts = [head, item.test or ""]
    if item.entry_point:
        parts.append(f"check({item.entry_point})")
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def score(item: Item, text: str, *, execute: bool = False, limits: Any = None) -> Score:
    """Score ``text`` (one arm's output) against ``item``.

    Text items never run anything.  A code item needs ``execute=True`` (a
    :class:`~specview.core.quality.suites.QualityError` otherwise) and is run by
    ``execute.run_sample(program(item, text), timeout=CODE_TIMEOUT, limits=limits)``.
    """
    if item.kind == "code":
        if not execute:
            raise QualityError(f"item {item.id!r} is code: scoring it runs what the model wrote; pass --execute "
                               "to allow that (docs/quality.md says how it is confined)")
        from .execute import run_sample

        res = run_sample(program(item, text), timeout=CODE_TIMEOUT, limits=limits)
        return Score(bool(res.passed), res.reason, "passed its tests" if res.passed else f"failed: {res.reason}")
    assert item.answer is not None
    if item.match == "number":
        got = last_number(text)
        if got is None:
            return Score(False, None, "no number in the reply")
        ok = numbers_equal(got, item.answer)
        return Score(ok, got, f"last number {got} {'=' if ok else '!='} {item.answer}")
    if item.match == "regex":
        return _search(item, text)
    want = normalise(item.answer)
    cands = candidates(text)
    if want in cands:
        return Score(True, want, "the expected answer")
    got = cands[0] if cands else None
    return Score(False, got, "no answer in the reply" if got is None else "not the expected answer")


def _search(item: Item, text: str) -> Score:
    """A regex item's pattern searched in ``text`` for at most :data:`PATTERN_TIMEOUT`; an error Score naming
    the item and the pattern where it runs out of time (or, from a result file, does not compile)."""
    assert item.answer is not None
    pattern = shown_pattern(item.answer)
    try:
        m = regex.search(item.answer, text, regex.M, timeout=PATTERN_TIMEOUT)
    except TimeoutError:
        error = (f"item {item.id!r}: the pattern {pattern} searched this reply ({len(text):,} characters) for "
                 f"more than {PATTERN_TIMEOUT:g} s and was stopped (it backtracks catastrophically); rewrite the "
                 "pattern in the suite")
        return Score(False, None, f"error: {error}", error=error)
    except (regex.error, RecursionError, OverflowError, ValueError) as exc:
        error = f"item {item.id!r}: the pattern {pattern} is not a valid regular expression ({exc})"
        return Score(False, None, f"error: {error}", error=error)
    return Score(m is not None, m.group(0) if m else None,
                 "matches the pattern" if m else "does not match the pattern")


__all__ = ["AFTER_FUNCTION", "CODE_REQUEST", "CODE_TIMEOUT", "PATTERN_TIMEOUT", "STOP_SEQUENCES", "Score",
           "completion_code", "program", "prompt_for", "score"]
