"""Reading an answer out of a model's reply: tolerant extractors, documented in ``docs/quality.md``.

A small instruct model rarely answers with the bare value: it says "The
answer is 945." or fences it.  So each match reads the reply leniently, and
the same way for both arms (a lenient reader cannot favour either):

* ``number``: the last number in the reply (``-12``, ``1,234``, ``3.50``),
  compared as a number with the expected one;
* ``exact``: the expected text equals, after :func:`normalise`, one of the
  reply's *candidates* (:func:`candidates`): its last fenced block, what
  follows the last colon of its last non-empty line, that line, the whole reply;
* ``regex``: ``re.search(answer, reply)`` over the whole reply (anchor it
  yourself), multi-line.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

#: a number as people write it: an optional minus, digits with optional thousands commas, an optional fraction
NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w]|\.\d)")
FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.S)
_QUOTES = "\"'`“”‘’*"


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (commas between thousands removed), or None."""
    found = NUMBER.findall(text or "")
    return found[-1].replace(",", "") if found else None


def fenced_blocks(text: str) -> list[str]:
    """The contents of the fenced blocks (```...```; an unclosed last fence runs to the end), in order."""
    return FENCE.findall(text or "")


def last_fenced_block(text: str) -> str | None:
    """The content of the last fenced block, or None."""
    blocks = fenced_blocks(text)
    return blocks[-1] if blocks else None


def normalise(text: str) -> str:
    """Whitespace collapsed, ``", "`` between list items, surrounding quotes, backticks, ``**`` and one
    trailing full stop removed."""
    t = " ".join((text or "").split())
    t = re.sub(r"\s*,\s*", ", ", t)
    prev = None
    while prev != t:  # "`**[1, 2]**`." -> "[1, 2]"
        prev = t
        t = t.strip().strip(_QUOTES).strip()
        if t.endswith(".") and not t.endswith(".."):
            t = t[:-1]
    return t


def candidates(text: str) -> list[str]:
    """What an ``exact`` answer may be, in order: the last fenced block, what follows the last colon of the last
    non-empty line, that line, the whole reply (duplicates and empty ones dropped)."""
    out: list[str] = []
    block = last_fenced_block(text)
    lines = [ln for ln in (text or "").splitlines() if ln.strip() and not ln.strip().startswith("```")]
    last = lines[-1] if lines else ""
    for c in (block, last.rsplit(":", 1)[1] if ":" in last else None, last, text):
        if c is None:
            continue
        n = normalise(c)
        if n and n not in out:
            out.append(n)
    return out


def numbers_equal(got: str, want: str) -> bool:
    """Whether two written numbers are the same number (``945`` = ``945.0`` = ``945.00``)."""
    try:
        return Decimal(got.replace(",", "")) == Decimal(want.replace(",", ""))
    except (InvalidOperation, AttributeError):
        return False


__all__ = ["candidates", "fenced_blocks", "last_fenced_block", "last_number", "normalise", "numbers_equal"]
