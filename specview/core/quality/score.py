"""Scoring one arm's answer to one item: text items by their extractor, code items by running their test.

A code item's program is its prompt, the completion, its test and
``check(entry_point)``, composed by :func:`program`; it runs only with
``execute=True`` (the sandbox in :mod:`specview.core.quality.execute`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .suites import Item

#: seconds one code sample may run (HumanEval's own harness gives 3)
CODE_TIMEOUT = 10.0


@dataclass(frozen=True)
class Score:
    """Whether an answer passed, what was read from it (the extracted answer, or the test's outcome), and why."""

    passed: bool
    got: str | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "got": self.got, "why": self.why}

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "score") -> "Score":
        raise NotImplementedError


def completion_code(item: Item, text: str) -> str:
    """The code of a completion: its last fenced block where it has one (a chat model fences its code), else
    the text as it is (a continuation of the prompt)."""
    raise NotImplementedError


def program(item: Item, text: str) -> str:
    """The program a code item runs: prompt + completion + test + ``check(entry_point)``.

    A completion that restates the whole function (``def entry_point`` in it)
    is taken on its own instead of after the prompt, so the function is not
    defined twice with the prompt's empty body first.
    """
    raise NotImplementedError


def score(item: Item, text: str, *, execute: bool = False, limits: Any = None) -> Score:
    """Score ``text`` (one arm's output) against ``item``.

    Text items never run anything.  A code item needs ``execute=True`` (a
    :class:`~specview.core.quality.suites.QualityError` otherwise) and is run by
    ``execute.run_sample(program(item, text), timeout=CODE_TIMEOUT, limits=limits)``.
    """
    raise NotImplementedError


__all__ = ["CODE_TIMEOUT", "Score", "completion_code", "program", "score"]
