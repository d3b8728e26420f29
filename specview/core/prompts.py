"""The prompts specview ships, and reading prompt files.

* the four built-in prompts (``resources/prompts/*.txt``): an essay, a technical
  explanation, code and a repetitive list -- the app's prompt menu and a
  matrix's default prompts;
* the suite (``resources/suite/suite.toml``): prompts written for measuring a
  divergence *rate*, each tagged with a category after Spec-Bench's
  (multi-turn conversation, translation, summarization, question answering,
  mathematical reasoning, retrieval-augmented answering) plus code.

A prompt is text wrapped in the target's chat template, text fed as it is, or
raw token ids (no BOS, no template).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .errors import SpecviewError
from .userfiles import read_user_file

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
PROMPTS_DIR = RESOURCES / "prompts"
SUITE_FILE = RESOURCES / "suite" / "suite.toml"

#: the suite's categories, in the order reports list them
SUITE_CATEGORIES = ("multi-turn", "translation", "summarization", "question-answering", "math-reasoning",
                    "retrieval", "code")


class PromptError(SpecviewError):
    """A prompt, a prompt file or the suite is unusable."""


@dataclass(frozen=True)
class PromptSpec:
    """One prompt: text (with or without the chat template) or raw token ids, optionally tagged with a category."""

    name: str
    text: str | None = None
    tokens: tuple[int, ...] | None = None
    chat: bool = True
    category: str | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.tokens is not None:
            d["tokens"] = list(self.tokens)
        else:
            d["text"] = self.text
            d["chat"] = self.chat
        if self.category is not None:
            d["category"] = self.category
        return d

    @classmethod
    def from_json(cls, d: Any, *, where: str = "prompt") -> "PromptSpec":
        """The inverse of :meth:`to_json`; :class:`PromptError` naming ``where`` on anything malformed."""
        if not isinstance(d, dict):
            raise PromptError(f"{where} must be an object with a name and a text or tokens")
        name, text, toks, cat = d.get("name"), d.get("text"), d.get("tokens"), d.get("category")
        if not isinstance(name, str):
            raise PromptError(f"{where}.name must be text")
        if cat is not None and not isinstance(cat, str):
            raise PromptError(f"{where}.category must be text")
        if toks:
            if not isinstance(toks, list) or not all(_is_token(t) for t in toks):
                raise PromptError(f"{where}.tokens must be a list of token ids (integers >= 0)")
            return cls(name=name, tokens=tuple(toks), chat=False, category=cat)
        if not isinstance(text, str):
            raise PromptError(f"{where}.text must be text")
        chat = d.get("chat", True)
        if not isinstance(chat, bool):
            raise PromptError(f"{where}.chat must be true or false")
        return cls(name=name, text=text, chat=chat, category=cat)


def _is_token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def user_path(path: str | os.PathLike[str]) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded where that user exists, else as written."""
    p = Path(path)
    try:
        return p.expanduser()
    except (RuntimeError, KeyError):  # "~name" of no user on this machine: a file name that starts with ~
        return p


def builtin_names() -> list[str]:
    return sorted(f.stem for f in PROMPTS_DIR.glob("*.txt"))


def builtin_prompts(names: Iterable[str] | None = None) -> list[PromptSpec]:
    """The built-in prompts (an essay, a technical explanation, code, a list), sorted by name."""
    files = sorted(PROMPTS_DIR.glob("*.txt"))
    if not files:
        raise PromptError(f"no built-in prompts found in {PROMPTS_DIR}; reinstall specview")
    found = {f.stem: f for f in files}
    chosen = list(found) if names is None else list(names)
    out = []
    for n in chosen:
        if n not in found:
            raise PromptError(f"unknown built-in prompt {n!r}; built-in prompts: {', '.join(found)}")
        out.append(PromptSpec(name=n, text=found[n].read_text(encoding="utf-8").strip(), chat=True))
    return out


#: the most a prompt file may hold: many times the longest context any model has (a million tokens of text is
#: a few MB), far less than a machine's memory
MAX_PROMPT_BYTES = 64 << 20
#: the most a TOML file specview reads (a matrix spec, a suite, a preset) may hold
MAX_TOML_BYTES = 64 << 20


def read_text_file(path: str | os.PathLike[str], what: str = "prompt file", *, pipes: bool = False) -> str:
    """A UTF-8 text file's contents, or :class:`PromptError` naming the file (:func:`.userfiles.read_user_file`:
    a FIFO is read only with ``pipes``, as a command line's ``<(...)``)."""
    p = user_path(path)
    raw = read_user_file(p, what=f"a {what}", limit=MAX_PROMPT_BYTES, error=PromptError, pipes=pipes)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PromptError(f"{p}: not UTF-8 text (byte {exc.start:,} is {raw[exc.start]:#04x}); save it as UTF-8") \
            from None


