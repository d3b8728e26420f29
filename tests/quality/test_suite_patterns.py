"""A suite's own regular expressions cannot hang specview: each is compiled when the suite loads (a bad one is
refused naming the file, the line, the item and the pattern), and each search of a reply is bounded, so a
pattern that backtracks catastrophically scores the item an error naming the item and the pattern."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import oracle
from specview.cli import main
from specview.core.quality import RESULT_FILE, QualityError, QualityResult, load_suite
from specview.core.quality.score import PATTERN_TIMEOUT, Score, score
from specview.core.quality.suites import Item

#: a reply of 5,000 characters that ``(a+)+$`` backtracks over for longer than the universe has existed
LONG = "a" * 4999 + "!"


#: patterns whose search of ``LONG`` takes longer than PATTERN_TIMEOUT on any CPU: a backtracking of exponential (or,
#: for ``(a+)+$``, high-polynomial: 1.3 s at 1,000 characters on a Zen 5 EPYC) cost in the reply's length.  A merely
#: quadratic one is no test of the bound: ``^(a|a?)+$`` searches these 5,000 characters in 0.95 s on that CPU.
CATASTROPHIC = [r"(a+)+$", r"(a|aa)+$", r"^(a|a)+$"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_a_catastrophic_pattern_on_a_long_reply_returns_an_error_naming_item_and_pattern(pattern: str) -> None:
    item = Item(id="greedy-1", prompt="say a lot of a", answer=pattern, match="regex")
    s = score(item, LONG)
    assert s.passed is False and s.got is None
    assert s.error is not None and s.why == f"error: {s.error}"
    assert "'greedy-1'" in s.error and f"/{pattern}/" in s.error
    assert f"{len(LONG):,} characters" in s.error and f"{PATTERN_TIMEOUT:g} s" in s.error


@pytest.mark.parametrize("pattern,text", [
    (r'\{\s*"name"\s*:\s*"Ada"\s*\}', 'Sure: {"name": "Ada"}'),
    (r'\{\s*"name"\s*:\s*"Ada"\s*\}', '{"name": "Alan"}'),
    (r"^\d{4}-\d{2}$", "the month\n2024-05\nthat is it"),  # re.M: ^ and $ at each line
    (r"(a+)+$", "a" * 30),  # the catastrophic pattern where it matches: at once
    (r"colou?r", "no such word"),
])
def test_a_sane_pattern_scores_as_re_search_says(pattern: str, text: str) -> None:
    m = re.search(pattern, text, re.M)
    s = score(Item(id="x", prompt="p", answer=pattern, match="regex"), text)
    assert s.error is None
    assert s.passed is (m is not None) and s.got == (m.group(0) if m else None)


def test_an_error_score_reads_back_and_a_plain_one_keeps_its_shape() -> None:
    s = score(Item(id="greedy-1", prompt="p", answer=r"(a+)+$", match="regex"), LONG)
    d = s.to_dict()
    assert d["error"] == s.error and Score.from_dict(json.loads(json.dumps(d))) == s
    plain = Score(True, "4", "the expected answer")
    assert plain.to_dict() == {"passed": True, "got": "4", "why": "the expected answer"}
    with pytest.raises(QualityError, match="score.error must be text"):
        Score.from_dict({**plain.to_dict(), "error": 3})


def suite_file(tmp_path: Path, lines: list[dict]) -> Path:
    p = tmp_path / "patterns.jsonl"
    p.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return p


GOOD = {"id": "ok", "prompt": "2+2?", "answer": "4"}


@pytest.mark.parametrize("pattern,why", [("a(b", "missing ), unterminated subpattern"),
                                         ("x{3,1}", "min repeat greater than max repeat"),
                                         ("(?P<n>a)(?P<n>b)", "redefinition of group name")])
def test_a_bad_pattern_is_refused_at_load_naming_file_line_item_and_pattern(tmp_path: Path, pattern: str,
                                                                            why: str) -> None:
    p = suite_file(tmp_path, [GOOD, {"id": "bad-one", "prompt": "x", "answer": pattern, "match": "regex"}])
    with pytest.raises(QualityError) as e:
        load_suite(str(p))
    msg = str(e.value)
    assert msg.startswith(f"{p}, line 2: the answer is not a valid regular expression (")
    assert why in msg and f"/{pattern}/" in msg and "(item 'bad-one')" in msg


def test_a_long_or_multiline_bad_pattern_is_shown_short_on_one_line(tmp_path: Path) -> None:
    pattern = "line one\n(" + "x" * 500
    p = suite_file(tmp_path, [{"prompt": "x", "answer": pattern, "match": "regex"}])
    with pytest.raises(QualityError) as e:
        load_suite(str(p))
    msg = str(e.value)
    assert "\n" not in msg and "/line one\\n(" in msg and "x" * 500 not in msg and "x.../" in msg
    assert "(item 'patterns-1')" in msg and len(msg) < 300 + len(str(p))


def test_a_catastrophic_pattern_through_specview_quality_finishes(tmp_path: Path, capsys) -> None:
    """End to end: the engine replies 5,000 characters; the run finishes, and the item's scores say why."""
    p = suite_file(tmp_path, [{"id": "greedy-1", "prompt": "Say a lot of a.", "answer": r"(a+)+$",
                               "match": "regex"}])
    oracle.register(load_suite(str(p)), name="oracle-patterns", reply=lambda it: LONG)
    out = tmp_path / "out"
    rc = main(["quality", "--engine", "oracle-patterns", "-m", "oracle", "-md", "oracle-draft", "--suite", str(p),
               "--max-tokens", str(len(LONG) + 8), "-o", str(out), "-q"])
    assert rc in (0, 1)
    res = QualityResult.load(out / RESULT_FILE)
    o = res.items[0]
    assert o.item_id == "greedy-1" and not o.vanilla.passed
    assert o.vanilla.error is not None and "/(a+)+$/" in o.vanilla.error and "'greedy-1'" in o.vanilla.error
    assert f"({len(LONG):,} characters)" in o.vanilla.error  # the whole reply was searched, and cut off
    # no verdict is no failed answer: the item is an error, outside the paired table
    assert o.error == f"the answer could not be judged: {o.vanilla.error}"
    assert o.outcome == "error" and res.table.n == 0


def test_a_matrix_cell_whose_answer_could_not_be_judged_is_not_scored() -> None:
    """A matrix over a task suite scores each cell as quality scores an item: a pattern that runs out of time is no
    failed answer, so the cell carries the error and counts in no paired outcome; a judged cell still does."""
    from types import SimpleNamespace

    from specview.core.matrix.quality import scored, score_cell

    def trace(text: str) -> SimpleNamespace:
        arm = SimpleNamespace(text=text)
        return SimpleNamespace(vanilla=arm, speculative=arm, comparison=SimpleNamespace(identical=True), config={})

    item = Item(id="greedy-1", prompt="say a lot of a", answer=r"(a+)+$", match="regex")
    q = score_cell(item, trace(LONG), {}, "patterns")
    assert q["error"].startswith("the answer could not be judged: ") and "/(a+)+$/" in q["error"]
    assert scored({"status": "ok", "quality": q}) is None
    judged = score_cell(item, trace("a" * 30), {}, "patterns")
    assert "error" not in judged and scored({"status": "ok", "quality": judged})["vanilla_pass"] is True
