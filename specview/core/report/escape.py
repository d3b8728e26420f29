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


#: how much of a nested value a report shows: levels, items per level, characters per string
SHOW_DEPTH, SHOW_ITEMS, SHOW_CHARS = 3, 12, 2000


def text(value: Any, *, _depth: int = 0) -> str:
    """Any value from a file as display text, bounded whatever it holds (deep nesting, huge integers)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value if len(value) <= SHOW_CHARS else value[:SHOW_CHARS] + "…"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 256 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple, dict)):
        if _depth >= SHOW_DEPTH:
            return "[…]" if not isinstance(value, dict) else "{…}"
        items = list(value.items())[:SHOW_ITEMS] if isinstance(value, dict) else list(value)[:SHOW_ITEMS]
        more = ", …" if len(value) > SHOW_ITEMS else ""
        if isinstance(value, dict):
            inner = ", ".join(f"{text(k, _depth=_depth + 1)}: {text(v, _depth=_depth + 1)}" for k, v in items)
            return "{" + inner + more + "}"
        return "[" + ", ".join(text(v, _depth=_depth + 1) for v in items) + more + "]"
    return type(value).__name__


def num(value: Any, spec: str = ".4f", *, unit: str = "") -> str:
    """A number formatted with ``spec`` (and ``unit``), or "n/a" for anything that is not a usable number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a"
    if isinstance(value, int) and value.bit_length() > 1000:
        return text(value)
    return format(value, spec) + unit


def esc(value: Any) -> str:
    """HTML-escape anything, quotes included (safe in text and in attribute values)."""
    return html.escape(value if isinstance(value, str) else text(value), quote=True)


def visible(piece: Any) -> str:
    """A token's text with its invisible characters made visible (newline ⏎, tab ⇥, CR ␍, NUL ␀)."""
    if piece is None:
        return "(end of output)"
    if not isinstance(piece, str):
        piece = text(piece)
    out = piece.replace("\r", "␍").replace("\n", "⏎").replace("\t", "⇥").replace("\x00", "␀")
    return "".join(ch if ch.isprintable() or ch == " " else f"\\x{ord(ch):02x}" for ch in out)


def _longest_run(text: str, ch: str) -> int:
    runs = re.findall(re.escape(ch) + "+", text)
    return max((len(r) for r in runs), default=0)


def md_code(value: Any, *, table: bool = False) -> str:
    """An inline Markdown code span that shows ``value`` literally, whatever it holds."""
    s = visible(value) if value is not None else ""
    if table:
        s = s.replace("|", "\\|")  # GFM splits table cells on | even inside code spans
    if not s:
        return "` `"
    fence = "`" * (_longest_run(s, "`") + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ")) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_fence(body: str, lang: str = "") -> str:
    """A fenced code block that ``body`` cannot close: the fence is longer than any backtick run in it."""
    n = max(3, _longest_run(body, "`") + 1)
    fence = "`" * n
    body = body if body.endswith("\n") else body + "\n"
    return f"{fence}{lang}\n{body}{fence}\n"


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>&|~!])")
_MD_LINE_START = re.compile(r"^(\s*)(\d*)([#+\-=>.)])")


def md_text(value: Any) -> str:
    """Plain text escaped for Markdown prose and table cells (no markup, no HTML, one line).

    Characters that make markup anywhere are backslash-escaped; those that only do at the start of a
    line (headings, lists, quotes) are escaped there.
    """
    s = _MD_SPECIAL.sub(r"\\\1", visible(value))
    m = _MD_LINE_START.match(s)
    if m and (m.group(2) == "") == (m.group(3) not in ".)"):  # "# x", "- x", "> x" or "1. x", "2) x"
        s = s[:m.start(3)] + "\\" + s[m.start(3):]
    return s

