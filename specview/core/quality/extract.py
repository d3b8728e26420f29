"""Reading an answer out of a model's reply: tolerant extractors, documented in ``docs/quality.md``.

A small instruct model rarely answers with the bare value: it says "The
answer is 945." or fences it.  So each match reads the reply leniently, and
the same way for both arms (a lenient reader cannot favour either):

* ``number``: the last number in the reply (``-12``, ``1,234``, ``3.50``),
  compared as a number with the expected one;
* ``exact``: the expected text equals, after :func:`normalise`, one of the
  reply's *candidates* (:func:`candidates`): the whole reply, its last fenced
  block, its last non-empty line, and what follows the last colon of that line;
* ``regex``: ``re.search(answer, reply)`` over the whole reply (anchor it
  yourself), multi-line.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])-?\d+(?:\.\d+)?")
FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.S)


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (commas between thousands removed), or None."""
    raise NotImplementedError


def last_fenced_block(text: str) -> str | None:
    """The content of the last fenced block (```...```; an unclosed last fence runs to the end), or None."""
    raise NotImplementedError


def normalise(text: str) -> str:
    """Whitespace collapsed, ``", "`` between list items, surrounding quotes, backticks, ``**`` and one
    trailing full stop removed."""
    raise NotImplementedError


def candidates(text: str) -> list[str]:
    """What an ``exact`` answer may be, in order: the last fenced block, what follows the last colon of the last
    non-empty line, that line, the whole reply (duplicates and empty ones dropped)."""
    raise NotImplementedError


def numbers_equal(got: str, want: str) -> bool:
    """Whether two written numbers are the same number (``945`` = ``945.0``)."""
    raise NotImplementedError


__all__ = ["candidates", "last_fenced_block", "last_number", "normalise", "numbers_equal"]
