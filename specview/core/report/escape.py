"""Escaping untrusted text for HTML and Markdown.

Token text is untrusted input: a token can be ``<script>``, a backtick fence,
a ``|`` or a newline; so can a prompt, a model path or an environment string.
Every piece of it goes through :func:`esc` in HTML, and into Markdown only
inside code spans or fenced blocks long enough not to be closed by what they
hold (:func:`md_code`, :func:`md_fence`), or through :func:`md_text`."""

from __future__ import annotations

import html
import re
from typing import Any


def esc(text: Any) -> str:
    """HTML-escape anything, quotes included (safe in text and in attribute values)."""
    return html.escape("" if text is None else str(text), quote=True)


def visible(piece: str | None) -> str:
    """A token's text with its invisible characters made visible (newline ⏎, tab ⇥, CR ␍, NUL ␀)."""
    if piece is None:
        return "(end of output)"
    out = piece.replace("\r", "␍").replace("\n", "⏎").replace("\t", "⇥").replace("\x00", "␀")
    return "".join(ch if ch.isprintable() or ch == " " else f"\\x{ord(ch):02x}" for ch in out)


def _longest_run(text: str, ch: str) -> int:
    runs = re.findall(re.escape(ch) + "+", text)
    return max((len(r) for r in runs), default=0)


def md_code(text: Any, *, table: bool = False) -> str:
    """An inline Markdown code span that shows ``text`` literally, whatever it holds."""
    s = visible(str(text)) if text is not None else ""
    if table:
        s = s.replace("|", "\\|")  # GFM splits table cells on | even inside code spans
    if not s:
        return "` `"
    fence = "`" * (_longest_run(s, "`") + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ")) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_fence(text: str, lang: str = "") -> str:
    """A fenced code block that ``text`` cannot close: the fence is longer than any backtick run in it."""
    n = max(3, _longest_run(text, "`") + 1)
    fence = "`" * n
    body = text if text.endswith("\n") else text + "\n"
    return f"{fence}{lang}\n{body}{fence}\n"


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>&|~!])")
_MD_LINE_START = re.compile(r"^(\s*)(\d*)([#+\-=>.)])")


def md_text(text: Any) -> str:
    """Plain text escaped for Markdown prose and table cells (no markup, no HTML, one line).

    Characters that make markup anywhere are backslash-escaped; those that only do at the start of a
    line (headings, lists, quotes) are escaped there.
    """
    s = _MD_SPECIAL.sub(r"\\\1", visible(str(text)))
    m = _MD_LINE_START.match(s)
    if m and (m.group(2) == "") == (m.group(3) not in ".)"):  # "# x", "- x", "> x" or "1. x", "2) x"
        s = s[:m.start(3)] + "\\" + s[m.start(3):]
    return s