def prompt_from_file(path: str | os.PathLike[str], *, chat: bool = True, name: str | None = None,
                     category: str | None = None, pipes: bool = False) -> PromptSpec:
    """A prompt read from a file (:func:`read_text_file`; ``pipes`` where a command line names it)."""
    p = user_path(path)
    return PromptSpec(name=name or p.stem, text=read_text_file(p, pipes=pipes), chat=chat, category=category)


# -- the suite ---------------------------------------------------------------------------
def read_toml(path: str | os.PathLike[str], error: type[SpecviewError] = PromptError) -> dict[str, Any]:
    """A TOML file as a dict, or ``error`` naming the file (unreadable, not UTF-8, not TOML, nested too deeply)."""
    import tomllib

    p = user_path(path)
    raw = read_user_file(p, what="a TOML file", limit=MAX_TOML_BYTES, error=error)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{p}: not UTF-8 text ({exc})") from None
    too_deep = _toml_too_deep(text)
    if too_deep:
        raise error(f"{p}: not a usable TOML file: {too_deep}")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{p}: not valid TOML ({exc})") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise error(f"{p}: not a usable TOML file: its values are nested too deeply") from None


#: deeper than any file specview reads needs; beyond it tomllib recurses (arrays, inline tables) or slows
#: down quadratically (a dotted key of thousands of parts)
TOML_MAX_DEPTH = 64
_TOML_TOKENS = re.compile(r'"""[\s\S]*?"""(?!")|\'\'\'[\s\S]*?\'\'\'(?!\')|"(?:\\.|[^"\\\n])*"|\'[^\'\n]*\'|#[^\n]*'
                          r'|[\[\]{}=,.\n]')


def _toml_too_deep(text: str, limit: int = TOML_MAX_DEPTH) -> str | None:
    """Why ``text`` nests beyond ``limit`` (brackets or dotted-key parts, outside strings and comments), or None."""
    depth = dots = 0
    for m in _TOML_TOKENS.finditer(text):
        ch = m.group()
        if len(ch) != 1:
            continue  # a string or a comment
        if ch in "[{":
            depth += 1
            dots = 0
            if depth > limit:
                return f"its arrays or tables are nested more than {limit} levels deep"
        elif ch in "]}":
            depth = max(0, depth - 1)
            dots = 0
        elif ch == ".":
            dots += 1
            if dots > limit:
                return f"a dotted key has more than {limit} parts"
        else:
            dots = 0
    return None


def suite_from_dict(d: Any, *, source: str) -> list[PromptSpec]:
    """Suite prompts from a TOML-shaped mapping: ``[[prompt]]`` tables with name, category and text."""
    if not isinstance(d, dict) or set(d) - {"prompt"} or not isinstance(d.get("prompt"), list):
        raise PromptError(f"{source}: a suite holds only [[prompt]] tables (name, category, text)")
    out: list[PromptSpec] = []
    seen: set[str] = set()
    for i, e in enumerate(d["prompt"]):
        where = f"{source}: prompt[{i}]"
        if not isinstance(e, dict) or set(e) - {"name", "category", "text", "chat"}:
            raise PromptError(f"{where} must be a table with name, category, text (and optionally chat)")
        name, cat, text, chat = e.get("name"), e.get("category"), e.get("text"), e.get("chat", True)
        if not isinstance(name, str) or not name.strip():
            raise PromptError(f"{where}: name must be non-empty text")
        if name in seen:
            raise PromptError(f"{where}: the name {name!r} is used twice")
        if not isinstance(cat, str) or not cat.strip():
            raise PromptError(f"{where} ({name}): category must be non-empty text")
        if not isinstance(text, str) or not text.strip():
            raise PromptError(f"{where} ({name}): text must be non-empty text")
        if not isinstance(chat, bool):
            raise PromptError(f"{where} ({name}): chat must be true or false")
        seen.add(name)
        out.append(PromptSpec(name=name, text=text.strip(), chat=chat, category=cat))
    if not out:
        raise PromptError(f"{source}: the suite has no prompts")
    return out


def suite_prompts(categories: Iterable[str] | None = None, *, path: str | os.PathLike[str] | None = None
                  ) -> list[PromptSpec]:
    """The suite's prompts (all, or those of ``categories``), in file order."""
    src = Path(path) if path is not None else SUITE_FILE
    prompts = suite_from_dict(read_toml(src), source=str(src))
    if categories is None:
        return prompts
    wanted = list(categories)
    have = sorted({p.category for p in prompts if p.category})
    bad = [c for c in wanted if c not in have]
    if bad:
        raise PromptError(f"unknown suite category {bad[0]!r}; categories: {', '.join(have)}")
    return [p for p in prompts if p.category in wanted]
